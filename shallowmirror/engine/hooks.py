"""Hook points: where later features (consumer-group offset sync, checkpoints, transactions)
attach to the engine without editing the core.

- ``batch_acknowledged(BatchAck)``: the target stored one batch. The ack carries the source range
  and the target range it became (``target_base`` None when the target answered
  DUPLICATE_SEQUENCE_NUMBER: written before, offset unknown). Fired once per forwarded batch, in
  acknowledgement order (per source partition: source order).
- ``offsets_committed(Mapping[TP, int])``: these source positions (the next offset to mirror, per
  topic-partition) were committed to the source cluster under the engine's group (the periodic
  and the final commit; a commit made while partitions are revoked happens in the membership
  thread and is not reported).
- ``partitions_assigned(list[TP])``: the engine owns these partitions from now on (their start
  positions are known, fetching starts).
- ``partitions_revoked(list[TP])``: the engine gave these up (after finishing or abandoning what
  was in flight): on a rebalance or a change of topics, and every partition still owned when the
  engine stops (after its final commit), as a Kafka consumer's ``onPartitionsRevoked`` at close.
- ``target_partition_unknown(TP)``: the target does not have this *target* topic-partition
  (it answered UNKNOWN_TOPIC_OR_PARTITION the first time since it last took a batch there, or
  its metadata lacks the topic or the partition): the topic was deleted, or has fewer partitions
  than the source (the source topic grew). Its batches wait and are retried (20 times, with
  backoff, then the partition stops). A mirror flow re-creates or widens its remote topics at
  once on this; MirrorMaker 2 would wait for its next topic refresh. With nobody listening, a
  partition the target's topic lacks, when the target says so in a Produce answer, fails at
  once; a topic or partition missing from the target's metadata (a name or partition no
  flow created) is looked up again first, 20 times with backoff (about 80 s: it may be being
  created), with a warning after the third.

Callbacks run on the engine's event loop and must not block. One that raises is never ignored:
``HookError`` names the hook and the callback, and the engine fails with it.

A ``batch_acknowledged`` callback that keeps a run map per source partition (offset syncs: where
the source->target delta changes, and the end) may hand the engine that map's ``AckRun`` with
``add(callback, runs=lookup)``. While it is the only callback, the engine then applies the usual
batch itself, in its native acknowledgement loop, instead of calling it: a batch that continues
the partition's current run only moves the run's end (``AckRun.extend``). Every other batch
still goes to the callback. Calling Python per batch cost the mirror process about as much again
as the rest of its per-batch work (``benchmarks/engine/hotpath_micro.py --offset-syncs``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from shallowmirror.errors import ShallowMirrorError

TP = tuple[str, int]
T = TypeVar("T")


class HookError(ShallowMirrorError):
    """A hook callback raised; the engine stops with this error (the callback's as cause)."""


class BatchAck(NamedTuple):
    """One acknowledged batch: source offsets [source_base, source_next) of a source partition are
    stored at target offsets [target_base, target_base + source_next - source_base). A tuple:
    one is made per batch while a callback listens (a frozen dataclass cost ~1 us more)."""

    source_topic: str
    source_partition: int
    source_base: int
    source_next: int
    record_count: int
    target_topic: str
    target_partition: int
    target_base: int | None
    #: Source offset of each record when the batch was re-packed (a compacted batch with offset
    #: gaps, renumbered densely on the target: record i is at target_base + i), else None.
    record_offsets: tuple[int, ...] | None = None

    @property
    def target_next(self) -> int | None:
        """The target offset after the batch (None when ``target_base`` is unknown)."""
        if self.target_base is None:
            return None
        if self.record_offsets is not None:
            return self.target_base + len(self.record_offsets)
        return self.target_base + self.source_next - self.source_base


class RunPoint(NamedTuple):
    """Source offset ``upstream`` is (or, for a run's end, will be) target offset
    ``downstream``."""

    upstream: int
    downstream: int


class AckRun:
    """Where a callback's run map of one source partition stands: its last anchor (source
    offset ``run_upstream`` stored at target offset ``run_downstream``; -1: none) and its
    ``end`` (a ``RunPoint``; None: not known). ``moved``: the engine moved the end since the
    callback last cleared it. A subclass keeps these fields current; the engine reads and
    writes them at their slots (``native/_cloops.pyx``), on its event loop. ``end`` is
    replaced whole, never changed in place, so another thread reads it without a lock."""

    __slots__ = ("run_upstream", "run_downstream", "end", "moved")

    def __init__(self) -> None:
        self.run_upstream = self.run_downstream = -1
        self.end: RunPoint | None = None
        self.moved = False

    def extends(self, source_base: int, target_base: int) -> bool:
        """Whether a plain batch from ``source_base`` stored at ``target_base`` continues the
        run, so that it moves the end and nothing else: past the last anchor, on its delta,
        and not across an end that says the target jumped."""
        end = self.end
        return (0 <= self.run_upstream < source_base
                and self.run_downstream + (source_base - self.run_upstream) == target_base
                and (end is None or end.upstream >= source_base
                     or end.downstream == target_base))

    def extend(self, source_base: int, source_next: int, target_base: int) -> None:
        """Apply such a batch: the end moves to its last offset."""
        self.end = RunPoint(source_next, target_base + (source_next - source_base))
        self.moved = True


class Hook(Generic[T]):
    """Callbacks of one hook point, called in the order they were added."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._callbacks: list[Callable[[T], None]] = []
        self._runs: dict[Callable[[T], None], Callable[[str, int], AckRun]] = {}

    def add(self, callback: Callable[[T], None], *,
            runs: Callable[[str, int], AckRun] | None = None) -> Callable[[T], None]:
        """Call ``callback(event)`` at this point from now on (usable as a decorator).
        ``runs(topic, partition)`` (``batch_acknowledged`` only): the callback's run map of a
        source partition, for the engine to extend itself (see the module docstring).
        Hooks are called synchronously, on the engine's loop: a coroutine function is refused
        (its coroutine would be made and never run, the events lost without a word)."""
        if not callable(callback):
            raise TypeError(f"{self.name} hook: a callback must be callable, got "
                            f"{type(callback).__name__}")
        # (An object whose __call__ is ``async def`` makes coroutines too.)
        if inspect.iscoroutinefunction(callback) or inspect.iscoroutinefunction(
                type(callback).__call__):
            raise TypeError(f"{self.name} hook: {getattr(callback, '__qualname__', callback)!s} "
                            "is a coroutine function; hooks are called synchronously on the "
                            "engine's loop: give a plain function (it may start a task with "
                            "asyncio.get_running_loop().create_task(...))")
        self._callbacks.append(callback)
        if runs is not None:
            self._runs[callback] = runs
        return callback

    def remove(self, callback: Callable[[T], None]) -> None:
        if callback not in self._callbacks:
            raise ValueError(f"{self.name} hook: {getattr(callback, '__qualname__', callback)!r} "
                             "was never added (or was removed already)")
        self._callbacks.remove(callback)
        if callback not in self._callbacks:
            self._runs.pop(callback, None)

    @property
    def runs(self) -> Callable[[str, int], AckRun] | None:
        """The run map lookup of the only callback, if it gave one; else None (every event
        goes to every callback)."""
        if len(self._callbacks) != 1:
            return None
        return self._runs.get(self._callbacks[0])

    def __bool__(self) -> bool:
        return bool(self._callbacks)

    def __call__(self, event: T) -> None:
        for callback in self._callbacks:
            try:
                callback(event)
            except Exception as err:
                raise HookError(f"{self.name} hook {getattr(callback, '__qualname__', callback)!r}"
                                f" failed: {type(err).__name__}: {err}") from err


@dataclass
class EngineHooks:
    """The engine's hook points (see the module docstring)."""

    batch_acknowledged: Hook[BatchAck] = field(
        default_factory=lambda: Hook("batch acknowledged"))
    offsets_committed: Hook[Mapping[TP, int]] = field(
        default_factory=lambda: Hook("offsets committed"))
    partitions_assigned: Hook[list[TP]] = field(
        default_factory=lambda: Hook("partitions assigned"))
    partitions_revoked: Hook[list[TP]] = field(
        default_factory=lambda: Hook("partitions revoked"))
    target_partition_unknown: Hook[TP] = field(
        default_factory=lambda: Hook("target partition unknown"))
