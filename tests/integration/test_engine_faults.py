"""Fault handling against real brokers: a corrupt source batch stops only its partition, with an
error naming cluster, topic, partition and offset; nothing of it is forwarded past the fault."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Producer
from engine_support import create_target, produce_corrupt_batch, run_until

from shallowmirror.testing.topics import read_topic
from shallowmirror.testing.workload import Workload, create_topic

pytestmark = pytest.mark.integration


def _produce(cluster, topic: str, partition: int, n: int, tag: str) -> None:
    p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i in range(n):
        p.produce(topic, value=f"{tag}-{i}".encode(), partition=partition)
    p.flush(30)


def test_corrupt_source_batch_stops_only_its_partition(source_cluster, target_cluster,
                                                       unique_topic):
    topic = unique_topic("crc")
    create_topic(source_cluster.client_config(), Workload(topic=topic, partitions=2))
    create_target(target_cluster, topic, 2)
    _produce(source_cluster, topic, 0, 5, "before")
    asyncio.run(produce_corrupt_batch(source_cluster, topic, 0))
    _produce(source_cluster, topic, 0, 5, "after")
    _produce(source_cluster, topic, 1, 50, "other")

    def other_partition_done(s) -> bool:
        other = s.partitions.get((topic, 1))
        return bool(s.stopped) and other is not None and other.lag == 0

    stats = run_until(source_cluster, target_cluster, [topic], {"fetch.max.wait.ms": 100},
                      other_partition_done)
    assert list(stats.stopped) == [(topic, 0)]
    error = stats.stopped[(topic, 0)]
    assert "CRC" in error.upper() and f"{topic}-0" in error and "offset 5" in error
    assert "cluster source" in error
    assert stats.partitions[(topic, 0)].position == 5       # not advanced past the fault
    target = read_topic(target_cluster.client_config(), topic)
    assert [r.value for r in target[0]] == [f"before-{i}".encode() for i in range(5)]
    assert len(target[1]) == 50                                # the others keep going
