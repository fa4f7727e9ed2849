"""Source batch <-> target batch pairing: whether a target batch is the shallow mirror's copy of a
source batch, compared without decompressing; and reading one partition batch by batch. Shared by
``shallowmirror verify`` (whole partitions) and the engine's resume from the target (a partition's
tail, ``engine.resume``).

Alignment: the shallow mirror forwards exactly one target batch per source *data* batch, in order.
The source is read with the flow's ``isolation.level`` and filtered the way the engine filters
(``codec.filter_batches``: control batches dropped, and under read_committed the batches of
aborted transactions and everything at or past the last stable offset); empty batches (compaction
removed every record) are dropped too. The target is read with control batches dropped.

Compared for each pair of a byte-for-byte forwarded batch (header fields by Kafka's names):
``record_count``, ``last_offset_delta``, ``base_timestamp`` (the batch's first timestamp),
``max_timestamp`` (only when neither batch carries the LogAppendTime bit: a LogAppendTime
broker stamps its own time, and ``log.append.time=clear`` drops the bit), the codec
(``attributes & 7``), and every byte after the 61-byte header (the records section).
Not compared, because they differ legitimately: ``base_offset``, ``partition_leader_epoch``,
``crc`` (it covers the producer fields), ``producer_id``, ``producer_epoch``, ``base_sequence``
(the mirror stamps its own idempotent identity), the transactional bit, the timestamp-type bit
and KIP-534's delete-horizon bit (cleared on forward). CRCs are not checked: comparing the records
section against the source is the stronger check.

Re-packed batches: a source batch the engine rebuilds through the deep path before forwarding (a
compacted batch with offset gaps, ``record_count != last_offset_delta + 1``; one straddling the
first offset read; a legacy magic 0/1 entry) cannot be identical byte for byte. Such batches are
compared record by record (key, value, headers, and timestamp when both are CreateTime) against
as many target batches as hold the same number of records (``match_rebuilt``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import errors as Errors

from shallowmirror import codec
from shallowmirror.codec import deep
from shallowmirror.codec.layout import COMPRESSION_NAMES, HEADER_SIZE
from shallowmirror.engine.source import log_start
from shallowmirror.errors import BrokerError, CorruptDataError, Where
from shallowmirror.net import Cluster
from shallowmirror.net.protocol import FETCH_API_KEY, fetch_request, versions

#: Bytes asked for per partition and Fetch request (a larger first batch still comes whole).
MAX_PARTITION_BYTES = 2 * 1024 * 1024
#: Records sections are compared in slices this size: small enough that the temporary ``bytes``
#: comes from the allocator's free lists, not a fresh mmap (10x faster on 1 MB batches).
COMPARE_SLICE_BYTES = 64 * 1024
#: Fetches in a row that may return no batch before the partition is reported stuck.
MAX_EMPTY_FETCHES = 50
_TIMESTAMP_TYPE_BIT = 0x08


# -- comparing one pair ------------------------------------------------------------------------


def needs_rebuild(view: Any, start_offset: int) -> bool:
    """Whether the engine rebuilds this source batch through the deep path before forwarding."""
    return (view.is_legacy or view.record_count != view.last_offset_delta + 1
            or view.base_offset < start_offset)


def same_bytes(a: memoryview, b: memoryview) -> bool:
    """``a == b`` byte for byte. memoryview's own ``==`` goes element by element (0.1 GB/s);
    ``bytes.startswith`` takes any buffer and memcmps it, so only ``a``'s slice is copied
    (13 GB/s, against 9 with both copied)."""
    if len(a) != len(b):
        return False
    for start in range(0, len(a), COMPARE_SLICE_BYTES):
        end = start + COMPARE_SLICE_BYTES
        if not bytes(a[start:end]).startswith(b[start:end]):
            return False
    return True


def compare_forwarded(source: Any, target: Any) -> str | None:
    """Why ``target`` is not the byte-for-byte forward of ``source`` (two v2 batch views), or
    None. See the module docstring for which header fields count."""
    if source.record_count != target.record_count:
        return f"record count {source.record_count} on the source, {target.record_count} on " \
               "the target"
    if source.last_offset_delta != target.last_offset_delta:
        return f"last offset delta {source.last_offset_delta} on the source, " \
               f"{target.last_offset_delta} on the target"
    if source.compression != target.compression:
        return (f"codec {_codec(source.compression)} on the source, "
                f"{_codec(target.compression)} on the target")
    if source.base_timestamp != target.base_timestamp:
        return f"first timestamp {source.base_timestamp} on the source, " \
               f"{target.base_timestamp} on the target"
    log_append = (source.attributes | target.attributes) & _TIMESTAMP_TYPE_BIT
    if not log_append and source.max_timestamp != target.max_timestamp:
        return f"max timestamp {source.max_timestamp} on the source, {target.max_timestamp} " \
               "on the target"
    if not same_bytes(source.buffer[HEADER_SIZE:], target.buffer[HEADER_SIZE:]):
        first = _first_difference(source.buffer[HEADER_SIZE:], target.buffer[HEADER_SIZE:])
        return (f"records section differs at byte {HEADER_SIZE + first} of the batch "
                f"({source.size} bytes on the source, {target.size} on the target)")
    return None


def _first_difference(a: memoryview, b: memoryview) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare_records(source: Sequence[deep.Record], target: Sequence[deep.Record]) -> str | None:
    """Why the target records are not the source records (a re-packed batch), or None."""
    for i, (s, t) in enumerate(zip(source, target, strict=True)):
        if (s.key, s.value, list(s.headers)) != (t.key, t.value, list(t.headers)):
            return f"record {i} of the re-packed batch (source offset {s.offset}) differs in " \
                   "key, value or headers"
        both_create_time = s.timestamp_type == 0 and t.timestamp_type == 0
        if both_create_time and s.timestamp != t.timestamp:
            return f"record {i} of the re-packed batch (source offset {s.offset}) has " \
                   f"timestamp {s.timestamp} on the source, {t.timestamp} on the target"
    return None


# -- reading one partition ---------------------------------------------------------------------


class PartitionReader:
    """One partition's batches from its log start (or ``from_offset``) up to the end seen at the
    first Fetch (high watermark, or last stable offset under read_committed), one Fetch response
    at a time with the next one already requested. ``chunks()`` yields the kept batch views of
    each response. From the log start, an offset 0 below it moves the start up; from a given
    ``from_offset`` that is out of range, the BrokerError (OFFSET_OUT_OF_RANGE) is raised."""

    def __init__(self, cluster: Cluster, topic: str, partition: int, *,
                 read_committed: bool, drop_aborted: bool,
                 max_partition_bytes: int = MAX_PARTITION_BYTES,
                 from_offset: int | None = None):
        self.cluster, self.topic, self.partition = cluster, topic, partition
        self.read_committed = read_committed
        self.drop_aborted = drop_aborted
        self.max_partition_bytes = max_partition_bytes
        self.from_log_start = from_offset is None
        self.start_offset = from_offset or 0
        self.end_offset: int | None = None
        self.position = self.start_offset
        self.bytes_read = 0
        self.dropped = 0

    def where(self, offset: int | None = None) -> Where:
        return Where(cluster=self.cluster.alias, topic=self.topic, partition=self.partition,
                     offset=self.position if offset is None else offset)

    async def _fetch(self, offset: int) -> Any:
        conn = await self.cluster.leader_connection(self.topic, self.partition)
        version = conn.api_version(FETCH_API_KEY, versions(FETCH_API_KEY))
        req = fetch_request(version, [(self.topic, self.partition, offset,
                                       self.max_partition_bytes)],
                            max_wait_ms=100, min_bytes=1, max_bytes=self.max_partition_bytes,
                            isolation_level=1 if self.read_committed else 0)
        frame = await conn.request_frame(req)
        response = codec.decode_fetch_response(frame, version)
        for t in response.topics:
            for part in t.partitions:
                if part.partition == self.partition:
                    return part
        raise BrokerError(Errors.UnknownTopicOrPartitionError.errno, self.where(offset))

    def _below_log_start(self, part: Any) -> bool:
        """The first fetch from the log start asked for offset 0, and the log starts later
        (retention or DeleteRecords moved it): asked once."""
        return (part.error_code == Errors.OffsetOutOfRangeError.errno and self.from_log_start
                and self.start_offset == 0)

    async def _log_start(self, part: Any) -> int:
        """Where the log starts after an OFFSET_OUT_OF_RANGE at 0 (``source.log_start``)."""
        start = await log_start(self.cluster, (self.topic, self.partition),
                                part.log_start_offset)
        if start <= 0:
            raise BrokerError(part.error_code, self.where(0))
        return start

    def _first_answer(self, part: Any) -> None:
        """Fix the end from the first answer."""
        if part.error_code:
            raise BrokerError(part.error_code, self.where())
        end = part.high_watermark
        if self.read_committed and part.last_stable_offset >= 0:
            end = part.last_stable_offset
        self.end_offset = end

    def _kept(self, part: Any) -> list:
        """The batches of one answer that the comparison sees, and the position advanced."""
        records = part.records
        if records is None or len(records) == 0:
            return []
        split = codec.split_batches(records, verify_crc=False, topic=self.topic,
                                    partition=self.partition)
        if not split.batches:
            return []
        self.bytes_read += split.consumed
        aborted = list(part.aborted_transactions or []) if self.drop_aborted else None
        kept = codec.filter_batches(split.batches, fetch_offset=self.position,
                                    aborted_transactions=aborted)
        assert self.end_offset is not None
        end = self.end_offset
        # Empty batches (compaction removed every record) are gaps; legacy entries have no
        # record count (-1) and are converted by the deep path.
        out = [b for b in kept if b.base_offset < end and (b.record_count > 0 or b.is_legacy)]
        self.dropped += sum(1 for b in split.batches
                            if b.next_offset > self.position and b.base_offset < end) - len(out)
        self.position = split.batches[-1].next_offset
        return out

    async def chunks(self) -> AsyncIterator[list]:
        pending: asyncio.Future | None = asyncio.ensure_future(self._fetch(self.position))
        empty = 0
        try:
            while pending is not None:
                part = await pending
                pending = None
                if self.end_offset is None:
                    if self._below_log_start(part):
                        self.start_offset = self.position = await self._log_start(part)
                        pending = asyncio.ensure_future(self._fetch(self.position))
                        continue
                    self._first_answer(part)
                if part.error_code:
                    raise BrokerError(part.error_code, self.where())
                assert self.end_offset is not None
                if self.position >= self.end_offset:
                    return
                before = self.position
                kept = self._kept(part)
                if self.position == before:
                    empty += 1
                    if empty > MAX_EMPTY_FETCHES:
                        raise CorruptDataError(
                            f"no batch returned at offset {before} in {empty} fetches (the end "
                            f"seen at start is {self.end_offset})", self.where(before))
                else:
                    empty = 0
                if self.position < self.end_offset:
                    pending = asyncio.ensure_future(self._fetch(self.position))
                if kept:
                    yield kept
        finally:
            if pending is not None:
                pending.cancel()


class BatchCursor:
    """Batch-at-a-time access over a reader's chunks."""

    def __init__(self, reader: PartitionReader):
        self.reader = reader
        self._chunks = reader.chunks()
        self.items: list = []
        self.index = 0

    async def peek(self) -> Any | None:
        while self.index >= len(self.items):
            try:
                self.items = await self._chunks.__anext__()
            except StopAsyncIteration:
                return None
            self.index = 0
        return self.items[self.index]

    async def take(self) -> Any | None:
        view = await self.peek()
        if view is not None:
            self.index += 1
        return view

    async def close(self) -> None:
        await self._chunks.aclose()

    async def remaining(self) -> tuple[int, int]:
        """(batches, records) left, reading to the end."""
        batches = records = 0
        while (view := await self.take()) is not None:
            batches += 1
            records += view.record_count
        return batches, records


@dataclass
class RebuiltMatch:
    """A re-packed source batch against the target batches after it (``match_rebuilt``)."""

    wanted: int                  # source records at or past the start offset
    got: int                     # target records read for them
    first_target: int | None     # base offset of the first target batch read
    target_bytes: int
    exhausted: bool              # the target ended before holding ``wanted`` records
    reason: str | None           # why they differ (None: the same records, or exhausted)


async def match_rebuilt(source: Any, start_offset: int, target: BatchCursor) -> RebuiltMatch:
    """Take target batches until they hold as many records as the re-packed ``source`` batch
    (its records from ``start_offset`` on), and compare the records."""
    wanted = [r for r in deep.decode_records(source) if r.offset >= start_offset]
    got: list[deep.Record] = []
    first_target = None
    target_bytes = 0
    while len(got) < len(wanted):
        t = await target.take()
        if t is None:
            return RebuiltMatch(len(wanted), len(got), first_target, target_bytes, True, None)
        first_target = t.base_offset if first_target is None else first_target
        got.extend(deep.decode_records(t))
        target_bytes += t.size
    if len(got) != len(wanted):
        reason = (f"the re-packed batch has {len(wanted)} records on the source, {len(got)} in "
                  "the target batches that hold it")
    else:
        reason = compare_records(wanted, got)
    return RebuiltMatch(len(wanted), len(got), first_target, target_bytes, False, reason)


def _codec(compression: int) -> str:
    """A codec's name (the id itself if unknown: a corrupt attribute)."""
    return COMPRESSION_NAMES.get(compression, f"id {compression}")
