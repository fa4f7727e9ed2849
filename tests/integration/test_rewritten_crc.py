"""Rewritten batches carry valid CRCs: a consumer that checks them (librdkafka, check.crcs=true)
reads the mirrored topic, and the same consumer rejects a batch whose CRC is wrong.

tansu stores batches without checking CRCs, so the broker proves nothing here: the consumer does.
The source is written by a plain producer (producer id -1), so stamping the mirror's own producer
id/epoch/sequence changes CRC-covered bytes in every batch and forces a recompute; the test checks
that every target batch's CRC differs from its source batch's. (An idempotent source is no proof:
tansu's producer ids are small counters, so source and mirror may get the same id and sequence.)
"""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from engine_support import (
    create_target,
    load_topic,
    produce_corrupt_batch,
    raw_batches,
    run_until_caught_up,
)

from shallowmirror.testing.topics import assert_same_records, read_topic
from shallowmirror.testing.workload import Workload, create_topic


def _read_checking_crcs(cluster, topic: str, partitions: int) -> tuple[int, list[str]]:
    """(records read, errors seen) reading the whole topic with CRC checks on."""
    consumer = Consumer({**cluster.client_config(), "group.id": "crc-check",
                         "enable.auto.commit": False, "check.crcs": True,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records, errors, at_end = 0, [], set()
    try:
        for _ in range(300):
            for msg in consumer.consume(num_messages=10_000, timeout=0.2):
                err = msg.error()
                if err is None:
                    records += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                else:
                    errors.append(str(err))
            if errors or len(at_end) == partitions:
                break
    finally:
        consumer.close()
    return records, errors


@pytest.mark.parametrize("codec", ["lz4", "zstd", "gzip"])
def test_stamped_batches_pass_librdkafka_crc_check(codec, source_cluster, target_cluster,
                                                  unique_topic):
    topic = unique_topic(f"crc-{codec}")
    loaded = load_topic(source_cluster, topic, 5_000, codec=codec, partitions=4)
    create_target(target_cluster, topic, 4)
    asyncio.run(run_until_caught_up(source_cluster, target_cluster, [topic]))

    source, target = raw_batches(source_cluster, topic), raw_batches(target_cluster, topic)
    pairs = [(s, t) for p in source for s, t in zip(source[p], target[p], strict=True)]
    assert pairs and all(s.producer_id == -1 for s, _ in pairs)
    assert all(t.producer_id >= 0 and t.base_sequence >= 0 for _, t in pairs), \
        "the mirror's idempotent identity must be stamped into every batch"
    assert all(s.crc != t.crc for s, t in pairs), "stamping must have recomputed every CRC"

    records, errors = _read_checking_crcs(target_cluster, topic, 4)
    assert errors == [] and records == 5_000
    assert_same_records(loaded.records(), read_topic(target_cluster.client_config(), topic),
                        topic=topic)


def test_crc_check_rejects_a_corrupt_batch(target_cluster, unique_topic):
    """The control: without it the test above could pass with a consumer that checks nothing."""
    topic = unique_topic("crc-bad")
    create_topic(target_cluster.client_config(), Workload(topic=topic, partitions=1))
    asyncio.run(produce_corrupt_batch(target_cluster, topic, 0))
    _, errors = _read_checking_crcs(target_cluster, topic, 1)
    assert errors and any("crc" in e.lower() or "checksum" in e.lower() for e in errors), errors
