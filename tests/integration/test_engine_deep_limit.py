"""The deep path's decompression limit, end to end on real brokers: a valid zstd batch whose
records decompress far beyond its size (3 records of 4 MiB of zeros in ~1.5 KB) must be trimmed
because the group's committed offset lies inside it. Under the default limit (64x the batch, at
least 1 MiB) the partition stops with an error naming the batch and the setting; raising
``deep.max.decompression.ratio`` lets the same batch through, trimmed."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from engine_support import commit_offset, create_target, run_until
from kafka.record.default_records import DefaultRecordBatchBuilder

from shallowmirror import codec
from shallowmirror.net import Cluster
from shallowmirror.testing.topics import read_topic
from shallowmirror.testing.workload import Workload, create_topic

pytestmark = pytest.mark.integration

VALUE_BYTES = 4 << 20
ZSTD = 4


def zero_bomb() -> bytes:
    """A valid zstd batch: 3 records of 4 MiB of zeros (what a broker accepts and stores)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=ZSTD, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=64 << 20)
    for i in range(3):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i,
                       value=bytes(VALUE_BYTES), headers=[])
    return bytes(builder.build())


async def produce_raw(cluster, topic: str, data: bytes) -> None:
    c = Cluster(cluster.client_config(), "source")
    await c.start()
    try:
        await c.refresh_metadata([topic])
        conn = await c.leader_connection(topic, 0)
        version = conn.api_version(0, (3, 9))
        cid = conn.next_correlation_id()
        buffers = codec.encode_produce_request(
            version=version, correlation_id=cid, client_id="test", transactional_id=None,
            acks=-1, timeout_ms=30000, topics=[(topic, [(0, [[data]])])])
        response = codec.decode_produce_response(await conn.send_raw(buffers, cid), version)
        assert response.topics[0][1][0].error_code == 0, response
    finally:
        await c.close()


def test_a_batch_decompressing_beyond_the_limit_stops_its_partition_until_allowed(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("bomb")
    create_topic(source_cluster.client_config(),
                 Workload(topic=topic, partitions=1, topic_config={"retention.ms": "-1"}))
    create_target(target_cluster, topic, 1)
    bomb = zero_bomb()
    assert len(bomb) < 4096
    asyncio.run(produce_raw(source_cluster, topic, bomb))
    group = f"g-{uuid.uuid4().hex[:10]}"
    commit_offset(source_cluster, group, topic, 1)              # inside the batch: it must be trimmed

    settings = {"group.id": group, "fetch.max.wait.ms": 100}
    stats = run_until(source_cluster, target_cluster, [topic], settings,
                      lambda s: bool(s.stopped))
    assert list(stats.stopped) == [(topic, 0)]
    error = stats.stopped[(topic, 0)]
    assert "zstd payload decompresses to more than 1048576 bytes" in error, error
    assert "deep.max.decompression.ratio" in error and f"{topic}-0" in error
    assert "offset 0" in error                           # the batch's base offset
    assert read_topic(target_cluster.client_config(), topic)[0] == []

    allowed = {**settings, "deep.max.decompression.ratio": 1_000_000}
    stats = run_until(source_cluster, target_cluster, [topic], allowed,
                      lambda s: s.partitions.get((topic, 0)) is not None
                      and s.partitions[(topic, 0)].position == 3)
    assert not stats.stopped, stats.stopped
    target = read_topic(target_cluster.client_config(), topic)[0]
    assert [(r.key, len(r.value)) for r in target] == [(b"k1", VALUE_BYTES), (b"k2", VALUE_BYTES)]
