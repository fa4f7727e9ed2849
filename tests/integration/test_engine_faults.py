"""Fault handling against real brokers: a corrupt source batch stops only its partition, with an
error naming cluster, topic, partition and offset; nothing of it is forwarded past the fault."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Producer
from engine_support import create_target, group
from kafka.record.default_records import DefaultRecordBatchBuilder

from shallowmirror import codec
from shallowmirror.engine import MirrorEngine
from shallowmirror.net import Cluster
from shallowmirror.testing.topics import read_topic
from shallowmirror.testing.workload import Workload, create_topic

pytestmark = pytest.mark.integration


def _produce(cluster, topic: str, partition: int, n: int, tag: str) -> None:
    p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=f"{tag}-{i}".encode(), partition=partition)
    p.flush(30)


async def _produce_corrupt_batch(cluster, topic: str, partition: int) -> None:
    """A batch whose last byte is flipped: the CRC no longer matches (tansu stores it anyway)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i in range(3):
        builder.append(i, timestamp=None, key=None, value=b"corrupt-%d" % i, headers=[])
    data = bytearray(builder.build())
    data[-1] ^= 0xFF
    c = Cluster(cluster.client_config(), "source")
    await c.start()
    try:
        await c.refresh_metadata([topic])
        conn = await c.leader_connection(topic, partition)
        version = conn.api_version(0, (3, 9))
        cid = conn.next_correlation_id()
        buffers = codec.encode_produce_request(
            version=version, correlation_id=cid, client_id="test", transactional_id=None,
            acks=-1, timeout_ms=10000, topics=[(topic, [(partition, [[bytes(data)]])])])
        frame = await conn.send_raw(buffers, cid)
        response = codec.decode_produce_response(frame, version)
        (_, parts), = response.topics
        if parts[0].error_code:
            pytest.skip(f"this broker validates CRCs on produce (error {parts[0].error_code})")
    finally:
        await c.close()


def test_corrupt_source_batch_stops_only_its_partition(source_cluster, target_cluster,
                                                       unique_topic):
    topic = unique_topic("crc")
    create_topic(source_cluster.client_config(), Workload(topic=topic, partitions=2))
    create_target(target_cluster, topic, 2)
    _produce(source_cluster, topic, 0, 5, "before")
    asyncio.run(_produce_corrupt_batch(source_cluster, topic, 0))
    _produce(source_cluster, topic, 0, 5, "after")
    _produce(source_cluster, topic, 1, 50, "other")

    async def scenario():
        engine = MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                              topics=[topic], settings={"partition.assignment": "all",
                                                        "group.id": group(),
                                                        "fetch.max.wait.ms": 100})
        stop = asyncio.Event()
        task = asyncio.create_task(engine.run(stop))
        for _ in range(400):
            s = engine.stats()
            if s.stopped and s.partitions.get((topic, 1)) and s.partitions[(topic, 1)].lag == 0:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await task
        return engine.stats()

    stats = asyncio.run(scenario())
    assert list(stats.stopped) == [(topic, 0)]
    error = stats.stopped[(topic, 0)]
    assert "CRC" in error.upper() and f"{topic}-0" in error and "offset 5" in error
    assert "cluster source" in error
    assert stats.partitions[(topic, 0)].position == 5       # not advanced past the fault
    target = read_topic(target_cluster.client_config(), topic)
    assert [r.value for r in target[0]] == [f"before-{i}".encode() for i in range(5)]
    assert len(target[1]) == 50                                # the others keep going
