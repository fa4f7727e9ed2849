"""Transactional exactly-once (engine.transactions) against real brokers.

Every check reads the target with a read_committed consumer (what the guarantee is about) and
compares it with the source record for record, per partition: nothing lost, nothing twice, the
order kept.
"""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Consumer, TopicPartition
from engine_support import create_target, group, load_topic, raw_batches, run_until_caught_up

from shallowmirror.testing.topics import assert_same_records, client_config, read_topic

pytestmark = pytest.mark.integration

EOS = {"exactly.once": "true", "transaction.interval.ms": "200"}


def group_offsets(cluster, group_id: str, topic: str, partitions: int) -> dict[int, int]:
    """The committed offsets of ``group_id`` on ``cluster`` (read_committed: only offsets of
    committed transactions count)."""
    consumer = Consumer({**client_config(cluster), "group.id": group_id,
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                   timeout=30)
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()


def test_exactly_once_mirrors_every_record_once_in_committed_transactions(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("eos")
    load_topic(source_cluster, topic, 6000, partitions=3)
    create_target(target_cluster, topic, partitions=3)
    group_id = group()
    stats = asyncio.run(run_until_caught_up(source_cluster, target_cluster, [topic],
                                            settings={**EOS, "group.id": group_id}))
    assert stats.records == 6000
    source = read_topic(source_cluster, topic)
    assert_same_records(source, read_topic(target_cluster, topic,
                                           isolation_level="read_committed"))
    # The source offsets went to the group on the TARGET, in the same transactions.
    assert group_offsets(target_cluster, group_id, topic, 3) == {
        p: records[-1].offset + 1 for p, records in source.items()}
    stored = raw_batches(target_cluster, topic)
    data = [b for batches in stored.values() for b in batches if not b.is_control]
    assert data and all(b.is_transactional for b in data)
    assert any(b.is_control for batches in stored.values() for b in batches)  # commit markers


ABORTS_NEED_KAFKA = pytest.mark.needs_real_kafka(
    "tansu 0.6 never reports aborted transactions in Fetch: read_committed sees aborted records")


@pytest.mark.parametrize("fault", [
    # The broker wrote the batches of Produce requests 3 and 7; their answers are lost.
    pytest.param({"lose_produce_answers": {3, 7}}, marks=ABORTS_NEED_KAFKA),
    # TxnOffsetCommit (api key 28) of the second transaction is refused after the broker
    # staged the offsets.
    pytest.param({"error_answers": {28: -1}, "error_calls": {2}}, marks=ABORTS_NEED_KAFKA),
    # EndTxn (api key 26) of the first commit answers CONCURRENT_TRANSACTIONS after the broker
    # committed: the retried EndTxn(commit) finds it committed (no abort, nothing twice).
    {"error_answers": {26: 51}, "error_calls": {1}},
], ids=["produce-answer-lost", "offset-commit-refused", "end-txn-retried"])
def test_a_target_error_mid_transaction_aborts_or_retries_without_loss_or_duplicates(
        source_cluster, target_cluster, unique_topic, fault):
    """Scripted FAULTS on a real target (fake_cluster.scripted_target_cluster): the broker does
    the real work, then the answer is lost or replaced by an error."""
    from shallowmirror.testing.fake_cluster import scripted_target_cluster

    topic = unique_topic("eos-fault")
    load_topic(source_cluster, topic, 4000, partitions=2, batch_bytes=16_000)
    create_target(target_cluster, topic, partitions=2)
    scripted = scripted_target_cluster(**fault)
    engines: list = []
    asyncio.run(run_until_caught_up(
        source_cluster, target_cluster, [topic], engine_out=engines, cluster_factory=scripted,
        settings={**EOS, "group.id": group(), "retry.backoff.ms": 10}))
    target = next(c for c in scripted.instances if c.scripted)
    assert target.faults_injected >= 1
    sinks = engines[0].sinks
    if "error_calls" in fault and 26 in fault["error_answers"]:
        assert sinks.aborted_transactions == 0
    else:
        assert sinks.aborted_transactions >= 1
    source = read_topic(source_cluster, topic)
    assert_same_records(source, read_topic(target_cluster, topic))   # read_committed
    if "lose_produce_answers" in fault:   # the aborted batches are stored, but never visible
        everything = read_topic(target_cluster, topic, isolation_level="read_uncommitted")
        assert sum(map(len, everything.values())) > sum(map(len, source.values()))
