"""Deep paths: the few batches that must be decompressed and rebuilt.

Shallow forwarding covers almost every batch; these cover the rest (README, "Decisions worth
knowing"):
- ``trim_batch``: a fetch that starts inside a batch (KIP-712 "fetch from the middle");
- ``repack_batch``: a compacted batch with offset gaps (``lastOffsetDelta + 1 != recordCount``);
- ``convert_legacy``: magic 0/1 message sets, which Produce v3+ does not accept;
- ``decode_records`` / ``iter_records``: reading records, for tests, tools and the deep-mirror
  baseline.

Every rebuilt batch keeps the source codec, base timestamp, timestamp type, leader epoch and
producer fields (sequence shifted as Kafka does for the first kept record); a trimmed or
repacked batch copies each kept record's bytes and only renumbers its offset delta, so record
timestamps, keys, values and headers come out exactly as they went in. Inputs are batch views
(``records.BatchView`` or the native one) or the raw bytes of one batch.

Hostile input (the batch CRC only proves the producer meant these bytes): every size is checked
against the bytes left (``v2records``, ``legacy``), decompression stops at
``DecompressionLimit.for_batch`` (``compression``), record counts are bounded by the bytes that
must hold them, and records stream through trim/repack/convert one at a time, so memory stays
proportional to the limit. Errors: ``CorruptDataError`` for malformed data,
``DecompressionLimitError`` (an ``UnsupportedFormatError``) over the limit,
``UnsupportedFormatError`` for data a path cannot carry, each naming offset and byte position.

Out of scope: the hot path (``records``), which never decompresses.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import kafka.codec
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from shallowmirror.codec import compression, legacy, v2records
from shallowmirror.codec import layout as L
from shallowmirror.errors import CorruptDataError, LocatedError, UnsupportedFormatError, Where

__all__ = ["Record", "DecompressionLimit", "DEFAULT_LIMIT", "decode_records", "iter_records",
           "trim_batch", "repack_batch", "convert_legacy"]

_MIB = 1 << 20
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
# baseOffset length leaderEpoch magic crc attributes lastOffsetDelta baseTimestamp maxTimestamp
# producerId producerEpoch baseSequence recordCount
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
_MAX_INT32 = (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_NO_TIMESTAMP = -1


@dataclass(frozen=True)
class DecompressionLimit:
    """How far the deep path may decompress one batch: ``ratio`` times its size on the wire,
    never less than ``floor_bytes`` (tiny batches of very compressible data stay possible),
    never more than ``max_bytes`` (settings ``deep.max.decompression.ratio`` and
    ``deep.max.decompressed.bytes``)."""

    ratio: int = 64
    max_bytes: int = 256 * _MIB
    floor_bytes: int = 1 * _MIB

    def for_batch(self, size: int) -> int:
        return min(self.max_bytes, max(self.floor_bytes, self.ratio * size))


DEFAULT_LIMIT = DecompressionLimit()


@dataclass(frozen=True)
class Record:
    """One record as a consumer sees it (control records included, key/value raw)."""

    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


class _SameCodecBuilder(DefaultRecordBatchBuilder):
    """kafka-python's v2 builder, except that it always compresses with the codec it was given.

    Not used by the deep paths any more (they copy record bytes); kept for tests and benchmarks
    that build batches the way a producer does.
    """

    __slots__ = ()

    def _maybe_compress(self) -> bool:
        if self._compression_type == self.CODEC_NONE:
            return False
        self._assert_has_codec(self._compression_type)
        header_size = self.HEADER_STRUCT.size
        data = bytes(self._buffer[header_size:])
        compressed = compression.compress(self._compression_type, data)
        del self._buffer[header_size:]
        self._buffer.extend(compressed)
        return True


assert kafka.codec.has_snappy()      # compression installs the cramjam adapter


@dataclass(frozen=True)
class _Header:
    """The fields of a v2 batch header the deep paths use."""

    base_offset: int
    leader_epoch: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def compression(self) -> int:
        return self.attributes & L.COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return L.LOG_APPEND_TIME if self.attributes & L.TIMESTAMP_TYPE_MASK else L.CREATE_TIME


# --- input: one batch's bytes, framing checked ----------------------------------------------

def _batch_bytes(batch) -> tuple[bytes, int, int]:
    """(bytes of one batch, its position for error messages, its base offset)."""
    if hasattr(batch, "buffer"):
        return bytes(batch.buffer), batch.position, batch.base_offset
    try:
        data = bytes(memoryview(batch))
    except TypeError:
        raise TypeError("a batch must be a BatchView or bytes-like, got "
                        f"{type(batch).__name__}") from None
    if len(data) < L.LOG_OVERHEAD:
        raise CorruptDataError(f"{len(data)} bytes cannot hold a batch", Where(position=0))
    return data, 0, _INT64.unpack_from(data, 0)[0]


def _check_whole(data: bytes, where: Where) -> int:
    """Validate the framing of one batch's bytes; return its magic."""
    if len(data) <= L.MAGIC_OFFSET:
        raise CorruptDataError(f"{len(data)} bytes cannot hold a batch", where)
    length = _INT32.unpack_from(data, L.LENGTH_OFFSET)[0]
    if length + L.LOG_OVERHEAD != len(data):
        raise CorruptDataError(f"batch length {length} does not match its {len(data)} bytes",
                               where)
    magic = data[L.MAGIC_OFFSET]
    minimum = {0: L.LEGACY_MIN_LENGTH_V0, 1: L.LEGACY_MIN_LENGTH_V1,
               2: L.V2_MIN_BATCH_LENGTH}.get(magic)
    if minimum is None:
        raise CorruptDataError(f"unknown magic {magic}", where)
    if length < minimum:
        raise CorruptDataError(f"batch length {length} below the minimum {minimum} for magic "
                               f"{magic}", where)
    return magic


def _v2_header(data: bytes, where: Where) -> _Header:
    """The header of a v2 batch, checked as ``split_batches`` checks it, and the CRC-32C."""
    (base_offset, _, leader_epoch, _, crc, attributes, last_offset_delta, base_timestamp,
     max_timestamp, producer_id, producer_epoch, base_sequence,
     record_count) = _V2_HEADER.unpack_from(data, 0)
    if attributes & L.COMPRESSION_MASK > L.MAX_COMPRESSION_V2:
        raise CorruptDataError(f"unknown compression codec {attributes & L.COMPRESSION_MASK}",
                               where)
    if last_offset_delta < 0 or record_count < 0 or record_count > last_offset_delta + 1:
        raise CorruptDataError(f"record count {record_count} does not fit last offset delta "
                               f"{last_offset_delta}", where)
    if base_offset > _INT64_MAX - 1 - last_offset_delta:
        raise CorruptDataError(f"base offset {base_offset} + last offset delta "
                               f"{last_offset_delta} leaves no next offset within int64", where)
    if crc32c(memoryview(data)[L.ATTRIBUTES_OFFSET:]) != crc:
        raise CorruptDataError("CRC-32C mismatch", where)
    return _Header(base_offset, leader_epoch, attributes, last_offset_delta, base_timestamp,
                   max_timestamp, producer_id, producer_epoch, base_sequence, record_count)


@contextmanager
def _located(where: Where):
    """Errors from data become codec errors naming ``where``; the decoders of untrusted bytes
    (zlib, lz4, zstd, cramjam, struct) raise many types, and memory can run out."""
    try:
        yield
    except LocatedError as err:
        raise err.at(**{k: v for k, v in vars(where).items() if v is not None}) from err
    except Exception as err:  # noqa: BLE001 - see the docstring
        raise CorruptDataError(f"cannot decode records: {err!r}", where) from err


def _limit(limit: DecompressionLimit | None) -> DecompressionLimit:
    if limit is None:
        return DEFAULT_LIMIT
    if not isinstance(limit, DecompressionLimit):
        raise TypeError(f"limit must be a DecompressionLimit, got {type(limit).__name__}")
    return limit


def _v2_payload(data: bytes, header: _Header, limit: DecompressionLimit) -> bytes:
    """The records section, decompressed within the limit for this batch."""
    payload = memoryview(data)[L.RECORDS_OFFSET:]
    if header.compression == L.COMPRESSION_NONE or header.record_count == 0:
        return bytes(payload)
    return compression.decompress(header.compression, payload, limit.for_batch(len(data)))


def _raw_records(data: bytes, header: _Header, limit: DecompressionLimit, *,
                 decode: bool = False) -> Iterator[v2records.RawRecord]:
    return v2records.iter_raw(_v2_payload(data, header, limit),
                              record_count=header.record_count,
                              last_offset_delta=header.last_offset_delta,
                              base_timestamp=header.base_timestamp, decode=decode)


# --- reading ---------------------------------------------------------------------------------

def iter_records(batch, *, limit: DecompressionLimit | None = None) -> Iterator[Record]:
    """Every record of one batch (v2 or legacy), one at a time; checks the CRC first."""
    data, position, base_offset = _batch_bytes(batch)
    where = Where(offset=base_offset, position=position)
    limit = _limit(limit)
    with _located(where):
        magic = _check_whole(data, where)
        if magic == 2:
            yield from _iter_v2(data, where, limit)
        else:
            for message in legacy.iter_messages(data, limit.for_batch(len(data))):
                yield Record(message.offset, message.timestamp, message.timestamp_type,
                             message.key, message.value, [])


def _iter_v2(data: bytes, where: Where, limit: DecompressionLimit) -> Iterator[Record]:
    header = _v2_header(data, where)
    for raw in _raw_records(data, header, limit, decode=True):
        key, value, headers = raw.fields
        # As Kafka's reader: LogAppendTime records all carry the batch's max timestamp.
        timestamp = (header.max_timestamp if header.timestamp_type == L.LOG_APPEND_TIME
                     else header.base_timestamp + raw.timestamp_delta)
        yield Record(header.base_offset + raw.offset_delta, timestamp, header.timestamp_type,
                     key, value, headers)


def decode_records(batch, *, limit: DecompressionLimit | None = None) -> list[Record]:
    """Decompress and decode every record of one batch (v2 or legacy); checks the CRC first.
    Holds every record at once: ``iter_records`` streams."""
    return list(iter_records(batch, limit=limit))


# --- writing ---------------------------------------------------------------------------------

def _encode_batch(header: _Header, payload: bytes) -> bytes:
    """A v2 batch around an encoded (uncompressed) records section; CRC-32C computed."""
    if header.compression != L.COMPRESSION_NONE:
        payload = compression.compress(header.compression, payload)
    length = L.HEADER_SIZE - L.LOG_OVERHEAD + len(payload)
    if length > _MAX_INT32:
        raise CorruptDataError(f"rebuilt batch of {length} bytes exceeds the int32 length")
    out = bytearray(_V2_HEADER.pack(
        header.base_offset, length, header.leader_epoch, 2, 0, header.attributes,
        header.last_offset_delta, header.base_timestamp, header.max_timestamp,
        header.producer_id, header.producer_epoch, header.base_sequence, header.record_count))
    out += payload
    _UINT32.pack_into(out, L.CRC_OFFSET, crc32c(memoryview(out)[L.ATTRIBUTES_OFFSET:]))
    return bytes(out)


def _add_sequence(base: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap at Int32.MAX_VALUE."""
    if base < 0:
        return base
    if base > _MAX_INT32 - increment:
        return increment - (_MAX_INT32 - base) - 1
    return base + increment


class _Rebuild:
    """Kept records re-encoded one by one: the payload, the count and what the header needs.
    Offset deltas become relative to the first kept record, or 0..n-1 when ``dense``."""

    def __init__(self, header: _Header, *, dense: bool) -> None:
        self.header = header
        self.dense = dense
        self.payload = bytearray()
        self.count = 0
        self.first_delta = self.last_delta = -1
        self.max_timestamp_delta = _INT64_MIN

    def add(self, raw: v2records.RawRecord) -> None:
        if self.count == 0:
            self.first_delta = raw.offset_delta
        self.last_delta = raw.offset_delta
        self.max_timestamp_delta = max(self.max_timestamp_delta, raw.timestamp_delta)
        offset_delta = self.count if self.dense else raw.offset_delta - self.first_delta
        self.payload += v2records.encode_record(raw.attributes, raw.timestamp_delta,
                                                offset_delta, raw.body)
        self.count += 1

    def max_timestamp(self) -> int:
        if self.header.timestamp_type == L.LOG_APPEND_TIME:
            return self.header.max_timestamp          # the append time, for every record
        return self.header.base_timestamp + self.max_timestamp_delta


def _v2_for_rebuild(batch, action: str, limit: DecompressionLimit | None
                    ) -> tuple[bytes, _Header, Iterator[v2records.RawRecord], Where]:
    data, position, base_offset = _batch_bytes(batch)
    where = Where(offset=base_offset, position=position)
    with _located(where):
        magic = _check_whole(data, where)
        if magic != 2:
            raise UnsupportedFormatError(f"cannot {action} a legacy magic {magic} entry; "
                                         "use convert_legacy", where)
        header = _v2_header(data, where)
        if header.attributes & L.CONTROL_MASK:
            raise UnsupportedFormatError(f"cannot {action} a control batch", where)
        return data, header, _raw_records(data, header, _limit(limit)), where


def trim_batch(batch, fetch_offset: int, *, limit: DecompressionLimit | None = None) -> bytes:
    """The batch without its records below ``fetch_offset``: same codec, timestamps and
    producer fields; the kept records' bytes are copied, only their offset deltas change."""
    fetch_offset = operator.index(fetch_offset)
    data, header, raws, where = _v2_for_rebuild(batch, "trim", limit)
    rebuild = _Rebuild(header, dense=False)
    with _located(where):
        for raw in raws:            # every record is checked, even when nothing is dropped
            if header.base_offset + raw.offset_delta >= fetch_offset:
                rebuild.add(raw)
    if rebuild.count == 0:
        raise ValueError(f"every record of the batch at offset {header.base_offset} lies "
                         f"below fetch offset {fetch_offset}: drop the batch instead")
    first = rebuild.first_delta
    if first == 0:
        return data
    with _located(where):
        kept = _rebuilt_header(header, base_offset=header.base_offset + first,
                               last_offset_delta=rebuild.last_delta - first,
                               record_count=rebuild.count,
                               base_sequence=_add_sequence(header.base_sequence, first),
                               max_timestamp=rebuild.max_timestamp())
        return _encode_batch(kept, bytes(rebuild.payload))


def repack_batch(batch, *, limit: DecompressionLimit | None = None) -> bytes:
    """A compacted batch renumbered densely (``lastOffsetDelta + 1 == recordCount``).

    The base offset stays the source's; records are renumbered base_offset + 0..n-1, so the
    caller must keep the true source offsets (``decode_records`` of the original) if it needs
    an exact offset map for this batch.
    """
    data, header, raws, where = _v2_for_rebuild(batch, "repack", limit)
    if header.record_count == 0:
        raise ValueError(f"the batch at offset {header.base_offset} is empty (compaction "
                         "removed every record): skip it")
    rebuild = _Rebuild(header, dense=True)
    with _located(where):
        for raw in raws:            # every record is checked, even when nothing changes
            rebuild.add(raw)
        if header.record_count == header.last_offset_delta + 1:
            return data
        dense = _rebuilt_header(header, base_offset=header.base_offset,
                                last_offset_delta=rebuild.count - 1, record_count=rebuild.count,
                                base_sequence=header.base_sequence,
                                max_timestamp=rebuild.max_timestamp())
        return _encode_batch(dense, bytes(rebuild.payload))


def _rebuilt_header(header: _Header, **changes) -> _Header:
    # The delete horizon (KIP-534) belongs to the source's cleaner: a rebuilt batch drops it.
    fields = {**vars(header), **changes,
              "attributes": header.attributes & ~L.DELETE_HORIZON_MASK}
    return _Header(**fields)


def convert_legacy(entries: Sequence, *, limit: DecompressionLimit | None = None) -> list[bytes]:
    """Magic 0/1 entries as v2 batches: consecutive entries of one codec and timestamp type
    become one dense batch (base offset = first record's offset), no producer id."""
    limit = _limit(limit)
    groups: list[_LegacyGroup] = []
    for entry in entries:
        data, position, base_offset = _batch_bytes(entry)
        where = Where(offset=base_offset, position=position)
        with _located(where):
            magic = _check_whole(data, where)
            if magic == 2:
                raise UnsupportedFormatError("convert_legacy takes magic 0/1 entries only",
                                             where)
            codec = data[L.LEGACY_ATTRIBUTES_OFFSET] & L.COMPRESSION_MASK
            for message in legacy.iter_messages(data, limit.for_batch(len(data))):
                if not (groups and groups[-1].takes(codec, message.timestamp_type)):
                    groups.append(_LegacyGroup(codec, message.timestamp_type))
                groups[-1].add(message)
    return [group.build() for group in groups if group.count]


class _LegacyGroup:
    """Legacy messages on their way into one v2 batch, encoded as they arrive."""

    def __init__(self, codec: int, timestamp_type: int) -> None:
        self.codec = codec
        self.timestamp_type = timestamp_type
        self.payload = bytearray()
        self.count = 0
        self.base_offset = 0
        self.base_timestamp = _NO_TIMESTAMP
        self.max_timestamp = _NO_TIMESTAMP

    def takes(self, codec: int, timestamp_type: int) -> bool:
        return (codec, timestamp_type) == (self.codec, self.timestamp_type)

    def add(self, message: legacy.LegacyMessage) -> None:
        if self.count == 0:
            self.base_offset = message.offset
            self.base_timestamp = message.timestamp
        delta = message.timestamp - self.base_timestamp
        if not _INT64_MIN <= delta <= _INT64_MAX:
            raise CorruptDataError(f"timestamps {self.base_timestamp} and {message.timestamp} "
                                   "are too far apart for one batch")
        if self.count > _MAX_INT32 - 1:
            raise CorruptDataError("more records than one batch can number")
        self.payload += v2records.encode_record(0, delta, self.count, v2records.encode_body(
            message.key, message.value))
        self.max_timestamp = max(self.max_timestamp, message.timestamp)
        self.count += 1

    def build(self) -> bytes:
        attributes = self.codec | (L.TIMESTAMP_TYPE_MASK
                                   if self.timestamp_type == L.LOG_APPEND_TIME else 0)
        header = _Header(self.base_offset, -1, attributes, self.count - 1, self.base_timestamp,
                         self.max_timestamp, -1, -1, -1, self.count)
        return _encode_batch(header, bytes(self.payload))
