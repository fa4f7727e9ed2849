"""Real Apache Kafka clusters for tests, the demo and the benchmark harness.

Each cluster is one KRaft process (broker and controller in one JVM; ``add_broker`` joins
broker-only nodes to it, for leaders that move) started from a Kafka
distribution found through ``KAFKA_HOME`` (or an explicit argument), listening on free ports of
127.0.0.1 with a fresh data directory and cluster id. It is ready when a Metadata request lists
the broker *and* the JVM is still alive. It is stopped by pid (never ``kafka-server-stop.sh``,
which stops every Kafka broker on the machine) and its data directory is removed.

The API matches the tansu clusters of ``embedded``: ``alias``, ``bootstrap``, ``pid``, ``alive``,
``client_config()``, ``stop()``; ``flavor`` is ``"kafka"``.

Test-friendly broker settings (everything else is Kafka's default, as users run it):
``log.retention.ms=-1`` (test data may carry old timestamps), ``group.initial.rebalance.delay.ms=0``,
small internal topics (a 50-partition ``__consumer_offsets`` takes seconds to create) and
``log.cleaner.backoff.ms=1000`` (Kafka's idle cleaner sleeps 15 s between looks: most of what a
compaction test waits for; only rolled segments are ever cleaned, which test topics get only
with a short ``segment.ms``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shallowmirror.testing.embedded import (
    BrokerStartError,
    _set_parent_death_signal,
    free_ports,
    probe_roundtrip,
)

log = logging.getLogger(__name__)

KAFKA_HOME_ENV = "KAFKA_HOME"
_READY_TIMEOUT_S = 90.0
#: Settings every test cluster gets; ``overrides`` win over them.
TEST_BROKER_SETTINGS: dict[str, str] = {
    "log.retention.ms": "-1",
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "4",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
    "log.cleaner.backoff.ms": "1000",
    # No KRaft no-op record every 500 ms (KIP-835): they only show a lone controller is alive,
    # and writing and replaying them cost each idle broker ~1.2% of a core (3.8% -> 2.6%).
    "metadata.max.idle.interval.ms": "0",
}
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: A class-data archive (``build_class_archive``) every Kafka JVM started here maps, if set.
CLASS_ARCHIVE_ENV = "SHALLOWMIRROR_KAFKA_CLASS_ARCHIVE"


def find_kafka_home(explicit: str | os.PathLike | None = None) -> Path:
    """The Kafka distribution: ``explicit``, else ``$KAFKA_HOME``; it must hold
    ``bin/kafka-server-start.sh`` and ``libs/``."""
    raw = explicit or os.environ.get(KAFKA_HOME_ENV)
    if not raw:
        raise BrokerStartError(
            f"no Apache Kafka distribution: set {KAFKA_HOME_ENV} (or pass --kafka-home) to the "
            "folder of an unpacked Kafka 3.x release"
        )
    home = Path(raw).expanduser().resolve()
    if not (home / "bin" / "kafka-server-start.sh").is_file() or not (home / "libs").is_dir():
        origin = "argument" if explicit else KAFKA_HOME_ENV
        raise BrokerStartError(
            f"{home} (from {origin}) is not a Kafka distribution: "
            "bin/kafka-server-start.sh or libs/ is missing"
        )
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise BrokerStartError("Apache Kafka needs Java 17 (no `java` on PATH and no JAVA_HOME)")
    return home


def metadata_lists_broker(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True if a Metadata v1 request (no topics) to host:port answers with at least one broker."""
    client_id = b"shallowmirror-probe"
    # Metadata v1 header (api_key 3, version 1, correlation 7, client id); topics = [] (none).
    body = struct.pack(">hhih", 3, 1, 7, len(client_id)) + client_id + struct.pack(">i", 0)
    payload = probe_roundtrip(host, port, body, timeout_s)
    if payload is None or len(payload) < 8:
        return False
    correlation, broker_count = struct.unpack(">ii", payload[:8])  # v1: brokers array first
    return correlation == 7 and broker_count > 0


@dataclass
class KafkaCluster:
    """One single-node KRaft Apache Kafka process: a whole cluster on 127.0.0.1."""

    alias: str
    port: int
    controller_port: int
    cluster_id: str
    kafka_home: Path
    work_dir: Path
    process: subprocess.Popen | None = None
    sasl_port: int | None = None
    sasl_users: dict[str, str] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)
    #: This node's id; 1, the controller, unless added with ``add_broker``.
    node_id: int = 1
    #: The controller's port when this node is a broker only (``add_broker``), else None.
    quorum_port: int | None = None
    #: More JVM options for this node (``KAFKA_OPTS``).
    java_options: str = ""
    flavor: str = field(default="kafka", init=False)
    embedded: bool = field(default=False, init=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        if self.sasl_port is None:
            raise BrokerStartError(f"cluster {self.alias} was started without a SASL listener")
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def pid(self) -> int:
        return self.process.pid if self.process else -1

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def log_path(self) -> Path:
        return self.work_dir / "logs" / "server.log"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    def client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def log_tail(self, lines: int = 30) -> str:
        """The log's last ``lines``, after its first ERROR/FATAL lines when the tail leaves
        them out: a broker that fails to start logs why once, then ~30 lines of shutdown."""
        for path in (self.log_path, self.work_dir / "logs" / "console.log"):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()
                if text:
                    tail = text[-lines:]
                    errors = [line for line in text[:-lines]
                              if " ERROR " in line or " FATAL " in line][:5]
                    if errors:
                        return "\n".join([*errors, "...", *tail])
                    return "\n".join(tail)
        return ""

    def kill(self, timeout_s: float = 30.0) -> None:
        """Stop the JVM by pid (SIGTERM, SIGKILL if it lingers); keep the data for a restart."""
        _LIVE.pop(id(self), None)
        if self.process is None:
            return
        if self.process.poll() is not None:
            self._report_early_exit()
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout_s)
        self.process = None

    def _report_early_exit(self) -> None:
        """A JVM found already gone when we come to stop it died on its own (crash, fatal log
        dir error, parent-death signal): say so with its log's tail, or a test that failed
        because of it shows only timeouts. Reported once: the exit code is cleared after."""
        code, self.process = self.process.returncode, None
        log.warning("Kafka node %s (pid gone, exit code %s) had stopped before it was asked "
                    "to; last lines of its log:\n%s", self.alias, code, self.log_tail(60))

    def restart(self) -> None:
        """Stop the broker and start it again on the same ports with the same data."""
        self.kill()
        _launch(self)
        _await_ready(self)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the broker by pid and remove its data and logs."""
        self.kill(timeout_s)
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


#: id(cluster) -> cluster, for the atexit safety net.
_LIVE: dict[int, KafkaCluster] = {}


def _server_properties(cluster: KafkaCluster, data_dir: Path | None = None) -> str:
    """The node's server.properties (``data_dir``: another ``log.dirs`` than its own)."""
    listeners = [f"PLAINTEXT://127.0.0.1:{cluster.port}"]
    if cluster.quorum_port is None:
        listeners.append(f"CONTROLLER://127.0.0.1:{cluster.controller_port}")
    advertised = [f"PLAINTEXT://127.0.0.1:{cluster.port}"]
    props: dict[str, str] = {
        "process.roles": "broker,controller" if cluster.quorum_port is None else "broker",
        "node.id": str(cluster.node_id),
        "controller.quorum.voters":
            f"1@127.0.0.1:{cluster.quorum_port or cluster.controller_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map":
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "log.dirs": str(data_dir or cluster.data_dir),
    }
    if cluster.sasl_port is not None:
        listeners.append(f"SASL_PLAINTEXT://127.0.0.1:{cluster.sasl_port}")
        advertised.append(f"SASL_PLAINTEXT://127.0.0.1:{cluster.sasl_port}")
        props["sasl.enabled.mechanisms"] = ",".join(SASL_MECHANISMS)
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in cluster.sasl_users.items())
        prefix = "listener.name.sasl_plaintext"
        props[f"{prefix}.plain.sasl.jaas.config"] = (
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};")
        for mech in ("scram-sha-256", "scram-sha-512"):
            props[f"{prefix}.{mech}.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;")
    props["listeners"] = ",".join(listeners)
    props["advertised.listeners"] = ",".join(advertised)
    props.update(TEST_BROKER_SETTINGS)
    props.update(cluster.settings)
    return "".join(f"{key}={value}\n" for key, value in props.items())


def _jvm_env(cluster: KafkaCluster) -> dict[str, str]:
    env = dict(os.environ)
    env["LOG_DIR"] = str(cluster.work_dir / "logs")
    env.setdefault("KAFKA_HEAP_OPTS", "-Xmx768m -Xms256m")
    tmp = cluster.work_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    options = [env.get("KAFKA_OPTS", ""), f"-Djava.io.tmpdir={tmp}", cluster.java_options]
    archive = env.get(CLASS_ARCHIVE_ENV)
    if archive and Path(archive).is_file():
        options.append(f"-XX:SharedArchiveFile={archive}")
    env["KAFKA_OPTS"] = " ".join(o for o in options if o)
    # The distribution's scripts must not pick up a JMX port or debug agent meant for another JVM.
    for var in ("JMX_PORT", "KAFKA_DEBUG"):
        env.pop(var, None)
    return env


#: (Kafka home, SCRAM users) -> the files ``kafka-storage.sh format`` wrote in this process,
#: less ``meta.properties`` (name -> bytes: a few hundred, kept in memory: a template folder
#: removed by an exit handler was left behind by some test processes of a Kafka run).
_FORMATTED: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, bytes]] = {}
_FORMAT_LOCK = threading.Lock()


def _format_storage(cluster: KafkaCluster) -> None:
    """Write what ``kafka-storage.sh format`` writes into the node's data dir:
    ``bootstrap.checkpoint`` (the metadata version, and SCRAM users) and ``meta.properties``
    (cluster id, node id, directory id). The checkpoint names no cluster or node, so the
    distribution's tool formats once per process and set of users, and each node gets a copy
    of its checkpoint and a ``meta.properties`` of its own: the tool is a JVM of its own, ~3.7
    CPU s each time, and a test run starts dozens of nodes."""
    files = _formatted_files(cluster)
    cluster.data_dir.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (cluster.data_dir / name).write_bytes(content)
    (cluster.data_dir / "meta.properties").write_text(
        f"node.id={cluster.node_id}\ndirectory.id={_random_uuid()}\nversion=1\n"
        f"cluster.id={cluster.cluster_id}\n")


def _formatted_files(cluster: KafkaCluster) -> dict[str, bytes]:
    """The files but ``meta.properties`` that the distribution's ``kafka-storage.sh format``
    writes for ``cluster``'s Kafka home and SCRAM users: run once per process, in a folder
    removed right after."""
    key = (str(cluster.kafka_home), tuple(sorted(cluster.sasl_users.items())))
    with _FORMAT_LOCK:
        files = _FORMATTED.get(key)
        if files is not None:
            return files
        with tempfile.TemporaryDirectory(prefix="kafka-format-") as work:
            data = Path(work) / "data"
            config = Path(work) / "server.properties"
            config.write_text(_server_properties(cluster, data_dir=data))
            cmd = [str(cluster.kafka_home / "bin" / "kafka-storage.sh"), "format",
                   f"--cluster-id={cluster.cluster_id}", "-c", str(config)]
            for user, password in cluster.sasl_users.items():
                for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                    cmd += ["--add-scram", f"{mech}=[name={user},password={password}]"]
            env = _jvm_env(cluster)
            env["KAFKA_HEAP_OPTS"] = "-Xmx128m"
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                                  stdin=subprocess.DEVNULL)
            if done.returncode != 0 or not (data / "bootstrap.checkpoint").is_file():
                raise BrokerStartError(
                    f"kafka-storage.sh format failed for cluster {cluster.alias} "
                    f"(exit {done.returncode}): {(done.stderr or done.stdout).strip()[-1500:]}"
                )
            files = {item.name: item.read_bytes() for item in data.iterdir()
                     if item.is_file() and item.name != "meta.properties"}
        _FORMATTED[key] = files
        return files


def _launch(cluster: KafkaCluster) -> None:
    """Start the JVM (not waiting for it); registered for the atexit safety net."""
    console = cluster.work_dir / "logs" / "console.log"
    console.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(cluster.kafka_home / "bin" / "kafka-server-start.sh"),
           str(cluster.work_dir / "server.properties")]
    with open(console, "ab") as out:
        try:
            # kafka-server-start.sh execs java, so this pid is the broker JVM's own pid.
            cluster.process = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=_jvm_env(cluster), preexec_fn=_set_parent_death_signal,
            )
        except OSError as err:
            raise BrokerStartError(f"cannot run {cmd[0]}: {err}") from err
    _LIVE[id(cluster)] = cluster


def _await_ready(cluster: KafkaCluster) -> None:
    """Wait until the started cluster answers Metadata; a cluster that does not is killed."""
    try:
        _wait_ready(cluster)
    except BaseException:
        cluster.kill()
        raise
    log.info("Kafka cluster %s up on %s (pid %d, id %s, logs %s)", cluster.alias,
             cluster.bootstrap, cluster.pid, cluster.cluster_id, cluster.work_dir / "logs")


def _wait_ready(cluster: KafkaCluster) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not cluster.alive:
            pid, code = cluster.pid, cluster.process.poll()
            cluster.process = None  # reported here: the kill that follows has nothing to add
            raise BrokerStartError(
                f"Kafka cluster {cluster.alias} (pid {pid}) exited with status {code} during "
                f"start-up on {cluster.bootstrap}; logs in {cluster.work_dir / 'logs'}:\n"
                f"{cluster.log_tail()}"
            )
        if metadata_lists_broker("127.0.0.1", cluster.port, timeout_s=1.0):
            return
        time.sleep(0.1)
    raise BrokerStartError(
        f"Kafka cluster {cluster.alias} did not answer Metadata on {cluster.bootstrap} within "
        f"{_READY_TIMEOUT_S:.0f}s; logs in {cluster.work_dir / 'logs'}:\n{cluster.log_tail()}"
    )


def _configure(cluster: KafkaCluster) -> None:
    """Write the node's server.properties and format its storage; remove it if that fails."""
    (cluster.work_dir / "server.properties").write_text(_server_properties(cluster))
    try:
        _format_storage(cluster)
    except BaseException:
        cluster.stop()
        raise


def prepare_kafka_cluster(
    alias: str = "cluster",
    *,
    kafka_home: str | os.PathLike | None = None,
    log_dir: str | os.PathLike | None = None,
    overrides: Mapping[str, str] | None = None,
    sasl_users: Mapping[str, str] | None = None,
    port: int | None = None,
) -> KafkaCluster:
    """Write the cluster's config and format its storage; ``launch()`` starts the JVM. Safe to
    run in a worker thread (it starts no long-lived process)."""
    home = find_kafka_home(kafka_home)
    parent = Path(log_dir) if log_dir else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix=f"kafka-{alias}-", dir=parent))
    # Distinct ports: two listeners of the broker on one port make kafka-storage.sh refuse it.
    controller_port, client_port, sasl_port = free_ports(3, avoid=(port,) if port else ())
    cluster = KafkaCluster(
        alias=alias, port=port or client_port, controller_port=controller_port,
        cluster_id=_random_uuid(), kafka_home=home, work_dir=work_dir,
        sasl_port=sasl_port if sasl_users else None, sasl_users=dict(sasl_users or {}),
        settings={k: str(v) for k, v in (overrides or {}).items()},
    )
    _configure(cluster)
    return cluster


def launch(cluster: KafkaCluster, *, wait: bool = True) -> KafkaCluster:
    """Start the prepared cluster's JVM. Call it from the thread that owns the cluster: the JVM
    gets SIGTERM when *that thread* exits (PR_SET_PDEATHSIG is per thread)."""
    try:
        _launch(cluster)
        if wait:
            _await_ready(cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def add_broker(cluster: KafkaCluster, node_id: int = 2, *, wait: bool = True) -> KafkaCluster:
    """Start a broker-only node ``node_id`` that joins ``cluster`` (its controller, its cluster
    id, its settings): a multi-broker cluster, for leaders that move. Returned as a
    ``KafkaCluster`` of its own (``kill``, ``restart``, ``stop`` act on this node only); its
    ``bootstrap`` reaches the whole cluster too. Launched from the calling thread (see
    ``launch``)."""
    work_dir = Path(tempfile.mkdtemp(prefix=f"kafka-{cluster.alias}-{node_id}-",
                                     dir=cluster.work_dir.parent))
    (port,) = free_ports(1, avoid=(cluster.port, cluster.controller_port))
    node = KafkaCluster(
        alias=f"{cluster.alias}/{node_id}", port=port, controller_port=cluster.controller_port,
        cluster_id=cluster.cluster_id, kafka_home=cluster.kafka_home, work_dir=work_dir,
        settings=dict(cluster.settings), node_id=node_id, quorum_port=cluster.controller_port)
    _configure(node)
    return launch(node, wait=wait)


def start_kafka_cluster(alias: str = "cluster", **options) -> KafkaCluster:
    """Start one single-node KRaft cluster and return it once a client gets metadata from it.

    Options (see ``prepare_kafka_cluster``): ``kafka_home``; ``log_dir``, the parent of the
    cluster's own work folder (config, data, logs); ``overrides``, broker settings;
    ``sasl_users`` (user -> password), which adds a SASL_PLAINTEXT listener with PLAIN and
    SCRAM-SHA-256/512 for those users (``cluster.sasl_bootstrap``); ``port``."""
    return launch(prepare_kafka_cluster(alias, **options))


def build_class_archive(path: str | os.PathLike, *,
                        kafka_home: str | os.PathLike | None = None) -> Path:
    """Write a dynamic class-data archive (Java's AppCDS) of a Kafka broker's start-up to
    ``path``: one throwaway broker started with ``-XX:ArchiveClassesAtExit`` and stopped. Brokers
    started with ``CLASS_ARCHIVE_ENV`` naming it map those classes already parsed and verified
    instead of loading them from the jars: measured on 2 cores, a broker's start-up took 4.4
    instead of 6.4 CPU s. For test runs that start many brokers; the archive fits only the
    Java and the Kafka distribution that wrote it (another Java ignores it, with a warning in
    the broker's console log)."""
    target = Path(path)
    cluster = prepare_kafka_cluster("class-archive", kafka_home=kafka_home,
                                    log_dir=target.parent)
    cluster.java_options = f"-XX:ArchiveClassesAtExit={target}"
    launch(cluster)
    try:
        cluster.kill()          # SIGTERM: the JVM writes the archive as it exits
        if not target.is_file():
            raise BrokerStartError(f"the Kafka broker wrote no class archive to {target}; "
                                   f"its log:\n{cluster.log_tail()}")
    finally:
        cluster.stop()
    return target


def _random_uuid() -> str:
    """A cluster or directory id, as ``kafka-storage.sh random-uuid`` makes one (Kafka's
    ``Uuid.toString``): 16 random bytes, URL-safe base64 without padding, never starting with
    "-" (``Uuid.randomUuid`` draws again then: a command line would take it for an option)."""
    import base64

    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def stop_all() -> None:
    """Stop every Kafka cluster this process started and has not stopped yet."""
    for cluster in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            cluster.stop()


atexit.register(stop_all)


@contextlib.contextmanager
def kafka_clusters(*aliases: str, kafka_home: str | os.PathLike | None = None,
                   log_dir: str | os.PathLike | None = None,
                   overrides: Mapping[str, str] | None = None) -> Iterator[list[KafkaCluster]]:
    """Start one Kafka cluster per alias (formatted and booted in parallel); stop them on exit."""
    from concurrent.futures import ThreadPoolExecutor

    prepared: list[KafkaCluster] = []
    errors: list[BaseException] = []
    with ThreadPoolExecutor(max_workers=max(1, len(aliases))) as pool:
        futures = [pool.submit(prepare_kafka_cluster, alias, kafka_home=kafka_home,
                               log_dir=log_dir, overrides=overrides) for alias in aliases]
        for future in futures:
            try:
                prepared.append(future.result())
            except BaseException as err:  # noqa: BLE001 - stop what was prepared, then re-raise
                errors.append(err)
    try:
        if errors:
            raise errors[0]
        for cluster in prepared:  # launched from this thread: see launch()
            launch(cluster, wait=False)
        for cluster in prepared:
            _await_ready(cluster)
        yield prepared
    finally:
        for cluster in prepared:
            cluster.stop()
