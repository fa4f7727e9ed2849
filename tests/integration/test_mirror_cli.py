"""`shallowmirror mirror` / `legacy` as a subprocess against real brokers.

Each test runs the CLI the way an operator would (a properties file, flags, signals) and checks
the target record for record with the topic reader. Tests share the session's clusters and keep
to their own unique topics (``topics = <their names>``), so they run against a shared real Kafka
too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from engine_support import NO_DELETE_RECORDS, delete_records_before, three_batches

from shallowmirror.engine.rawfetch import fetch_all
from shallowmirror.mirror.clients import admin_client
from shallowmirror.mirror.topic_sync import explicit_configs
from shallowmirror.testing.topics import assert_same_records, read_topic
from shallowmirror.testing.workload import Workload, load

#: Quick discovery and status for tests.
FAST = {"metadata.max.age.ms": "1000", "status.interval.seconds": "5"}


def group_timings(cluster) -> dict[str, str]:
    """Short group timings the cluster accepts: tansu holds JoinGroup for session.timeout.ms / 2,
    so it gets 2 s; Apache Kafka refuses less than its group.min.session.timeout.ms (6 s)."""
    if cluster.flavor == "tansu":
        return {"session.timeout.ms": "2000", "heartbeat.interval.ms": "500"}
    return {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}


def mm2_properties(path: Path, source, target, **keys: str) -> Path:
    """An mm2.properties with clusters A (source fixture) and B (target fixture)."""
    lines = ["clusters = A, B", f"A.bootstrap.servers = {source.bootstrap}",
             f"B.bootstrap.servers = {target.bootstrap}"]
    # A group per configuration file: tests share the clusters, not their consumer groups.
    group = {"group.id": f"shallowmirror-test-{uuid.uuid4().hex[:10]}"}
    lines += [f"{k} = {v}" for k, v in {**FAST, **group_timings(source), **group,
                                          **keys}.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "shallowmirror", *args]


def run_cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """Run `shallowmirror ARGS` to completion; stdout/stderr captured as text."""
    try:
        return subprocess.run(command(*args), capture_output=True, text=True,
                              timeout=timeout_s, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired as err:
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else ""
        raise AssertionError(f"shallowmirror {' '.join(args)} did not exit within "
                             f"{timeout_s:.0f}s; its log:\n{stderr[-6000:]}") from None


def run_until_caught_up(*args: str, timeout_s: float = 90) -> subprocess.CompletedProcess:
    result = run_cli(*args, "--exit-when-caught-up", "--caught-up-timeout", str(timeout_s),
                     timeout_s=timeout_s + 60)
    assert result.returncode == 0, f"mirror failed ({result.returncode}):\n{result.stderr[-4000:]}"
    return result


class Background:
    """`shallowmirror ARGS` running in the background; always stopped by its pid."""

    def __init__(self, *args: str, log_path: Path):
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command(*args), stdout=self._log,
                                        stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout_s: float = 60) -> int:
        """SIGTERM, then wait for the graceful exit; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        finally:
            self.stop()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._log.close()


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str,
             proc: Background | None = None) -> None:
    """Poll ``condition`` until true; fail with ``what`` (and the mirror's log) otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        if proc is not None and proc.process.poll() is not None:
            raise AssertionError(f"mirror exited ({proc.process.returncode}) while waiting for "
                                 f"{what}:\n{proc.log()[-4000:]}")
        time.sleep(0.5)
    log = proc.log()[-4000:] if proc is not None else ""
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{log}")


pytestmark = pytest.mark.integration


def _load(cluster, topic: str, records: int = 3000, partitions: int = 3, codec: str = "lz4",
          **kw):
    return load(cluster, Workload(topic, records=records, partitions=partitions, codec=codec,
                                  value_bytes=200, **kw))


def _count(cluster, topic: str) -> int:
    try:
        return sum(len(v) for v in read_topic(cluster, topic, timeout_s=10).values())
    except Exception:  # noqa: BLE001 - not there yet
        return -1


def _same(source, topic, target, remote) -> None:
    assert_same_records(read_topic(source, topic), read_topic(target, remote), topic=remote)


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()
    except OSError:
        return ""


def _flow(**keys):
    return {"A->B.enabled": "true", **keys}


# -- MirrorMaker 2 configurations -----------------------------------------------------------------


def test_mm2_default_policy_mirrors_record_for_record(source_cluster, target_cluster, tmp_path,
                                                       unique_topic):
    orders = unique_topic("orders")
    _load(source_cluster, orders, codec="zstd")
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **_flow(topics=orders))
    result = run_until_caught_up("mirror", str(config), "--summary-json",
                                 str(tmp_path / "summary.json"))
    _same(source_cluster, orders, target_cluster, f"A.{orders}")
    assert "caught up" in result.stdout and "3,000 records" in result.stdout
    # The remote topic got the source's partitions and compression.type=producer.
    admin = admin_client({"bootstrap.servers": target_cluster.bootstrap}, what="test")
    assert len(admin.list_topics(timeout=10).topics[f"A.{orders}"].partitions) == 3
    resource = ConfigResource(ResourceType.TOPIC, f"A.{orders}")
    configs = explicit_configs(admin.describe_configs([resource])[resource].result(10))
    assert configs.get("compression.type", "producer") == "producer"


def test_bidirectional_flows_do_not_loop(source_cluster, target_cluster, tmp_path):
    tag = uuid.uuid4().hex[:8]
    orders, payments = f"orders-{tag}", f"payments-{tag}"
    _load(source_cluster, orders, records=1000, partitions=2)
    _load(target_cluster, payments, records=1000, partitions=2, codec="gzip")
    # Both flows see every topic of the test, remote ones included: only cycle detection keeps
    # A.orders (on B) from going back to A, and B.payments (on A) from going back to B.
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **{"A->B.enabled": "true", "B->A.enabled": "true",
                               "topics": f".*{tag}"})
    run_until_caught_up("mirror", str(config))
    # A second run sees the remote topics created by the first and still must not loop.
    run_until_caught_up("mirror", str(config))
    _same(source_cluster, orders, target_cluster, f"A.{orders}")
    _same(target_cluster, payments, source_cluster, f"B.{payments}")
    for cluster in (source_cluster, target_cluster):
        admin = admin_client({"bootstrap.servers": cluster.bootstrap}, what="test")
        names = [t for t in admin.list_topics(timeout=10).topics if tag in t]
        assert set(names) in ({orders, f"B.{payments}"}, {f"A.{orders}", payments}), names


@pytest.mark.tansu_workaround("tansu cannot add partitions: the narrow topic stays in error")
def test_identity_policy_keeps_topic_names(source_cluster, target_cluster, tmp_path,
                                           unique_topic, on_tansu):
    topic, narrow = unique_topic("ident"), unique_topic("narrow")
    _load(source_cluster, topic, codec="snappy")
    _load(source_cluster, narrow, records=100, partitions=3)
    # The target already has `narrow` with fewer partitions, and tansu cannot add any: a clear
    # error for that topic, while the other one is mirrored.
    _load(target_cluster, narrow, records=0, partitions=1)
    config = mm2_properties(
        tmp_path / "mm2.properties", source_cluster, target_cluster,
        **_flow(topics=f"{topic},{narrow}", **{"replication.policy.class":
                                 "org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
                                 # More engines than partitions: one owns nothing.
                                 "A->B.tasks.max": "4"}))
    result = run_cli("mirror", str(config), "--exit-when-caught-up", "--caught-up-timeout", "90",
                     timeout_s=150)
    _same(source_cluster, topic, target_cluster, topic)
    if on_tansu:   # caught up except the topic it cannot mirror: not a success
        assert result.returncode == 1, result.stdout + result.stderr[-3000:]
        assert (f"source topic {narrow} has 3 partitions but remote topic {narrow} on B has 1"
                in result.stderr), result.stderr[-3000:]
        assert "caught up, except 1 stopped (below)" in result.stdout, result.stdout
        assert f"error: {narrow}: source topic" in result.stdout
    else:  # a real Kafka grows the remote topic
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
        _same(source_cluster, narrow, target_cluster, narrow)


def test_exit_when_caught_up_ends_when_every_topic_stopped_on_an_error(
        source_cluster, target_cluster, tmp_path, unique_topic, on_tansu):
    """The flow's only topic cannot be mirrored (tansu: its remote topic has fewer partitions
    and cannot grow; Kafka: a replication factor above the broker count): the run waited for
    ever, a status line every 30 s, where one with another topic beside it ended at once."""
    narrow = unique_topic("onlybad")
    _load(source_cluster, narrow, records=100, partitions=3)
    keys = {"replication.policy.class":
            "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"}
    if on_tansu:
        _load(target_cluster, narrow, records=0, partitions=1)
    else:
        keys["replication.factor"] = "3"
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **_flow(topics=narrow, **keys))
    began = time.monotonic()
    result = run_cli("mirror", str(config), "--exit-when-caught-up", timeout_s=120)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert time.monotonic() - began < 90
    assert "caught up, except 1 stopped (below)" in result.stdout, result.stdout
    assert f"error: {narrow}: " in result.stdout, result.stdout


@pytest.mark.parametrize("topics", ["listed", "pattern"])
def test_one_cluster_under_two_addresses_is_refused_before_a_record_is_copied(
        source_cluster, tmp_path, unique_topic, topics):
    """A and B are one cluster reached at two addresses (127.0.0.1 and localhost), and the
    policy keeps names: each record would be copied onto itself without end. The cluster id
    gives it away: refused (a listed topic at start, a pattern's on its first batch), exit 1,
    nothing written."""
    host, _, port = source_cluster.bootstrap.partition(":")
    if host != "127.0.0.1" or "," in port:
        pytest.skip("needs a one-broker cluster on 127.0.0.1, reachable as localhost too")
    topic = unique_topic("loop")
    _load(source_cluster, topic, records=500, partitions=2)
    before = _count(source_cluster, topic)
    config = tmp_path / "mm2.properties"
    config.write_text("\n".join([
        "clusters = A, B", f"A.bootstrap.servers = {source_cluster.bootstrap}",
        f"B.bootstrap.servers = localhost:{port}", "A->B.enabled = true",
        f"A->B.topics = {topic if topics == 'listed' else topic[:-3] + '.*'}",
        "replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
        f"group.id = shallowmirror-test-{uuid.uuid4().hex[:10]}",
        *(f"{k} = {v}" for k, v in {**FAST, **group_timings(source_cluster)}.items())]) + "\n")
    result = run_cli("mirror", str(config), "--exit-when-caught-up", "--caught-up-timeout",
                     "60", timeout_s=120)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert "A and B are the same cluster (cluster id " in result.stderr, result.stderr[-3000:]
    assert f"topic {topic} keeps its name on the target" in result.stderr
    assert "flow A->B stopped" in result.stderr          # not restarted again and again
    assert _count(source_cluster, topic) == before == 500


def test_deep_path_mirrors_the_same_records(source_cluster, target_cluster, tmp_path,
                                            unique_topic):
    topic = unique_topic("deep")
    _load(source_cluster, topic, records=2000, codec="gzip")
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **_flow(topics=topic))
    metrics = tmp_path / "metrics.jsonl"
    result = run_until_caught_up("mirror", str(config), "--deep", "--metrics-file", str(metrics))
    _same(source_cluster, topic, target_cluster, f"A.{topic}")
    assert "(deep)" in result.stdout
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert sum(e["records"] for e in events if e["kind"] == "flow" and e["mode"] == "deep"
               and e["topic"] == topic) == 2000
    # Recompressed with the codec the data came in (read from a stored batch header).
    batches, _totals = asyncio.run(fetch_all(target_cluster.client_config(), f"A.{topic}"))
    codecs = {b.compression for parts in batches.values() for b in parts}
    assert codecs == {1}, codecs  # gzip


@pytest.mark.needs_real_kafka(NO_DELETE_RECORDS)
def test_readers_from_the_log_start_follow_a_moved_log_start(source_cluster, unique_topic):
    """Where retention moved the log start, Kafka answers a fetch at 0 with OFFSET_OUT_OF_RANGE
    and no log start; the readers that start there then ask ListOffsets. The deep path's codec
    probe (it recompresses with the source's codec; it said None: the default codec) and the
    fetch-only reader (it raised)."""
    from shallowmirror.mirror.codec_probe import probe_codec

    topic = unique_topic("probe")
    three_batches(source_cluster, topic, "zstd")
    config = source_cluster.client_config()
    assert asyncio.run(probe_codec(config, topic)) == "zstd"
    delete_records_before(source_cluster, topic, 100)
    assert asyncio.run(probe_codec(config, topic)) == "zstd"
    batches, totals = asyncio.run(fetch_all(config, topic))
    assert [(b.base_offset, b.record_count) for b in batches[0]] == [(100, 100), (200, 100)]
    assert totals.records == 200


def test_a_flow_can_switch_between_shallow_and_deep(source_cluster, target_cluster, tmp_path,
                                                   unique_topic):
    topic = unique_topic("switch")
    _load(source_cluster, topic, records=1500)
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **_flow(topics=topic))
    run_until_caught_up("mirror", str(config))
    for seed, extra in ((1, ["--deep"]), (2, [])):
        load(source_cluster, Workload(topic, records=700, partitions=3, codec="lz4",
                                      value_bytes=200, create_topic=False, seed=seed))
        run_until_caught_up("mirror", str(config), *extra)
    # Same group, same committed offsets: every record once, in order.
    _same(source_cluster, topic, target_cluster, f"A.{topic}")


@pytest.mark.needs_real_kafka("tansu does not serve the KIP-848 consumer group protocol")
def test_the_default_protocol_on_a_kip_848_source_then_deep_is_refused_with_what_to_do(
        start_broker, target_cluster, tmp_path, unique_topic):
    """On a source serving KIP-848 the default (group.protocol=auto) makes a consumer-protocol
    group; Kafka 3.7 then refuses the deep path's classic JoinGroup with GROUP_ID_NOT_FOUND,
    which librdkafka retried every 2 s for ever. The deep flow stops with what to do, exit 1,
    and the shallow path goes on from the group's commits."""
    source = start_broker("kip848", overrides={
        "group.coordinator.rebalance.protocols": "classic,consumer"})
    topic = unique_topic("auto-deep")
    _load(source, topic, records=1200)
    config = mm2_properties(tmp_path / "mm2.properties", source, target_cluster,
                            **_flow(topics=topic))
    first = run_until_caught_up("mirror", str(config), "--log-level", "INFO")
    assert "joined with the consumer group protocol (KIP-848)" in first.stderr, first.stderr
    assert "assigned 3 partitions" in first.stderr
    deep = run_cli("mirror", str(config), "--deep", "--exit-when-caught-up", timeout_s=90)
    assert deep.returncode == 1, deep.stderr[-3000:]
    assert "exists with the consumer protocol" in deep.stderr, deep.stderr[-3000:]
    assert "new group.id" in deep.stderr and "Traceback" not in deep.stderr
    load(source, Workload(topic, records=500, partitions=3, codec="lz4", value_bytes=200,
                          create_topic=False, seed=3))
    run_until_caught_up("mirror", str(config))
    _same(source, topic, target_cluster, f"A.{topic}")


# -- MirrorMaker 1 flags ---------------------------------------------------------------------------


def test_legacy_mirrormaker1_flags(source_cluster, target_cluster, tmp_path, unique_topic):
    first, second, other = unique_topic("mm1a"), unique_topic("mm1b"), unique_topic("other")
    for topic in (first, second, other):
        _load(source_cluster, topic, records=800, partitions=2)
    consumer = tmp_path / "consumer.properties"
    consumer.write_text(f"bootstrap.servers={source_cluster.bootstrap}\n"
                        f"group.id=mm1-{uuid.uuid4().hex[:6]}\n"
                        + "".join(f"{k}={v}\n" for k, v in group_timings(source_cluster).items())
                        + "key.deserializer=org.apache.kafka.common.serialization."
                        "ByteArrayDeserializer\n")
    producer = tmp_path / "producer.properties"
    producer.write_text(f"bootstrap.servers={target_cluster.bootstrap}\nacks=all\n")
    run_until_caught_up("legacy", "--consumer.config", str(consumer), "--producer.config",
                        str(producer), "--include", f"{first}, {second}", "--num.streams", "1",
                        "--offset.commit.interval.ms", "500", "--abort.on.send.failure",
                        "true")
    _same(source_cluster, first, target_cluster, first)
    _same(source_cluster, second, target_cluster, second)
    admin = admin_client({"bootstrap.servers": target_cluster.bootstrap}, what="test")
    target_topics = admin.list_topics(timeout=10).topics
    assert other not in target_topics
    # MirrorMaker 1 only read the source: the offset syncs went to the target (KIP-716).
    assert "mm2-offset-syncs.target.internal" in target_topics
    source_admin = admin_client({"bootstrap.servers": source_cluster.bootstrap}, what="test")
    assert "mm2-offset-syncs.target.internal" not in source_admin.list_topics(timeout=10).topics


# -- a running mirror --------------------------------------------------------------------------------


def test_running_mirror_picks_up_new_topics_and_config_changes(
        source_cluster, target_cluster, tmp_path):
    tag = uuid.uuid4().hex[:8]
    early, late = f"early-{tag}", f"late-{tag}"
    _load(source_cluster, early, records=500, partitions=1,
          topic_config={"retention.ms": "86400000"})
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **_flow(topics=f".*-{tag}",
                                    **{"refresh.topics.interval.seconds": "1",
                                       "sync.topic.configs.interval.seconds": "1"}))
    from shallowmirror.testing.embedded import free_port

    port = free_port()
    metrics = tmp_path / "metrics.jsonl"
    mirror = Background("mirror", str(config), "--prometheus-port", str(port),
                        "--metrics-file", str(metrics), "--log-format", "json",
                        log_path=tmp_path / "mirror.log")
    try:
        wait_for(lambda: _count(target_cluster, f"A.{early}") == 500, 60, "the first topic",
                 mirror)
        wait_for(lambda: f'topic="{early}"' in _scrape(port), 30, "Prometheus metrics", mirror)
        scraped = _scrape(port)
        assert (f'shallowmirror_record_count_total{{partition="0",source="A",target="B",'
                f'topic="{early}"}} 500.0') in scraped, scraped
        _load(source_cluster, late, records=700, partitions=2)
        wait_for(lambda: _count(target_cluster, f"A.{late}") == 700, 60,
                 "the topic created while running", mirror)

        source_admin = admin_client({"bootstrap.servers": source_cluster.bootstrap}, what="t")
        target_admin = admin_client({"bootstrap.servers": target_cluster.bootstrap}, what="t")
        change = ConfigResource(ResourceType.TOPIC, early, incremental_configs=[ConfigEntry(
            "retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
        source_admin.incremental_alter_configs([change])[change].result(10)
        remote = ConfigResource(ResourceType.TOPIC, f"A.{early}")

        def retention() -> str | None:
            described = target_admin.describe_configs([remote])[remote].result(10)
            return explicit_configs(described).get("retention.ms")

        wait_for(lambda: retention() == "3600000", 30, "the config change", mirror)
        assert mirror.terminate() == 0, mirror.log()[-3000:]
    finally:
        mirror.stop()
    events = [json.loads(line) for line in metrics.read_text().splitlines()]
    flow_events = [e for e in events if e["kind"] == "flow" and e["topic"] == early]
    assert sum(e["records"] for e in flow_events) == 500
    logs = [json.loads(line) for line in mirror.log().splitlines() if line.startswith("{")]
    assert any(e["flow"] == "A->B" and f"A.{late}" in e["message"] for e in logs)
    _same(source_cluster, early, target_cluster, f"A.{early}")
    _same(source_cluster, late, target_cluster, f"A.{late}")


def _mirror_around(config: Path, tmp_path: Path, target_cluster, remote: str, before: int,
                   change: Callable[[], None], after: int | tuple[Callable[[], bool], str],
                   *args: str, timeout_s: float = 60) -> str:
    """Run `shallowmirror mirror` until ``remote`` holds ``before`` records, ``change`` things,
    wait until it holds ``after`` records (or until ``after``'s condition, named by its
    text, holds), stop it with SIGTERM (exit 0 expected); its log."""
    if isinstance(after, int):
        count = after
        after = (lambda: _count(target_cluster, remote) == count,
                 f"{count} records on {remote} after the change")
    mirror = Background("mirror", str(config), *args, log_path=tmp_path / "mirror.log")
    try:
        wait_for(lambda: _count(target_cluster, remote) == before, 60,
                 f"the first {before} copies", mirror)
        change()
        wait_for(after[0], timeout_s, after[1], mirror)
        assert mirror.terminate() == 0, mirror.log()[-3000:]
    finally:
        mirror.stop()
    return mirror.log()


@pytest.mark.parametrize(("mode", "says"), [
    ("shallow", "cluster A unreachable or connection lost"),
    ("deep", "flow A->B: deep consumer (cluster A): "),
])
def test_a_source_cluster_lost_mid_run_is_reported(start_broker, target_cluster, tmp_path,
                                                   unique_topic, mode, says):
    """The source cluster goes away under a running mirror: the log says so, naming the
    cluster. The deep path said nothing for as long as it was gone (librdkafka's client errors
    went to its debug log), and its status line went on saying lag 0. A SIGTERM then stops the
    shallow path without its final commit, which waited for the lost cluster until the group
    session ended (8 s here, session.timeout.ms), and says so."""
    source = start_broker("A")
    topic = unique_topic("lost")
    _load(source, topic, records=500, partitions=1)
    config = mm2_properties(tmp_path / "mm2.properties", source, target_cluster,
                            **_flow(topics=topic))
    log_path = tmp_path / "mirror.log"
    # The shallow path also waits for a failed round of reconnections.
    warnings = (says, "cluster A: cannot reach") if mode == "shallow" else (says,)

    def reported() -> bool:
        lines = log_path.read_text().splitlines()
        return all(any(" WARNING " in line and text in line for line in lines)
                   for text in warnings)

    log = _mirror_around(config, tmp_path, target_cluster, f"A.{topic}", 500, source.stop,
                         (reported, f"a warning saying {says!r}"),
                         *(["--deep"] if mode == "deep" else []))
    assert "Traceback" not in log, log[-3000:]
    if mode == "shallow":
        said = log_path.read_text()
        assert "final commit to A skipped: the cluster has been unreachable for" in said, said
        assert "final commit to A failed" not in said, said


@pytest.mark.needs_real_kafka("a tansu broker restarted on its port is a new, empty cluster")
@pytest.mark.parametrize("mode", ["deep", "shallow-all"])
def test_the_status_says_the_source_is_unreachable_until_it_is_back(
        start_broker, target_cluster, tmp_path, unique_topic, mode):
    """While the source's brokers are all down the status line names the cluster and the lag
    is unknown (it said lag 0, from the last high watermarks seen: the deep path always, the
    shallow one with partition.assignment=all, where no group session expires); once the
    broker is back the lag is known again and the note is gone."""
    source = start_broker("A")
    topic = unique_topic("back")
    _load(source, topic, records=500, partitions=1)
    keys = {"partition.assignment": "all"} if mode == "shallow-all" else {}
    config = mm2_properties(tmp_path / "mm2.properties", source, target_cluster,
                            **_flow(topics=topic, **keys))
    log_path = tmp_path / "mirror.log"

    def statuses() -> list[str]:
        return [line for line in log_path.read_text().splitlines() if " status A->B " in line]

    seen: list[int] = []

    def down_then_back() -> None:
        source.kill()
        wait_for(lambda: any("[cluster A unreachable for" in line and "lag unknown" in line
                             for line in statuses()), 60, "a status line naming cluster A")
        seen.append(len(statuses()))
        source.restart()     # same port, same data

    def back() -> bool:
        later = statuses()[seen[0]:] if seen else []
        return any("lag 0 records" in line and "unreachable" not in line for line in later)

    log = _mirror_around(config, tmp_path, target_cluster, f"A.{topic}", 500, down_then_back,
                         (back, "a status line with the lag known again"),
                         *(["--deep"] if mode == "deep" else []), "--status-interval", "1",
                         timeout_s=120)
    assert "Traceback" not in log, log[-3000:]
    if mode == "deep":
        # librdkafka never says a broker is back; the group's next answer (a re-join, a commit)
        # does. Before, the status still said "unreachable" for up to 15 s after records flowed
        # again. One line may have been computed just before the answer was logged.
        lines = log_path.read_text().splitlines()
        back_at = [i for i, line in enumerate(lines)
                   if "deep consumer (cluster A): reachable again after" in line]
        assert back_at, "no line saying cluster A is reachable again:\n" + "\n".join(lines[-30:])
        late = [line for line in lines[back_at[0]:] if " status A->B " in line
                and "unreachable" in line]
        assert len(late) <= 1, "\n".join(late)


@pytest.mark.parametrize(("max_age_ms", "learnt"), [
    pytest.param("1000", "not in the target's metadata",   # a metadata refresh sees it gone
                 id="from-metadata"),
    pytest.param("300000", "UNKNOWN_TOPIC_OR_PARTITION from broker",   # a Produce answer does
                 id="from-produce", marks=pytest.mark.needs_real_kafka(
                     "tansu 0.6 answers a Produce to a deleted topic with success (the records "
                     "go nowhere), so there is no error to act on")),
    pytest.param("1000", "Unknown topic or partition (remote partition",   # librdkafka's word
                 id="deep", marks=pytest.mark.needs_real_kafka(
                     "tansu 0.6 answers a Produce to a deleted topic with success")),
])
def test_a_remote_topic_deleted_while_mirroring_is_created_again_at_once(
        source_cluster, target_cluster, tmp_path, unique_topic, max_age_ms, learnt, request):
    """The remote topic is deleted on the target mid-run, with topic refresh at its default
    600 s: the mirror logs that the target has no such partition (learnt from its metadata, or
    from a Produce answer), the flow refreshes topics at once (re-creating the topic, with its
    warning), and what the source gets next lands in the new topic, record for record. Before,
    the batches retried silently until their retries ran out (a minute and more), and a SIGTERM
    meanwhile exited 0 with them unmirrored. The deep path learns it from librdkafka (after its
    topic.metadata.propagation.max.ms, 30 s); its producer had made Kafka auto-create the topic
    with the broker's defaults (one partition), which topic sync then only 'grew'."""
    deep = request.node.callspec.id == "deep"
    topic = unique_topic("redo")
    remote = f"A.{topic}"
    _load(source_cluster, topic, records=600, partitions=2)
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **_flow(topics=topic, **{"refresh.topics.interval.seconds": "600",
                                                     "metadata.max.age.ms": max_age_ms}))
    first: dict[int, int] = {}

    def delete_remote_topic() -> None:
        first.update({p: len(v) for p, v in read_topic(source_cluster, topic).items()})
        target_admin = admin_client({"bootstrap.servers": target_cluster.bootstrap}, what="t")
        target_admin.delete_topics([remote])[remote].result(15)
        wait_for(lambda: remote not in target_admin.list_topics(timeout=10).topics, 30,
                 "the remote topic to be deleted")
        time.sleep(2 * int(max_age_ms) / 1000 if int(max_age_ms) < 5000 else 0)
        _load(source_cluster, topic, records=400, partitions=2, create_topic=False, seed=5)

    log = _mirror_around(config, tmp_path, target_cluster, remote, 600, delete_remote_topic, 400,
                         *(["--deep"] if deep else []), timeout_s=90 if deep else 60)
    assert f"target B has no {'' if deep else 'partition '}{remote}-" in log, log[-3000:]
    assert learnt in log, log[-3000:]
    assert "refreshing topics now" in log
    assert f"remote topic {remote} is gone from B (deleted there?); created it again" in log
    assert f"{remote} grown to" not in log, log[-3000:]   # not auto-created by a Produce
    assert deep or "takes batches again" in log
    after = {p: records[first[p]:] for p, records in read_topic(source_cluster, topic).items()}
    assert_same_records(after, read_topic(target_cluster, remote), topic=remote)


_SHALLOW_AGAIN_ON_TANSU = (
    "tansu answers a Fetch past the end of a re-created topic with an empty response, so the "
    "shallow engine mirrors again what it fetched before its next metadata answer")


@pytest.mark.parametrize("mode", [
    pytest.param("shallow", marks=pytest.mark.needs_real_kafka(_SHALLOW_AGAIN_ON_TANSU)),
    pytest.param("exactly-once", marks=pytest.mark.needs_real_kafka(_SHALLOW_AGAIN_ON_TANSU)),
    pytest.param("deep", marks=pytest.mark.needs_real_kafka(
        "librdkafka 2.16's consumer crashes (SIGSEGV in rd_kafka_metadata_cache_find) on "
        "tansu's Metadata answer for a subscribed topic that was deleted"))])
def test_a_source_topic_deleted_and_created_again_is_mirrored_from_its_start(
        source_cluster, target_cluster, tmp_path, unique_topic, mode):
    """The source topic is deleted under a running mirror and created again with more records
    than the old one had: every record of the new topic lands after the old topic's, none
    skipped. The deep path used to fetch on at the old topic's position (librdkafka keeps no
    topic ids), so the new topic's first 100 records were never mirrored. Exactly-once commits
    its offsets on the target, where the deletion drops nothing."""
    deep = mode == "deep"
    topic = unique_topic("again")
    remote = f"A.{topic}"
    first = _load(source_cluster, topic, records=100, partitions=1)
    eos = {"A->B.exactly.once": "true"} if mode == "exactly-once" else {}
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **_flow(topics=topic, **{"metadata.max.age.ms": "1000"}, **eos))
    second = []

    def recreate() -> None:
        admin = admin_client({"bootstrap.servers": source_cluster.bootstrap}, what="t")
        admin.delete_topics([topic], operation_timeout=30)[topic].result(30)
        wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, 30,
                 "the source topic to be gone")
        second.append(_load(source_cluster, topic, records=300, partitions=1, seed=7))

    new_values = None

    def new_topic_mirrored() -> bool:
        nonlocal new_values
        got = [r.value for r in read_topic(target_cluster, remote).get(0, [])]
        new_values = [r.value for r in second[0].records()[0]] if second else None
        # And the re-creation seen: the deep path's topic-id watch looks every
        # metadata.max.age.ms, and a partition assigned afresh has all it needs before that.
        logged = "deleted and created again" in (tmp_path / "mirror.log").read_text()
        return new_values is not None and got[-300:] == new_values and logged

    log = _mirror_around(config, tmp_path, target_cluster, remote, 100, recreate,
                         (new_topic_mirrored, "the new topic's 300 records, in order, last, "
                                              "and the re-creation logged"),
                         *(["--deep"] if deep else []))
    got = [r.value for r in read_topic(target_cluster, remote)[0]]
    assert got[:100] == [r.value for r in first.records()[0]], "the old topic's copies first"
    # Nothing skipped. The deep path may mirror again what it fetched of the new topic before
    # it saw the new id (at least once): a stretch of the new topic, in order, before all of
    # it. The shallow engine on Kafka does not (a Fetch of the deleted topic fails first).
    stretch = got[100:-300]
    assert not stretch or any(new_values[i:i + len(stretch)] == stretch
                              for i in range(len(new_values))), "copies out of place"
    if not deep:
        assert len(got) == 400, f"{len(got)} copies, expected 400"
    assert "deleted and created again" in log, log[-3000:]


@pytest.mark.needs_real_kafka("tansu cannot add partitions (no CreatePartitions)")
@pytest.mark.parametrize(("assignment", "mode", "learnt"), [
    ("group", "shallow", "(the target's metadata lists 3 partitions"),
    ("all", "shallow", "(the target's metadata lists 3 partitions"),
    ("group", "exactly-once", "(AddPartitionsToTxn answered UNKNOWN_TOPIC_OR_PARTITION"),
    ("group", "deep", "Unknown partition (remote partition "),
], ids=["group", "all", "exactly-once", "deep"])
def test_partitions_added_to_a_source_topic_while_mirroring_are_mirrored(
        source_cluster, target_cluster, tmp_path, unique_topic, assignment, mode, learnt):
    """Partitions are added to the source topic under a running mirror, with topic refresh at its
    default 600 s: the new partitions are owned within metadata.max.age.ms (in a consumer group
    too, where librdkafka would look only every 5 minutes), the flow widens the remote topic as
    soon as their batches find it too narrow, and every record arrives. Before, the new
    partitions stopped at once with "has 3 partitions, no partition 3" and stayed stopped after
    the remote topic grew; in a group they went unseen for minutes with the lag saying 0; under
    exactly-once their transactions asked AddPartitionsToTxn again and again, for minutes; the
    deep path restarted with backoff until the next topic refresh."""
    from confluent_kafka.admin import NewPartitions

    topic = unique_topic("grow")
    remote = f"A.{topic}"
    _load(source_cluster, topic, records=300, partitions=3)
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **_flow(topics=topic, **{"refresh.topics.interval.seconds": "600",
                                                     "metadata.max.age.ms": "2000",
                                                     "A->B.partition.assignment": assignment,
                                                     "A->B.exactly.once":
                                                         str(mode == "exactly-once").lower()}))
    def add_partitions() -> None:
        source_admin = admin_client({"bootstrap.servers": source_cluster.bootstrap}, what="t")
        source_admin.create_partitions([NewPartitions(topic, 5)])[topic].result(15)
        _load(source_cluster, topic, records=500, partitions=5, create_topic=False, seed=5)

    log = _mirror_around(config, tmp_path, target_cluster, remote, 300, add_partitions, 800,
                         *(["--deep"] if mode == "deep" else []))
    if mode == "deep":      # its runner fails on the first record, restarts once repaired
        assert f"{learnt}{remote}-" in log, log[-3000:]
    else:
        assert f"target B has no partition {remote}-3 {learnt}" in log, log[-3000:]
        assert f"target B: {remote}-3 takes batches again" in log, log[-3000:]
    assert f"{remote} grown to 5 partitions" in log
    assert "partition stopped" not in log
    _same(source_cluster, topic, target_cluster, remote)


@pytest.mark.parametrize("ending", ["caught-up", "sigterm"])
def test_caught_up_with_a_stopped_partition_is_not_a_success(source_cluster, target_cluster,
                                                              tmp_path, unique_topic, ending):
    """--exit-when-caught-up stops once every partition that can go on has caught up; one that
    stopped with an error (here a batch above max.request.size) was not mirrored: exit 1, and
    the summary says so on its first line and names the error. A mirror stopped by SIGTERM
    while that partition is stopped exits 1 as well (it exited 0: a service manager saw a clean
    stop of a run that had left records behind)."""
    from confluent_kafka import Producer

    topic = unique_topic("stopped")
    load(source_cluster, Workload(topic, records=200, partitions=2, codec="lz4",
                                  value_bytes=100))
    producer = Producer({**source_cluster.client_config(), "compression.type": "none"})
    producer.produce(topic, value=os.urandom(300_000), partition=0)
    producer.flush(30)
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **{"A->B.enabled": "true", "A->B.topics": topic,
                               "A->B.max.request.size": "200000"})
    if ending == "sigterm":
        _stopped_partition_then_sigterm(config, tmp_path, source_cluster, target_cluster, topic)
        return
    result = run_cli("mirror", str(config), "--exit-when-caught-up", "--caught-up-timeout",
                     "90", timeout_s=150)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    first = result.stdout.splitlines()[0]
    assert first.endswith("— caught up, except 1 stopped (below)"), result.stdout
    assert f"error: {topic}-0: source batch of 300" in result.stdout, result.stdout
    assert "max.request.size=200000" in result.stdout, result.stdout
    assert "(mm2.properties: B.producer.max.request.size)" in result.stdout, result.stdout
    assert "caught up except 1 stopped partition or topic" in result.stderr, result.stderr[-3000:]
    copies = read_topic(target_cluster.client_config(), f"A.{topic}")
    assert len(copies[1]) == len(read_topic(source_cluster.client_config(), topic)[1])


def _stopped_partition_then_sigterm(config: Path, tmp_path: Path, source_cluster,
                                    target_cluster, topic: str) -> None:
    """Run until every record but the one too large is on the target, then SIGTERM: exit 1."""
    expected = sum(len(v) for v in read_topic(source_cluster.client_config(), topic).values())
    mirror = Background("mirror", str(config), log_path=tmp_path / "mirror.log")
    try:
        wait_for(lambda: _count(target_cluster, f"A.{topic}") == expected - 1
                 and "max.request.size=200000" in mirror.log(), 90,
                 "every record but the one above max.request.size", mirror)
        assert mirror.terminate() == 1, mirror.log()[-3000:]
    finally:
        mirror.stop()
    log = mirror.log()
    assert "stopped except 1 stopped partition or topic" in log, log[-3000:]
    assert f"error: {topic}-0: source batch of 300" in log, log[-3000:]


def test_sigterm_then_restart_loses_nothing(source_cluster, target_cluster, tmp_path,
                                            unique_topic):
    topic = unique_topic("restart")
    first = _load(source_cluster, topic, records=20000, partitions=3)
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **_flow(topics=topic))
    mirror = Background("mirror", str(config), log_path=tmp_path / "first.log")
    try:
        wait_for(lambda: _count(target_cluster, f"A.{topic}") > 0, 60, "the first records",
                 mirror)
        assert mirror.terminate() == 0, mirror.log()[-3000:]
    finally:
        mirror.stop()
    assert "committing offsets" in mirror.log()
    # More records while the mirror is down, with the same seed-independent topic.
    load(source_cluster, Workload(topic, records=5000, partitions=3, codec="lz4",
                                  value_bytes=200, create_topic=False, seed=1))
    run_until_caught_up("mirror", str(config))
    expected = read_topic(source_cluster, topic)
    assert sum(len(v) for v in expected.values()) == first.record_count + 5000
    # Exactly the source: nothing lost, nothing written twice.
    assert_same_records(expected, read_topic(target_cluster, f"A.{topic}"))


# -- bad configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize("keys,args,message", [
    ({"clusters": "A, B", "A.bootstrap.servers": "127.0.0.1:1", "A->B.enabled": "true"}, [],
     "cluster 'B' has no bootstrap servers: set B.bootstrap.servers"),
    ({"clusters": "A, B", "A.bootstrap.servers": "127.0.0.1:1",
      "B.bootstrap.servers": "127.0.0.1:2", "A->C.enabled": "true"}, [],
     "A->C: unknown cluster alias 'C' (clusters: A, B)"),
    ({"clusters": "A, B", "A.bootstrap.servers": "127.0.0.1:1",
      "B.bootstrap.servers": "127.0.0.1:2", "A->B.enabled": "true", "topics": "orders[0-9"},
     [], "bad regex 'orders[0-9'"),
    ({"clusters": "A, B", "A.bootstrap.servers": "127.0.0.1:1",
      "B.bootstrap.servers": "127.0.0.1:2", "A->B.enabled": "true", "topics.exclude": "x",
      "topics.blacklist": "y"}, [], "topics.exclude and topics.blacklist"),
    ({"clusters": "A, B", "A.bootstrap.servers": "127.0.0.1:1",
      "B.bootstrap.servers": "127.0.0.1:2", "A->B.enabled": "true"},
     ["--caught-up-timeout", "5"], "--caught-up-timeout needs --exit-when-caught-up"),
])
def test_bad_configuration_fails_before_running_with_a_clear_message(tmp_path, keys, args,
                                                                     message):
    path = tmp_path / "mm2.properties"
    path.write_text("\n".join(f"{k} = {v}" for k, v in keys.items()) + "\n")
    result = run_cli("mirror", str(path), *args, timeout_s=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "invalid configuration" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_file_and_legacy_errors(tmp_path):
    result = run_cli("mirror", str(tmp_path / "nope.properties"))
    assert result.returncode == 2 and "cannot read" in result.stderr
    consumer = tmp_path / "c.properties"
    consumer.write_text("group.id=g\n")
    result = run_cli("legacy", "--consumer.config", str(consumer), "--producer.config",
                     str(consumer), "--include", "a", "--whitelist", "b")
    assert result.returncode == 2
    assert "--include and --whitelist" in result.stderr
    assert "bootstrap.servers is required" in result.stderr


def test_unknown_key_warns_with_the_closest_known_key(tmp_path):
    # Without --allow-unknown-keys this is an error (tests/unit/test_cli_messages.py).
    path = tmp_path / "mm2.properties"
    path.write_text("clusters = A, B\nA.bootstrap.servers = 127.0.0.1:1\n"
                    "B.bootstrap.servers = 127.0.0.1:2\nA->B.enabled = true\n"
                    "refresh.topic.interval.seconds = 5\n")
    result = run_cli("mirror", str(path), "--check", "--allow-unknown-keys")
    assert result.returncode == 0, result.stderr
    assert ("unknown configuration key 'refresh.topic.interval.seconds'; did you mean "
            "'refresh.topics.interval.seconds'?") in result.stderr
    assert "configuration OK" in result.stdout


def test_unreachable_cluster_is_retried_with_a_clear_message(tmp_path):
    from shallowmirror.testing.embedded import free_port

    path = tmp_path / "mm2.properties"
    port = free_port()
    path.write_text(f"clusters = A, B\nA.bootstrap.servers = 127.0.0.1:{port}\n"
                    f"B.bootstrap.servers = 127.0.0.1:{free_port()}\nA->B.enabled = true\n"
                    "request.timeout.ms = 1000\n")
    result = run_cli("mirror", str(path), "--exit-when-caught-up", "--caught-up-timeout", "4",
                     timeout_s=60)
    assert result.returncode == 1
    assert "cluster A did not answer Metadata" in result.stderr
    assert f"nothing listens at 127.0.0.1:{port}" in result.stderr
    assert "retrying in" in result.stderr


@pytest.mark.broker_independent("no cluster: an HTTP server where one should be")
def test_a_listener_that_is_not_kafka_is_named_as_such(tmp_path):
    """An HTTP server where a broker should be: librdkafka says "Broker transport failure" as
    for a dead address; the message says this one accepts connections."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        from shallowmirror.testing.embedded import free_port

        port = server.server_address[1]
        path = tmp_path / "mm2.properties"
        path.write_text(f"clusters = A, B\nA.bootstrap.servers = 127.0.0.1:{port}\n"
                        f"B.bootstrap.servers = 127.0.0.1:{free_port()}\nA->B.enabled = true\n"
                        "request.timeout.ms = 1000\n")
        result = run_cli("mirror", str(path), "--exit-when-caught-up", "--caught-up-timeout",
                         "4", timeout_s=60)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 1
    assert (f"127.0.0.1:{port} accepts connections but gave no Kafka answer: is it a Kafka "
            "listener, and does it expect TLS or SASL (security.protocol is PLAINTEXT)?"
            ) in result.stderr, result.stderr[-3000:]


def test_mirror_waits_for_a_cluster_that_comes_up_later(target_cluster, tmp_path, start_broker):
    from shallowmirror.testing.embedded import free_port

    port = free_port()
    topic = f"late-cluster-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "mm2.properties"
    config.write_text(f"clusters = A, B\nA.bootstrap.servers = 127.0.0.1:{port}\n"
                      f"B.bootstrap.servers = {target_cluster.bootstrap}\n"
                      f"A->B.enabled = true\nA->B.topics = {topic}\n"
                      "request.timeout.ms = 1000\nrefresh.topics.interval.seconds = 1\n"
                      + "".join(f"{k} = {v}\n"
                                for k, v in {**FAST, **group_timings(target_cluster)}.items()))
    mirror = Background("mirror", str(config), log_path=tmp_path / "mirror.log")
    try:
        wait_for(lambda: "cluster A did not answer Metadata" in mirror.log(), 30,
                 "the unreachable-cluster message", mirror)
        source = start_broker("late", port=port)
        _load(source, topic, records=300, partitions=1)
        wait_for(lambda: _count(target_cluster, f"A.{topic}") == 300, 90,
                 "records from the cluster that came up later", mirror)
        assert mirror.terminate() == 0, mirror.log()[-3000:]
        _same(source, topic, target_cluster, f"A.{topic}")
    finally:
        mirror.stop()


@pytest.mark.needs_real_kafka("tansu accepts any session timeout")
def test_a_session_timeout_the_broker_refuses_stops_the_mirror_with_the_range(
        source_cluster, target_cluster, tmp_path, unique_topic):
    """INVALID_SESSION_TIMEOUT from JoinGroup used to be retried silently for ever."""
    topic = unique_topic("sto")
    _load(source_cluster, topic, records=10, partitions=1)
    config = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                            **_flow(**{"A->B.topics": topic}), **{"session.timeout.ms": "2000",
                                                                 "heartbeat.interval.ms": "500"})
    # No --caught-up-timeout: the refusal alone must end the process (it used to retry for ever).
    result = run_cli("mirror", str(config), "--exit-when-caught-up", timeout_s=60)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "flow A->B stopped" in result.stderr
    assert "session.timeout.ms=2000" in result.stderr
    assert "group.min.session.timeout.ms" in result.stderr
    assert "caught up" not in result.stderr.lower().replace("not caught up", "")
    assert "Traceback" not in result.stderr


def test_every_subcommand_has_help():
    for sub in ("mirror", "legacy"):
        result = run_cli(sub, "--help")
        assert result.returncode == 0 and "usage: shallowmirror " + sub in result.stdout
