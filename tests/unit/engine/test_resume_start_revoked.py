"""A partition revoked while resume's start commit is under way is not fetched afterwards.

``ResumeStart.run`` reads the target, commits the start positions, then attaches the partitions
to the fetch loops. It checked ownership before the commit only: a partition revoked (or revoked
and assigned again, as a new ``SourcePartition``) while the commit was awaited was attached
anyway, so the revoked ownership went on fetching beside the partition's next owner, and in
the same engine its acknowledgements reached the new ownership's offsets (seen with
group.protocol=consumer: IndexError in ``PartitionOffsets.ack``)."""

from __future__ import annotations

import asyncio
import concurrent.futures

from shallowmirror.engine.batch import SourcePartition
from shallowmirror.engine.config import resolve_settings
from shallowmirror.engine.offsets import OffsetMap
from shallowmirror.engine.resume import ResumeOutcome, ResumeStart
from shallowmirror.engine.runtime import Runtime

TOPIC = "t"


class _Resume:
    """The target reads answer at once: start where the committed offset is."""

    def keep(self, *args) -> None:
        return None

    def stored_point(self, target, metadata):
        return None

    async def first_start(self, tp, target, committed):
        return ResumeOutcome(position=committed, point=None)


class _Sources:
    def __init__(self) -> None:
        self.attached: list[SourcePartition] = []

    def attach(self, sp: SourcePartition) -> None:
        self.attached.append(sp)


class _Membership:
    """Commits wait until the test lets them finish."""

    def __init__(self) -> None:
        self.pending: list[concurrent.futures.Future] = []

    def commit(self, offsets) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.pending.append(future)
        return future


async def _start_and_commit(count: int, meanwhile) -> tuple[list, dict]:
    """Resume's start of ``count`` partitions, ``meanwhile(partitions, sps)`` run while its
    commit is held; what it attached, and the partitions it started with."""
    runtime = Runtime(resolve_settings({}), fail=lambda err: None)
    sources, membership = _Sources(), _Membership()
    partitions: dict = {}
    start = ResumeStart(_Resume(), runtime, sources, partitions, where=str,
                        source_alias="source", group_id="g")
    sps = [SourcePartition(TOPIC, p, 0, OffsetMap()) for p in range(count)]
    for sp in sps:
        partitions[sp.tp] = sp
        start.hold(sp, sp.tp, None)
    run = asyncio.create_task(start.run([(sp, sp.tp) for sp in sps], {},
                                        {sp.tp for sp in sps}, membership, lambda o: o))
    while not membership.pending:
        await asyncio.sleep(0)
    meanwhile(partitions, sps)
    membership.pending[0].set_result(None)
    await run
    return sources.attached, {sp.tp: sp for sp in sps}


def test_only_partitions_still_owned_after_the_commit_are_fetched():
    def meanwhile(partitions: dict, sps: list) -> None:
        del partitions[(TOPIC, 1)]                                  # revoked
        partitions[(TOPIC, 2)] = SourcePartition(TOPIC, 2, 0, OffsetMap())  # and assigned again

    attached, sps = asyncio.run(_start_and_commit(3, meanwhile))
    assert attached == [sps[(TOPIC, 0)]]
    assert sps[(TOPIC, 1)].paused and sps[(TOPIC, 2)].paused


def test_a_partition_being_revoked_when_the_commit_ends_is_not_fetched():
    """The revocation keeps the partition in the engine's dict while its in-flight batches
    settle (``EngineCore._on_revoked``): the entry alone said "owned", and resume attached it
    there (seen on Kafka 3.7 with group.protocol=consumer: the revoked ownership fetched on)."""
    def meanwhile(partitions: dict, sps: list) -> None:
        sps[1].revoked = True                     # revocation under way, still in the dict

    attached, sps = asyncio.run(_start_and_commit(2, meanwhile))
    assert [sp.partition for sp in attached] == [0]
    assert sps[(TOPIC, 1)].paused
