"""Exact resume from the target (``resume.from.target=true``, the default): after a restart, a
kill or a rebalance, fetching starts after the last source batch already on the target, not at
the committed offset - so what the previous owner copied after its last commit is not copied again.

Why it can be exact: a shallow mirror writes one target batch per source data batch, in order,
whose records section is the source batch's byte for byte (``engine.pairing``). So the target
partition's tail says exactly which source batches are there.

Commit metadata (the pair that anchors the walk)
------------------------------------------------
Every source offset commit carries, in the commit's metadata string, the target position that
goes with a source position at or below the committed offset::

    shallowmirror.resume/1 source=<S> target=<target topic>:<target partition>@<T>

meaning: every batch the mirror forwarded from source offsets below ``S`` is on the target below
``T``, and the copy of the first forwarded batch at or after ``S`` (if any) starts at ``T``.
``S`` is the committed offset itself, except when the target did not say where the last batch
went (tansu's DUPLICATE_SEQUENCE_NUMBER answer): then the last known pair is kept (``S`` below the
committed offset; the walk just reads a little more). ``/1`` is the format version: metadata of
another version, of another tool, or unreadable is reported per partition and resume falls back
to the committed offset for that partition.

On assignment (start, restart, rebalance), per partition::

    source  ... | b7 | b8 | b9 | b10 | b11 | ...        committed offset = S = start of b8
                       |    |    |
    target  ... | b7'| b8'| b9'|  <- end (high watermark when read)
                  T ^
    walk: b8' == b8, b9' == b9 (record count, offset delta, timestamps, codec, records section;
          re-packed batches record by record), target ends -> fetching starts at b10.

Anything else refuses the partition with ``ResumeRefusedError`` (it stops, nothing of it is
forwarded, the committed offset and its metadata stay): a target batch that is not the copy of
the next source batch (another writer on the target, a changed source), target batches beyond
the source's end, a target that no longer holds ``T`` (truncated, re-created, trimmed by
retention), or a target that ends before batches below the committed offset. The way out, once
understood, is ``resume.from.target=false`` for the flow (at-least-once from the committed
offset) or resetting the group's offsets.

First start (no committed offset): the start position is committed at once with the target
partition's end (ListOffsets latest) as its pair, before any batch moves, so a kill before the
first periodic commit resumes exactly too.

Falls back to the committed offset (at-least-once, logged once per assignment): no metadata
(a commit by an older version, a broker that does not keep commit metadata - tansu
0.6 answers OffsetFetch with empty metadata; or a bare start a member committed when revoked
before its first start was committed), metadata for another target partition (the replication
policy changed), or source records from ``S`` deleted by retention. The first two are anchored
as a first start is, so only what was copied before this owner is copied twice: a kill of this
owner leaves the next one a pair to walk from.

Safety rule: a race with an old owner still finishing may at worst cause a duplicate, never a
skipped record. Fetching starts after a source batch only if its copy was *read* on the target,
at the position the walk expected, before fetching starts. Whatever the old owner writes later (a
rebalance's in-flight batches, a request the broker completes after a ``kill -9``) was not read,
so the new owner fetches and writes it too: a duplicate. A skip would need a copy that was read
and then disappears (a target that loses acknowledged data, e.g. ``acks=1`` and an unclean
leader election: outside what any producer can guarantee), or a target batch that matches the
wrong source batch - impossible, because the walk is positional from a pair the mirror itself
recorded, and a hole in the old owner's writes (a later batch landing after an earlier one
failed) shows as a mismatch, which refuses rather than skips. A stale pair (an older commit) only
makes the walk longer; a commit made by a zombie after the group moved on is rejected by the
group coordinator (its generation is old).

Start-up: ``ResumeStart`` holds assigned partitions unfetched while their target tails are read
(retried through retriable errors; a refusal stops the partition), moves each past what is there,
commits the moved positions, then lets them all fetch (``EngineCore._on_assigned`` calls it).

Cost: one read of the target from ``T`` to its end - at most what was written since the last
commit (``offset.commit.interval.ms``) plus what was in flight - and of as many source batches.

Out of scope: ``BatchForwarder`` programs (they route each batch themselves, so no target
partition goes with a source partition: ``EngineCore.routes_by_partition`` is False); transactional
exactly-once flows, which resume from the target-side group instead (``EngineCore.run`` builds no
``TargetResume`` when ``exactly_once`` is on).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

from kafka import errors as Errors

from shallowmirror.engine.batch import SourcePartition, still_owned
from shallowmirror.engine.membership import Membership, Positions
from shallowmirror.engine.offsets import MapRow, OffsetMap
from shallowmirror.engine.pairing import (
    BatchCursor,
    PartitionReader,
    compare_forwarded,
    match_rebuilt,
    needs_rebuild,
)
from shallowmirror.engine.runtime import Runtime
from shallowmirror.engine.source import Sources, list_offset
from shallowmirror.errors import BrokerError, ConnectionFailedError, LocatedError, Where
from shallowmirror.net import Cluster

log = logging.getLogger(__name__)

TP = tuple[str, int]

METADATA_PREFIX = "shallowmirror.resume/"
METADATA_VERSION = 1
_V1 = re.compile(r"source=(?P<source>\d+) target=(?P<topic>[A-Za-z0-9._-]+):(?P<partition>\d+)"
                 r"@(?P<target>\d+)")
#: Partitions resumed at once (each holds two readers' responses).
RESUMES_IN_FLIGHT = 8


class ResumeRefusedError(LocatedError):
    """The target partition does not hold what the commit metadata says the mirror wrote there
    (another writer, a truncated or re-created target): the partition is stopped."""


@dataclass(frozen=True)
class ResumePoint:
    """Source position ``source_offset`` goes with target position ``target_offset`` of
    ``target_topic``-``target_partition`` (see the module docstring)."""

    source_offset: int
    target_topic: str
    target_partition: int
    target_offset: int

    def encode(self) -> str:
        return (f"{METADATA_PREFIX}{METADATA_VERSION} source={self.source_offset} "
                f"target={self.target_topic}:{self.target_partition}@{self.target_offset}")


def parse_metadata(text: str | None) -> tuple[ResumePoint | None, str | None]:
    """(point, None), or (None, why it cannot be used), or (None, None) when there is none."""
    if not text:
        return None, None
    if not text.startswith(METADATA_PREFIX):
        return None, f"the commit metadata is not shallowmirror's ({text[:60]!r})"
    version, _, rest = text[len(METADATA_PREFIX):].partition(" ")
    if version != str(METADATA_VERSION):
        return None, (f"the commit metadata has format version {version[:10]!r}; this version "
                      f"reads {METADATA_VERSION}")
    match = _V1.fullmatch(rest)
    if match is None:
        return None, f"the commit metadata is unreadable ({text[:80]!r})"
    return ResumePoint(int(match["source"]), match["topic"], int(match["partition"]),
                       int(match["target"])), None


@dataclass
class ResumeOutcome:
    """Where fetching starts, and what was found on the target."""

    position: int
    point: ResumePoint | None            # the pair that goes with ``position`` (None: unknown)
    rows: list[MapRow] = field(default_factory=list)   # batches found on the target
    records: int = 0
    target_bytes: int = 0
    fallback: str | None = None          # why resume fell back to the committed offset
    #: The target topic the committed offset was mirrored into, when it is another topic than
    #: this run's (a new mapping on the same group: it starts at the old mapping's offsets).
    other_topic: str | None = None


@dataclass
class _Owned:
    """Per owned partition: where this ownership started and the last pair committed."""

    target: TP
    start: int                           # rows below this are from an earlier ownership
    last: ResumePoint | None


class TargetResume:
    """Resume positions on assignment, and the commit metadata that makes them exact."""

    def __init__(self, source: Cluster, target: Cluster, *, group_id: str,
                 read_committed: bool) -> None:
        self.source, self.target = source, target
        self.group_id = group_id
        self.read_committed = read_committed
        self._owned: dict[TP, _Owned] = {}
        self._slots = asyncio.Semaphore(RESUMES_IN_FLIGHT)

    # ---- commit side ----
    def commit_metadata(self, tp: TP, committed: int, offset_map: OffsetMap) -> str | None:
        """The metadata to commit with ``committed`` for ``tp`` (None: nothing known yet)."""
        owned = self._owned.get(tp)
        if owned is None:
            return None
        if owned.last is not None and owned.last.source_offset > committed:
            # The committed offset went below the pair: the partition's offsets started anew
            # (its topic deleted and created again). The pair names records that no longer
            # exist; committed beside the new offset, the next owner would walk from its
            # source offset and skip the new topic's records below it (seen on Kafka 3.7: the
            # first 100 of a re-created topic). This ownership starts again from here.
            owned.last = None
            owned.start = committed
        point = self._point_at(owned, committed, offset_map)
        if point is not None:
            owned.last = point
        return owned.last.encode() if owned.last is not None else None

    @staticmethod
    def _point_at(owned: _Owned, committed: int, offset_map: OffsetMap) -> ResumePoint | None:
        row = offset_map.row_before(committed)
        if row is not None and row.source_base >= owned.start:
            if row.target_base is None:          # target did not say where it went
                return None
            target_offset = row.target_base + min(committed, row.source_end) - row.source_base
            return ResumePoint(committed, *owned.target, target_offset)
        last = owned.last
        if last is not None and owned.start <= last.source_offset <= committed:
            # Nothing forwarded since the last pair of this ownership: only gaps (control
            # batches, aborted transactions), so the target position is the same.
            return replace(last, source_offset=committed)
        return None

    @staticmethod
    def stored_point(target: TP, metadata: str | None) -> ResumePoint | None:
        """The pair in ``metadata`` if it is for ``target`` (else None)."""
        point, _ = parse_metadata(metadata)
        if point is None or (point.target_topic, point.target_partition) != target:
            return None
        return point

    def release(self, tp: TP) -> None:
        """``tp`` was revoked."""
        self._owned.pop(tp, None)

    def keep(self, tp: TP, target: TP, start: int, point: ResumePoint | None) -> None:
        """Own ``tp`` from ``start`` on; ``point``: the pair to commit until batches move (a
        refused partition keeps its old pair, so a restart refuses it again)."""
        self._owned[tp] = _Owned(target, start, point)

    # ---- assignment side ----
    async def first_start(self, tp: TP, target: TP, position: int) -> ResumeOutcome:
        """No committed offset: start at ``position``, anchored (see ``_anchored``)."""
        return await self._anchored(target, position, None)

    async def _anchored(self, target: TP, position: int, fallback: str | None) -> ResumeOutcome:
        """Start at ``position`` with (``position``, the target's end now) as the pair, committed
        before any batch moves: a kill before the first periodic commit then resumes exactly.
        For a first start, and for a fallback to the committed offset - without the pair, a
        kill of this owner before its first periodic commit would make the next owner fall back
        too, and copy again everything this one copied (a two-process group killed in turn
        piled up 11,616 duplicates that way, from one bare commit of a member revoked at once).
        A target partition that does not exist yet gives no pair (the first periodic commit
        brings one)."""
        try:
            end = await list_offset(self.target, target, -1)
        except BrokerError as err:
            if err.code != Errors.UnknownTopicOrPartitionError.errno:
                raise
            return ResumeOutcome(position, None, fallback="the target partition does not exist")
        return ResumeOutcome(position, ResumePoint(position, *target, end), fallback=fallback)

    async def resume(self, tp: TP, target: TP, committed: int,
                     metadata: str | None) -> ResumeOutcome:
        """Where ``tp`` starts: after the last source batch already on ``target``."""
        point, problem = parse_metadata(metadata)
        if point is None:
            return await self._anchored(target, committed, problem or (
                "no target position in the commit metadata (first start, a commit by an older "
                "version, or a broker that keeps no commit metadata)"))
        if (point.target_topic, point.target_partition) != target:
            outcome = await self._anchored(target, committed, (
                f"the commit metadata is for target {point.target_topic}-"
                f"{point.target_partition}; this flow now writes to {target[0]}-{target[1]}"))
            if point.target_topic != target[0]:
                outcome.other_topic = point.target_topic
            return outcome
        if point.source_offset > committed:
            return ResumeOutcome(committed, None, fallback=(
                f"the commit metadata is for source offset {point.source_offset}, above the "
                f"committed offset {committed} (offsets reset by hand?)"))
        async with self._slots:
            return await _Walk(self, tp, point, committed).run()


class _Walk:
    """One partition's walk (see the module drawing)."""

    def __init__(self, owner: TargetResume, tp: TP, point: ResumePoint, committed: int) -> None:
        self.owner, self.tp, self.point, self.committed = owner, tp, point, committed
        self.src = BatchCursor(PartitionReader(
            owner.source, tp[0], tp[1], read_committed=owner.read_committed,
            drop_aborted=owner.read_committed, from_offset=point.source_offset))
        self.tgt = BatchCursor(PartitionReader(
            owner.target, point.target_topic, point.target_partition, read_committed=False,
            drop_aborted=False, from_offset=point.target_offset))
        self.outcome = ResumeOutcome(point.source_offset, point)

    async def run(self) -> ResumeOutcome:
        try:
            await self._check_target_start()
            try:
                await self.src.peek()
            except BrokerError as err:
                if err.code != Errors.OffsetOutOfRangeError.errno:
                    raise
                return ResumeOutcome(self.committed, None, fallback=(
                    f"the source no longer holds offset {self.point.source_offset} (retention?), "
                    "so the target cannot be matched"))
            await self._match()
            await self._check_committed_prefix_found()
        finally:
            await self.src.close()
            await self.tgt.close()
        return self.outcome

    async def _check_target_start(self) -> None:
        try:
            await self.tgt.peek()
        except BrokerError as err:
            if err.code != Errors.OffsetOutOfRangeError.errno:
                raise
            raise self._refused(self.point.target_offset, (
                f"the target partition no longer holds offset {self.point.target_offset}, where "
                f"the mirror's copy of source offset {self.point.source_offset} on starts "
                "(target truncated, re-created or trimmed by retention?)")) from err

    async def _match(self) -> None:
        start = self.point.source_offset
        while (t := await self.tgt.peek()) is not None:
            s = await self.src.take()
            if s is None:
                raise self._refused(t.base_offset, (
                    f"target batch at offset {t.base_offset} has no source batch: the source "
                    f"ends at offset {self.src.reader.position} (another writer on the target?)"))
            if needs_rebuild(s, start):
                match = await match_rebuilt(s, start, self.tgt)
                if match.exhausted and s.next_offset > self.committed:
                    return          # part of a re-packed batch: sent again whole (a duplicate)
                if match.exhausted:
                    raise self._refused(self.tgt.reader.position, (
                        f"the target ends inside the copy of the re-packed source batch at "
                        f"offset {s.base_offset}, below the committed offset {self.committed} "
                        "(target truncated?)"))
                if match.reason is not None:
                    raise self._refused(match.first_target, self._not_a_copy(
                        s.base_offset, match.first_target, match.reason))
                self._found(max(s.base_offset, start), s.next_offset, match.wanted,
                            match.first_target, match.got, match.target_bytes)
                continue
            await self.tgt.take()
            reason = compare_forwarded(s, t)
            if reason is not None:
                raise self._refused(t.base_offset, self._not_a_copy(s.base_offset,
                                                                    t.base_offset, reason))
            self._found(s.base_offset, s.next_offset, s.record_count, t.base_offset,
                        t.record_count, t.size)

    def _found(self, source_base: int, source_next: int, records: int, target_base: int | None,
               target_records: int, target_bytes: int) -> None:
        out = self.outcome
        assert target_base is not None
        out.rows.append(MapRow(source_base, records, target_base))
        out.records += records
        out.target_bytes += target_bytes
        out.position = source_next
        out.point = replace(self.point, source_offset=source_next,
                            target_offset=target_base + target_records)

    async def _check_committed_prefix_found(self) -> None:
        """Source batches below the committed offset were acknowledged: they must have been
        found on the target (the walk ended because the target did). Only their records from
        the pair on count: a pair anchored inside a batch (a fallback to a committed offset
        there) says nothing of the records before it."""
        s = await self.src.peek()
        if s is None or max(s.base_offset, self.point.source_offset) >= self.committed:
            return
        raise self._refused(self.tgt.reader.position, (
            f"the target ends at offset {self.tgt.reader.position} without the copy of source "
            f"batch at offset {s.base_offset}, below the committed offset {self.committed} "
            "(target truncated?)"))

    def _not_a_copy(self, source_offset: int, target_offset: int | None, reason: str) -> str:
        return (f"target batch at offset {target_offset} is not the mirror's copy of source "
                f"batch at offset {source_offset}: {reason} (another writer on the target, or "
                "the source changed)")

    def _refused(self, target_offset: int | None, reason: str) -> ResumeRefusedError:
        owner = self.owner
        return ResumeRefusedError(
            f"resume refused for {self.tp[0]}-{self.tp[1]} of source cluster {owner.source.alias} "
            f"(committed offset {self.committed}, commit metadata of group {owner.group_id}: "
            f"source offset {self.point.source_offset} is target offset "
            f"{self.point.target_offset}): {reason}. Nothing is forwarded from this partition; "
            "if the target is right as it is, set resume.from.target=false for this flow to "
            "mirror from the committed offset (duplicates possible)",
            Where(cluster=owner.target.alias, topic=self.point.target_topic,
                  partition=self.point.target_partition, offset=target_offset))


def fallback_summary(fallbacks: Mapping[TP, str]) -> str:
    """One log line for every partition that starts at its committed offset."""
    by_reason: dict[str, list[str]] = {}
    for (topic, partition), why in sorted(fallbacks.items()):
        by_reason.setdefault(why, []).append(f"{topic}-{partition}")
    return "; ".join(f"{why}: {', '.join(tps)}" for why, tps in by_reason.items())


class ResumeStart:
    """Starts assigned partitions under resume (``EngineCore._on_assigned``): each is held
    unfetched, the target's tail is read, each moves past what the target holds, the moved
    positions are committed, then all are fetched together."""

    def __init__(self, resume: TargetResume, runtime: Runtime, sources: Sources,
                 partitions: Mapping[TP, SourcePartition], *, where: Callable[[TP], str],
                 source_alias: str, group_id: str) -> None:
        self.resume, self.runtime, self.sources = resume, runtime, sources
        #: The engine's owned partitions (the same dict): one no longer there was revoked.
        self.partitions = partitions
        self.where = where
        self.source_alias, self.group_id = source_alias, group_id

    def hold(self, sp: SourcePartition, target: TP, metadata: str | None) -> None:
        """Until the target's tail is read: not fetched, and commits keep the stored pair."""
        self.resume.keep(sp.tp, target, sp.offsets.committed,
                         self.resume.stored_point(target, metadata))
        sp.paused = True

    async def run(self, items: list[tuple[SourcePartition, TP]], metadata: Mapping[TP, str],
                  first: set[TP], membership: Membership | None,
                  positions: Callable[[Mapping[TP, int]], Positions]) -> None:
        """Start each partition after the last source batch already on the target;
        a partition without a committed offset (in ``first``) first commits its start with the
        target's end. ``positions`` adds the commit metadata to what ``membership`` commits."""
        resume = self.resume

        def attempt(sp: SourcePartition, target: TP) -> Callable[[], Awaitable[ResumeOutcome]]:
            if sp.tp in first:
                return lambda: resume.first_start(sp.tp, target, sp.offsets.committed)
            return lambda: resume.resume(sp.tp, target, sp.offsets.committed,
                                         metadata.get(sp.tp))

        started_at = time.monotonic()
        outcomes = await asyncio.gather(*(self._with_retries(sp, attempt(sp, target))
                                          for sp, target in items))
        walked = [o for o in outcomes if o is not None and o.fallback is None and o.rows]
        if walked:
            log.info("resume from the target: %d of %d partitions read in %.0f ms (%d "
                             "target bytes matched)", len(walked), len(items),
                             (time.monotonic() - started_at) * 1000,
                             sum(o.target_bytes for o in walked))
        fallbacks: dict[TP, str] = {}
        anchored: set[TP] = set()         # fallbacks with a pair made now (``_anchored``)
        elsewhere: dict[str, str] = {}   # this run's target topic -> the one committed into
        started = []
        for (sp, target), outcome in zip(items, outcomes, strict=True):
            if outcome is None or not still_owned(self.partitions, sp) or self.runtime.stopping:
                continue                  # stopped, or revoked while reading
            if outcome.other_topic is not None:
                elsewhere[target[0]] = outcome.other_topic
            if outcome.fallback is not None and sp.tp not in first:
                fallbacks[sp.tp] = outcome.fallback
            if outcome.fallback is not None and outcome.point is not None:
                anchored.add(sp.tp)
            self._start_resumed(sp, target, outcome)
            started.append(sp)
        if elsewhere:
            shown = ", ".join(f"{old} (now {new})" for new, old in sorted(elsewhere.items()))
            log.warning("cluster %s, group %s: its committed offsets were made mirroring into "
                        "other target topics: %s; this run starts at them, so the records "
                        "before them are not copied to the new topics (give a new mapping its "
                        "own group.id to copy from the start)", self.source_alias,
                        self.group_id, shown)
        if fallbacks:
            log.info("cluster %s, group %s: starting at the committed offset (batches "
                             "copied after the last commit may be mirrored twice): %s",
                             self.source_alias, self.group_id, fallback_summary(fallbacks))
        # Committed before any batch moves (first starts and fallbacks: the start with the
        # target's end; resumed partitions: past what the target holds), so the next owner's
        # walk is short.
        now = {sp.tp: sp.offsets.committed for sp in started
               if sp.tp in first or sp.tp in anchored
               or sp.offsets.committed != sp.last_committed_sent}
        if now and membership is not None:
            try:
                await asyncio.wrap_future(membership.commit(positions(now)))
                for sp in started:
                    sp.last_committed_sent = now.get(sp.tp, sp.last_committed_sent)
            except Exception as err:  # noqa: BLE001 - the periodic commit carries it later
                log.warning("commit of %d resumed positions to %s failed: %s", len(now),
                                    self.source_alias, err)
        self.runtime.startup.mark("target read")
        for sp in started:
            # Revoked (or re-assigned: a new SourcePartition) while the commit was under way:
            # fetching it would give the partition a second writer.
            if not still_owned(self.partitions, sp) or self.runtime.stopping:
                continue
            sp.paused = False
            self.sources.attach(sp)
        self.runtime.progress.notify()

    async def _with_retries(self, sp: SourcePartition,
                            attempt: Callable[[], Awaitable[ResumeOutcome]]
                            ) -> ResumeOutcome | None:
        """One partition's resume (or first start), retried through connection failures and
        retriable broker errors while the partition is owned; None once it is stopped."""
        backoff = self.runtime.backoff()
        while True:
            try:
                return await attempt()
            except (ConnectionFailedError, BrokerError) as err:
                if isinstance(err, ConnectionFailedError) or err.retriable:
                    delay = backoff.next_s()
                    log.warning("%s: reading the target to resume failed (%s); "
                                        "retrying in %.1fs", self.where(sp.tp), err, delay)
                    await asyncio.sleep(delay)
                    if not still_owned(self.partitions, sp) or self.runtime.stopping:
                        return None
                    continue
                error: BaseException = err
            except ResumeRefusedError as err:
                error = err
            if still_owned(self.partitions, sp):
                self.sources.stop_partition(sp, error)
            return None

    def _start_resumed(self, sp: SourcePartition, target: TP, outcome: ResumeOutcome) -> None:
        """Move ``sp`` past what the target already holds and record those batches."""
        committed = sp.offsets.committed
        position = max(committed, outcome.position)
        if position > committed:
            sp.offsets.add_gap(position)
        if outcome.rows:
            sp.offsets.offset_map.forget_from(outcome.rows[0].source_base)
            for row in outcome.rows:
                sp.offsets.offset_map.add(row)
            sp.offsets.offset_map.seal()     # what this ownership forwards: rows of its own
        self.resume.keep(sp.tp, target, position, outcome.point)
        if outcome.fallback is None and outcome.rows:
            log.info("%s: resumed from the target: %d batches (%d records, %d bytes) "
                             "from source offset %d already on %s-%d; fetching starts at %d "
                             "(committed %d)", self.where(sp.tp), len(outcome.rows),
                             outcome.records, outcome.target_bytes, outcome.rows[0].source_base,
                             target[0], target[1], position, committed)
