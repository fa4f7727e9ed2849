"""What flows through the engine: a fetched batch on its way to the target, and per-partition state.

``FetchedBatch`` is what the low-level forwarder API hands to a program: the source location, the
batch view (a slice of the fetch frame, never a copy) and, once routed, the target location and
the header the producer side stamped. ``SourcePartition`` is the engine's state of one source
partition (fetch position, offsets, high watermark, counters, the error that stopped it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shallowmirror.engine.budget import FrameLease
from shallowmirror.engine.offsets import OffsetMap, PartitionOffsets
from shallowmirror.engine.producer_identity import Stamp
from shallowmirror.errors import LocatedError

TP = tuple[str, int]


class BatchAbandonedError(LocatedError):
    """A forwarded batch the engine gave up before the target acknowledged it: its partition
    was revoked (its next owner mirrors it again from the last commit), stopped, or the engine
    stopped. The target may hold it already: delivery is at least once."""


class FetchedBatch:
    """One source RecordBatch between fetch and target acknowledgement.

    ``view`` aliases the fetch frame (or a rebuilt batch after a trim/repack/legacy conversion,
    then ``rebuilt`` says which). ``source_base`` is the first forwarded offset and ``next_offset``
    the source offset after the batch.

    Once registered with its partition's offsets (``PartitionOffsets.add_batches``) the batch is
    itself that partition's entry for [``start``, ``end``): one object per batch from fetch to
    acknowledgement, not a batch plus an entry plus a stamp (the per-batch cost of small
    batches is mostly objects made and attributes set)."""

    __slots__ = (
        "topic", "partition", "view", "lease", "fetched_at", "record_count", "size",
        "compression", "source_base", "next_offset", "rebuilt", "target_topic",
        "target_partition", "header", "rest", "attempts", "done", "abandoned",
        "_callbacks", "_future", "high_watermark", "enqueue_no", "record_offsets",
        # the offsets entry (engine.offsets): start < 0 until registered; ``offsets``: the
        # ownership's PartitionOffsets that registered it (who may forward or acknowledge it)
        "start", "end", "acked", "target_base", "is_gap", "offsets",
        # the producer identity stamped into ``header`` (generation < 0: not stamped)
        "producer_id", "producer_epoch", "base_sequence", "stamp_generation",
    )

    def __init__(self, topic: str, partition: int, view: Any, lease: FrameLease | None,
                 source_base: int, next_offset: int, rebuilt: str | None = None,
                 high_watermark: int = -1, fetched_at: float | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.view = view
        self.lease = lease
        #: When the fetch response came (latency metrics): one clock read per response.
        self.fetched_at = time.monotonic() if fetched_at is None else fetched_at
        self.record_count: int = view.record_count
        self.size: int = view.size
        self.compression: int = view.compression
        self.source_base = source_base
        self.next_offset = next_offset
        self.rebuilt = rebuilt
        self.high_watermark = high_watermark
        self.target_topic: str | None = None
        self.target_partition: int | None = None
        self.header: bytes | None = None
        self.rest: memoryview | None = None
        self.attempts = 0
        self.enqueue_no = -1             # order of first enqueue: resend order
        #: Source offset of every record when the batch was re-packed (compacted: its records
        #: are renumbered densely on the target), else None. Exact offset translation needs it.
        self.record_offsets: tuple[int, ...] | None = None
        self.done = False
        self.abandoned = False
        #: Completion callbacks (the forwarder API); None until one is added.
        self._callbacks: list[Callable[[FetchedBatch, int | None, BaseException | None],
                                       None]] | None = None
        self._future: asyncio.Future | None = None
        self.start = -1
        self.end = next_offset
        self.acked = False
        self.target_base: int | None = None
        self.is_gap = False
        self.offsets: PartitionOffsets | None = None
        self.stamp_generation = -1

    # ---- as an offsets entry ----
    @property
    def entry(self) -> FetchedBatch | None:
        """The batch's offsets entry (itself) once registered, else None."""
        return self if self.start >= 0 else None

    @property
    def payload(self) -> FetchedBatch:
        """What an offsets entry carries: the batch itself."""
        return self

    @property
    def stamp(self) -> Stamp | None:
        """The producer identity in ``header`` (None: not stamped yet)."""
        if self.stamp_generation < 0:
            return None
        return Stamp(self.producer_id, self.producer_epoch, self.base_sequence,
                     self.stamp_generation)

    @stamp.setter
    def stamp(self, stamp: Stamp | None) -> None:
        if stamp is None:
            self.stamp_generation = -1
            return
        (self.producer_id, self.producer_epoch, self.base_sequence,
         self.stamp_generation) = stamp

    def __repr__(self) -> str:
        return (f"FetchedBatch({self.topic}-{self.partition} @{self.source_base}"
                f"..{self.next_offset}, {self.record_count} records, {self.size} bytes)")

    @property
    def last_offset(self) -> int:
        return self.next_offset - 1

    # ---- completion (used by the forwarder API) ----
    def add_done_callback(self, fn: Callable[[FetchedBatch, int | None, BaseException | None],
                                             None]) -> None:
        """``fn(batch, target_base_offset, error)`` once the target acknowledged or it failed."""
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(fn)

    def future(self) -> asyncio.Future:
        """An awaitable resolving to the target base offset (None if the target did not say)."""
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
        return self._future

    def _finish(self, target_base: int | None, error: BaseException | None) -> None:
        if self.done:
            return
        self.done = True
        if self._future is not None and not self._future.done():
            if error is None:
                self._future.set_result(target_base)
            else:
                self._future.set_exception(error)
                if isinstance(error, BatchAbandonedError):
                    # Routine in a group (a revocation): a program that does not await its
                    # futures is not told "exception was never retrieved" for each one.
                    self._future.exception()
        if self._callbacks is not None:
            for fn in self._callbacks:
                fn(self, target_base, error)
        self.release()

    def release(self) -> None:
        """Give the fetch frame back to the budget (idempotent)."""
        if self.lease is not None:
            self.lease.drop()
            self.lease = None
        self.view = None
        self.rest = None


@dataclass
class PartitionStats:
    """What ``MirrorEngine.stats()`` reports per source partition."""

    topic: str
    partition: int
    position: int
    high_watermark: int
    lag: int | None
    records: int
    batches: int
    bytes: int
    errors: int
    error: str | None          # set when the partition is stopped
    #: Stopped because another instance took its transactional id over (exactly-once): that
    #: instance mirrors it now, so nothing is left behind on its account.
    taken_over: bool = False


@dataclass
class EngineStats:
    partitions: dict[TP, PartitionStats] = field(default_factory=dict)
    budget_bytes_in_use: int = 0
    budget_peak_bytes: int = 0
    producer_id: int = -1
    producer_epoch: int = -1
    duplicates_acked_unknown_offset: int = 0
    #: Seconds from ``run`` to each start-up phase reached (``engine.startup.PHASES``).
    startup: dict[str, float] = field(default_factory=dict)
    #: (records, batches, bytes) mirrored of partitions no longer owned (revoked, or their
    #: topic deleted): ``records``, ``batches`` and ``bytes`` are this engine's totals.
    released: tuple[int, int, int] = (0, 0, 0)
    #: Why ``mirror()``/``mirror_async()`` returned: ``"caught_up"`` (``until_caught_up``: every
    #: partition reached the source's end), ``"stop"`` (the stop event) or ``"timeout"``
    #: (``timeout_s`` passed first); ``""`` from ``stats()`` of an engine or forwarder.
    ended_by: str = ""

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions.values()) + self.released[0]

    @property
    def batches(self) -> int:
        return sum(p.batches for p in self.partitions.values()) + self.released[1]

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions.values()) + self.released[2]

    @property
    def stopped(self) -> dict[TP, str]:
        return {tp: p.error for tp, p in self.partitions.items() if p.error}


class SourcePartition:
    """The engine's state of one owned source partition."""

    __slots__ = ("topic", "partition", "offsets", "high_watermark", "high_watermark_at", "leader",
                 "paused", "error", "skip_to_high_watermark", "topic_id", "taken_over",
                 "last_committed_sent", "records", "batches", "bytes", "errors", "ack_run",
                 "ack_tally", "revoked")

    def __init__(self, topic: str, partition: int, position: int, offset_map: OffsetMap) -> None:
        self.topic = topic
        self.partition = partition
        offset_map.seal()                # a new ownership: its rows start rows of their own
        self.offsets = PartitionOffsets(position, offset_map=offset_map)
        self.high_watermark = -1
        #: When (``time.monotonic()``) the Fetch that told ``high_watermark`` was sent: "caught
        #: up" as of a moment needs a high watermark the broker read after it.
        self.high_watermark_at = float("-inf")
        self.leader: int | None = None
        self.paused = False              # revoked or leader unknown: not fetched
        #: Being revoked (or revoked): never fetched again, even while the revocation keeps it
        #: in the engine's partitions for its in-flight batches to settle (``still_owned``).
        self.revoked = False
        self.error: str | None = None    # stopped: nothing forwarded, offset not advanced
        self.skip_to_high_watermark = False   # auto.offset.reset=latest on tansu-safe terms
        #: The source topic's id when first fetched (None: the broker gives none): another id
        #: later means the topic was deleted and created again, its offsets starting anew.
        self.topic_id: str | None = None
        self.taken_over = False          # stopped because another instance fenced it
        self.last_committed_sent = -1
        self.records = 0
        self.batches = 0
        self.bytes = 0
        self.errors = 0
        #: The ``batch_acknowledged`` callback's run map of this partition (``hooks.AckRun``),
        #: when it gave one: the engine then extends it itself for a usual batch.
        self.ack_run: Any = None
        #: Its ``metrics.AckTally`` while metrics are summed per interval: the engine's native
        #: acknowledgement loop adds to it.
        self.ack_tally: Any = None

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    @property
    def fetch_position(self) -> int:
        return self.offsets.end

    def abandon_pending(self, *, release: bool = False,
                        error: Callable[[FetchedBatch], BaseException] | None = None) -> int:
        """Give up every fetched batch not yet acknowledged (revoked, or the engine stopping):
        the position stays at the last acknowledged batch, so they are mirrored again by whoever
        fetches next. ``release`` also gives their frames back to the budget. ``error``: what a
        program awaiting one of them (a forwarder's future or callback) is told, ``error(batch)``;
        without it that wait never ended. Returns how many."""
        entries = self.offsets.abandon_pending()
        for entry in entries:
            batch = entry.payload
            if not isinstance(batch, FetchedBatch):
                continue
            batch.abandoned = True
            if error is not None and not batch.done and (
                    batch._future is not None or batch._callbacks is not None):
                batch._finish(None, error(batch))      # its frame goes back with it
            elif release:
                batch.release()
        return len(entries)

    @property
    def fetchable(self) -> bool:
        return not self.paused and self.error is None and self.leader is not None

    def stats(self) -> PartitionStats:
        committed = self.offsets.committed
        lag = None if self.high_watermark < 0 else max(0, self.high_watermark - committed)
        return PartitionStats(self.topic, self.partition, committed, self.high_watermark, lag,
                              self.records, self.batches, self.bytes, self.errors, self.error,
                              self.taken_over)


def still_owned(partitions: Mapping[TP, SourcePartition], sp: SourcePartition) -> bool:
    """Whether ``sp`` is its partition's current ownership: the engine's entry for it, and not
    being revoked. A revocation keeps the partition in the engine's dict while its in-flight
    batches settle; a task that checked the entry alone (resume's start, a leader lookup)
    attached it to a fetch loop again there, and the revoked ownership fetched on beside the
    next owner (the engine's own, after an assignment back: its acknowledgements then reached
    the new ownership's offsets, IndexError in ``PartitionOffsets.ack``; seen on Kafka 3.7)."""
    return not sp.revoked and partitions.get(sp.tp) is sp
