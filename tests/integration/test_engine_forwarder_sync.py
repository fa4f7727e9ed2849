"""``SyncBatchForwarder`` (the per-batch forwarder for plain code) against real brokers: routed and
dropped batches, acknowledgements carrying target base offsets, commits only at acknowledged
boundaries and a restart resuming right after the last acknowledged batch."""

from __future__ import annotations

import concurrent.futures

import pytest
from engine_support import create_target, group, load_topic, raw_batches

from shallowmirror.engine import FetchedBatch, SyncBatchForwarder
from shallowmirror.testing.topics import Record, assert_same_records, group_offsets, read_topic
from tests.map_rows import assert_map_holds

pytestmark = pytest.mark.integration

FAST = {"partition.assignment": "all", "fetch.max.wait.ms": 100}


def _committed(cluster, group_id: str, topic: str, partitions: int) -> dict[int, int]:
    return group_offsets(cluster, group_id, topic, range(partitions))


def _until_ends(fwd: SyncBatchForwarder, ends: dict[int, int], decide) -> None:
    """Hand every fetched batch to ``decide`` until each partition reached its end offset."""
    reached = {p: False for p in ends}
    while not all(reached.values()):
        batch = fwd.next_batch(timeout_s=30)
        assert batch is not None, f"no batch for 30 s; reached {reached}"
        decide(batch)
        if batch.next_offset >= ends[batch.partition]:
            reached[batch.partition] = True


def _without(records: list[Record], ranges: list[tuple[int, int]]) -> list[Record]:
    return [r for r in records if not any(lo <= r.offset < hi for lo, hi in ranges)]


def test_forward_and_drop_with_acks_and_exact_offsets(source_cluster, target_cluster,
                                                     unique_topic):
    topic = unique_topic("sync")
    target_topic = topic + "-copy"
    load_topic(source_cluster, topic, 3_000, codec="zstd", partitions=2, batch_bytes=16_000,
               linger_ms=5)
    create_target(target_cluster, target_topic, 2)
    source = read_topic(source_cluster.client_config(), topic)
    ends = {p: rs[-1].offset + 1 for p, rs in source.items()}
    seen: dict[int, int] = {0: 0, 1: 0}
    acks: list[tuple[int, int, int, int | None]] = []     # partition, source_base, count, target
    futures: list[tuple[FetchedBatch, concurrent.futures.Future]] = []
    dropped: dict[int, list[tuple[int, int]]] = {0: [], 1: []}

    def on_ack(batch: FetchedBatch, target_base: int | None, error) -> None:
        assert error is None
        acks.append((batch.partition, batch.source_base, batch.record_count, target_base))

    def decide(batch: FetchedBatch) -> None:
        seen[batch.partition] += 1
        if seen[batch.partition] % 3 == 0:           # every third batch goes nowhere
            dropped[batch.partition].append((batch.source_base, batch.next_offset))
            fwd.drop(batch)
        else:
            futures.append((batch, fwd.forward(batch, target_topic, batch.partition,
                                               on_ack=on_ack)))

    with SyncBatchForwarder(source_cluster.client_config(), target_cluster.client_config(),
                            topics=[topic], settings={**FAST, "group.id": group()}) as fwd:
        _until_ends(fwd, ends, decide)
        results = [f.result(timeout=30) for _, f in futures]
        assert fwd.wait_caught_up(30)
        stats = fwd.stats()
        maps = {p: fwd.offset_map(topic, p) for p in (0, 1)}

    assert all(dropped.values()) and len(acks) == len(futures) >= 4
    assert stats.partitions[(topic, 0)].position == ends[0]
    assert stats.partitions[(topic, 1)].position == ends[1]
    # Target: exactly the forwarded records, in order; the dropped batches are absent.
    target = read_topic(target_cluster.client_config(), target_topic)
    expected = {p: _without(rs, dropped[p]) for p, rs in source.items()}
    assert_same_records(expected, target, topic=target_topic)
    assert stats.records == sum(len(rs) for rs in expected.values())
    # Acks: the future and the callback agree, and carry the target base offsets.
    by_batch = {(p, base): t for p, base, _, t in acks}
    assert results == [by_batch[(b.partition, b.source_base)] for b, _ in futures]
    dst = raw_batches(target_cluster, target_topic)
    for p in (0, 1):
        mine = sorted((base, count, t) for q, base, count, t in acks if q == p)
        assert [(t, count) for _, count, t in mine] == [
            (b.base_offset, b.record_count) for b in dst[p]]
        # The offset map covers every forwarded batch and none of the dropped ones: a dropped
        # batch is a gap on the source, so a run of the map ends before each.
        assert_map_holds(maps[p], mine)
        assert all(maps[p].translate(lo) is None for lo, _ in dropped[p])


def test_commits_only_acknowledged_batches_and_restart_resumes_after_them(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("resume")
    load_topic(source_cluster, topic, 2_000, codec="lz4", partitions=2, batch_bytes=16_000,
               linger_ms=5)
    create_target(target_cluster, topic, 2)
    source = read_topic(source_cluster.client_config(), topic)
    ends = {p: rs[-1].offset + 1 for p, rs in source.items()}
    g = group()
    cfg = source_cluster.client_config(), target_cluster.client_config()
    held: dict[int, FetchedBatch] = {}
    acked_end: dict[int, int] = {}

    # Run 1: forward three batches per partition, then hold the fourth (neither forwarded nor
    # dropped) and ignore everything after it.
    with SyncBatchForwarder(*cfg, topics=[topic], settings={**FAST, "group.id": g}) as fwd:
        counts = {0: 0, 1: 0}
        futures = []
        while len(held) < 2:
            batch = fwd.next_batch(timeout_s=30)
            assert batch is not None
            p = batch.partition
            if p in held:
                continue
            counts[p] += 1
            if counts[p] <= 3:
                futures.append(fwd.forward(batch, topic, p))
                acked_end[p] = batch.next_offset
            else:
                held[p] = batch
        for f in futures:
            f.result(timeout=30)
        fwd.commit()
        mid_run = _committed(source_cluster, g, topic, 2)
        stats = fwd.stats()
    after_close = _committed(source_cluster, g, topic, 2)
    for p in (0, 1):
        assert held[p].source_base == acked_end[p] < ends[p]
        assert mid_run[p] == after_close[p] == acked_end[p]     # never past the held batch
        assert stats.partitions[(topic, p)].position == acked_end[p]

    # Run 2, same group: starts exactly at the held batch and forwards everything.
    first: dict[int, int] = {}

    def forward_all(batch: FetchedBatch) -> None:
        first.setdefault(batch.partition, batch.source_base)
        fwd2.forward(batch, topic, batch.partition)

    with SyncBatchForwarder(*cfg, topics=[topic], settings={**FAST, "group.id": g}) as fwd2:
        _until_ends(fwd2, ends, forward_all)
        assert fwd2.wait_caught_up(30)
    assert first == acked_end
    assert _committed(source_cluster, g, topic, 2) == ends
    assert_same_records(source, read_topic(target_cluster.client_config(), topic), topic=topic)


def test_closed_forwarder_refuses_work_and_close_is_idempotent(source_cluster, target_cluster,
                                                               unique_topic):
    topic = unique_topic("closed")
    create_target(source_cluster, topic, 1)
    fwd = SyncBatchForwarder(source_cluster.client_config(), target_cluster.client_config(),
                             topics=[topic], settings={**FAST, "group.id": group()})
    fwd.start()
    assert fwd.next_batch(timeout_s=0.2) is None       # empty topic: nothing to hand out
    fwd.close()
    fwd.close()
    assert not fwd._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        fwd.next_batch(timeout_s=0.1)
