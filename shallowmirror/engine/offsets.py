"""Offset tracking per source partition: the committed position and the source->target map.

Every fetched range of a source partition becomes an *entry*, in fetch order. An entry is either a
forwarded batch (waiting for, or holding, the target's acknowledgement) or a *gap*: offsets that
were fetched but deliberately not forwarded (control batches, aborted transactions, batches a
program dropped, a range skipped after OFFSET_OUT_OF_RANGE). Gaps count as acknowledged at once.

::

    source partition offsets  100        110             125     130          150
                              |  batch A  |    batch B     |  gap  |  batch C   |
    entries                   [100,110)    [110,125)        [125,130)[130,150)
    state                     acked        in flight        acked    acked
                                          ^
                              committed position = 110: the end of the contiguous acknowledged
                              prefix. Never beyond an unacknowledged batch (B), even though C is
                              already on the target; after B's ack it jumps to 150.

    target partition offsets  7000       7010             (gap: nothing written)
                              | batch A' |  batch B'  |  batch C'  |
    map rows                  (source_base=100, count=25, target_base=7000)   A and B: one run
                              (source_base=130, count=20, target_base=7025)   C, after the gap

    translate(source=117) = 7000 + (117 - 100) = 7017     exact inside a run
    translate(source=127) = None                           inside a gap: not mirrored

Invariants (asserted):
- entries are contiguous: each entry's ``start`` is the previous entry's ``end``;
- the committed position only grows, and equals the start of the first unacknowledged entry (or
  the end of the last entry when all are acknowledged);
- map rows are ordered by ``source_base`` and never overlap; a batch that continues the last row
  on both sides (source and target offsets) extends it rather than adding one.

A row's ``target_base`` is ``None`` when the target acknowledged without telling where the batch
went (tansu answers DUPLICATE_SEQUENCE_NUMBER for a resent idempotent batch that is already
written; stock Kafka returns the original offset instead). Such rows translate to ``None``.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class MapRow(NamedTuple):
    """One forwarded batch, or a run of them that follow each other on both sides (an offset
    map's row): ``count`` source offsets from ``source_base`` are ``count`` target offsets from
    ``target_base`` (None: acknowledged, target offset unknown). Immutable; a tuple because
    resume makes one per batch it finds on the target."""

    source_base: int
    count: int
    target_base: int | None

    @property
    def source_end(self) -> int:
        return self.source_base + self.count


#: Rows an offset map keeps by default (the engine's ``offset.map.max.rows``): ~0.9 MB at most.
DEFAULT_MAX_ROWS = 10_000


class OffsetMap:
    """Exact source->target offset translation for one partition: one row per *run* of forwarded
    batches that follow each other on both sides.

    A batch that starts where the last row ends on the source *and* lands where it ends on the
    target extends that row (``count`` grows) instead of adding one: translation is the same
    arithmetic either way (``target_base + (offset - source_base)``), and a mirror without gaps
    keeps one row per partition instead of one per batch - a row per batch was ~88 bytes, 88 MB
    per partition at the old cap of 1,000,000 rows, reached after ~6 GB of 16 KiB batches. A gap
    on either side (filtered or dropped batches, a compacted source, another writer on the
    target, an unknown target offset) starts a new row, as does the first batch after ``seal``;
    this is how MM2's offset syncs describe a partition too.

    Rows are kept as three parallel columns of ints (a ``MapRow`` is made only when one is read).
    ``max_rows`` bounds memory: the oldest rows are dropped first (``first_source_offset`` then
    says from where translation is available)."""

    __slots__ = ("max_rows", "_bases", "_counts", "_targets", "_next_source", "_next_target")

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        assert max_rows >= 1, "an offset map keeps at least its last row"
        self.max_rows = max_rows
        self._bases: deque[int] = deque()
        self._counts: deque[int] = deque()
        self._targets: deque[int | None] = deque()
        # Where a batch must start, on each side, to extend the last row (-1: nothing can).
        self._next_source = -1
        self._next_target = -1

    def add(self, row: MapRow) -> None:
        self.add_row(row.source_base, row.count, row.target_base)

    def add_row(self, source_base: int, count: int, target_base: int | None) -> None:
        """``add(MapRow(source_base, count, target_base))`` without making the row: extends the
        last row when the batch continues it on both sides (see the class docstring)."""
        if source_base == self._next_source and target_base == self._next_target:
            self._counts[-1] += count
            self._next_source += count
            self._next_target += count
            return
        bases = self._bases
        if bases:
            assert source_base >= bases[-1] + self._counts[-1], (
                f"offset map rows overlap: {self._row(-1)} then "
                f"{MapRow(source_base, count, target_base)}")
        bases.append(source_base)
        self._counts.append(count)
        self._targets.append(target_base)
        self._next_source = source_base + count
        self._next_target = -1 if target_base is None else target_base + count
        if len(bases) > self.max_rows:
            bases.popleft()
            self._counts.popleft()
            self._targets.popleft()

    def seal(self) -> None:
        """The next row starts a row of its own, even if it continues the last one: rows of a
        new ownership of the partition are not merged into those of an earlier one (resume
        reads the row before the committed offset and takes only rows of the current one)."""
        self._next_source = -1

    def _row(self, index: int) -> MapRow:
        return MapRow(self._bases[index], self._counts[index], self._targets[index])

    def forget_from(self, source_offset: int) -> int:
        """Forget translation from ``source_offset`` on (the source log restarted there: topic
        re-created, truncated, or an ownership starting below what was mirrored): rows starting
        there or beyond go, a row reaching past it is cut there. Below it every row stays exact:
        records below where a log restarts are the ones mirrored (a truncated log loses whole
        batches from its end). Returns how many source offsets were forgotten."""
        forgotten = 0
        bases, counts = self._bases, self._counts
        while bases and bases[-1] >= source_offset:
            bases.pop()
            forgotten += counts.pop()
            self._targets.pop()
        if bases and bases[-1] + counts[-1] > source_offset:
            forgotten += bases[-1] + counts[-1] - source_offset
            counts[-1] = source_offset - bases[-1]
        if forgotten:
            self._next_source = -1           # the last row changed: the next starts its own
        return forgotten

    @property
    def source_end(self) -> int | None:
        """The source offset after the last row (None: no row)."""
        return self._bases[-1] + self._counts[-1] if self._bases else None

    def __len__(self) -> int:
        return len(self._bases)

    def rows(self) -> list[MapRow]:
        return [MapRow(*row) for row in zip(self._bases, self._counts, self._targets,
                                            strict=True)]

    def row_for(self, source_offset: int) -> MapRow | None:
        """The row holding ``source_offset``, or None (a gap, not yet mirrored, or trimmed)."""
        index = bisect.bisect_right(self._bases, source_offset) - 1
        if index < 0:
            return None
        row = self._row(index)
        return row if source_offset < row.source_end else None

    def translate(self, source_offset: int) -> int | None:
        """The target offset of the record at ``source_offset``, exactly, or None if unknown."""
        row = self.row_for(source_offset)
        if row is None or row.target_base is None:
            return None
        return row.target_base + (source_offset - row.source_base)

    def row_before(self, source_position: int) -> MapRow | None:
        """The last row starting below ``source_position`` (None: no such row)."""
        index = bisect.bisect_left(self._bases, source_position) - 1
        return self._row(index) if index >= 0 else None

    def translate_position(self, source_position: int) -> int | None:
        """Translate a consumer *position* (next offset to read): the target position after the
        last mirrored record below ``source_position`` (checkpoints). None if unknown."""
        row = self.row_before(source_position)
        if row is None or row.target_base is None:
            return None
        return row.target_base + min(source_position, row.source_end) - row.source_base

    @property
    def first_source_offset(self) -> int | None:
        return self._bases[0] if self._bases else None

    @property
    def unknown_rows(self) -> int:
        return sum(1 for target in self._targets if target is None)


@dataclass(eq=False, slots=True)
class Entry:
    """A fetched range [start, end) of one source partition (see the module drawing)."""

    start: int
    end: int
    source_base: int = -1           # first forwarded offset (> start after a mid-batch trim)
    record_count: int = 0           # 0 for a gap
    acked: bool = False
    target_base: int | None = None
    is_gap: bool = False
    payload: object = field(default=None, repr=False)   # the engine's in-flight batch

    def __post_init__(self) -> None:
        assert self.start <= self.end, f"entry runs backwards: {self.start} > {self.end}"


class PartitionOffsets:
    """The committed position and the offset map of one source partition."""

    __slots__ = ("_entries", "_committed", "_end", "offset_map")

    def __init__(self, position: int, *, offset_map: OffsetMap | None = None) -> None:
        self._entries: deque[Entry] = deque()
        self._committed = position
        self._end = position                 # end of the last entry: where fetching continues
        self.offset_map = offset_map if offset_map is not None else OffsetMap()

    @property
    def committed(self) -> int:
        """End of the contiguous acknowledged prefix: the offset safe to commit."""
        return self._committed

    @property
    def end(self) -> int:
        """End of the last fetched range."""
        return self._end

    @property
    def pending(self) -> int:
        """Entries fetched and not yet committed (in flight or waiting behind one)."""
        return len(self._entries)

    def add_batch(self, end: int, source_base: int, record_count: int,
                  payload: object = None) -> Entry:
        """Register a forwarded batch ending at ``end`` (its next_offset); whatever lies between
        the previous end and ``source_base`` was filtered out and becomes part of this range."""
        assert source_base >= self._end, (
            f"batch at {source_base} starts below the fetched end {self._end}")
        entry = Entry(start=self._end, end=end, source_base=source_base,
                      record_count=record_count, payload=payload)
        assert source_base + record_count <= end
        self._entries.append(entry)
        self._end = end
        return entry

    def add_batches(self, batches: Sequence[Any]) -> None:
        """Register forwarded batches (in order) that are their own entries: each has
        ``source_base``, ``record_count`` and ``next_offset``, and gets ``start``/``end`` here
        (the engine's ``FetchedBatch``: one object per batch instead of a batch and an entry),
        and ``offsets`` (this object: the ownership that may acknowledge it)."""
        end = self._end
        for batch in batches:
            source_base = batch.source_base
            assert end <= source_base and source_base + batch.record_count <= batch.next_offset, (
                f"batch at {source_base} starts below the fetched end {end}")
            batch.start = end
            end = batch.end = batch.next_offset
            batch.offsets = self
        self._entries.extend(batches)
        self._end = end

    def add_gap(self, end: int) -> Entry | None:
        """Fetched offsets up to ``end`` that will not be forwarded: acknowledged at once."""
        if end <= self._end:
            return None
        entry = Entry(start=self._end, end=end, acked=True, is_gap=True)
        self._entries.append(entry)
        self._end = end
        self._advance()
        return entry

    def ack(self, entry: Entry, target_base: int | None) -> int:
        """The target acknowledged ``entry``; return the (possibly advanced) committed position."""
        assert not entry.acked, f"entry {entry} acknowledged twice"
        entries = self._entries
        if not entries or (entries[0] is not entry and not any(e is entry for e in entries)):
            # Not one of this ownership's entries (an earlier ownership's batch reaching it was
            # an IndexError here, or acknowledged in name only): refused, nothing recorded. The
            # scan runs only off the usual path (a partition's batches are acknowledged in order).
            raise AssertionError(
                f"acknowledged offsets {entry.start}..{entry.end - 1} are not pending in this "
                f"partition (committed {self._committed}, fetched up to {self._end}, "
                f"{len(entries)} pending): a batch of an earlier ownership, or of another engine")
        entry.acked = True
        entry.target_base = target_base
        if entries[0] is entry and (len(entries) == 1 or not entries[1].acked):
            # The usual case: the oldest entry, nothing acknowledged behind it (what _advance
            # does for one entry, without its loop).
            entries.popleft()
            assert entry.start == self._committed, (
                f"entries not contiguous: committed {self._committed}, next starts {entry.start}")
            if not entry.is_gap and entry.record_count:
                self.offset_map.add_row(entry.source_base, entry.record_count, target_base)
            self._committed = entry.end
            return entry.end
        self._advance()
        return self._committed

    def _advance(self) -> None:
        entries = self._entries
        committed = before = self._committed
        while entries and entries[0].acked:
            entry = entries.popleft()
            assert entry.start == committed, (
                f"entries not contiguous: committed {committed}, next starts {entry.start}")
            if not entry.is_gap and entry.record_count:
                self.offset_map.add_row(entry.source_base, entry.record_count,
                                        entry.target_base)
            committed = entry.end
        self._committed = committed
        assert committed >= before

    def reset(self, position: int) -> None:
        """Restart from ``position`` (offset reset, or a partition assigned anew). Forward jumps
        keep the pending entries and add a gap; anything else needs nothing pending."""
        if position >= self._end:
            self.add_gap(position)
            return
        assert not self._entries, "cannot move a partition backwards with batches in flight"
        self._committed = self._end = position
        # The source log restarted below what was mirrored (topic re-created, truncated): rows
        # from there on describe records that no longer exist at those offsets.
        self.offset_map.forget_from(position)

    def restart(self, position: int) -> None:
        """Start again at ``position`` of a source partition whose offsets started anew (its
        topic deleted and created again): every row of the offset map describes records that
        no longer exist, forward of ``position`` as well. Needs nothing pending."""
        assert not self._entries, "cannot restart a partition with batches in flight"
        self._committed = self._end = position
        self.offset_map.forget_from(0)

    def abandon_pending(self) -> list[Entry]:
        """Forget every unacknowledged entry (partition revoked or stopped); fetching would resume
        at the committed position. Returns what was abandoned."""
        abandoned = list(self._entries)
        self._entries.clear()
        self._end = self._committed
        return abandoned

    def unacked(self) -> list[Entry]:
        return [entry for entry in self._entries if not entry.acked]
