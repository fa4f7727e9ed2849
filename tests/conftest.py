"""Session fixtures shared by every integration test.

Clusters: two brokers for the whole session (``source_cluster``, ``target_cluster``) of the flavor
``SHALLOWMIRROR_BROKER`` names — ``tansu`` (embedded, the default) or ``kafka`` (real Apache Kafka
from ``KAFKA_HOME``) — or, when ``SHALLOWMIRROR_SOURCE_BOOTSTRAP`` and
``SHALLOWMIRROR_TARGET_BOOTSTRAP`` are set, those existing clusters: the tests run unchanged. Each
cluster object has ``.bootstrap``, ``.alias``, ``.flavor`` (tansu, kafka or external),
``.embedded`` (a tansu we started) and ``.client_config()``. Tests share the clusters and isolate
themselves with ``unique_topic()`` names. ``start_broker`` starts a private cluster of the
session's flavor for tests that stop, restart or reconfigure a broker; ``add_broker`` gives a
private Kafka cluster a second broker.

Markers:
- ``needs_real_kafka("why")``: tansu cannot serve the test (e.g. it reports no aborted
  transactions); skipped, with the reason, when the clusters are embedded tansu.
- ``tansu_workaround("why")``: the test adapts to a documented tansu quirk; it runs everywhere and
  the ``on_tansu`` fixture says which branch applies.
- ``harness_tansu``: the test exercises the tansu starter itself (port clash, missing binary,
  the demo's embedded brokers); it runs in the tansu session only — the Kafka starter has its own
  tests (``test_kafka_harness.py``).
- ``broker_independent("why")``: what the test proves does not depend on the broker (a report
  computed from a run's metrics, an address nothing listens on): skipped in the Apache Kafka
  session, which `make test` runs after the tansu one.

At session end every broker process started by this test process must be gone (checked by pid);
if one is left, it is killed and the session fails loudly.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from shallowmirror.testing import clusters as test_clusters
from shallowmirror.testing import embedded

#: The test brokers' JVMs (and MirrorMaker 2's, through the same scripts) start with the C1
#: compiler only and the serial collector: the suite starts dozens of Kafka JVMs on two cores, and
#: the full JIT and G1's threads spent ~35% more CPU bringing each one up (8.0 s to ready, 7.5 CPU
#: s in its first 10 s, against 6.0 s and 4.9 CPU s). Neither changes what the broker does. Test
#: runs only: ``shallowmirror brokers`` and the benchmarks keep Kafka's own defaults, and a value
#: set by the person running the tests wins.
os.environ.setdefault(
    "KAFKA_JVM_PERFORMANCE_OPTS",
    "-server -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto -Djava.awt.headless=true")
#: Spark's driver JVM (local reports: spark-submit adds SPARK_SUBMIT_OPTS to it) with the serial
#: collector too. Its C1-only compiling is the product's own for local sessions
#: (``reports.spark.LOCAL_JIT_OPTION``), and a test checks that it reaches the JVM. A value set by
#: the caller wins.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:+UseSerialGC")

#: Every broker the fixtures started, checked at session end. Process handles, not bare pids:
#: pids wrap quickly here (pid_max 32768, every JVM thread takes one), and a pid this worker's
#: broker had may by then be a broker of the other xdist worker, which a bare-pid sweep killed
#: mid-test (psutil compares the start time, so a reused pid is no longer "ours").
_STARTED: list[psutil.Process] = []


def _track(pid: int) -> None:
    with contextlib.suppress(psutil.Error):
        _STARTED.append(psutil.Process(pid))


def _using_external() -> bool:
    return bool(os.environ.get(embedded.SOURCE_ENV) or os.environ.get(embedded.TARGET_ENV))


def session_flavor() -> str:
    """tansu, kafka or external: what the session's clusters are."""
    return "external" if _using_external() else test_clusters.broker_flavor()


def pytest_report_header(config: pytest.Config) -> str:
    flavor = session_flavor()
    if flavor == "external":
        return (f"clusters: external ({embedded.SOURCE_ENV}={os.environ.get(embedded.SOURCE_ENV)}, "
                f"{embedded.TARGET_ENV}={os.environ.get(embedded.TARGET_ENV)})")
    if flavor == "kafka":
        return f"clusters: Apache Kafka from {os.environ.get('KAFKA_HOME', '(KAFKA_HOME unset)')}"
    return "clusters: embedded tansu (needs_real_kafka tests are skipped)"


#: Test files that share the session's Spark fixtures (tests/unit/reports/conftest.py). Under
#: ``--dist loadfile`` each worker that ran one of them started its own Spark and computed the
#: whole report (~40 s); as one work unit they start Spark and compute the report once.
_SPARK_FILES = frozenset(f"tests/unit/reports/{name}.py"
                         for name in ("test_html", "test_jobs", "test_report_cli"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (``make test``) with the Spark test files as one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SparkFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "spark-report-tests" if scope in _SPARK_FILES else scope

    return SparkFilesTogether(config, log)


def pytest_runtest_setup(item: pytest.Item) -> None:
    flavor = session_flavor()
    marker = item.get_closest_marker("needs_real_kafka")
    if marker is not None and flavor == "tansu":
        why = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
        pytest.skip(f"needs real Apache Kafka, not embedded tansu{': ' + why if why else ''} "
                    f"(the Apache Kafka run of `make test` covers it)")
    if item.get_closest_marker("harness_tansu") is not None and flavor != "tansu":
        pytest.skip("tests the embedded tansu starter itself: covered by the tansu run")
    independent = item.get_closest_marker("broker_independent")
    if independent is not None and flavor == "kafka":
        why = independent.args[0] if independent.args else ""
        pytest.skip(f"does not depend on the broker{': ' + why if why else ''}: covered by the "
                    f"tansu run")


@pytest.fixture(scope="session")
def broker_log_dir(tmp_path_factory: pytest.TempPathFactory):
    """Where embedded brokers write their logs (pytest keeps the last few sessions' tmp dirs)."""
    return tmp_path_factory.mktemp("brokers")


@pytest.fixture(scope="session")
def clusters(broker_log_dir) -> Iterator[tuple]:
    """(source, target): external clusters from the environment, or two clusters of the session's
    flavor started once for the session."""
    external = embedded.external_from_env()
    if external is not None:
        yield external
        return
    with test_clusters.started_clusters(session_flavor(), "source", "target",
                                        log_dir=broker_log_dir) as started:
        for cluster in started:
            _track(cluster.pid)
        yield tuple(started)


@pytest.fixture
def start_broker(broker_log_dir) -> Iterator[Callable[..., object]]:
    """Factory of private clusters of the session's flavor: ``start_broker("net", port=None)``.
    Skips on external clusters (nothing of ours to stop or restart). All stopped after the test."""
    yield from _private_clusters(broker_log_dir)


@pytest.fixture(scope="module")
def start_module_broker(broker_log_dir) -> Iterator[Callable[..., object]]:
    """``start_broker`` for a file whose tests share a private cluster that none of them stops,
    restarts or reconfigures (each with its own topics and groups): started once, stopped after
    the file. A Kafka JVM costs 6 to 17 s to come up on two cores."""
    yield from _private_clusters(broker_log_dir)


def _private_clusters(broker_log_dir) -> Iterator[Callable[..., object]]:
    flavor = session_flavor()
    if flavor == "external":
        pytest.skip("stops, restarts or reconfigures a broker: needs brokers this session starts")
    started = []

    def start(alias: str, *, port: int | None = None, overrides=None):
        cluster = test_clusters.start_one(flavor, alias, log_dir=broker_log_dir, port=port,
                                          overrides=overrides)
        _track(cluster.pid)
        started.append(cluster)
        return cluster

    try:
        yield start
    finally:
        for cluster in started:
            cluster.stop()


@pytest.fixture
def add_broker() -> Iterator[Callable[..., object]]:
    """``add_broker(cluster, node_id=2)``: a broker-only node joining a private Kafka cluster
    from ``start_broker`` (leaders that move). Stopped after the test."""
    from shallowmirror.testing.kafka import add_broker as start_node

    started = []

    def add(cluster, node_id: int = 2):
        node = start_node(cluster, node_id)
        _track(node.pid)
        started.append(node)
        return node

    try:
        yield add
    finally:
        for node in started:
            node.stop()


@pytest.fixture(scope="session")
def source_cluster(clusters):
    return clusters[0]


@pytest.fixture(scope="session")
def target_cluster(clusters):
    return clusters[1]


@pytest.fixture(scope="session")
def on_tansu(clusters) -> bool:
    """True when the session's clusters are embedded tansu (for ``tansu_workaround`` branches)."""
    return clusters[0].flavor == "tansu"


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> Callable[..., str]:
    """Factory of topic names unique to this test and run: ``unique_topic("orders")``."""
    test = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:60]

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{test}-{uuid.uuid4().hex[:10]}"

    return make


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every broker this session started must be gone: fail loudly (and clean up) if not."""
    test_clusters.stop_all()  # what a test started and forgot; the pid check below still applies
    leftovers = [process for process in _STARTED if _still_running(process)]
    tracked = {process.pid for process in leftovers}
    leftovers += [child for child in psutil.Process().children(recursive=True)
                  if _is_broker(child) and child.pid not in tracked]
    if not leftovers:
        return
    for process in leftovers:
        with contextlib.suppress(psutil.Error):
            process.kill()  # psutil refuses a pid that was reused since
    leftovers = [process.pid for process in leftovers]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = (f"BROKER OR SPARK PROCESSES LEFT RUNNING AFTER THE SESSION (now killed): "
               f"pids {leftovers}")
    if reporter is not None:
        reporter.write_line(message, red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _still_running(process: psutil.Process) -> bool:
    """The very process we started (not a later one with its pid) runs and is no zombie."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _is_broker(process: psutil.Process) -> bool:
    """A tansu broker, a Kafka broker JVM (``kafka.Kafka``) or Spark's gateway JVM
    (``SparkSubmit``, started by the report tests), not a zombie."""
    try:
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        cmdline = process.cmdline()
        return (process.name() == "tansu" or "kafka.Kafka" in cmdline
                or "org.apache.spark.deploy.SparkSubmit" in cmdline)
    except psutil.Error:
        return False
