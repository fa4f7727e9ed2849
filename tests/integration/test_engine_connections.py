"""Several produce connections per target broker (``target.connections.per.broker``): every
target partition pinned to one connection, so per-partition order, the idempotent sequence, the
offset map and the batch_acknowledged hook stay exact while requests go out on several
connections at once. Partitions with large batches are spread over the connections; partitions
with small batches share the first (spreading them would only make smaller requests)."""

from __future__ import annotations

import asyncio

import pytest
from engine_support import create_target, group, load_topic, raw_batches

from shallowmirror.engine import MirrorEngine
from shallowmirror.engine.sink import SPREAD_MIN_BATCH_BYTES
from shallowmirror.testing.topics import assert_same_records, read_topic

pytestmark = pytest.mark.integration


def test_partitions_pinned_to_connections_keep_order_offsets_and_hooks(
        source_cluster, target_cluster, unique_topic):
    big, small = unique_topic("lanes-big"), unique_topic("lanes-small")
    # Large producer batches (~80 KB compressed) on one topic, small ones (~6 KB: many batches
    # per partition, several in flight on each connection) on the other.
    load_topic(source_cluster, big, 30_000, codec="lz4", partitions=8, batch_bytes=262_144,
               value_bytes=300)
    load_topic(source_cluster, small, 20_000, codec="lz4", partitions=4, batch_bytes=16_384,
               value_bytes=300)
    create_target(target_cluster, big, 8)
    create_target(target_cluster, small, 4)
    acks: list = []
    engine = MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                          topics=[big, small], settings={
                              "partition.assignment": "all", "group.id": group(),
                              "fetch.max.wait.ms": 100, "target.connections.per.broker": 3})
    engine.hooks.batch_acknowledged.add(acks.append)

    async def scenario():
        stop = asyncio.Event()
        task = asyncio.create_task(engine.run(stop))
        try:
            await engine.runtime.progress.wait_until(lambda: engine.ready or task.done())
            assert await engine.wait_caught_up(120), engine.stats()
        finally:
            stop.set()
            await task
        return engine.stats()

    stats = asyncio.run(scenario())
    assert stats.records == 50_000 and not stats.stopped

    sinks = engine.sinks.values()
    assert sorted(s.lane for s in sinks) == [0, 1, 2], "three connections to the one broker"
    owners = {}
    for sink in sinks:
        for ttp in sink.partitions:
            assert ttp not in owners, f"{ttp} produced over two connections"
            owners[ttp] = sink.lane
    assert len(owners) == 12
    assert all(s.requests_sent > 0 for s in sinks)
    first_size = {(t, p): bs[0].size for t in (big, small)
                  for p, bs in raw_batches(source_cluster, t).items()}
    large = {ttp for ttp, size in first_size.items() if size >= SPREAD_MIN_BATCH_BYTES}
    assert {ttp[0] for ttp in large} == {big}, f"first batch sizes: {first_size}"
    assert {owners[ttp] for ttp in large} == {0, 1, 2}, "large-batch partitions spread"
    assert all(owners[ttp] == 0 for ttp in owners if ttp not in large), \
        "small-batch partitions share the first connection"

    for topic in (big, small):
        _assert_exact_copy(engine, source_cluster, target_cluster, topic, acks, stats)


def _assert_exact_copy(engine, source_cluster, target_cluster, topic, acks, stats) -> None:
    source = read_topic(source_cluster.client_config(), topic)
    target = read_topic(target_cluster.client_config(), topic)
    assert_same_records(source, target, topic=topic)     # partition, order, every field
    src_batches, dst_batches = raw_batches(source_cluster, topic), raw_batches(target_cluster,
                                                                               topic)
    assert {p: [(b.base_offset, b.record_count) for b in bs] for p, bs in src_batches.items()} \
        == {p: [(b.base_offset, b.record_count) for b in bs] for p, bs in dst_batches.items()}
    assert {b.producer_id for bs in dst_batches.values() for b in bs} == {stats.producer_id}
    for p, bs in dst_batches.items():
        # One idempotent sequence per partition, gap-free, whatever connection carried it.
        assert [b.base_sequence for b in bs] == [b.base_offset for b in bs]
        rows = engine.offset_map(topic, p).rows()
        assert [(r.source_base, r.count, r.target_base) for r in rows] == [
            (s.base_offset, s.record_count, d.base_offset)
            for s, d in zip(src_batches[p], bs, strict=True)]
        # The hook fired once per batch, in source order, with the ranges of the map.
        mine = [a for a in acks if (a.source_topic, a.source_partition) == (topic, p)]
        assert [(a.source_base, a.source_next, a.target_base) for a in mine] == [
            (r.source_base, r.source_base + r.count, r.target_base) for r in rows]
