"""Which test broker to start: embedded tansu (the default) or real Apache Kafka.

``SHALLOWMIRROR_BROKER`` = ``tansu`` | ``kafka`` picks the flavor for tests, the bench harness and
``shallowmirror brokers``; Kafka is found through ``KAFKA_HOME`` (``kafka.find_kafka_home``).
Clusters given by ``SHALLOWMIRROR_SOURCE/TARGET_BOOTSTRAP`` (``embedded.external_from_env``) win
over both: nothing is started then.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from shallowmirror.testing import embedded, kafka
from shallowmirror.testing.embedded import BrokerStartError

BROKER_ENV = "SHALLOWMIRROR_BROKER"
FLAVORS = ("tansu", "kafka")


def broker_flavor(explicit: str | None = None) -> str:
    """The flavor to start: ``explicit``, else ``$SHALLOWMIRROR_BROKER``, else ``tansu``."""
    flavor = (explicit or os.environ.get(BROKER_ENV) or "tansu").strip().lower()
    if flavor not in FLAVORS:
        raise BrokerStartError(f"{BROKER_ENV}={flavor!r}: expected one of {', '.join(FLAVORS)}")
    return flavor


def start_one(flavor: str, alias: str, *, log_dir=None, port: int | None = None,
              kafka_home=None, overrides=None):
    """Start one cluster of ``flavor``; the caller stops it."""
    if flavor == "kafka":
        return kafka.start_kafka_cluster(alias, kafka_home=kafka_home, log_dir=log_dir,
                                         overrides=overrides, port=port)
    return embedded.start_cluster(alias, log_dir=log_dir, port=port)


@contextlib.contextmanager
def started_clusters(flavor: str, *aliases: str, log_dir=None,
                     kafka_home=None) -> Iterator[list]:
    """One cluster per alias (Kafka JVMs start in parallel); all stopped on exit."""
    if flavor == "kafka":
        with kafka.kafka_clusters(*aliases, kafka_home=kafka_home, log_dir=log_dir) as started:
            yield started
    else:
        with embedded.embedded_clusters(*aliases, log_dir=log_dir) as started:
            yield started


@contextlib.contextmanager
def source_and_target(broker: str | None = None, kafka_home=None) -> Iterator[tuple[str, list]]:
    """(flavor, [source, target]) for a benchmark: the clusters given by
    ``SHALLOWMIRROR_SOURCE/TARGET_BOOTSTRAP`` (flavor "external", nothing started), else two
    started here and stopped on exit: ``broker``'s flavor, or Kafka when ``kafka_home`` is
    given, or ``broker_flavor``'s default."""
    external = embedded.external_from_env()
    if external is not None:
        yield "external", list(external)
        return
    flavor = broker_flavor(broker or ("kafka" if kafka_home else None))
    with started_clusters(flavor, "source", "target", kafka_home=kafka_home) as started:
        yield flavor, started


def stop_all() -> None:
    """Stop every cluster of any flavor this process started."""
    embedded.stop_all()
    kafka.stop_all()


def serve_until_signal(aliases: list[str], *, flavor: str = "tansu", kafka_home=None,
                       log_dir=None) -> int:
    """``shallowmirror brokers``: start one cluster per alias, print lines that paste into
    mm2.properties as they are, and stop them all on Ctrl-C or SIGTERM."""
    import logging
    import signal

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with started_clusters(flavor, *aliases, log_dir=log_dir, kafka_home=kafka_home) as clusters:
        for cluster in clusters:
            print(f"{cluster.alias}.bootstrap.servers = {cluster.bootstrap}", flush=True)
        pids = ", ".join(f"{c.alias} pid {c.pid}" for c in clusters)
        if flavor == "kafka":
            where = ", ".join(str(c.work_dir) for c in clusters)
            what = f"Apache Kafka from {clusters[0].kafka_home} ({pids}); data and logs in {where}"
        else:
            what = f"embedded tansu brokers ({pids}), storage in memory only"
        print(f"# {what}.\n# Stop them with Ctrl-C, or: kill {os.getpid()}", flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        dead: list = []
        while signal.sigtimedwait({signal.SIGINT, signal.SIGTERM}, 1.0) is None:
            # A cluster that died (killed, out of memory) is said at once, not found later by
            # a mirror that cannot connect. The others keep running: killing one cluster is
            # also how a failover is tried out.
            for cluster in clusters:
                if cluster not in dead and not cluster.alive:
                    dead.append(cluster)
                    rest = [c.alias for c in clusters if c.alive]
                    then = (f"{', '.join(rest)} still running (Ctrl-C stops them)" if rest
                            else "no cluster left; stopping")
                    print(f"shallowmirror brokers: cluster {cluster.alias} (pid {cluster.pid}) "
                          f"exited with status {cluster.process.returncode}; {then}",
                          file=sys.stderr, flush=True)
            if len(dead) == len(clusters):
                break
    return 1 if dead else 0
