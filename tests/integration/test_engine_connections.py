"""Several produce connections per target broker (``target.connections.per.broker``): every
target partition pinned to one connection, so per-partition order, the idempotent sequence, the
offset map and the batch_acknowledged hook stay exact while requests go out on several
connections at once."""

from __future__ import annotations

import asyncio

import pytest
from engine_support import create_target, group, load_topic, raw_batches

from shallowmirror.engine import MirrorEngine
from shallowmirror.testing.topics import assert_same_records, read_topic

pytestmark = pytest.mark.integration


def test_partitions_pinned_to_connections_keep_order_offsets_and_hooks(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("lanes")
    # Small producer batches: many batches per partition, several in flight on each connection.
    load_topic(source_cluster, topic, 30_000, codec="lz4", partitions=8, batch_bytes=16_384,
               value_bytes=300)
    create_target(target_cluster, topic, 8)
    acks: list = []
    engine = MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                          topics=[topic], settings={
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
    assert stats.records == 30_000 and not stats.stopped

    sinks = engine.sinks.values()
    assert sorted(s.lane for s in sinks) == [0, 1, 2], "three connections to the one broker"
    owners = {}
    for sink in sinks:
        for ttp in sink.partitions:
            assert ttp not in owners, f"{ttp} produced over two connections"
            owners[ttp] = sink.lane
    assert len(owners) == 8 and set(owners.values()) == {0, 1, 2}
    assert all(s.requests_sent > 0 for s in sinks)

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
        mine = [a for a in acks if a.source_partition == p]
        assert [(a.source_base, a.source_next, a.target_base) for a in mine] == [
            (r.source_base, r.source_base + r.count, r.target_base) for r in rows]
