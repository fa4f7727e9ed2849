"""Verify a shallow mirror: source and target partitions compared batch by batch, undecompressed.

Alignment
---------
The shallow mirror forwards exactly one target batch per source *data* batch, in order. So the
source partition is read from its log start with the flow's ``isolation.level`` and filtered the
way the engine filters (``codec.filter_batches``: control batches dropped, and under
read_committed the batches of aborted transactions and everything at or past the last stable
offset); empty batches (compaction removed every record) are dropped too. The target partition
is read from its log start (control batches dropped). The two sequences are then zipped::

    source  [data 0-9] [ctrl 10] [data 11-30] [data 31-40, compacted: 3 records] ...
                |                     |              |  re-packed by the deep path
    target  [data 0-9]            [data 10-29]    [data 30-32]                    ...

Each pair is compared as ``shallowmirror.engine.pairing`` describes (the same checks the engine
runs when it resumes from the target): header fields that must survive forwarding and the
records section byte for byte; a batch the engine re-packs through the deep path record by
record, counted as re-packed in the summary.

A source whose log start moved past 0 (retention, DeleteRecords) no longer has the records the
target's first batches copied: the target is read up to the copy of the source's first batch,
the batches before it are counted as older (not compared), and the zip starts there.

A target without the source's head (a mirror that did not start at the source's log start,
``auto.offset.reset=latest``, or a remote topic re-created or trimmed by retention) is a mismatch
at the first batch, said as such when the target's first batch is the copy of a later source
batch; a mirror still running shows as a missing tail. Run verify after
``mirror --exit-when-caught-up``.

Concurrency and memory: ``PARTITIONS_IN_FLIGHT`` partitions of a topic are compared at once (the
brokers' fetch latency overlaps the comparing), each holding one Fetch response per side plus
one prefetched: at most 4 x ``PARTITIONS_IN_FLIGHT`` responses of ``MAX_PARTITION_BYTES``
(32 MiB; a first batch larger than that still comes whole, as Kafka's KIP-74 answers). The mismatch reported is the one in the lowest-numbered partition of the first topic
that has one.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shallowmirror.codec import deep
from shallowmirror.engine.config import resolve_settings
from shallowmirror.engine.pairing import (
    MAX_PARTITION_BYTES,
    BatchCursor,
    PartitionReader,
    compare_forwarded,
    match_rebuilt,
    needs_rebuild,
)
from shallowmirror.errors import ConfigError
from shallowmirror.mirror.config import FlowConfig, MirrorConfig
from shallowmirror.net import Cluster

#: Partitions of one topic compared concurrently.
PARTITIONS_IN_FLIGHT = 4
#: A one-shot check gives up on an unreachable broker sooner than a mirror (120 s): 30 s, as
#: ``shallowmirror offsets`` does, unless the config sets ``reconnect.deadline.ms``.
RECONNECT_DEADLINE_MS = 30_000


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mismatch:
    """The first difference found in one flow's partition: where, on both clusters, and what."""

    flow: str
    source_alias: str
    target_alias: str
    topic: str
    target_topic: str
    partition: int
    source_offset: int | None
    target_offset: int | None
    reason: str

    def __str__(self) -> str:
        source = (f"source {self.source_alias} {self.topic}-{self.partition}"
                  + (f" offset {self.source_offset}" if self.source_offset is not None else ""))
        target = (f"target {self.target_alias} {self.target_topic}-{self.partition}"
                  + (f" offset {self.target_offset}" if self.target_offset is not None else ""))
        return f"flow {self.flow}: {source} / {target}: {self.reason}"


@dataclass
class PartitionTally:
    """What was compared in one partition (or summed over a topic)."""

    batches: int = 0
    records: int = 0
    source_bytes: int = 0
    target_bytes: int = 0
    repacked: int = 0
    dropped: int = 0        # source control/aborted/empty batches the mirror does not forward
    older: int = 0          # target batches of records the source log no longer has

    def pair(self, source: Any, target: Any) -> None:
        """A source batch and its forwarded copy, found equal."""
        self.batches += 1
        self.records += source.record_count
        self.source_bytes += source.size
        self.target_bytes += target.size

    def add(self, other: PartitionTally) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class TopicResult:
    flow: str
    topic: str
    target_topic: str
    partitions: int
    tally: PartitionTally = field(default_factory=PartitionTally)


@dataclass
class VerifyResult:
    topics: list[TopicResult] = field(default_factory=list)
    mismatch: Mismatch | None = None
    elapsed_s: float = 0.0
    cpu_s: float = 0.0          # this process's CPU time (user + system) while verifying

    @property
    def source_bytes(self) -> int:
        return sum(t.tally.source_bytes for t in self.topics)


#: Called every few MB and at each partition's end: (flow, topic, partition, source bytes
#: compared since the previous call).
Progress = Callable[[str, str, int, int], None]


# -- one partition -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionJob:
    flow: FlowConfig
    topic: str
    target_topic: str
    partition: int

    def mismatch(self, source_offset: int | None, target_offset: int | None,
                 reason: str) -> Mismatch:
        return Mismatch(self.flow.name, self.flow.source, self.flow.target, self.topic,
                        self.target_topic, self.partition, source_offset, target_offset, reason)


async def verify_partition(job: PartitionJob, source: Cluster, target: Cluster, *,
                           progress: Progress | None = None
                           ) -> tuple[PartitionTally, Mismatch | None]:
    """Zip the partition's source and target batches; stop at the first difference."""
    # As the flow's engine fetches: exactly-once reads read_committed whatever the file says.
    read_committed = resolve_settings(job.flow.engine_settings)["isolation.level"] == \
        "read_committed"
    src = BatchCursor(PartitionReader(source, job.topic, job.partition,
                                      read_committed=read_committed, drop_aborted=read_committed))
    tgt = BatchCursor(PartitionReader(target, job.target_topic, job.partition,
                                      read_committed=False, drop_aborted=False))
    tally = PartitionTally()
    try:
        mismatch = await _zip(job, src, tgt, tally, progress)
    finally:
        await src.close()
        await tgt.close()
        tally.dropped = src.reader.dropped
    return tally, mismatch


async def _zip(job: PartitionJob, src: BatchCursor, tgt: BatchCursor, tally: PartitionTally,
               progress: Progress | None) -> Mismatch | None:
    reported_at = 0
    first = await src.peek()
    if first is not None and src.reader.start_offset > 0:
        problem = await _skip_older(job, first, src, tgt, tally)
        if problem is not None:
            return problem
    while (s := await src.take()) is not None:
        t = await tgt.peek()
        if t is None:
            batches, records = await src.remaining()
            return job.mismatch(s.base_offset, tgt.reader.position,
                                f"missing on the target: {batches + 1} source batches "
                                f"({records + s.record_count} records) from source offset "
                                f"{s.base_offset} on; the target ends at offset "
                                f"{tgt.reader.position}")
        if needs_rebuild(s, src.reader.start_offset):
            problem = await _compare_rebuilt(job, s, src.reader.start_offset, tgt, tally)
            if problem is not None:
                return problem
            continue
        await tgt.take()
        reason = compare_forwarded(s, t)
        if reason is not None:
            if tally.batches == 0 and tally.older == 0:    # the very first pair
                reason = await _head_missing(s, t, src) or reason
            return job.mismatch(s.base_offset, t.base_offset, reason)
        tally.pair(s, t)
        if progress is not None and tally.source_bytes - reported_at >= MAX_PARTITION_BYTES:
            progress(job.flow.name, job.topic, job.partition, tally.source_bytes - reported_at)
            reported_at = tally.source_bytes
    if progress is not None:
        progress(job.flow.name, job.topic, job.partition, tally.source_bytes - reported_at)
    extra = await tgt.peek()
    if extra is not None:
        batches, records = await tgt.remaining()
        return job.mismatch(src.reader.position, extra.base_offset,
                            f"extra on the target: {batches} batches ({records} records) from "
                            f"target offset {extra.base_offset} on have no source batch")
    return None


async def _skip_older(job: PartitionJob, first: Any, src: BatchCursor, tgt: BatchCursor,
                      tally: PartitionTally) -> Mismatch | None:
    """The source log starts past 0 (retention or DeleteRecords removed its head): the target
    batches before the copy of the source's first batch hold records the source no longer has.
    They are skipped (counted as ``older``) and that pair is compared whole, as it was mirrored
    (the first batch may now straddle the log start). A target without that copy is a
    mismatch: started later, trimmed by its own retention, or another topic."""
    start = src.reader.start_offset
    # A first batch straddling the log start was re-packed if the mirror came after the cut:
    # its copy then begins with the record at the log start.
    at_start = (_record_key(next(r for r in deep.decode_records(first) if r.offset >= start))
                if needs_rebuild(first, start) else None)
    skipped = records = 0
    while (t := await tgt.peek()) is not None:
        if compare_forwarded(first, t) is None:
            await src.take()
            await tgt.take()
            tally.older += skipped
            tally.pair(first, t)
            return None
        if at_start is not None and _record_key(deep.decode_records(t)[0]) == at_start:
            tally.older += skipped
            return None                  # the zip compares the re-packed copy from here
        await tgt.take()
        skipped += 1
        records += t.record_count
    return job.mismatch(first.base_offset, None,
                        f"no copy of the source's first batch (offset {first.base_offset}; the "
                        f"source log starts at {src.reader.start_offset}, retention or "
                        f"DeleteRecords removed what was below) among the target's {skipped} "
                        f"batches ({records} records): the mirror started later, or the target "
                        "was trimmed by its own retention")


async def _head_missing(first: Any, t: Any, src: BatchCursor) -> str | None:
    """Why the first pair differs, when the target's first batch is the copy of a later source
    batch: the target lacks the source's head (mirror started later, remote topic re-created or
    trimmed by its retention). None when no source batch matches (then the pair's own reason
    stands). Reads the source on, only after a mismatch."""
    batches, records = 1, first.record_count
    while (s := await src.take()) is not None:
        if compare_forwarded(s, t) is None:
            return (f"the target's first batch is the copy of source offset {s.base_offset}: "
                    f"the {batches} source batches ({records} records) from offset "
                    f"{first.base_offset} before it are not on the target (the mirror started "
                    "later, or the remote topic was re-created or trimmed by its retention)")
        batches += 1
        records += s.record_count
    return None


def _record_key(record: deep.Record) -> tuple:
    """What identifies a record wherever it is stored (not its offset)."""
    return (record.timestamp, record.key, record.value, record.headers)


async def _compare_rebuilt(job: PartitionJob, s: Any, start_offset: int, tgt: BatchCursor,
                           tally: PartitionTally) -> Mismatch | None:
    """A source batch the engine re-packed: its records against the next target batches."""
    match = await match_rebuilt(s, start_offset, tgt)
    tally.target_bytes += match.target_bytes
    if match.exhausted:
        return job.mismatch(s.base_offset, tgt.reader.position,
                            f"missing on the target: the re-packed batch's {match.wanted} "
                            f"records (only {match.got} found)")
    if match.reason is not None:
        return job.mismatch(s.base_offset, match.first_target, match.reason)
    tally.batches += 1
    tally.repacked += 1
    tally.records += match.wanted
    tally.source_bytes += s.size
    return None


# -- flows and topics --------------------------------------------------------------------------


def select_flows(config: MirrorConfig, flow: str | None) -> list[FlowConfig]:
    """The flows to verify: the one named ``A->B`` or every enabled flow; shallow flows only."""
    flows = config.flows
    if flow is not None:
        names = [f.name for f in flows]
        flows = [f for f in flows if f.name == flow.replace(" ", "")]
        if not flows:
            raise ConfigError(f"--flow {flow}: no enabled flow of that name (enabled: "
                              f"{', '.join(names) or 'none'})")
    if not flows:
        raise ConfigError("no enabled flow: set A->B.enabled = true")
    deep_flows = [f.name for f in flows if not f.shallow]
    if deep_flows:
        raise ConfigError([f"flow {name} is deep (use.raw.bytes=false): its batches are rebuilt, "
                           "so there is nothing to compare byte for byte" for name in deep_flows])
    return flows


def compile_topic_patterns(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    compiled, problems = [], []
    for p in patterns:
        try:
            compiled.append(re.compile(p))
        except re.error as err:
            problems.append(f"--topics {p!r}: not a regular expression ({err})")
    if problems:
        raise ConfigError(problems)
    return compiled


def _mirrored_topics(flow: FlowConfig, source: Cluster,
                     patterns: Sequence[re.Pattern[str]]) -> list[str]:
    topics = sorted(name for name, meta in source.metadata.topics.items()
                    if not meta.error_code and flow.should_replicate(name))
    if patterns:
        topics = [t for t in topics if any(p.fullmatch(t) for p in patterns)]
    return topics


async def verify_flow(flow: FlowConfig, patterns: Sequence[re.Pattern[str]], result: VerifyResult,
                      *, progress: Progress | None = None) -> None:
    """Every mirrored topic of one flow; stops at the first mismatch (in ``result``)."""
    source = Cluster({"reconnect.deadline.ms": RECONNECT_DEADLINE_MS, **flow.source_consumer},
                     flow.source)
    target = Cluster({"reconnect.deadline.ms": RECONNECT_DEADLINE_MS, **flow.target_producer},
                     flow.target)
    try:
        await source.start()
        await target.start()
        await source.refresh_metadata(None)
        topics = _mirrored_topics(flow, source, patterns)
        await target.refresh_metadata([flow.remote_topic(t) for t in topics] or [])
        for topic in topics:
            if not await _verify_topic(flow, topic, source, target, result, progress):
                return
    finally:
        await source.close()
        await target.close()


async def _verify_topic(flow: FlowConfig, topic: str, source: Cluster, target: Cluster,
                        result: VerifyResult, progress: Progress | None) -> bool:
    remote = flow.remote_topic(topic)
    partitions = source.partitions(topic) or []
    topic_result = TopicResult(flow.name, topic, remote, len(partitions))
    result.topics.append(topic_result)
    target_partitions = target.partitions(remote)
    if target_partitions is None:
        result.mismatch = PartitionJob(flow, topic, remote, 0).mismatch(
            None, None, f"remote topic {remote} does not exist on {flow.target}")
        return False
    missing = [p for p in partitions if p not in target_partitions]
    if missing:
        result.mismatch = PartitionJob(flow, topic, remote, missing[0]).mismatch(
            None, None, f"remote topic {remote} has no partition {missing[0]}")
        return False
    slots = asyncio.Semaphore(PARTITIONS_IN_FLIGHT)

    async def one(p: int) -> tuple[PartitionTally, Mismatch | None]:
        async with slots:
            return await verify_partition(PartitionJob(flow, topic, remote, p), source, target,
                                          progress=progress)

    outcomes = await asyncio.gather(*(one(p) for p in partitions))
    for tally, _ in outcomes:
        topic_result.tally.add(tally)
    mismatches = [m for _, m in outcomes if m is not None]
    if mismatches:
        result.mismatch = mismatches[0]
        return False
    return True


async def verify(config: MirrorConfig, *, flow: str | None = None,
                 topic_patterns: Iterable[str] = (),
                 progress: Progress | None = None) -> VerifyResult:
    """Verify the selected flows; ``result.mismatch`` is the first difference, if any.

    Raises ConfigError for a bad selection and ConnectionFailedError for an unreachable
    cluster."""
    flows = select_flows(config, flow)
    patterns = compile_topic_patterns(topic_patterns)
    result = VerifyResult()
    started, cpu_started = time.monotonic(), time.process_time()
    for f in flows:
        await verify_flow(f, patterns, result, progress=progress)
        if result.mismatch is not None:
            break
    result.elapsed_s = time.monotonic() - started
    result.cpu_s = time.process_time() - cpu_started
    return result
