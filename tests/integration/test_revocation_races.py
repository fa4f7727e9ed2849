"""A partition revoked while resume's start is under way is not fetched by anyone after.

Resume from the target (the default) starts assigned partitions in a task of its own: it reads
the target, commits the start positions, then attaches the partitions to the fetch loops. A
revocation keeps the partition in the engine's dict while its in-flight batches settle and its
position is committed; resume, finishing its commit then, saw the entry and attached the revoked
partition again. That ownership fetched and forwarded on after the revocation, beside the next
owner (seen on Kafka 3.7 with group.protocol=consumer, where the engine was later given the
partition back and the stale batches' acknowledgements reached the new ownership: IndexError).

A scripted membership makes the timing exact on a real broker: it holds resume's commit, the
test revokes one partition, and the commit is let go while the revocation waits for the
source's metadata (its replaced-topic check)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from engine_support import create_target, group, load_topic, until

from shallowmirror.engine import BatchAbandonedError, BatchForwarder, MirrorEngine
from shallowmirror.engine.membership import Positions
from shallowmirror.testing.topics import read_topic

pytestmark = pytest.mark.integration

TP = tuple[str, int]


class HeldCommits:
    """A membership driven by the test: partitions are assigned and revoked by calling the
    engine's callbacks; commits wait until ``release`` (then every later one settles at once)."""

    def __init__(self, source_config: Mapping[str, Any], *, mode: str, on_assigned: Any,
                 on_revoked: Any, **_: Any) -> None:
        self.mode = mode
        self.on_assigned, self.on_revoked = on_assigned, on_revoked
        self.held: list[concurrent.futures.Future] = []
        self.holding = True
        self.ended = False
        self.last_error: str | None = None

    def start(self, topics: Sequence[str]) -> None:
        return None

    def set_topics(self, topics: Sequence[str]) -> None:
        return None

    def set_partitions(self, partitions: Sequence[TP]) -> None:
        return None

    def commit(self, offsets: Mapping[TP, int]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self.holding:
            self.held.append(future)
        else:
            future.set_result(None)
        return future

    def release(self) -> None:
        self.holding = False
        held, self.held = self.held, []
        for future in held:
            future.set_result(None)

    async def close(self, final_offsets: Mapping[TP, int]) -> None:
        self.release()
        self.ended = True


@pytest.mark.parametrize("again", [False, True], ids=["revoked", "revoked and assigned again"])
def test_a_partition_revoked_during_resumes_start_commit_is_not_fetched_after(
        source_cluster, target_cluster, unique_topic, again: bool):
    """Revoked: nothing of it reaches the target. Assigned back to the same engine afterwards:
    mirrored once from the position the revocation committed, its copy exact (the revoked
    ownership fetching beside it wrote each record twice, or failed the engine)."""
    topic = unique_topic("revoke-resume")
    load_topic(source_cluster, topic, 2000, partitions=2)
    create_target(target_cluster, topic, 2)
    memberships: list[HeldCommits] = []

    def factory(*args: Any, **kwargs: Any) -> HeldCommits:
        memberships.append(HeldCommits(*args, **kwargs))
        return memberships[-1]

    async def scenario() -> tuple[Any, bool]:
        engine = MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                              topics=[topic], membership_factory=factory,
                              settings={"partition.assignment": "group", "group.id": group(),
                                        "fetch.max.wait.ms": 100})
        stop = asyncio.Event()
        run = asyncio.create_task(engine.run(stop))
        try:
            assert await until(lambda: engine.ready or run.done(), 30)
            assert not run.done(), run.exception()
            membership = memberships[0]
            tps = [(topic, 0), (topic, 1)]
            await membership.on_assigned(tps, Positions({tp: None for tp in tps}))
            assert await until(lambda: bool(membership.held), 30), "resume never committed"
            revoking = asyncio.create_task(membership.on_revoked([(topic, 1)], True))
            for _ in range(3):                 # into its metadata lookup
                await asyncio.sleep(0)
            assert not revoking.done()
            membership.release()               # resume attaches what it still owns
            released = await revoking
            if again:
                await membership.on_assigned([(topic, 1)], Positions(released))
            assert await engine.wait_caught_up(60)
            # Long enough for a wrongly attached partition 1 to be fetched and forwarded.
            await asyncio.sleep(1.0)
            return engine.stats(), (topic, 1) in engine.partitions
        finally:
            stop.set()
            await asyncio.gather(run, return_exceptions=True)

    stats, owned = asyncio.run(scenario())
    assert owned == again
    copies = read_topic(target_cluster.client_config(), topic)
    source = read_topic(source_cluster.client_config(), topic)
    assert len(copies.get(0, [])) == len(source[0]) and stats.partitions[(topic, 0)].lag == 0
    if not again:
        assert copies.get(1, []) == [], f"{len(copies[1])} records of the revoked partition"
        return
    assert [_content(r) for r in copies.get(1, [])] == [_content(r) for r in source[1]]


def _content(record: Any) -> tuple:
    return (record.key, record.value, record.headers, record.timestamp_ms)


def _forwarder(source_cluster, target_cluster, topic: str, memberships: list) -> BatchForwarder:
    def factory(*args: Any, **kwargs: Any) -> HeldCommits:
        membership = HeldCommits(*args, **kwargs)
        membership.holding = False
        memberships.append(membership)
        return membership

    return BatchForwarder(source_cluster.client_config(), target_cluster.client_config(),
                          topics=[topic], membership_factory=factory,
                          settings={"partition.assignment": "group", "group.id": group(),
                                    "fetch.max.wait.ms": 100})


def test_a_forwarder_program_learns_of_batches_its_revoked_partition_abandoned(
        source_cluster, target_cluster, unique_topic):
    """A program forwarding a batch it holds after the batch's partition was revoked gets
    ``BatchAbandonedError`` naming the batch, at once (the batch was queued and dropped unsent:
    the future never resolved); the batches of that partition still waiting to be handed out
    are not handed out."""
    topic = unique_topic("revoke-forwarder")
    load_topic(source_cluster, topic, 4000, partitions=2, batch_bytes=16384)
    create_target(target_cluster, topic, 2)
    memberships: list[HeldCommits] = []

    async def scenario() -> tuple:
        forwarder = _forwarder(source_cluster, target_cluster, topic, memberships)
        await forwarder.start()
        try:
            membership = memberships[0]
            tps = [(topic, 0), (topic, 1)]
            await membership.on_assigned(tps, Positions({tp: None for tp in tps}))
            held: dict[int, Any] = {}
            while len(held) < 2:
                batch = await forwarder.next_batch(30)
                assert batch is not None
                if batch.partition in held:
                    forwarder.drop(batch)
                held.setdefault(batch.partition, batch)
            await membership.on_revoked([(topic, 1)], False)
            with pytest.raises(BatchAbandonedError) as abandoned:
                await asyncio.wait_for(forwarder.forward(held[1], topic, 1), 10)
            with pytest.raises(ValueError, match="already forwarded"):
                forwarder.forward(held[1], topic, 1)
            assert await asyncio.wait_for(forwarder.forward(held[0], topic, 0), 10) >= 0
            # New records on both: partition 0's are handed out, partition 1's are not fetched.
            await asyncio.to_thread(load_topic, source_cluster, topic, 1000, partitions=2,
                                    create_topic=False, seed=5)
            later = []
            wait_s = 15.0                      # for the new records' first fetch, then less
            while (batch := await forwarder.next_batch(wait_s)) is not None:
                later.append(batch.partition)
                forwarder.drop(batch)
                wait_s = 2.0
            return str(abandoned.value), held[1], later
        finally:
            await forwarder.stop()

    text, batch, later = asyncio.run(scenario())
    assert f"topic-partition {topic}-1, offset {batch.source_base}" in text, text
    assert "revoked" in text and "next owner" in text, text
    assert later and set(later) == {0}, later


def test_every_forwarded_batch_of_a_stopped_partition_resolves(source_cluster, target_cluster,
                                                               unique_topic):
    """A batch forwarded to a partition the target lacks stops its source partition; the
    batches forwarded after it and not yet written were abandoned unsent and their futures
    never resolved (a program gathering them waited for ever). Each now fails with the
    partition's error (those sent before the stop are written: which ones is timing)."""
    topic = unique_topic("stopped-forwarder")
    load_topic(source_cluster, topic, 3000, partitions=1, batch_bytes=16384)
    create_target(target_cluster, topic, 1)

    async def scenario() -> list:
        forwarder = BatchForwarder(source_cluster.client_config(),
                                   target_cluster.client_config(), topics=[topic],
                                   settings={"fetch.max.wait.ms": 100})
        await forwarder.start()
        try:
            futures = []
            for i in range(30):
                batch = await forwarder.next_batch(30)
                assert batch is not None
                futures.append(forwarder.forward(batch, topic, 5 if i == 3 else 0))
            return await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), 30)
        finally:
            await forwarder.stop()

    results = asyncio.run(scenario())        # all resolved: the gather ended
    assert isinstance(results[3], Exception) and "no partition 5" in str(results[3]), results[3]
    # The others were written (sent before the stop: their target offsets) or were abandoned
    # by it (queued behind it, or in flight): then they carry the partition's error.
    others = results[:3] + results[4:]
    failed = [r for r in others if not isinstance(r, int)]
    assert all(isinstance(r, Exception) and "no partition 5" in str(r) for r in failed), failed
    written = [r for r in others if isinstance(r, int)]
    assert written == sorted(set(written)), written     # each at its own target offset
