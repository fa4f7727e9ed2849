"""Exact source->target offset translation from *syncs*: the points where the offset delta of a
mirrored partition changes, plus the end of what is mirrored.

A shallow mirror writes each source batch as one target batch, so inside a run of contiguously
mirrored source offsets ``target = source + delta``. The delta changes only at a gap: offsets
that were not mirrored (control batches, aborted transactions, offsets compaction removed, a range
skipped on reset) or a target-side jump (the mirror's own transaction markers, records mirrored
twice after a crash). One *anchor* sync per change, plus one *end* sync, describe the whole map::

    source   100 .............. 149 | 150 151 | 152 ........ 179 |  (end: 180)
             mirrored run              gap:      mirrored run
                                       control   (delta 898)
                                       batch and
                                       abort
    target   1000 ............. 1049            1050 ....... 1077   (end: 1078)

    syncs    anchor (100, 1000)   anchor (152, 1050)   end (180, 1078)

    translate(p) for a consumer *position* p (the next offset it would read):
      i      = last anchor with upstream <= p          (none: p is below everything mirrored ->
                                                         the first anchor's downstream)
      linear = anchor_i.downstream + (p - anchor_i.upstream)
      result = min(linear, next anchor's downstream, end's downstream)

    A source gap that coincides with a target jump (the mirror's transaction marker) gets a
    second anchor at the gap's start, so the gap translates to the record after it, not to the
    marker.

      translate(120) = 1020    inside a run: exact
      translate(150) = 1050    inside a gap: the next mirrored record (capped by anchor (152, 1050))
      translate(185) = 1078    past the end: never past what is mirrored

Re-packed compacted batches (their records renumbered densely on the target) get the same rule
per record: record j of such a batch, at source offset s_j, is stored at target_base + j; an
anchor is added wherever s_j does not continue the current run. A position between two surviving
records therefore translates to the next surviving record, exactly like any other gap.

When the same source offsets are mirrored again (a restart after a crash wrote them twice), the
later copy wins: an anchor removes every anchor at or above its upstream offset, so a failed-over
consumer continues in the copy that is followed by the rest of the partition.

Invariants (asserted): anchors are ordered by upstream offset, strictly increasing; the end, when
known, is at or above the last anchor. Out of scope: how syncs are stored (``offset_syncs.py``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from shallowmirror.engine.hooks import AckRun, RunPoint

TP = tuple[str, int]


#: Source offset ``upstream`` is (or, for an end sync, will be) target offset ``downstream``.
#: A tuple (an end sync is made per acknowledged batch), the engine's own (``RunPoint``): it
#: moves the end of a run itself.
Sync = RunPoint


class PartitionSyncs(AckRun):
    """The exact translation map of one source partition (see the module drawing). As an
    ``AckRun`` (its last anchor also kept as two ints, and its end), the engine can move the
    end of the current run itself (``add(..., runs=)`` in ``engine.hooks``)."""

    __slots__ = ("_ups", "_downs")

    def __init__(self) -> None:
        super().__init__()
        self._ups: list[int] = []
        self._downs: list[int] = []

    def __len__(self) -> int:
        return len(self._ups)

    @property
    def anchors(self) -> list[Sync]:
        return [Sync(u, d) for u, d in zip(self._ups, self._downs, strict=True)]

    def add_anchor(self, sync: Sync) -> None:
        """Apply an anchor (from an acknowledged batch, or replayed from the offset-syncs
        topic in log order): anchors at or above its upstream offset describe an older copy."""
        index = bisect.bisect_left(self._ups, sync.upstream)
        del self._ups[index:], self._downs[index:]
        self._ups.append(sync.upstream)
        self._downs.append(sync.downstream)
        self.run_upstream, self.run_downstream = sync
        # The end described the run before this anchor, or an older copy of these offsets.
        self.end = None

    def set_end(self, sync: Sync) -> None:
        """The end of what is mirrored: positions at or past it translate to its downstream."""
        if self._ups and sync.upstream < self._ups[-1]:
            return          # an end written before a later anchor moved the run back: stale
        self.end = sync

    def _projection(self, upstream: int) -> int | None:
        if not self._ups:
            return None
        return self._downs[-1] + (upstream - self._ups[-1])

    def add_batch(self, source_base: int, source_next: int, target_base: int,
                  record_offsets: Sequence[int] | None = None) -> list[Sync]:
        """One acknowledged batch: source [source_base, source_next) stored from
        ``target_base``. ``record_offsets`` lists the source offset of every record when the
        batch was re-packed (compacted: not every offset holds a record). Returns the new
        anchors (what the offset-syncs topic must receive)."""
        assert source_next > source_base, f"empty batch {source_base}..{source_next}"
        if record_offsets is None and self.extends(source_base, target_base):
            # The usual batch continues the current run: no anchor, only a new end (what the
            # general rule below decides for it, without its per-record loop).
            self.extend(source_base, source_next, target_base)
            return []
        offsets: Sequence[int] = record_offsets if record_offsets is not None else (source_base,)
        added: list[Sync] = []
        end = self.end
        if end is not None and end.upstream < offsets[0] and end.downstream != target_base:
            # A source gap and a target jump together: the gap's start must already translate
            # to this batch (the run before would point at the jumped-over target offsets).
            sync = Sync(end.upstream, target_base)
            self.add_anchor(sync)
            added.append(sync)
        count = 0
        for index, upstream in enumerate(offsets):
            downstream = target_base + index
            if self._projection(upstream) != downstream or (
                    self._ups and upstream <= self._ups[-1]):
                sync = Sync(upstream, downstream)
                self.add_anchor(sync)
                added.append(sync)
            count = index + 1
        if record_offsets is None:
            count = source_next - source_base
            self.end = Sync(source_next, target_base + count)
        else:
            # After the last surviving record the batch is a gap: the end starts there.
            self.end = Sync(offsets[-1] + 1, target_base + count)
        return added

    def translate(self, position: int, *, target_end: int | None = None) -> int | None:
        """The target position for a consumer at source ``position`` (next offset to read), or
        None when nothing of the partition is known to be mirrored. ``target_end`` (the target
        partition's high watermark) caps the result when the end sync is unknown."""
        if not self._ups:
            return None
        index = bisect.bisect_right(self._ups, position) - 1
        if index < 0:
            result = self._downs[0]
        else:
            result = self._downs[index] + (position - self._ups[index])
            if index + 1 < len(self._ups):
                result = min(result, self._downs[index + 1])
        if self.end is not None:
            result = min(result, self.end.downstream)
        if target_end is not None:
            result = min(result, target_end)
        return result


    def translate_back(self, position: int) -> int | None:
        """The source position for a consumer at target ``position`` (failback: a group that
        moved to the target returns to the source). The same rule mirrored: the source offset
        of the first mirrored record at or after ``position``; past the end, the end's
        upstream offset. None when nothing is known."""
        if not self._ups:
            return None
        index = bisect.bisect_right(self._downs, position) - 1
        if index < 0:
            result = self._ups[0]
        else:
            result = self._ups[index] + (position - self._downs[index])
            if index + 1 < len(self._ups):
                result = min(result, self._ups[index + 1])
        if self.end is not None:
            result = self.end.upstream if position >= self.end.downstream \
                else min(result, self.end.upstream)
        return result


class SyncTable:
    """``PartitionSyncs`` per source topic-partition."""

    def __init__(self) -> None:
        self.partitions: dict[TP, PartitionSyncs] = {}

    def partition(self, topic: str, partition: int) -> PartitionSyncs:
        syncs = self.partitions.get((topic, partition))
        if syncs is None:
            syncs = self.partitions[(topic, partition)] = PartitionSyncs()
        return syncs

    def get(self, topic: str, partition: int) -> PartitionSyncs | None:
        return self.partitions.get((topic, partition))

    def translate(self, topic: str, partition: int, position: int, *,
                  target_end: int | None = None) -> int | None:
        syncs = self.partitions.get((topic, partition))
        return None if syncs is None else syncs.translate(position, target_end=target_end)

    def translate_back(self, topic: str, partition: int, position: int) -> int | None:
        """Target position -> source position of source ``topic``/``partition``'s map."""
        syncs = self.partitions.get((topic, partition))
        return None if syncs is None else syncs.translate_back(position)
