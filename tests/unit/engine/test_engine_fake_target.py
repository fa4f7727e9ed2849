"""Produce-side error paths a real broker cannot be made to produce on demand, against the scripted
FAKE target cluster (shallowmirror/testing/fake_cluster.py): the source is the session's real
(embedded) source cluster, the target the fake, reached through the engine's public config.

Each test asserts on what the fake received and stored (bytes, producer ids, sequences, order)
and on the engine's state (positions, offset map, stopped partitions)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import pytest

from shallowmirror.engine import MirrorEngine
from shallowmirror.engine.sink import Sink
from shallowmirror.testing.fake_cluster import (
    DUPLICATE_SEQUENCE_NUMBER,
    NOT_LEADER_OR_FOLLOWER,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    Attempt,
    FakeTargetCluster,
    Stored,
    write_source_batches,
)
from tests.map_rows import assert_map_holds

pytestmark = pytest.mark.integration

HEADER_BYTES = 61           # v2 batch header: what the engine rewrites; the rest is forwarded
INVALID_PRODUCER_EPOCH = 47
PRODUCER_FENCED = 90
MESSAGE_TOO_LARGE = 10
NOT_ENOUGH_REPLICAS = 19


async def _mirror(source_cluster, fake: FakeTargetCluster, topic: str,
                  done: Callable[[MirrorEngine], bool], target_config: dict | None = None,
                  **settings) -> MirrorEngine:
    """Run a MirrorEngine source -> fake until ``done(engine)`` (at most 30 s), then stop it."""
    engine = MirrorEngine(source_cluster.client_config(), {**fake.config(),
                                                            **(target_config or {})},
                          topics=[topic],
                          settings={"partition.assignment": "all",
                                    "group.id": f"g-{uuid.uuid4().hex[:8]}",
                                    "fetch.max.wait.ms": 100, "retry.backoff.ms": 10,
                                    "retry.backoff.max.ms": 50, **settings})
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    try:
        for _ in range(600):
            if task.done():
                await task
            if engine.ready and done(engine):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"scenario did not finish in 30 s: {engine.stats()}")
    finally:
        stop.set()
        await task
    return engine


def _caught_up(topic: str, ends: dict[int, int]) -> Callable[[MirrorEngine], bool]:
    def done(engine: MirrorEngine) -> bool:
        s = engine.stats().partitions
        return all(s.get((topic, p)) is not None and s[(topic, p)].position == end
                   for p, end in ends.items())
    return done


def _assert_stored_exactly(fake: FakeTargetCluster, topic: str, written: dict[int, list[bytes]]):
    """The fake holds every source batch once, in source order, payload byte for byte, with
    contiguous sequences per producer id."""
    for p, batches in written.items():
        stored = fake.stored(topic, p)
        assert [s.data[HEADER_BYTES:] for s in stored] == [b[HEADER_BYTES:] for b in batches]
        expected_seq: dict[int, int] = {}
        for s in stored:
            assert s.base_sequence == expected_seq.get(s.producer_id, 0), (p, s)
            expected_seq[s.producer_id] = s.base_sequence + s.record_count


def _assert_offset_map_exact(engine: MirrorEngine, fake: FakeTargetCluster, topic: str,
                             partitions: int, records: int = 5) -> None:
    for p in range(partitions):
        assert_map_holds(engine.offset_map(topic, p), [
            (i * records, records, s.base_offset) for i, s in enumerate(fake.stored(topic, p))])


@pytest.fixture
def topic(unique_topic) -> str:
    return unique_topic("fake")


def test_not_leader_moves_the_partition_and_resends_the_same_bytes(source_cluster, topic):
    async def main():
        written = await write_source_batches(source_cluster, topic, 1, 8)
        moved: list[Attempt] = []

        def script(a: Attempt):
            if not moved and a.base_sequence >= 10:      # the third batch: leader moves away
                moved.append(a)
                fake.leaders[(topic, 0)] = 2
            return None

        async with FakeTargetCluster({topic: 1}, brokers=2, script=script) as fake:
            engine = await _mirror(source_cluster, fake, topic, _caught_up(topic, {0: 40}))
            return written, fake, engine, moved

    written, fake, engine, moved = asyncio.run(main())
    _assert_stored_exactly(fake, topic, written)
    assert fake.producer_ids == [1000]                  # no identity reset for a leader move
    rejected = [a for a in fake.attempts if a.error_code == NOT_LEADER_OR_FOLLOWER]
    assert rejected and {a.node_id for a in rejected} == {1}
    for a in rejected:    # resent to the new leader: same bytes, same producer id and sequence
        again = [b for b in fake.attempts if b.node_id == 2 and b.identity == a.identity]
        assert [b.data for b in again] == [a.data] and again[0].error_code == 0
    stored = fake.stored(topic, 0)
    assert {s.base_sequence for s in stored[:2]} == {0, 5}
    after = fake.attempts[fake.attempts.index(moved[0]) + 1:]
    assert all(a.node_id == 2 for a in after if a.error_code == 0)
    assert [a.node_id for a in fake.attempts if a.error_code == 0] == [1, 1] + [2] * 6
    assert not engine.stats().stopped
    _assert_offset_map_exact(engine, fake, topic, 1)


def test_batches_fetched_after_the_metadata_names_a_new_leader_queue_behind_the_old_ones(
        source_cluster, topic):
    """The target's metadata names broker 2 while broker 1 still answers for the partition
    (NOT_ENOUGH_REPLICAS: a leader moving back after a broker restart on Kafka 3.7 with
    min.insync.replicas=2). Batches fetched meanwhile used to be queued for broker 2 at once,
    ahead of the ones still waiting for broker 1: they were written first, and their sequence
    gap (OUT_OF_ORDER_SEQUENCE_NUMBER) brought a new producer identity that let the rest in
    behind them. They now wait behind the old ones and move with them, in order."""
    tp = (topic, 0)

    async def main():
        written = await write_source_batches(source_cluster, topic, 1, 4)
        stalled = asyncio.Event()

        def script(a: Attempt):
            if a.node_id == 1 and a.base_sequence >= 10:
                # From the third batch on, broker 1 cannot take it; the metadata names broker 2.
                fake.metadata_leaders[tp] = 2
                stalled.set()
                return NOT_ENOUGH_REPLICAS
            return None

        async with FakeTargetCluster({topic: 1}, brokers=2, script=script) as fake:
            # The target's metadata is read every 200 ms: the new leader is seen during the stall.
            engine = MirrorEngine(
                source_cluster.client_config(), {**fake.config(), "metadata.max.age.ms": 200},
                topics=[topic],
                settings={"partition.assignment": "all", "group.id": f"g-{uuid.uuid4().hex[:8]}",
                          "fetch.max.wait.ms": 100, "retry.backoff.ms": 50,
                          "retry.backoff.max.ms": 100})
            stop = asyncio.Event()
            task = asyncio.create_task(engine.run(stop))
            try:
                await asyncio.wait_for(stalled.wait(), 30)
                for _ in range(100):        # the engine has read the new metadata
                    if engine.sinks.cluster.leader(*tp) == 2:
                        break
                    await asyncio.sleep(0.05)
                assert engine.sinks.cluster.leader(*tp) == 2
                more = await write_source_batches(source_cluster, topic, 1, 4, first=4)
                for _ in range(100):        # and fetched the new batches
                    if engine.partitions[tp].fetch_position == 40:
                        break
                    await asyncio.sleep(0.05)
                assert engine.partitions[tp].fetch_position == 40
                await asyncio.sleep(0.3)
                fake.leaders[tp] = 2        # broker 2 takes the partition
                fake.metadata_leaders.clear()
                for _ in range(200):
                    if engine.stats().partitions[tp].records == 40:
                        break
                    await asyncio.sleep(0.05)
            finally:
                stop.set()
                await task
            return {0: written[0] + more[0]}, fake, engine

    written, fake, engine = asyncio.run(main())
    assert engine.stats().partitions[tp].records == 40, engine.stats()
    _assert_stored_exactly(fake, topic, written)
    assert fake.producer_ids == [1000]          # no identity reset: no sequence gap was sent
    assert not engine.stats().stopped
    _assert_offset_map_exact(engine, fake, topic, 1)


def test_retriable_error_on_one_partition_while_the_others_succeed(source_cluster, topic):
    async def main():
        written = await write_source_batches(source_cluster, topic, 3, 4)
        failures = {"left": 2}

        def script(a: Attempt):
            if a.partition == 1 and a.base_sequence == 0 and failures["left"]:
                failures["left"] -= 1
                return NOT_ENOUGH_REPLICAS
            return None

        async with FakeTargetCluster({topic: 3}, script=script) as fake:
            engine = await _mirror(source_cluster, fake, topic,
                                   _caught_up(topic, {0: 20, 1: 20, 2: 20}))
            return written, fake, engine

    written, fake, engine = asyncio.run(main())
    _assert_stored_exactly(fake, topic, written)
    p1 = fake.attempts_for(topic, 1)
    failed = [a for a in p1 if a.error_code == NOT_ENOUGH_REPLICAS]
    assert len(failed) == 2
    # Partition 1's first batch went out three times with the same bytes and sequence...
    first = [a for a in p1 if a.identity == failed[0].identity]
    assert len(first) == 3 and len({a.data for a in first}) == 1 and first[-1].error_code == 0
    # ...while every batch of partitions 0 and 2 was accepted the first time it was sent.
    for p in (0, 2):
        attempts = fake.attempts_for(topic, p)
        assert [a.error_code for a in attempts] == [0] * 4
    assert fake.producer_ids == [1000] and not engine.stats().stopped
    _assert_offset_map_exact(engine, fake, topic, 3)


@pytest.mark.parametrize("code", [OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH,
                                  PRODUCER_FENCED])
def test_sequence_or_fencing_error_resets_the_identity_and_restamps(code, source_cluster, topic):
    async def main():
        written = await write_source_batches(source_cluster, topic, 2, 6)
        hit: list[Attempt] = []

        def script(a: Attempt):
            # From the third batch of partition 0 on, the broker refuses producer 1000 for good
            # (state lost, epoch bumped elsewhere, fenced): only a new identity gets through.
            if a.producer_id == 1000 and a.partition == 0 and a.base_sequence >= 10:
                hit.append(a)
                return code
            return None

        async with FakeTargetCluster({topic: 2}, script=script) as fake:
            engine = await _mirror(source_cluster, fake, topic, _caught_up(topic, {0: 30, 1: 30}))
            return written, fake, engine, hit

    written, fake, engine, hit = asyncio.run(main())
    assert hit
    assert fake.producer_ids == [1000, 1001]
    assert engine.stats().producer_id == 1001 and not engine.stats().stopped
    # Nothing lost or duplicated; sequences contiguous per producer id; the failed batch was
    # re-stamped (new producer id, sequence from 0) over the same payload.
    _assert_stored_exactly(fake, topic, written)
    stored = fake.stored(topic, 0)
    assert [s.producer_id for s in stored[:2]] == [1000, 1000]
    assert stored[2].producer_id == 1001 and stored[2].base_sequence == 0
    assert stored[2].data[HEADER_BYTES:] == hit[0].data[HEADER_BYTES:]
    assert stored[2].data[:HEADER_BYTES] != hit[0].data[:HEADER_BYTES]
    _assert_offset_map_exact(engine, fake, topic, 2)


def test_duplicate_sequence_is_acknowledged_with_unknown_target_offset(source_cluster, topic):
    async def main():
        written = await write_source_batches(source_cluster, topic, 1, 4)

        def script(a: Attempt):
            if a.base_sequence == 5 and not any(b.base_sequence == 5 for b in fake.attempts):
                return Stored(DUPLICATE_SEQUENCE_NUMBER)    # written, answered "duplicate"
            return None

        async with FakeTargetCluster({topic: 1}, script=script) as fake:
            engine = await _mirror(source_cluster, fake, topic, _caught_up(topic, {0: 20}))
            return written, fake, engine

    written, fake, engine = asyncio.run(main())
    _assert_stored_exactly(fake, topic, written)
    assert len(fake.attempts) == 4                         # not resent
    stats = engine.stats()
    assert stats.duplicates_acked_unknown_offset == 1 and not stats.stopped
    # The duplicate's target offset is unknown: its row stands alone, the next starts anew.
    assert_map_holds(engine.offset_map(topic, 0), [(0, 5, 0), (5, 5, None), (10, 5, 10),
                                                   (15, 5, 15)])
    assert engine.offset_map(topic, 0).rows()[1].target_base is None
    assert engine.offset_map(topic, 0).translate(7) is None
    assert engine.offset_map(topic, 0).translate(12) == 12


def test_message_too_large_stops_the_partition_with_a_clear_error(source_cluster, topic):
    async def main():
        written = await write_source_batches(source_cluster, topic, 2, 4)

        def script(a: Attempt):
            if a.partition == 0 and a.base_sequence == 5:
                return MESSAGE_TOO_LARGE
            return None

        async with FakeTargetCluster({topic: 2}, script=script) as fake:
            def done(engine: MirrorEngine) -> bool:
                s = engine.stats()
                return bool(s.stopped) and _caught_up(topic, {1: 20})(engine)

            engine = await _mirror(source_cluster, fake, topic, done)
            return written, fake, engine

    written, fake, engine = asyncio.run(main())
    stats = engine.stats()
    assert list(stats.stopped) == [(topic, 0)]
    error = stats.stopped[(topic, 0)]
    size = len(written[0][1])
    assert "TOO_LARGE" in error and f"{size}-byte" in error
    assert f"{topic}-0 offset 5" in error and "max.message.bytes" in error
    assert stats.partitions[(topic, 0)].position == 5       # not past the rejected batch
    assert len(fake.stored(topic, 0)) == 1                  # nothing of it after the fault
    _assert_stored_exactly(fake, topic, {1: written[1]})    # the other partition goes on


def test_batches_waiting_for_an_unknown_target_leader_keep_their_order(source_cluster, topic):
    # A target partition without a leader yet (Kafka right after the topic was created): every
    # batch routed meanwhile waits for the one lookup and is queued in source order. (Each batch
    # used to look the leader up on its own and the lookups, backing off with jitter, finished
    # in any order: the target got the batches reordered, with sequences to match.)
    async def main():
        written = await write_source_batches(source_cluster, topic, 1, 8)
        async with FakeTargetCluster({topic: 1}) as fake:
            fake.leaders[(topic, 0)] = -1

            async def elect_after_a_few_lookups() -> None:
                while fake.metadata_requests < 4:
                    await asyncio.sleep(0.01)
                fake.leaders[(topic, 0)] = 1

            electing = asyncio.create_task(elect_after_a_few_lookups())
            engine = await _mirror(source_cluster, fake, topic, _caught_up(topic, {0: 40}))
            await electing
            return written, fake, engine

    written, fake, engine = asyncio.run(main())
    _assert_stored_exactly(fake, topic, written)
    _assert_offset_map_exact(engine, fake, topic, 1)
    assert fake.producer_ids == [1000]


def test_stopping_with_requests_in_flight_drops_them_with_one_line(source_cluster, topic, caplog,
                                                                 monkeypatch):
    # A target that stops answering (what a real broker cannot be made to do): the engine stops
    # with Produce requests in flight on its open connection, answered (if ever) in a done
    # callback rather than a task the shutdown could cancel. They are dropped as the engine
    # stops: one line says how many, no resend warning when the connection then closes, no
    # error, no acknowledgement after the final commit, nothing left counted in flight.
    caplog.set_level(logging.INFO)
    in_flight_at_stop: list[int] = []
    abandon = Sink.abandon_requests

    def recording_abandon(sink: Sink) -> None:
        in_flight_at_stop.append(len(sink.waiting))
        abandon(sink)

    monkeypatch.setattr(Sink, "abandon_requests", recording_abandon)

    async def main():
        await write_source_batches(source_cluster, topic, 2, 4)
        loop_errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _l, ctx: loop_errors.append(ctx))
        async with FakeTargetCluster({topic: 2}) as fake:
            fake.answer_produce = False
            # request.timeout.ms (engine): how long shutdown waits for answers; the connection's
            # own request timeout is given as 30 s (given only to the engine, it would be the
            # connection's too), so the requests are still in flight at the stop.
            engine = await _mirror(source_cluster, fake, topic,
                                   lambda _e: fake.produce_requests >= 1,
                                   target_config={"request.timeout.ms": 30000},
                                   **{"request.timeout.ms": 1000})
        await asyncio.sleep(0.1)         # let any late callback run
        return fake, engine, loop_errors

    fake, engine, loop_errors = asyncio.run(main())
    assert fake.produce_requests >= 1 and sum(in_flight_at_stop) >= 1, \
        "requests were in flight on the open connection when the engine stopped"
    for sink in engine.sinks.values():
        assert sink.requests_in_flight == 0 and not sink.waiting
        assert all(tq.in_flight == 0 and not tq.failed for tq in sink.partitions.values())
    assert all(not engine.offset_map(topic, p).rows() for p in range(2))   # nothing acked
    assert not engine.stats().stopped
    assert loop_errors == []
    noise = [r.getMessage() for r in caplog.records
             if r.levelno >= logging.WARNING or "resent" in r.getMessage()]
    # One line says what was given up (the next start mirrors it again); nothing else.
    assert len(noise) == 1 and noise[0].startswith("cluster source -> target: ") and \
        noise[0].endswith("batches still unacknowledged after request.timeout.ms=1000 at "
                          "shutdown; abandoned, not committed (the next start mirrors them "
                          "again)"), noise
