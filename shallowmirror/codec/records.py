"""Record-set half of the codec, pure-Python twin of ``native/_crecords.pyx``.

Contract (``shallowmirror.codec.contract``): ``split_batches`` cuts a record set into batch views
(slices of the caller's buffer, never copies) after checking every header and, optionally, the
CRC; ``filter_batches`` keeps what a ``read_committed`` Java consumer would deliver (minus what
lies wholly below the fetch offset); ``rewrite_for_produce`` makes a new 61-byte header for a
Produce request and hands back the untouched rest of the batch. Byte layout: ``layout.py``.

Decisions both implementations share (the differential suite holds them to it):
- A batch whose ``batchLength`` runs past the end of the buffer is a partial tail (a fetch cut
  it), *unless* its magic byte is readable and wrong or its length is below the minimum for its
  magic: then it is corrupt. Junk therefore fails loudly instead of looking like a short read.
- ``record_count <= last_offset_delta + 1`` is accepted: compaction leaves offset gaps (and even
  empty batches). Such a batch cannot be produced as is; ``rewrite_for_produce`` refuses it with
  ``UnsupportedFormatError`` and ``deep.repack_batch`` fixes it.
- Legacy entries (magic 0/1) are split and CRC-checked (CRC-32) but never rewritten.
- Offsets are int64 on the wire: a batch whose ``next_offset`` (base offset + last offset delta
  + 1) would pass 2**63 - 1 is corrupt (the base offset lies outside the CRC).
- Arguments are checked at the boundary, identically in both: an int argument must be an
  integer (``operator.index``: TypeError otherwise) within its wire range (ValueError); batches
  handed to ``filter_batches`` must be this module's ``BatchView``; ``aborted_transactions``
  entries must be (producer_id, first_offset) pairs of int64s.
- For legacy entries ``last_offset == base_offset`` (the wrapper carries the last inner offset).

Out of scope: decompression, record-level decoding (``deep``), Fetch/Produce framing
(``messages``).
"""

from __future__ import annotations

import operator
import struct
import zlib
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from crc32c import crc32c

from shallowmirror.codec import layout as L
from shallowmirror.errors import CorruptDataError, CrcMismatchError, UnsupportedFormatError, Where

__all__ = ["BatchView", "SplitResult", "split_batches", "filter_batches", "rewrite_for_produce",
           "stamp_batches"]

_LOG_HEADER = struct.Struct(">qi")
# baseOffset length leaderEpoch magic crc attributes lastOffsetDelta baseTimestamp maxTimestamp
# producerId producerEpoch baseSequence recordCount
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
_LEGACY_CRC_MAGIC_ATTRS = struct.Struct(">Ibb")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")
_PRODUCER_FIELDS = struct.Struct(">qhi")   # producerId, producerEpoch, baseSequence

_INT16_MIN, _INT16_MAX = -(1 << 15), (1 << 15) - 1
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class BatchView:
    """One batch (or legacy entry) of a record set; ``buffer`` aliases the caller's bytes."""

    __slots__ = (
        "_records", "position", "base_offset", "batch_length", "partition_leader_epoch",
        "magic", "crc", "attributes", "last_offset_delta", "base_timestamp", "max_timestamp",
        "producer_id", "producer_epoch", "base_sequence", "record_count",
    )

    def __init__(self, records: memoryview, position: int, base_offset: int, batch_length: int,
                 partition_leader_epoch: int, magic: int, crc: int, attributes: int,
                 last_offset_delta: int, base_timestamp: int, max_timestamp: int,
                 producer_id: int, producer_epoch: int, base_sequence: int,
                 record_count: int) -> None:
        self._records = records
        self.position = position
        self.base_offset = base_offset
        self.batch_length = batch_length
        self.partition_leader_epoch = partition_leader_epoch
        self.magic = magic
        self.crc = crc
        self.attributes = attributes
        self.last_offset_delta = last_offset_delta
        self.base_timestamp = base_timestamp
        self.max_timestamp = max_timestamp
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.record_count = record_count

    @property
    def compression(self) -> int:
        return self.attributes & L.COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        if self.magic == 0:
            return L.CREATE_TIME
        return L.LOG_APPEND_TIME if self.attributes & L.TIMESTAMP_TYPE_MASK else L.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & L.TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & L.CONTROL_MASK)

    @property
    def is_legacy(self) -> bool:
        return self.magic < 2

    @property
    def last_offset(self) -> int:
        if self.magic < 2:
            return self.base_offset
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def size(self) -> int:
        return self.batch_length + L.LOG_OVERHEAD

    @property
    def buffer(self) -> memoryview:
        return self._records[self.position:self.position + self.batch_length + L.LOG_OVERHEAD]

    def __repr__(self) -> str:
        return (f"BatchView(position={self.position}, base_offset={self.base_offset}, "
                f"magic={self.magic}, size={self.size}, record_count={self.record_count}, "
                f"attributes={self.attributes:#x})")


class SplitResult:
    """Batches of a record set, the bytes they cover, and whether a truncated tail remains."""

    __slots__ = ("batches", "consumed", "partial")

    def __init__(self, batches: list, consumed: int, partial: bool) -> None:
        self.batches = batches
        self.consumed = consumed
        self.partial = partial

    def __repr__(self) -> str:
        return (f"SplitResult(batches={len(self.batches)}, consumed={self.consumed}, "
                f"partial={self.partial})")


def _overflow_message(base_offset: int, last_offset_delta: int) -> str:
    return (f"base offset {base_offset} + last offset delta {last_offset_delta} leaves no next "
            f"offset within int64 (at most {_INT64_MAX})")


def _as_int(name: str, value, low: int, high: int) -> int:
    """An integer argument in [low, high]: TypeError if not an integer, ValueError if out."""
    if type(value) is not int:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} {value} out of range [{low}, {high}]")
    return value


def _aborted_pairs(aborted_transactions) -> list[tuple[int, int]]:
    """(producer_id, first_offset) pairs, checked, sorted by first offset."""
    pairs = []
    for item in aborted_transactions:
        try:
            producer_id, first_offset = item
        except (TypeError, ValueError):
            raise TypeError("aborted_transactions entries must be (producer_id, first_offset) "
                            f"pairs, got {type(item).__name__} {item!r:.60}") from None
        pairs.append((_as_int("aborted producer_id", producer_id, _INT64_MIN, _INT64_MAX),
                      _as_int("aborted first_offset", first_offset, _INT64_MIN, _INT64_MAX)))
    pairs.sort(key=_first_offset)
    return pairs


def _first_offset(pair: tuple[int, int]) -> int:
    return pair[1]


def _as_bytes_view(records) -> memoryview:
    view = memoryview(records)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _corrupt(message: str, topic, partition, offset, position, cls=CorruptDataError):
    return cls(message, Where(topic=topic, partition=partition, offset=offset, position=position))


def split_batches(records, *, verify_crc: bool = True, topic: str | None = None,
                  partition: int | None = None) -> SplitResult:
    """Split a record set into batch views; stop cleanly at a trailing partial batch."""
    verify_crc = bool(verify_crc)               # flags are read at the boundary, as in native
    view = _as_bytes_view(records)
    end = view.nbytes
    pos = 0
    batches: list[BatchView] = []
    partial = False
    while True:
        remaining = end - pos
        if remaining < L.LOG_OVERHEAD:
            partial = remaining > 0
            break
        base_offset, length = _LOG_HEADER.unpack_from(view, pos)
        if remaining <= L.MAGIC_OFFSET:
            # Magic not readable yet: only the length can be judged.
            if length < L.LEGACY_MIN_LENGTH_V0:
                raise _corrupt(f"batch length {length} below the minimum "
                               f"{L.LEGACY_MIN_LENGTH_V0}", topic, partition, base_offset, pos)
            partial = True
            break
        magic = view[pos + L.MAGIC_OFFSET]
        if magic > 127:
            magic -= 256
        if magic == 2:
            min_length = L.V2_MIN_BATCH_LENGTH
        elif magic == 1:
            min_length = L.LEGACY_MIN_LENGTH_V1
        elif magic == 0:
            min_length = L.LEGACY_MIN_LENGTH_V0
        else:
            raise _corrupt(f"unknown magic {magic}", topic, partition, base_offset, pos)
        if length < min_length:
            raise _corrupt(f"batch length {length} below the minimum {min_length} for magic "
                           f"{magic}", topic, partition, base_offset, pos)
        size = length + L.LOG_OVERHEAD
        if size > remaining:
            partial = True
            break
        if magic == 2:
            batch = _parse_v2(view, pos, size, verify_crc, topic, partition)
        else:
            batch = _parse_legacy(view, pos, size, magic, verify_crc, topic, partition)
        batches.append(batch)
        pos += size
    return SplitResult(batches, pos, partial)


def _parse_v2(view: memoryview, pos: int, size: int, verify_crc: bool, topic, partition
              ) -> BatchView:
    (base_offset, length, leader_epoch, magic, crc, attributes, last_offset_delta,
     base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence,
     record_count) = _V2_HEADER.unpack_from(view, pos)
    if attributes & L.COMPRESSION_MASK > L.MAX_COMPRESSION_V2:
        raise _corrupt(f"unknown compression codec {attributes & L.COMPRESSION_MASK}",
                       topic, partition, base_offset, pos)
    if last_offset_delta < 0 or record_count < 0 or record_count > last_offset_delta + 1:
        raise _corrupt(f"record count {record_count} does not fit last offset delta "
                       f"{last_offset_delta}", topic, partition, base_offset, pos)
    if base_offset > _INT64_MAX - 1 - last_offset_delta:
        raise _corrupt(_overflow_message(base_offset, last_offset_delta), topic, partition,
                       base_offset, pos)
    if verify_crc:
        computed = crc32c(view[pos + L.ATTRIBUTES_OFFSET:pos + size])
        if computed != crc:
            raise _corrupt(f"CRC-32C mismatch: stored {crc:#010x}, computed {computed:#010x}",
                           topic, partition, base_offset, pos, CrcMismatchError)
    return BatchView(view, pos, base_offset, length, leader_epoch, magic, crc, attributes,
                     last_offset_delta, base_timestamp, max_timestamp, producer_id,
                     producer_epoch, base_sequence, record_count)


def _parse_legacy(view: memoryview, pos: int, size: int, magic: int, verify_crc: bool, topic,
                  partition) -> BatchView:
    base_offset, length = _LOG_HEADER.unpack_from(view, pos)
    crc, _, attributes = _LEGACY_CRC_MAGIC_ATTRS.unpack_from(view, pos + L.LEGACY_CRC_OFFSET)
    if attributes & L.COMPRESSION_MASK > L.MAX_COMPRESSION_LEGACY:
        raise _corrupt(f"unknown compression codec {attributes & L.COMPRESSION_MASK} for magic "
                       f"{magic}", topic, partition, base_offset, pos)
    if base_offset > _INT64_MAX - 1:
        raise _corrupt(_overflow_message(base_offset, 0), topic, partition, base_offset, pos)
    end = pos + size
    key_pos = pos + (L.LEGACY_KEY_LENGTH_OFFSET_V1 if magic == 1 else
                     L.LEGACY_KEY_LENGTH_OFFSET_V0)
    key_length = _INT32.unpack_from(view, key_pos)[0]
    value_pos = key_pos + 4 + max(key_length, 0)
    # The minimum length guarantees room for both length fields of an empty key and value.
    if key_length < -1 or value_pos + 4 > end:
        raise _corrupt(f"legacy key length {key_length} does not fit the message", topic,
                       partition, base_offset, pos)
    value_length = _INT32.unpack_from(view, value_pos)[0]
    if value_length < -1 or value_pos + 4 + max(value_length, 0) != end:
        raise _corrupt(f"legacy value length {value_length} does not fill the message", topic,
                       partition, base_offset, pos)
    if verify_crc:
        computed = zlib.crc32(view[pos + L.MAGIC_OFFSET:end])
        if computed != crc:
            raise _corrupt(f"CRC-32 mismatch: stored {crc:#010x}, computed {computed:#010x}",
                           topic, partition, base_offset, pos, CrcMismatchError)
    return BatchView(view, pos, base_offset, length, -1, magic, crc, attributes, -1, -1, -1, -1,
                     -1, -1, -1)


def _read_varint(view: memoryview, pos: int, end: int, max_bytes: int, batch: BatchView
                 ) -> tuple[int, int]:
    """Zigzag varint at ``pos``; at most ``max_bytes`` bytes and never past ``end``."""
    shift = 0
    raw = 0
    for i in range(max_bytes):
        if pos + i >= end:
            break
        byte = view[pos + i]
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos + i + 1
        shift += 7
    raise CorruptDataError("malformed varint in control record",
                           Where(offset=batch.base_offset, position=batch.position))


def _is_abort_marker(batch: BatchView) -> bool:
    """Whether a control batch's first record is an ABORT marker (as the Java consumer reads)."""
    if batch.record_count == 0:
        return False
    view = batch._records
    start = batch.position
    end = start + batch.size
    pos = start + L.RECORDS_OFFSET
    _, pos = _read_varint(view, pos, end, 5, batch)            # record length
    pos += 1                                                    # record attributes
    _, pos = _read_varint(view, pos, end, 10, batch)            # timestamp delta
    _, pos = _read_varint(view, pos, end, 5, batch)             # offset delta
    key_length, pos = _read_varint(view, pos, end, 5, batch)
    if key_length < 4 or pos + 4 > end:
        raise CorruptDataError(f"control record key of {key_length} bytes is too short",
                               Where(offset=batch.base_offset, position=batch.position))
    version = _INT16.unpack_from(view, pos)[0]
    if version < 0:
        raise CorruptDataError(f"control record version {version} is negative",
                               Where(offset=batch.base_offset, position=batch.position))
    return _INT16.unpack_from(view, pos + 2)[0] == L.CONTROL_TYPE_ABORT


def filter_batches(batches: Sequence[BatchView], *, fetch_offset: int,
                   aborted_transactions: Sequence[tuple[int, int]] | None = None,
                   drop_control: bool = True) -> list:
    """Batches worth forwarding (contract.Codec.filter_batches).

    ``aborted_transactions is None`` means read_uncommitted: nothing is dropped for aborts.
    Otherwise the Java consumer's rule: an aborted (producer_id, first_offset) marks that
    producer as aborting once a batch reaches first_offset; its transactional batches are dropped
    until its ABORT control batch. The bookkeeping runs for every batch, including those below
    the fetch offset, so a marker below it still closes its transaction.
    """
    drop_control = bool(drop_control)
    fetch_offset = _as_int("fetch_offset", fetch_offset, _INT64_MIN, _INT64_MAX)
    read_committed = aborted_transactions is not None
    pending = _aborted_pairs(aborted_transactions) if read_committed else []
    next_pending = 0
    aborting: set[int] = set()
    kept = []
    for batch in batches:
        if type(batch) is not BatchView:
            raise TypeError("batches must hold BatchView objects from split_batches, got "
                            f"{type(batch).__name__}")
        if read_committed and batch.producer_id >= 0:
            last_offset = batch.last_offset
            while next_pending < len(pending) and pending[next_pending][1] <= last_offset:
                aborting.add(pending[next_pending][0])
                next_pending += 1
            if batch.is_control:
                if _is_abort_marker(batch):
                    aborting.discard(batch.producer_id)
            elif batch.is_transactional and batch.producer_id in aborting:
                continue
        if batch.is_control and drop_control:
            continue
        if batch.last_offset < fetch_offset:
            continue
        kept.append(batch)
    return kept


def rewrite_for_produce(batch: BatchView, *, producer_id: int = -1, producer_epoch: int = -1,
                        base_sequence: int = -1, transactional: bool = False,
                        clear_log_append_time: bool = False) -> tuple[bytes, memoryview]:
    """(new 61-byte header, view of the rest) for a Produce request (contract.Codec)."""
    transactional, clear_log_append_time = bool(transactional), bool(clear_log_append_time)
    if type(batch) is not BatchView:
        raise TypeError(f"batch must be a BatchView from split_batches, got {type(batch).__name__}")
    where = Where(offset=batch.base_offset, position=batch.position)
    if batch.magic < 2:
        raise UnsupportedFormatError(
            f"legacy magic {batch.magic} entry cannot go into Produce v3+; convert it with "
            "shallowmirror.codec.deep.convert_legacy", where)
    if batch.attributes & L.CONTROL_MASK:
        raise UnsupportedFormatError("control batches cannot be produced; drop them", where)
    if batch.record_count != batch.last_offset_delta + 1:
        raise UnsupportedFormatError(
            f"batch has offset gaps (record count {batch.record_count}, last offset delta "
            f"{batch.last_offset_delta}); repack it with shallowmirror.codec.deep.repack_batch",
            where)
    producer_id = _as_int("producer_id", producer_id, _INT64_MIN, _INT64_MAX)
    producer_epoch = _as_int("producer_epoch", producer_epoch, _INT16_MIN, _INT16_MAX)
    base_sequence = _as_int("base_sequence", base_sequence, _INT32_MIN, _INT32_MAX)
    if transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id")

    # The delete horizon (KIP-534) is the source cleaner's schedule, not the target's: clear it,
    # so the target's own delete.retention.ms decides when its tombstones go.
    attributes = batch.attributes & ~(L.TRANSACTIONAL_MASK | L.DELETE_HORIZON_MASK)
    if transactional:
        attributes |= L.TRANSACTIONAL_MASK
    if clear_log_append_time:
        attributes &= ~L.TIMESTAMP_TYPE_MASK
    start = batch.position
    whole = batch._records
    header = bytearray(whole[start:start + L.HEADER_SIZE])
    header[0:8] = b"\x00" * 8                                   # baseOffset 0, outside the CRC
    header[12:16] = b"\xff\xff\xff\xff"                         # partitionLeaderEpoch -1
    rest = whole[start + L.HEADER_SIZE:start + batch.size]
    if (attributes != batch.attributes or producer_id != batch.producer_id
            or producer_epoch != batch.producer_epoch or base_sequence != batch.base_sequence):
        covered = bytes(header[L.ATTRIBUTES_OFFSET:])
        _INT16.pack_into(header, L.ATTRIBUTES_OFFSET, attributes)
        _PRODUCER_FIELDS.pack_into(header, L.PRODUCER_ID_OFFSET, producer_id, producer_epoch,
                                   base_sequence)
        # The CRC follows the header's change, as the native build computes it: CRC-32C is
        # linear, so crc(new) ^ crc(old) does not depend on the CRC the batch carries, and a
        # batch that arrived with a wrong CRC keeps a wrong one (never a fresh, valid CRC over
        # damaged bytes). The native build gets the difference from the 40 changed header bytes
        # alone; here two passes of the crc32c package give the same number.
        crc = (batch.crc ^ crc32c(rest, crc32c(memoryview(header)[L.ATTRIBUTES_OFFSET:]))
               ^ crc32c(rest, crc32c(covered)))
        _UINT32.pack_into(header, L.CRC_OFFSET, crc)
    return bytes(header), rest


def stamp_batches(picks: Iterable[tuple[Hashable, Any]], *, producer_id: int = -1,
                  producer_epoch: int = -1, generation: int,
                  sequences: dict[Hashable, int] | None = None,
                  clear_log_append_time: bool = False, headers: bool = True) -> int:
    """Stamp the batches of one Produce request (contract.Codec.stamp_batches); returns how
    many were stamped."""
    producer_id = _as_int("producer_id", producer_id, _INT64_MIN, _INT64_MAX)
    producer_epoch = _as_int("producer_epoch", producer_epoch, _INT16_MIN, _INT16_MAX)
    if sequences is not None and type(sequences) is not dict:
        raise TypeError(f"sequences must be a dict or None, got {type(sequences).__name__}")
    stamped = 0
    for key, batch in picks:
        if batch.stamp_generation == generation:
            continue                          # stamped: a resend keeps its bytes
        view = batch.view
        if type(view) is not BatchView:
            raise TypeError(f"batch.view must be a BatchView from split_batches, got "
                            f"{type(view).__name__}")
        if sequences is None:
            base = -1
        else:
            count = batch.record_count
            if count <= 0:
                raise ValueError(f"an idempotent batch needs at least one record ({batch!r})")
            base = _as_int("sequence", sequences.get(key, 0), 0, _INT32_MAX)
            sequences[key] = (base + count) % L.SEQUENCE_MODULUS
        header_rest = rewrite_for_produce(
            view, producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base,
            clear_log_append_time=clear_log_append_time)    # its checks, in either case
        if headers:
            batch.header, batch.rest = header_rest
        batch.producer_id = producer_id
        batch.producer_epoch = producer_epoch
        batch.base_sequence = base
        batch.stamp_generation = generation
        stamped += 1
    return stamped
