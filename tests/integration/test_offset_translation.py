"""Offset syncs, exact translation, checkpoints and failover/failback against real brokers.

Truth: the mirrored records themselves. The source read as the mirror reads it and the target
read back, zipped in order, give every (source offset, target offset) pair; a consumer position
p on the source must translate to the target offset of the first mirrored record at or after p
(past the last one: the target's end). Anything else re-reads or skips records.
"""

from __future__ import annotations

import bisect
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from engine_support import raw_batches
from test_mirror_cli import Background, mm2_properties, run_cli, run_until_caught_up, wait_for

from shallowmirror.mirror.config import load_mm2
from shallowmirror.replication.checkpoints import checkpoints_topic, read_checkpoints
from shallowmirror.replication.groups import CommittedOffset, Groups
from shallowmirror.replication.internal_topics import read_topic as read_internal
from shallowmirror.replication.translate import (
    load_flow_syncs,
    offset_syncs_topic,
    translate_offsets,
)
from shallowmirror.testing.topics import read_topic
from shallowmirror.testing.workload import Workload, load

pytestmark = pytest.mark.integration

MIRROR = {"A->B.enabled": "true", "isolation.level": "read_committed",
          "emit.checkpoints.interval.seconds": "1", "refresh.groups.interval.seconds": "1"}


def mirrored_pairs(source, topic: str, target, remote: str) -> dict[int, list[tuple[int, int]]]:
    """Per partition, (source offset, target offset) of every mirrored record, checked equal."""
    src = read_topic(source, topic, isolation_level="read_committed")
    dst = read_topic(target, remote, isolation_level="read_uncommitted")
    pairs = {}
    for partition, records in src.items():
        copies = dst.get(partition, [])
        if len(copies) != len(records):
            theirs = {(r.key, r.value) for r in copies}
            missing = [(r.offset, r.key, r.value) for r in records
                       if (r.key, r.value) not in theirs]
            mine = {(r.key, r.value) for r in records}
            extra = [(r.offset, r.key, r.value) for r in copies if (r.key, r.value) not in mine]
            raise AssertionError(f"partition {partition}: mirror incomplete: {len(records)} "
                                 f"source records, {len(copies)} copies; not copied: "
                                 f"{missing[:5]}; copies not on the source: {extra[:5]}")
        for a, b in zip(records, copies, strict=True):
            assert (a.key, a.value) == (b.key, b.value), (partition, a.offset, b.offset)
        pairs[partition] = [(a.offset, b.offset) for a, b in zip(records, copies, strict=True)]
    return pairs


def wait_mirrored(source, topic: str, target, remote: str, mirror: Background
                  ) -> dict[int, list[tuple[int, int]]]:
    """Wait (up to 120 s) until the running ``mirror`` has copied ``topic`` completely, then
    return its ``mirrored_pairs``."""
    def mirrored() -> dict[int, list[tuple[int, int]]] | None:
        try:
            return mirrored_pairs(source, topic, target, remote)
        except Exception:  # noqa: BLE001 - still mirroring
            return None

    wait_for(lambda: mirrored() is not None, 120, "the mirror to copy the topic", mirror)
    return mirrored()


def expected_position(pairs: list[tuple[int, int]], position: int) -> int:
    """Target position of source ``position``: the first mirrored record at or after it
    (``pairs`` are in source order; a binary search: the tests ask this for every offset)."""
    at = bisect.bisect_left(pairs, (position,))
    return pairs[at][1] if at < len(pairs) else pairs[-1][1] + 1


def assert_exact_for_every_offset(table, topic: str, pairs, source_ends: dict[int, int]) -> int:
    checked = 0
    for partition, mirrored in pairs.items():
        for position in range(0, source_ends[partition] + 3):
            got = table.translate(topic, partition, position)
            assert got == expected_position(mirrored, position), (partition, position)
            checked += 1
    return checked


def source_ends(source, topic: str) -> dict[int, int]:
    ends: dict[int, int] = {}
    for partition, batches in raw_batches(source, topic).items():
        last = batches[-1]
        ends[partition] = last.base_offset + max(last.record_count, 1)
    return ends


def offset_syncs_bytes(flow) -> tuple[int, int]:
    """(records, key + value bytes) in the flow's offset-syncs topic."""
    records = read_internal(flow.source_admin, offset_syncs_topic(flow), alias=flow.source)
    return len(records), sum(len(k or b"") + len(v or b"") for k, v in records)


def test_translation_is_exact_for_every_offset_and_survives_a_restart(
        source_cluster, target_cluster, tmp_path, unique_topic):
    """100k records with transactions (control batches; aborted ones on Kafka, where the Fetch
    response reports them) in two loads with a mirror restart between them."""
    topic = unique_topic("txn")
    workload = dict(partitions=2, value_bytes=50, keys=0, headers=0, transactional=True,
                    transaction_records=700, abort_every=4, linger_ms=5)
    load(source_cluster, Workload(topic, records=60_000, **workload))
    props = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                           **MIRROR, topics=topic)
    run_until_caught_up("mirror", str(props))
    flow = load_mm2(props).flows[0]
    remote = flow.remote_topic(topic)
    pairs = mirrored_pairs(source_cluster, topic, target_cluster, remote)
    assert assert_exact_for_every_offset(load_flow_syncs(flow), topic, pairs,
                                         source_ends(source_cluster, topic)) > 60_000

    # A restart: the new process knows nothing but the offset-syncs topic.
    load(source_cluster, Workload(topic, records=40_000, seed=1, create_topic=False,
                                  **workload))
    run_until_caught_up("mirror", str(props))
    pairs = mirrored_pairs(source_cluster, topic, target_cluster, remote)
    assert sum(len(p) for p in pairs.values()) >= 100_000 * 3 // 4 - 100
    table = load_flow_syncs(flow)
    assert assert_exact_for_every_offset(table, topic, pairs,
                                         source_ends(source_cluster, topic)) > 100_000
    records, size = offset_syncs_bytes(flow)
    batches = sum(len(b) for b in raw_batches(source_cluster, topic).values())
    print(f"offset syncs: {records} records, {size} bytes of keys and values for {batches} "
          f"source batches ({size * 1_000_000 // max(batches, 1):,} bytes per million batches)")


# -- checkpoints, MM2's RemoteClusterUtils, failover and failback ---------------------------------

JAVA_TRANSLATE = """
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.connect.mirror.RemoteClusterUtils;

public class Translate {
    public static void main(String[] args) throws Exception {
        Map<String, Object> props = new HashMap<>();
        props.put("bootstrap.servers", args[0]);
        Map<TopicPartition, OffsetAndMetadata> offsets =
            RemoteClusterUtils.translateOffsets(props, args[1], args[2], Duration.ofSeconds(60));
        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets.entrySet()) {
            System.out.println(e.getKey().topic() + " " + e.getKey().partition() + " "
                + e.getValue().offset());
        }
    }
}
"""


def java_translate_offsets(tmp_path: Path, bootstrap: str, source_alias: str,
                           group: str) -> dict[tuple[str, int], int]:
    """MM2's own ``RemoteClusterUtils.translateOffsets`` (connect-mirror-client 3.7), compiled
    and run here: what MM2's tools read from our checkpoints."""
    libs = Path(os.environ.get("KAFKA_HOME", "/work/shared/kafka")) / "libs"
    jars = [*libs.glob("connect-mirror-client-*.jar"), *libs.glob("kafka-clients-*.jar"),
            *libs.glob("slf4j-api-*.jar")]
    if shutil.which("javac") is None or len(jars) < 3:
        pytest.skip("needs javac/java and $KAFKA_HOME/libs with connect-mirror-client")
    classpath = os.pathsep.join(str(j) for j in jars)
    (tmp_path / "Translate.java").write_text(JAVA_TRANSLATE)
    subprocess.run(["javac", "-cp", classpath, "-d", str(tmp_path),
                    str(tmp_path / "Translate.java")], check=True, capture_output=True)
    # Run with every jar of the distribution, as MM2's own scripts do (kafka-clients needs
    # opentelemetry's and the codecs' jars at run time).
    done = subprocess.run(["java", "-cp", f"{libs / '*'}{os.pathsep}{tmp_path}", "Translate",
                           bootstrap, source_alias, group], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = {}
    for line in done.stdout.split("\n"):
        if line.strip():
            topic, partition, offset = line.split()
            out[(topic, int(partition))] = int(offset)
    return out


def records_from(cluster, topic: str, positions: dict[int, int], isolation: str
                 ) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    """What a consumer starting at ``positions`` reads, per partition."""
    found = read_topic(cluster, topic, isolation_level=isolation)
    return {p: [(r.key, r.value) for r in records if r.offset >= positions[p]]
            for p, records in found.items()}


def test_checkpoints_failover_and_failback_reread_and_skip_nothing(
        source_cluster, target_cluster, tmp_path, unique_topic):
    topic = unique_topic("orders")
    load(source_cluster, Workload(topic, records=9_000, partitions=3, value_bytes=60, keys=0,
                                  headers=0, transactional=True, transaction_records=250,
                                  abort_every=3, linger_ms=5))
    batches = raw_batches(source_cluster, topic)
    controls = {p: [b.base_offset for b in bs if b.is_control] for p, bs in batches.items()}
    # Group "billing" stopped at: a control batch's offset (a gap), a record mid-topic, and the
    # very start.
    stopped = {0: controls[0][len(controls[0]) // 2], 1: 2_345, 2: 0}
    billing = f"billing-{uuid.uuid4().hex[:8]}"
    Groups(source_cluster.client_config(), alias="A").commit(
        billing, [CommittedOffset(topic, p, o, f"meta-{p}") for p, o in stopped.items()])

    props = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                           **MIRROR, topics=topic, groups=billing)
    flow = load_mm2(props).flows[0]
    remote = flow.remote_topic(topic)
    mirror = Background("mirror", str(props), log_path=tmp_path / "mirror.log")
    try:
        def checkpointed() -> dict[tuple[str, int], int]:
            try:
                found = read_checkpoints(flow.target_admin, checkpoints_topic(flow), alias="B",
                                         group=billing, timeout_s=10)
            except Exception:  # noqa: BLE001 - not created yet
                return {}
            return {k: c.downstream_offset for k, c in found.items()}

        pairs = wait_mirrored(source_cluster, topic, target_cluster, remote, mirror)
        truth = {(remote, p): expected_position(pairs[p], o) for p, o in stopped.items()}
        wait_for(lambda: checkpointed() == truth, 60, f"checkpoints {truth}", mirror)
        assert {(t.to_topic, t.partition): t.downstream
                for t in translate_offsets(flow, billing)} == truth
    finally:
        assert mirror.terminate() == 0, mirror.log()[-3000:]

    # MM2's own reader returns exactly our offsets.
    assert java_translate_offsets(tmp_path, target_cluster.bootstrap, "A", billing) == truth

    dry = run_cli("offsets", "failover", str(props), "--group", billing, "--to", "B")
    assert dry.returncode == 0, dry.stderr
    assert (f"dry run, nothing written: group {billing} on cluster B: --execute would commit "
            f"these 3 offsets (0 already committed, 0 committed at another offset, 3 with "
            f"none)") in dry.stdout, dry.stdout
    assert Groups(flow.target_admin, alias="B").committed(billing) == []
    done = run_cli("offsets", "failover", str(props), "--group", billing, "--to", "B",
                   "--execute")
    assert done.returncode == 0, done.stderr
    again = run_cli("offsets", "failover", str(props), "--group", billing, "--to", "B")
    assert f"group {billing} on cluster B already has these 3 offsets" in again.stdout, \
        again.stdout
    on_b = {c.partition: c.offset for c in Groups(flow.target_admin, alias="B")
            .committed(billing)}
    assert {(remote, p): o for p, o in on_b.items()} == truth
    # Resumed on B, the group reads exactly what it had left to read on A: 0 re-read, 0 skipped.
    assert records_from(target_cluster, remote, on_b, "read_uncommitted") == \
        records_from(source_cluster, topic, stopped, "read_committed")

    # It consumes on B for a while, stops, and goes back to A where it stopped on B.
    moved = {p: min(o + 1_001, pairs[p][-1][1] + 1) for p, o in on_b.items()}
    moved[2] = pairs[2][-1][1] + 1                     # partition 2 read to the end
    Groups(flow.target_admin, alias="B").commit(
        billing, [CommittedOffset(remote, p, o, "") for p, o in moved.items()])
    back = run_cli("offsets", "failback", str(props), "--group", billing, "--to", "A",
                   "--execute")
    assert back.returncode == 0, back.stderr
    on_a = {c.partition: c.offset for c in Groups(source_cluster.client_config(), alias="A")
            .committed(billing)}
    assert records_from(source_cluster, topic, on_a, "read_committed") == \
        records_from(target_cluster, remote, moved, "read_uncommitted")


# -- compacted gaps: re-packed batches translate per record ---------------------------------------

COMPACT = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
           "delete.retention.ms": "100", "min.compaction.lag.ms": "0",
           "max.compaction.lag.ms": "1000", "compression.type": "producer"}


def gapped_batches_on_tansu(cluster, topic: str) -> None:
    """Batches with offset gaps written as they are (tansu stores them; Kafka renumbers)."""
    import asyncio

    from kafka.record.default_records import DefaultRecordBatchBuilder
    from test_verify import _produce

    load(cluster, Workload(topic, records=300, partitions=1, value_bytes=40, linger_ms=5))
    batches = []
    for round_no in range(20):
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=3, is_transactional=False,
                                            producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                            batch_size=1 << 20)
        for delta in (0, 3, 4, 9, 10, 17):
            builder.append(delta, timestamp=1_700_000_000_000 + delta, key=b"k%d" % delta,
                           value=b"kept-%d-%d" % (round_no, delta), headers=[])
        batches.append(bytearray(builder.build()))
    asyncio.run(_produce(cluster, topic, {0: batches}))
    load(cluster, Workload(topic, records=100, partitions=1, value_bytes=40, create_topic=False,
                           seed=2))


def cleaned_by_kafka(cluster, topic: str) -> None:
    """Keyed overwrites that Kafka's log cleaner compacts into batches with offset gaps."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic

    from shallowmirror.mirror.clients import admin_client

    admin = admin_client(cluster.client_config(), what="test admin")
    admin.create_topics([NewTopic(topic, 1, 1, config=COMPACT)])[topic].result(30)
    producer = Producer({**cluster.client_config(), "compression.type": "lz4",
                         "linger.ms": 20})
    produced = 0
    for round_no in range(6):
        for i in range(300):
            key = b"keep-%d-%d" % (round_no, i) if i % 20 == 0 else b"key-%d" % (i % 50)
            producer.produce(topic, key=key, value=b"r%d-v%d" % (round_no, i), partition=0)
            produced += 1
        producer.flush(30)
        time.sleep(0.3)

    def cleaned() -> bool:
        producer.produce(topic, key=b"roller", value=b"x", partition=0)
        producer.flush(30)
        found = read_topic(cluster, topic, timeout_s=15)
        return sum(len(v) for v in found.values()) < produced // 2

    wait_for(cleaned, 150, "Kafka's log cleaner to compact the source topic")

    # The last rolls leave the log dirty: let the cleaner finish before the mirror reads, so
    # the source does not change under it (the truth is read from the source afterwards).
    def offsets() -> list[int]:
        return [r.offset for r in read_topic(cluster, topic, timeout_s=15)[0]]

    last: list[list[int]] = [offsets()]

    def settled() -> bool:
        time.sleep(3)
        now = offsets()
        same, last[0] = now == last[0], now
        return same

    wait_for(settled, 90, "Kafka's log cleaner to settle")


def test_compacted_gaps_translate_to_the_next_surviving_record(
        source_cluster, target_cluster, tmp_path, unique_topic):
    topic = unique_topic("compacted")
    if source_cluster.flavor == "tansu":
        gapped_batches_on_tansu(source_cluster, topic)
    else:
        cleaned_by_kafka(source_cluster, topic)
    offsets = [r.offset for r in read_topic(source_cluster, topic)[0]]
    assert offsets != list(range(offsets[0], offsets[0] + len(offsets))), "expected gaps"
    props = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                           **MIRROR, topics=topic)
    run_until_caught_up("mirror", str(props))
    flow = load_mm2(props).flows[0]
    pairs = mirrored_pairs(source_cluster, topic, target_cluster, flow.remote_topic(topic))
    ends = source_ends(source_cluster, topic)
    assert assert_exact_for_every_offset(load_flow_syncs(flow), topic, pairs, ends) > 0


def test_failover_refuses_while_the_group_consumes_on_the_target(
        source_cluster, target_cluster, tmp_path, unique_topic):
    from confluent_kafka import Consumer
    from test_mirror_cli import group_timings

    topic = unique_topic("busy")
    load(source_cluster, Workload(topic, records=10, partitions=1))
    group = f"busy-{uuid.uuid4().hex[:8]}"
    Groups(source_cluster.client_config(), alias="A").commit(
        group, [CommittedOffset(topic, 0, 5, "")])
    remote = f"A.{topic}"
    load(target_cluster, Workload(remote, records=10, partitions=1))
    props = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                           **MIRROR, topics=topic)
    timings = group_timings(target_cluster)
    consumer = Consumer({**target_cluster.client_config(), "group.id": group,
                         "enable.auto.commit": False,
                         "session.timeout.ms": timings["session.timeout.ms"],
                         "heartbeat.interval.ms": timings["heartbeat.interval.ms"]})
    try:
        consumer.subscribe([remote])
        deadline = time.monotonic() + 60
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.5)
        assert consumer.assignment(), "the consumer never joined its group"
        refused = run_cli("offsets", "failover", str(props), "--group", group, "--to", "B",
                          "--live", "--execute")
    finally:
        consumer.close()
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"group {group!r} is active on cluster B" in refused.stderr
    assert Groups(target_cluster.client_config(), alias="B").committed(group) == []


def test_translation_is_exact_under_exactly_once_mirroring(
        source_cluster, target_cluster, tmp_path, unique_topic):
    """Exactly-once mirroring adds the mirror's own commit markers on the target: target-side
    jumps, some at the same place as source gaps."""
    topic = unique_topic("eos")
    load(source_cluster, Workload(topic, records=6_000, partitions=2, value_bytes=50, keys=0,
                                  headers=0, transactional=True, transaction_records=300,
                                  abort_every=3, linger_ms=5))
    props = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                           **MIRROR, topics=topic, **{"A->B.exactly.once": "true",
                                                      "transaction.interval.ms": "200"})
    run_until_caught_up("mirror", str(props))
    flow = load_mm2(props).flows[0]
    remote = flow.remote_topic(topic)
    src = read_topic(source_cluster, topic, isolation_level="read_committed")
    dst = read_topic(target_cluster, remote, isolation_level="read_committed")
    pairs = {p: [(a.offset, b.offset) for a, b in zip(records, dst[p], strict=True)]
             for p, records in src.items()}
    assert any(b.is_control for bs in raw_batches(target_cluster, remote).values() for b in bs)
    table = load_flow_syncs(flow)
    for partition, mirrored in pairs.items():
        for position in range(0, mirrored[-1][0] + 3):
            assert table.translate(topic, partition, position) == \
                expected_position(mirrored, position), (partition, position)


def test_translate_before_anything_is_mirrored_says_so_and_fails(source_cluster, target_cluster,
                                                                 tmp_path, unique_topic):
    """Before the mirror ran, every row showed '-' and the command exited 0 without a word,
    where failover said 'not translatable yet' and exited 1."""
    topic = unique_topic("unmirrored")
    load(source_cluster, Workload(topic, records=300, partitions=2, value_bytes=60))
    group = f"billing-{uuid.uuid4().hex[:8]}"
    Groups(source_cluster.client_config(), alias="A").commit(
        group, [CommittedOffset(topic, p, 10, "") for p in range(2)])
    props = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                           **MIRROR, topics=topic)
    result = run_cli("offsets", "translate", str(props), "--group", group, "--timeout", "20")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"not translatable yet (nothing mirrored): {topic}-0, {topic}-1" in result.stderr
    assert f"no offset of group '{group}' translates to B yet" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_partial_failover_writes_what_translates_names_the_rest_and_exits_3(
        source_cluster, target_cluster, tmp_path, unique_topic):
    """One topic of the group mirrored, the other created after the mirror ran. failover wrote
    the first, printed the second as 'not translatable yet' and exited 0, as after a whole
    move: a script could not tell it had left partitions behind."""
    mirrored, later = unique_topic("copied"), unique_topic("later")
    empty = unique_topic("empty")
    load(source_cluster, Workload(mirrored, records=200, partitions=1, value_bytes=40))
    load(source_cluster, Workload(empty, records=0, partitions=1))
    props = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                           **MIRROR, topics=f"{mirrored},{later},{empty}")
    run_until_caught_up("mirror", str(props))
    load(source_cluster, Workload(later, records=50, partitions=1, value_bytes=40))
    group = f"partial-{uuid.uuid4().hex[:8]}"
    # An empty partition, which consumers commit 0 for, is no partial move: 0 is exact there.
    Groups(source_cluster.client_config(), alias="A").commit(
        group, [CommittedOffset(mirrored, 0, 120, ""), CommittedOffset(later, 0, 10, ""),
                CommittedOffset(empty, 0, 0, "")])
    flow = load_mm2(props).flows[0]
    remote = flow.remote_topic(mirrored)
    pairs = mirrored_pairs(source_cluster, mirrored, target_cluster, remote)[0]

    translated = run_cli("offsets", "translate", str(props), "--group", group)
    assert translated.returncode == 3, translated.stdout + translated.stderr
    assert f"not translatable yet (nothing mirrored): {later}-0" in translated.stderr

    dry = run_cli("offsets", "failover", str(props), "--group", group, "--to", "B", "--live")
    assert dry.returncode == 3, dry.stdout + dry.stderr
    assert f"--execute would leave 1 partition of group {group} on cluster B" in dry.stderr
    assert Groups(target_cluster.client_config(), alias="B").committed(group) == []

    done = run_cli("offsets", "failover", str(props), "--group", group, "--to", "B", "--live",
                   "--execute")
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"wrote 2 offsets of group {group} on cluster B" in done.stdout
    assert f"partly done: 1 partition of group {group} on cluster B was not written" in \
        done.stderr
    assert "Traceback" not in done.stderr
    written = Groups(target_cluster.client_config(), alias="B").committed(group)
    assert sorted((c.topic, c.partition, c.offset) for c in written) == sorted([
        (remote, 0, expected_position(pairs, 120)), (flow.remote_topic(empty), 0, 0)])
