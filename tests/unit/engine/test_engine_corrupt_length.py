"""A flipped ``batchLength`` (outside the CRC) used to read as a partial tail: split_batches says
"partial, no batch" and the engine fetched the same offset forever (repro_06). A real broker
cannot be made to serve such bytes (Kafka validates what it stores, tansu cannot parse it), so a
SCRIPTED source wraps the real source cluster's connections and flips one bit of the length of
the batch at offset 5 in every Fetch response. The target is the real target cluster.

The engine must stop that partition with an error naming the offset and the sizes (as the Java
consumer's "Failed to make progress"), after forwarding everything before it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from shallowmirror import codec
from shallowmirror.engine import MirrorEngine
from shallowmirror.testing.fake_cluster import (
    ScriptedConnectionBase,
    ScriptedSourceClusterBase,
    write_source_batches,
)
from shallowmirror.testing.topics import read_topic
from shallowmirror.testing.workload import Workload, create_topic

pytestmark = pytest.mark.integration

CORRUPT_BASE_OFFSET = 5


class LengthFlippingConnection(ScriptedConnectionBase):
    """A real source connection whose Fetch responses carry the batch at CORRUPT_BASE_OFFSET
    with bit 16 of its batchLength flipped (its CRC still matches: the length is outside)."""

    async def request_frame(self, req: Any, timeout_ms: int | None = None) -> Any:
        frame = await self._conn.request_frame(req, timeout_ms)
        if req.API_KEY != 1 or frame is None:
            return frame
        data = bytearray(frame)
        response = codec.decode_fetch_response(frame, req.API_VERSION)
        for topic in response.topics:
            for part in topic.partitions:
                if part.records is None or len(part.records) == 0:
                    continue
                start = bytes(data).find(bytes(part.records))
                for view in codec.split_batches(part.records, verify_crc=False).batches:
                    if view.base_offset == CORRUPT_BASE_OFFSET:
                        data[start + view.position + 9] ^= 0x01      # length 0x..xx -> +65536
                        self._cluster.flips += 1
        return memoryview(bytes(data))


class LengthFlippingSourceCluster(ScriptedSourceClusterBase):
    connection_class = LengthFlippingConnection

    def __init__(self, config: Any, alias: str) -> None:
        super().__init__(config, alias)
        self.flips = 0


async def run_until_stopped(source: Any, target: Any, topics: list[str], polls: int = 600,
                            settled: Any = None):
    """One engine (all partitions, its own group) until a partition stops and ``settled(stats)``
    holds (the batches before the fault written: on Kafka one may still wait for the target
    leader when the fault is found); its final stats."""
    engine = MirrorEngine(source.client_config(), target.client_config(), topics=topics,
                          settings={"partition.assignment": "all", "fetch.max.wait.ms": 100,
                                    "group.id": f"g-{uuid.uuid4().hex[:8]}",
                                    "retry.backoff.ms": 10},
                          cluster_factory=LengthFlippingSourceCluster)
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    try:
        for _ in range(polls):
            stats = engine.stats()
            if (stats.stopped and (settled is None or settled(stats))) or task.done():
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    return engine.stats()


def test_a_flipped_batch_length_stops_the_partition_instead_of_refetching_forever(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("lenflip")
    create_topic(target_cluster.client_config(), Workload(topic=topic, partitions=1))
    asyncio.run(write_source_batches(source_cluster, topic, 1, 3))     # offsets 0..14

    stats = asyncio.run(run_until_stopped(
        source_cluster, target_cluster, [topic],
        settled=lambda s: s.partitions[(topic, 0)].position == CORRUPT_BASE_OFFSET))
    scripted = next(c for c in LengthFlippingSourceCluster.instances if c.scripted)
    assert scripted.flips >= 1
    assert list(stats.stopped) == [(topic, 0)]
    error = stats.stopped[(topic, 0)]
    assert "no complete batch" in error and "offset 5" in error and f"{topic}-0" in error
    assert "claims 65" in error and "fetch.max.bytes=" in error
    assert stats.partitions[(topic, 0)].position == 5      # not advanced past the fault
    target = read_topic(target_cluster.client_config(), topic)[0]
    source = read_topic(source_cluster.client_config(), topic)[0]
    assert [r.value for r in target] == [r.value for r in source[:5]]
