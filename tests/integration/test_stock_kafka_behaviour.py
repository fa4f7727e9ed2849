"""What stock Apache Kafka does that tansu does not, mirrored end to end.

Each test runs on both brokers where tansu can serve it; those tansu cannot (aborted
transactions, the last stable offset, the log cleaner, per-topic max.message.bytes) are marked
``needs_real_kafka`` and run in the Apache Kafka session of ``make test``.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from engine_support import (
    RunningEngine,
    create_target,
    load_topic,
    raw_batches,
    run_until,
    run_until_caught_up,
    wait_until,
)

from shallowmirror.testing.topics import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    assert_same_records,
    read_topic,
)
from shallowmirror.testing.workload import Workload, create_topic

pytestmark = pytest.mark.integration


def _count(cluster, topic: str, isolation_level: str = "read_uncommitted") -> int:
    try:
        back = read_topic(cluster, topic, isolation_level=isolation_level, timeout_s=15)
    except Exception:  # noqa: BLE001 - not there (yet)
        return -1
    return sum(len(v) for v in back.values())


def _admin(cluster) -> AdminClient:
    return AdminClient({**cluster.client_config(), "log_level": 0})


# -- transactions --------------------------------------------------------------------------------


@pytest.mark.needs_real_kafka("tansu never reports aborted_transactions in Fetch")
def test_read_committed_mirrors_committed_transactions_only(source_cluster, target_cluster,
                                                            unique_topic):
    topic = unique_topic("rc")
    loaded = load_topic(source_cluster, topic, 6_000, codec="zstd", partitions=3,
                        transactional=True, transaction_records=400, abort_every=3)
    create_target(target_cluster, topic, 3)
    asyncio.run(run_until_caught_up(source_cluster, target_cluster, [topic],
                                    settings={"isolation.level": "read_committed"}))
    committed = loaded.records("read_committed")
    assert sum(map(len, committed.values())) < 6_000, "the plan must abort some transactions"
    # Even a read_uncommitted reader of the target sees no aborted record: none was written.
    target = read_topic(target_cluster, topic, isolation_level="read_uncommitted")
    assert_same_records(committed, target, topic=topic)
    dst = raw_batches(target_cluster, topic)
    assert not any(b.is_control or b.is_transactional for bs in dst.values() for b in bs)


@pytest.mark.needs_real_kafka("tansu's last stable offset does not hold back read_committed")
def test_an_open_transaction_holds_the_mirror_at_the_last_stable_offset(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("lso")
    create_topic(source_cluster, Workload(topic=topic, partitions=1))
    create_target(target_cluster, topic, 1)
    txn = Producer({**source_cluster.client_config(), "transactional.id": f"open-{topic}",
                    "linger.ms": 5})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(100):
        txn.produce(topic, key=b"k%d" % i, value=b"committed-%d" % i, partition=0)
    txn.commit_transaction(30)
    txn.begin_transaction()
    for i in range(50):
        txn.produce(topic, key=b"k%d" % i, value=b"open-%d" % i, partition=0)
    txn.flush(30)                      # written, not committed: the LSO stays at 101
    plain = Producer({**source_cluster.client_config(), "linger.ms": 5})
    for i in range(30):
        plain.produce(topic, value=b"after-%d" % i, partition=0)
    assert plain.flush(30) == 0

    with RunningEngine(source_cluster, target_cluster, [topic],
                       {"isolation.level": "read_committed"}) as running:
        wait_until(lambda: _count(target_cluster, topic) == 100, 60,
                   "the committed transaction on the target", running)
        # The mirror stands at the LSO (100 records + the commit marker = 101) and stays there
        # while it goes on fetching (fetch.max.wait.ms=100: dozens of fetches in 3 s).
        wait_until(lambda: running.stats().partitions[(topic, 0)].position == 101, 30,
                   "the position at the last stable offset", running)
        time.sleep(3)
        assert running.stats().partitions[(topic, 0)].position == 101
        assert _count(target_cluster, topic) == 100
        txn.commit_transaction(30)
        wait_until(lambda: _count(target_cluster, topic) == 180, 60,
                   "the transaction and the records after it, once it committed", running)
    values = [r.value for r in read_topic(target_cluster, topic,
                                           isolation_level="read_uncommitted")[0]]
    assert values == ([b"committed-%d" % i for i in range(100)]
                      + [b"open-%d" % i for i in range(50)]
                      + [b"after-%d" % i for i in range(30)])


# -- topic-level settings ----------------------------------------------------------------------


def test_log_append_time_source_topic(source_cluster, target_cluster, unique_topic, on_tansu):
    topic = unique_topic("lat")
    loaded = load_topic(source_cluster, topic, 2_000, codec="lz4", partitions=2,
                        topic_config={"message.timestamp.type": "LogAppendTime"})
    create_target(target_cluster, topic, 2)
    source = read_topic(source_cluster, topic)
    source_types = {r.timestamp_type for rs in source.values() for r in rs}
    if not on_tansu:
        assert source_types == {TIMESTAMP_LOG_APPEND_TIME}, "Kafka stamps append times"
    asyncio.run(run_until_caught_up(source_cluster, target_cluster, [topic]))
    target = read_topic(target_cluster, topic)
    # log.append.time=clear (default): the bit is cleared, so the target's records carry the
    # create times their producers set, exactly as a CreateTime topic would have stored them.
    assert_same_records(loaded.records(), target, topic=topic)
    assert {r.timestamp_type for rs in target.values() for r in rs} == {TIMESTAMP_CREATE_TIME}


@pytest.mark.needs_real_kafka("tansu ignores a topic's max.message.bytes")
def test_target_max_message_bytes_below_the_source_batch_names_the_value(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("mmb")
    load_topic(source_cluster, topic, 300, codec="none", partitions=1, value_bytes=1000,
               batch_bytes=200_000)
    create_topic(target_cluster, Workload(topic=topic, partitions=1,
                                          topic_config={"max.message.bytes": "4096"}))
    stats = run_until(source_cluster, target_cluster, [topic], {},
                      lambda s: len(s.stopped) == 1)
    (where, error), = stats.stopped.items()
    assert where == (topic, 0)
    assert "max.message.bytes=4096" in error and "offset 0" in error, error
    assert stats.partitions[(topic, 0)].position == 0
    assert _count(target_cluster, topic) == 0


@pytest.mark.needs_real_kafka("tansu answers a Fetch past the end of a re-created topic with an "
                               "empty response, not OFFSET_OUT_OF_RANGE, so no client can notice")
def test_source_topic_deleted_and_recreated_while_mirroring(source_cluster, target_cluster,
                                                            unique_topic):
    topic = unique_topic("recreate")
    first = load_topic(source_cluster, topic, 500, codec="lz4", partitions=1)
    create_target(target_cluster, topic, 1)
    with RunningEngine(source_cluster, target_cluster, [topic],
                       {"auto.offset.reset": "earliest", "metadata.max.age.ms": 500}) as running:
        wait_until(lambda: _count(target_cluster, topic) == 500, 60, "the first topic's records",
                   running)
        admin = _admin(source_cluster)
        admin.delete_topics([topic], operation_timeout=30)[topic].result(30)
        wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, 30,
                   "the source topic to be gone")
        second = load_topic(source_cluster, topic, 300, codec="lz4", partitions=1, seed=7)
        wait_until(lambda: _count(target_cluster, topic) == 800, 90,
                   "the re-created topic's records after the first ones", running)
        assert not running.stats().stopped, running.stats().stopped
    target = read_topic(target_cluster, topic)[0]
    assert [r.value for r in target] == ([r.value for r in first.records()[0]]
                                         + [r.value for r in second.records()[0]])


# -- compaction ----------------------------------------------------------------------------------


@pytest.mark.needs_real_kafka("tansu has no log cleaner")
def test_a_topic_cleaned_by_kafkas_log_cleaner_mirrors_every_surviving_record(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("compact")
    config = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
              "delete.retention.ms": "100", "min.compaction.lag.ms": "0",
              "max.compaction.lag.ms": "1000"}
    admin = _admin(source_cluster)
    admin.create_topics([NewTopic(topic, 1, 1, config={**config,
                                                       "compression.type": "producer"})]
                        )[topic].result(30)
    producer = Producer({**source_cluster.client_config(), "compression.type": "lz4",
                         "linger.ms": 20})
    produced = 0
    for round_no in range(6):          # each round overwrites keys; rounds land in new segments
        for i in range(200):
            # Every 20th key is never written again: it survives cleaning between the overwritten
            # ones, so the cleaned log has offset gaps (batches the mirror must re-pack).
            key = b"keep-%d-%d" % (round_no, i) if i % 20 == 0 else b"key-%d" % (i % 50)
            value = None if (round_no == 4 and i % 10 == 5) else b"r%d-v%d" % (round_no, i)
            producer.produce(topic, key=key, value=value, partition=0,
                             headers=[("round", b"%d" % round_no)])
            produced += 1
        producer.flush(30)
        time.sleep(0.3)                # segment.ms: the next record rolls a new segment

    def cleaned() -> bool:
        producer.produce(topic, key=b"roller", value=b"x", partition=0)  # rolls the segment
        producer.flush(30)
        return _count(source_cluster, topic) < produced // 2

    # Kafka's cleaner checks every log.cleaner.backoff.ms (15 s by default, 1 s on test clusters).
    wait_until(cleaned, 120, "Kafka's log cleaner to compact the source topic")
    before = read_topic(source_cluster, topic)[0]
    offsets = [r.offset for r in before]
    assert offsets != list(range(offsets[0], offsets[0] + len(offsets))), "expected gaps"
    create_target(target_cluster, topic, 1)
    asyncio.run(run_until_caught_up(source_cluster, target_cluster, [topic]))
    after = read_topic(source_cluster, topic)[0]
    target = read_topic(target_cluster, topic)[0]
    # The cleaner may run again while mirroring, so the target lies between the two reads:
    # every record it holds survived in the first read, and every record still on the source
    # is on the target - each identical (key, tombstone value, headers, timestamp).
    def content(records):
        return [(r.key, r.value, r.headers, r.timestamp_ms) for r in records]

    assert _is_subsequence(content(target), content(before))
    assert _is_subsequence(content(after), content(target))
    assert any(r.value is None for r in target) or not any(r.value is None for r in after)


def _is_subsequence(small: list, big: list) -> bool:
    it = iter(big)
    return all(any(item == other for other in it) for item in small)


# -- topic configuration sync (MirrorMaker 2's rules) ---------------------------------------------


def _topic_configs(cluster, topic: str) -> dict:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = _admin(cluster)  # held until the result is in: a collected client cancels it
    return admin.describe_configs([resource])[resource].result(30)


@pytest.mark.needs_real_kafka("tansu's DescribeConfigs returns only what was set")
def test_config_sync_copies_topic_overrides_only(source_cluster, target_cluster, unique_topic,
                                                 tmp_path):
    from test_mirror_cli import Background, mm2_properties

    topic = unique_topic("cfg")
    load_topic(source_cluster, topic, 200, codec="gzip", partitions=2,
               topic_config={"retention.ms": "-1", "max.message.bytes": "2000000",
                             "compression.type": "gzip"})
    props = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster, **{
        "A->B.enabled": "true", "A->B.topics": topic, "sync.topic.configs.interval.seconds": "1",
        "refresh.topics.interval.seconds": "1"})
    remote = f"A.{topic}"
    mirror = Background("mirror", str(props), log_path=tmp_path / "mirror.log")
    try:
        wait_until(lambda: _count(target_cluster, remote) == 200, 90, "the mirrored records")
        configs = _topic_configs(target_cluster, remote)
        assert configs["retention.ms"].value == "-1"
        assert configs["max.message.bytes"].value == "2000000"
        # Never compression.type (the target must keep the source's bytes as they are) ...
        assert configs["compression.type"].value == "producer"
        # ... and nothing that was only a broker default on the source.
        source_defaults = {name for name, entry in _topic_configs(source_cluster, topic).items()
                           if entry.is_default or entry.source != 1}  # 1: DYNAMIC_TOPIC_CONFIG
        copied = {name for name, entry in configs.items() if entry.source == 1}
        assert not (copied & source_defaults - {"compression.type"}), copied & source_defaults
        # A source override changed while mirroring shows up on the target.
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry("retention.ms", "86400000",
                        incremental_operation=AlterConfigOpType.SET)])
        source_admin = _admin(source_cluster)
        source_admin.incremental_alter_configs([resource])[resource].result(30)
        wait_until(lambda: _topic_configs(target_cluster, remote)["retention.ms"].value
                   == "86400000", 60, "the changed override on the target")
        assert mirror.process.poll() is None, mirror.log()[-3000:]
    finally:
        assert mirror.terminate() == 0, mirror.log()[-3000:]
    assert "Traceback" not in mirror.log()


# -- ListOffsets ---------------------------------------------------------------------------------


@pytest.mark.needs_real_kafka("tansu answers ListOffsets latest wrongly")
def test_auto_offset_reset_latest_starts_at_the_end_and_read_committed_at_the_lso(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("latest")
    create_topic(source_cluster, Workload(topic=topic, partitions=1))
    create_target(target_cluster, topic, 1)
    plain = Producer({**source_cluster.client_config(), "linger.ms": 5})
    for i in range(40):
        plain.produce(topic, value=b"before-%d" % i, partition=0)
    assert plain.flush(30) == 0
    txn = Producer({**source_cluster.client_config(), "transactional.id": f"lso-{topic}"})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(10):
        txn.produce(topic, value=b"open-%d" % i, partition=0)
    txn.flush(30)   # open: LSO = 40, high watermark = 50
    with RunningEngine(source_cluster, target_cluster, [topic],
                       {"auto.offset.reset": "latest",
                        "isolation.level": "read_committed"}) as running:
        wait_until(lambda: (topic, 0) in running.stats().partitions, 30, "the assignment",
                   running)
        # "latest" under read_committed is the LSO (40), not the high watermark (50): the open
        # transaction's records are mirrored once it commits, not skipped.
        wait_until(lambda: running.stats().partitions[(topic, 0)].position == 40, 30,
                   "the start position at the LSO", running)
        txn.commit_transaction(30)
        wait_until(lambda: _count(target_cluster, topic) == 10, 60, "the committed records",
                   running)
    values = [r.value for r in read_topic(target_cluster, topic,
                                           isolation_level="read_uncommitted")[0]]
    assert values == [b"open-%d" % i for i in range(10)]


def test_auto_offset_reset_latest_mirrors_exactly_what_comes_after(source_cluster, target_cluster,
                                                                   unique_topic):
    """On both brokers: nothing written before the start is mirrored (tansu's ListOffsets
    "latest" points inside the last batch: the engine skips to that batch's end), and nothing
    written after it is skipped."""
    topic = unique_topic("latest-both")
    load_topic(source_cluster, topic, 500, codec="lz4", partitions=1, batch_bytes=16_000)
    create_target(target_cluster, topic, 1)
    with RunningEngine(source_cluster, target_cluster, [topic],
                       {"auto.offset.reset": "latest"}) as running:
        wait_until(lambda: (topic, 0) in running.stats().partitions
                   and running.stats().partitions[(topic, 0)].position == 500, 30,
                   "the start position at the end of what was there", running)
        plain = Producer({**source_cluster.client_config(), "linger.ms": 5,
                          "enable.idempotence": True})
        for i in range(30):
            plain.produce(topic, value=b"after-%d" % i, partition=0)
        assert plain.flush(30) == 0
        wait_until(lambda: _count(target_cluster, topic) == 30, 60, "the records written after",
                   running)
    values = [r.value for r in read_topic(target_cluster, topic)[0]]
    assert values == [b"after-%d" % i for i in range(30)]
