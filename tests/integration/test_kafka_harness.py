"""The real Apache Kafka starter (``shallowmirror.testing.kafka``): clusters come up on free ports
with their own ids, are stopped by pid with nothing left behind, die with their owner, restart
with their data, and serve SASL PLAIN and SCRAM when asked. Runs wherever a Kafka distribution
is found (``KAFKA_HOME``); the tansu starter has its own tests in ``test_foundation.py``."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import psutil
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from shallowmirror.mirror.config import load_properties
from shallowmirror.testing import kafka
from shallowmirror.testing.embedded import BrokerStartError, pid_gone
from shallowmirror.testing.topics import read_topic

# In the Apache Kafka run of `make test` only: run 1 (tansu) would start the same JVMs again.
pytestmark = [pytest.mark.integration,
              pytest.mark.needs_real_kafka("starts Apache Kafka clusters of its own")]


def _kafka_home() -> str:
    try:
        return str(kafka.find_kafka_home())
    except BrokerStartError as err:
        pytest.skip(f"no Apache Kafka distribution here: {err}")


def _wait_gone(pid: int, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pid_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pid_gone(pid)


def test_a_missing_distribution_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("KAFKA_HOME", raising=False)
    with pytest.raises(BrokerStartError, match="set KAFKA_HOME"):
        kafka.find_kafka_home()
    with pytest.raises(BrokerStartError, match="is not a Kafka distribution"):
        kafka.find_kafka_home(tmp_path)


def test_two_clusters_distinct_stopped_by_pid_and_data_removed(broker_log_dir):
    home = _kafka_home()
    with kafka.kafka_clusters("a", "b", kafka_home=home, log_dir=broker_log_dir) as pair:
        ids = {AdminClient(c.client_config()).list_topics(timeout=20).cluster_id for c in pair}
        assert len(ids) == 2, "each cluster has its own id"
        assert {c.cluster_id for c in pair} == ids
        pids = [c.pid for c in pair]
        dirs = [c.work_dir for c in pair]
        assert all("kafka.Kafka" in psutil.Process(pid).cmdline() for pid in pids)
        # Formatted from one copy of kafka-storage.sh's output: the same checkpoint, and a
        # meta.properties of each node's own that the broker took (it is up, with that id).
        metas = [load_properties(c.data_dir / "meta.properties") for c in pair]
        assert [m["cluster.id"] for m in metas] == [c.cluster_id for c in pair]
        assert len({m["directory.id"] for m in metas}) == 2
        assert all(m["node.id"] == "1" and m["version"] == "1" for m in metas)
        checkpoints = {(c.data_dir / "bootstrap.checkpoint").read_bytes() for c in pair}
        assert len(checkpoints) == 1
    assert all(pid_gone(pid) for pid in pids)
    assert not any(d.exists() for d in dirs)


@pytest.mark.skipif(not os.environ.get(kafka.CLASS_ARCHIVE_ENV),
                    reason="no class archive given (`make test` writes one for its Kafka run)")
def test_brokers_map_the_class_archive_the_suite_wrote(clusters):
    """The archive is only worth its build if the JVM takes it: one written by another Java,
    or for another class path, is ignored with a warning and the brokers load every class."""
    archive = os.path.realpath(os.environ[kafka.CLASS_ARCHIVE_ENV])
    for cluster in clusters:
        maps = psutil.Process(cluster.pid).memory_maps(grouped=True)
        assert any(os.path.realpath(m.path) == archive for m in maps), (
            f"broker {cluster.alias} (pid {cluster.pid}) does not map {archive}")


def test_a_port_clash_gives_a_clear_error(broker_log_dir, caplog):
    home = _kafka_home()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        before = set(kafka._LIVE)
        with caplog.at_level("WARNING", logger=kafka.__name__), \
                pytest.raises(BrokerStartError, match="exited with status") as info:
            kafka.start_kafka_cluster("clash", kafka_home=home, log_dir=broker_log_dir, port=port)
    assert str(port) in str(info.value)
    assert "before it was asked" not in caplog.text, "the error says it once, with the log"
    assert set(kafka._LIVE) == before


def test_restart_keeps_the_data(broker_log_dir, unique_topic, caplog):
    home = _kafka_home()
    topic = unique_topic("restart")
    with kafka.start_kafka_cluster("restart", kafka_home=home, log_dir=broker_log_dir) as cluster:
        producer = Producer({**cluster.client_config(), "linger.ms": 0,
                             # a retried first batch (auto-created topic) may not overtake
                             "enable.idempotence": True})
        for i in range(10):
            producer.produce(topic, value=b"v%d" % i)
        assert producer.flush(30) == 0
        old_pid = cluster.pid
        with caplog.at_level("WARNING", logger=kafka.__name__):
            cluster.restart()
        assert cluster.pid != old_pid and pid_gone(old_pid)
        assert "before it was asked" not in caplog.text, "a stop we asked for is no crash"
        values = [r.value for r in read_topic(cluster, topic)[0]]
        assert values == [b"v%d" % i for i in range(10)]


def test_a_node_that_died_on_its_own_is_reported_with_its_log(broker_log_dir, caplog):
    """A test that fails because its broker crashed shows only timeouts, unless stopping the
    broker says it was already gone and why."""
    home = _kafka_home()
    cluster = kafka.start_kafka_cluster("crash", kafka_home=home, log_dir=broker_log_dir)
    try:
        os.kill(cluster.pid, 9)
        cluster.process.wait(30)       # not pid_gone: a JVM's main thread is a zombie early
    finally:
        with caplog.at_level("WARNING", logger=kafka.__name__):
            cluster.stop()
    reports = [r.getMessage() for r in caplog.records if "before it was asked" in r.getMessage()]
    assert len(reports) == 1, caplog.text
    assert "crash" in reports[0] and "exit code -9" in reports[0]
    assert "Kafka Server started" in reports[0] or "KafkaRaftServer" in reports[0], reports[0]


def test_a_kafka_broker_dies_with_its_owner(broker_log_dir):
    home = _kafka_home()
    code = ("import time; from shallowmirror.testing.kafka import start_kafka_cluster; "
            f"c = start_kafka_cluster('orphan', kafka_home={home!r}, log_dir={str(broker_log_dir)!r}); "
            "print(c.pid, flush=True); time.sleep(120)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ})
    try:
        line = owner.stdout.readline()
        pid = int(line)
        assert not pid_gone(pid)
    finally:
        owner.kill()
        owner.wait(10)
    assert _wait_gone(pid), f"Kafka pid {pid} outlived its owner"


def test_sasl_listener_accepts_its_users_and_refuses_others(broker_log_dir):
    home = _kafka_home()
    with kafka.start_kafka_cluster("sasl", kafka_home=home, log_dir=broker_log_dir,
                                   sasl_users={"alice": "alice-secret"}) as cluster:
        for mechanism in kafka.SASL_MECHANISMS:
            good = {"bootstrap.servers": cluster.sasl_bootstrap,
                    "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
                    "sasl.username": "alice", "sasl.password": "alice-secret"}
            assert AdminClient(good).list_topics(timeout=20).brokers, mechanism
            seen: list[str] = []
            bad = {**good, "sasl.password": "wrong", "log_level": 0,
                   "error_cb": lambda err, seen=seen: seen.append(err.name())}
            admin = AdminClient(bad)
            with pytest.raises(Exception, match="(?i)transport|authentication"):
                admin.list_topics(timeout=5)
            deadline = time.monotonic() + 10
            while "_AUTHENTICATION" not in seen and time.monotonic() < deadline:
                admin.poll(0.2)  # error callbacks are served by poll()
            assert "_AUTHENTICATION" in seen, (mechanism, seen)


def test_brokers_cli_runs_real_kafka_until_ctrl_c():
    """`shallowmirror brokers --kafka-home DIR A B`: paste-ready lines, both clusters answer,
    Ctrl-C stops both JVMs (by pid) and exits 0."""
    import signal

    home = _kafka_home()
    proc = subprocess.Popen([sys.executable, "-m", "shallowmirror", "brokers", "--kafka-home",
                             home, "A", "B"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        addresses = {}
        for line in lines[:2]:
            key, _, value = line.strip().partition(" = ")
            addresses[key] = value
        assert set(addresses) == {"A.bootstrap.servers", "B.bootstrap.servers"}, lines
        assert "Apache Kafka" in lines[2] and "pid" in lines[2]
        pids = [int(p) for p in re.findall(r"pid (\d+)", lines[2])]
        for bootstrap in addresses.values():
            assert AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=20).brokers
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert len(pids) == 2 and all(_wait_gone(pid) for pid in pids)
