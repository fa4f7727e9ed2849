"""Several produce connections per target broker (``target.connections.per.broker``): every
target partition pinned to one connection, so per-partition order, the idempotent sequence, the
offset map and the batch_acknowledged hook stay exact while requests go out on several
connections at once. Partitions with large batches are spread over the connections; partitions
with small batches share the first (spreading them would only make smaller requests)."""

from __future__ import annotations

import asyncio
import sys

import pytest
from engine_support import create_target, group, load_topic, raw_batches

from shallowmirror.engine import MirrorEngine
from shallowmirror.engine.sink import SPREAD_MIN_BATCH_BYTES, Sink
from shallowmirror.testing.topics import assert_same_records, read_topic
from tests.map_rows import assert_map_holds

pytestmark = pytest.mark.integration


async def _mirror_until_caught_up(engine: MirrorEngine, caught_up=None):
    """Run ``engine`` (hooks already added) until it has caught up; its stats. ``caught_up()``
    runs then, before the engine stops."""
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    try:
        await engine.runtime.progress.wait_until(lambda: engine.ready or task.done())
        assert await engine.wait_caught_up(120), engine.stats()
        if caught_up is not None:
            caught_up()
    finally:
        stop.set()
        await task
    return engine.stats()


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

    stats = asyncio.run(_mirror_until_caught_up(engine))
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
        per_batch = [(s.base_offset, s.record_count, d.base_offset)
                     for s, d in zip(src_batches[p], bs, strict=True)]
        assert_map_holds(engine.offset_map(topic, p), per_batch)
        # The hook fired once per batch, in source order, with the batches' ranges.
        mine = [a for a in acks if (a.source_topic, a.source_partition) == (topic, p)]
        assert [(a.source_base, a.source_next, a.target_base) for a in mine] == [
            (base, base + count, target) for base, count, target in per_batch]


def test_connections_dropped_mid_mirror_resend_in_order_over_both_send_paths(
        source_cluster, target_cluster, unique_topic, monkeypatch):
    # A request goes out from the produce loop when its connection is open (answered in a done
    # callback) and from a task that waits for the connection otherwise. Dropping the target
    # connections again and again while mirroring makes requests fail in flight, the next ones
    # wait for a new connection, and later ones go straight out again: the copy must stay exact.
    # Large batches, two connections: the second (lane 1) is opened only by its produce requests.
    topic = unique_topic("drops")
    load_topic(source_cluster, topic, 30_000, codec="lz4", partitions=4, batch_bytes=131_072,
               value_bytes=300)
    create_target(target_cluster, topic, 4)
    paths = {"open": 0, "waiting": 0}
    send_now, send = Sink._send_now, Sink._send

    def counting_send_now(self, *args):
        paths["open"] += 1
        return send_now(self, *args)

    def counting_send(self, *args):
        paths["waiting"] += 1
        return send(self, *args)

    monkeypatch.setattr(Sink, "_send_now", counting_send_now)
    monkeypatch.setattr(Sink, "_send", counting_send)
    acks: list = []
    drops: list[int] = []
    engine = MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                          topics=[topic], settings={
                              "partition.assignment": "all", "group.id": group(),
                              "fetch.max.wait.ms": 100, "retry.backoff.ms": 10,
                              "retry.backoff.max.ms": 50, "target.connections.per.broker": 2})

    dropped_lane_one: list = []

    def lane_one_connection():
        return next((engine.sinks.live_connection(s.node_id, 1) for s in engine.sinks.values()
                     if s.lane == 1), None)

    def drop_connections_now_and_then(ack) -> None:
        acks.append(ack)
        # Every 10 acknowledgements, and only once lane 1 has a connection opened since the last
        # drop: each drop then sends lane 1's next request through the waiting path, however load
        # paces the lanes. (Two drops before lane 1 reconnects would be one wait: answers read on
        # one loop turn, several at a time, can cross two thresholds before a close has run.)
        lane_one = lane_one_connection()
        if (len(acks) >= 10 * (len(drops) + 1) and len(drops) < 4 and lane_one is not None
                and (not dropped_lane_one or lane_one is not dropped_lane_one[-1])):
            dropped_lane_one.append(lane_one)
            live = list(engine.target.live_connections())
            drops.append(len(live))
            for conn in live:
                asyncio.get_running_loop().create_task(conn.close())

    engine.hooks.batch_acknowledged.add(drop_connections_now_and_then)

    stats = asyncio.run(_mirror_until_caught_up(engine))
    assert stats.records == 30_000 and not stats.stopped
    assert len(drops) == 4 and all(drops), "the target connections were dropped four times"
    assert sorted(s.lane for s in engine.sinks.values()) == [0, 1]
    # Lane 1 waits for its connection at first and after every drop (lane 0's is reopened
    # at once by the metadata refresh a lost connection starts, so it rarely has to).
    assert paths["open"] > 0 and paths["waiting"] >= 4, paths
    source = read_topic(source_cluster.client_config(), topic)
    target = read_topic(target_cluster.client_config(), topic)
    assert_same_records(source, target, topic=topic)     # each record once, in order
    src_batches, dst_batches = raw_batches(source_cluster, topic), raw_batches(target_cluster,
                                                                               topic)
    assert {p: [(b.base_offset, b.record_count) for b in bs] for p, bs in src_batches.items()} \
        == {p: [(b.base_offset, b.record_count) for b in bs] for p, bs in dst_batches.items()}
    for p, bs in dst_batches.items():
        assert [b.base_sequence for b in bs] == [b.base_offset for b in bs]
        # Acknowledged once per batch, in source order, resends included.
        mine = [a.source_base for a in acks if a.source_partition == p]
        assert mine == [b.base_offset for b in src_batches[p]]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="wake marks are Linux-only")
def test_answers_coalesced_on_the_target_connection_lose_and_delay_nothing(
        source_cluster, target_cluster, unique_topic):
    # Small batches keep several Produce requests in flight on one connection: the mirror then
    # waits for three answers per wake-up (target.answers.per.wakeup=3, the default). Every answer
    # must be at least the size the wake mark counted on (else the connection would stop
    # coalescing, or wait), and the copy stays exact.
    topic = unique_topic("coalesced")
    load_topic(source_cluster, topic, 40_000, codec="lz4", partitions=8, batch_bytes=16_384,
               value_bytes=300)
    create_target(target_cluster, topic, 8)
    engine = MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                          topics=[topic], settings={
                              "partition.assignment": "all", "group.id": group(),
                              "fetch.max.wait.ms": 100})
    marks: list[tuple[int, int]] = []

    def read_marks() -> None:
        for sink in engine.sinks.values():
            proto = sink._versioned._protocol if sink._versioned is not None else None
            if proto is not None:
                marks.append((proto.lowat_raised, proto.bound_broken))

    stats = asyncio.run(_mirror_until_caught_up(engine, read_marks))
    assert stats.records == 40_000 and not stats.stopped
    assert marks and all(broken == 0 for _raised, broken in marks), marks
    assert any(raised > 0 for raised, _broken in marks), f"never two answers awaited: {marks}"
    source = read_topic(source_cluster.client_config(), topic)
    target = read_topic(target_cluster.client_config(), topic)
    assert_same_records(source, target, topic=topic)
