"""Deep paths: the few batches that must be decompressed and rebuilt, via kafka-python's records.

Shallow forwarding covers almost every batch; these cover the rest (DESIGN.md, "Wire facts"):
- ``trim_batch``: a fetch that starts inside a batch (KIP-712 "fetch from the middle");
- ``repack_batch``: a compacted batch with offset gaps (``lastOffsetDelta + 1 != recordCount``);
- ``convert_legacy``: magic 0/1 message sets, which Produce v3+ does not accept;
- ``decode_records``: reading records, for tests, tools and the deep-mirror baseline.

Every rebuilt batch keeps the source codec (kafka-python's builder would silently fall back to no
compression when compressing does not pay: ``_SameCodecBuilder`` overrides that one decision),
the source base offset and leader epoch, and the producer fields (sequence shifted as Kafka
does for the first kept record). Inputs are batch views (``records.BatchView`` or the native one)
or the raw bytes of one batch.

Snappy: kafka-python imports the ``python-snappy`` module, which is not a dependency here;
when it is absent, a two-function adapter over ``cramjam`` (a dependency; python-snappy >= 0.7
is itself a wrapper of cramjam) is installed into ``kafka.codec`` on import of this module.

Out of scope: the hot path (``records``), which never decompresses.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import cramjam
import kafka.codec
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatch

from shallowmirror.codec import layout as L
from shallowmirror.errors import CorruptDataError, UnsupportedFormatError, Where

__all__ = ["Record", "decode_records", "trim_batch", "repack_batch", "convert_legacy"]

_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")
_MAX_INT32 = (1 << 31) - 1
_NO_TIMESTAMP = -1


class _CramjamSnappy:
    """The two functions of python-snappy's API that ``kafka.codec`` calls, over cramjam."""

    @staticmethod
    def compress(data) -> bytes:
        return bytes(cramjam.snappy.compress_raw(bytes(data)))

    @staticmethod
    def decompress(data) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(bytes(data)))


if kafka.codec.snappy is None:
    kafka.codec.snappy = _CramjamSnappy


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

    The stock builder writes the batch uncompressed when compression does not shrink it; a
    mirror must keep the source codec (the target topic may require it), so that fallback goes.
    """

    __slots__ = ()

    def _maybe_compress(self) -> bool:
        if self._compression_type == self.CODEC_NONE:
            return False
        self._assert_has_codec(self._compression_type)
        header_size = self.HEADER_STRUCT.size
        data = bytes(self._buffer[header_size:])
        encode = {
            self.CODEC_GZIP: kafka.codec.gzip_encode,
            self.CODEC_SNAPPY: kafka.codec.snappy_encode,
            self.CODEC_LZ4: kafka.codec.lz4_encode,
            self.CODEC_ZSTD: kafka.codec.zstd_encode,
        }[self._compression_type]
        compressed = encode(data)
        del self._buffer[header_size:]
        self._buffer.extend(compressed)
        return True


def _batch_bytes(batch) -> tuple[bytes, int, int]:
    """(bytes of one batch, its position for error messages, its base offset)."""
    if hasattr(batch, "buffer"):
        return bytes(batch.buffer), batch.position, batch.base_offset
    data = bytes(batch)
    if len(data) < L.LOG_OVERHEAD:
        raise CorruptDataError(f"{len(data)} bytes cannot hold a batch", Where(position=0))
    return data, 0, _INT64.unpack_from(data, 0)[0]


def _check_whole(data: bytes, position: int, base_offset: int) -> int:
    """Validate the framing of one batch's bytes; return its magic."""
    where = Where(offset=base_offset, position=position)
    if len(data) <= L.MAGIC_OFFSET:
        raise CorruptDataError(f"{len(data)} bytes cannot hold a batch", where)
    length = _INT32.unpack_from(data, L.LENGTH_OFFSET)[0]
    if length + L.LOG_OVERHEAD != len(data):
        raise CorruptDataError(f"batch length {length} does not match its {len(data)} bytes",
                               where)
    magic = data[L.MAGIC_OFFSET]
    if magic not in (0, 1, 2):
        raise CorruptDataError(f"unknown magic {magic}", where)
    if magic == 2 and len(data) < L.HEADER_SIZE:
        raise CorruptDataError("batch shorter than the v2 header", where)
    return magic


def decode_records(batch) -> list[Record]:
    """Decompress and decode every record of one batch (v2 or legacy); checks the CRC first."""
    data, position, base_offset = _batch_bytes(batch)
    magic = _check_whole(data, position, base_offset)
    where = Where(offset=base_offset, position=position)
    try:
        if magic == 2:
            reader = DefaultRecordBatch(data)
            if not reader.validate_crc():
                raise CorruptDataError("CRC-32C mismatch", where)
            return [Record(r.offset, r.timestamp, r.timestamp_type, r.key, r.value,
                           list(r.headers)) for r in reader]
        legacy = LegacyRecordBatch(data, magic)
        if not legacy.validate_crc():
            raise CorruptDataError("CRC-32 mismatch", where)
        return [Record(r.offset, r.timestamp if r.timestamp is not None else _NO_TIMESTAMP,
                       r.timestamp_type or 0, r.key, r.value, []) for r in legacy]
    except CorruptDataError:
        raise
    except Exception as err:  # noqa: BLE001 - decoders of untrusted bytes raise many types
        raise CorruptDataError(f"cannot decode records: {err!r}", where) from err


def _header(data: bytes) -> DefaultRecordBatch:
    return DefaultRecordBatch(data[:L.HEADER_SIZE])


def _build(records: Sequence[Record], *, base_offset: int, leader_epoch: int, compression: int,
           timestamp_type: int, transactional: bool, producer_id: int, producer_epoch: int,
           base_sequence: int) -> bytes:
    """One dense v2 batch (offset deltas 0..n-1) with the given header fields."""
    if not records:
        raise ValueError("a batch needs at least one record")
    builder = _SameCodecBuilder(2, compression, transactional, producer_id, producer_epoch,
                                base_sequence, _MAX_INT32)
    for delta, record in enumerate(records):
        timestamp = record.timestamp
        if timestamp_type == L.LOG_APPEND_TIME:
            # kafka-python's reader reports the append time for every record of such a batch;
            # keep it (deltas 0) and restore the attribute bit below.
            timestamp = records[-1].timestamp
        builder.append(delta, timestamp, record.key, record.value, record.headers)
    out = bytearray(builder.build())
    _INT64.pack_into(out, L.BASE_OFFSET_OFFSET, base_offset)          # outside the CRC
    _INT32.pack_into(out, L.PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)
    if timestamp_type == L.LOG_APPEND_TIME:
        attributes = _INT16.unpack_from(out, L.ATTRIBUTES_OFFSET)[0] | L.TIMESTAMP_TYPE_MASK
        _INT16.pack_into(out, L.ATTRIBUTES_OFFSET, attributes)
        _UINT32.pack_into(out, L.CRC_OFFSET, crc32c(memoryview(out)[L.ATTRIBUTES_OFFSET:]))
    return bytes(out)


def _add_sequence(base: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap at Int32.MAX_VALUE."""
    if base < 0:
        return base
    if base > _MAX_INT32 - increment:
        return increment - (_MAX_INT32 - base) - 1
    return base + increment


def _v2_for_rebuild(batch, action: str) -> tuple[bytes, DefaultRecordBatch, list[Record]]:
    data, position, base_offset = _batch_bytes(batch)
    magic = _check_whole(data, position, base_offset)
    where = Where(offset=base_offset, position=position)
    if magic != 2:
        raise UnsupportedFormatError(f"cannot {action} a legacy magic {magic} entry; "
                                     "use convert_legacy", where)
    header = _header(data)
    if header.is_control_batch:
        raise UnsupportedFormatError(f"cannot {action} a control batch", where)
    return data, header, decode_records(batch)


def trim_batch(batch, fetch_offset: int) -> bytes:
    """The batch without its records below ``fetch_offset``: same codec and producer fields."""
    data, header, records = _v2_for_rebuild(batch, "trim")
    kept = [r for r in records if r.offset >= fetch_offset]
    if len(kept) == len(records):
        return data
    if not kept:
        raise ValueError(f"every record of the batch at offset {header.base_offset} lies below "
                         f"fetch offset {fetch_offset}: drop the batch instead")
    first = kept[0].offset
    return _build(kept, base_offset=first, leader_epoch=header.leader_epoch,
                  compression=header.compression_type, timestamp_type=header.timestamp_type,
                  transactional=header.is_transactional, producer_id=header.producer_id,
                  producer_epoch=header.producer_epoch,
                  base_sequence=_add_sequence(header.base_sequence, first - header.base_offset))


def repack_batch(batch) -> bytes:
    """A compacted batch renumbered densely (``lastOffsetDelta + 1 == recordCount``).

    The base offset stays the source's; records are renumbered base_offset + 0..n-1, so the
    caller must keep the true source offsets (``decode_records`` of the original) if it needs
    an exact offset map for this batch.
    """
    data, header, records = _v2_for_rebuild(batch, "repack")
    if not records:
        raise ValueError(f"the batch at offset {header.base_offset} is empty (compaction "
                         "removed every record): skip it")
    if header.records_count == header.last_offset_delta + 1:
        return data
    return _build(records, base_offset=header.base_offset, leader_epoch=header.leader_epoch,
                  compression=header.compression_type, timestamp_type=header.timestamp_type,
                  transactional=header.is_transactional, producer_id=header.producer_id,
                  producer_epoch=header.producer_epoch, base_sequence=header.base_sequence)


def convert_legacy(entries) -> list[bytes]:
    """Magic 0/1 entries as v2 batches: consecutive entries of one codec and timestamp type
    become one dense batch (base offset = first record's offset), no producer id."""
    groups: list[tuple[int, int, list[Record]]] = []
    for entry in entries:
        data, position, base_offset = _batch_bytes(entry)
        magic = _check_whole(data, position, base_offset)
        if magic == 2:
            raise UnsupportedFormatError("convert_legacy takes magic 0/1 entries only",
                                         Where(offset=base_offset, position=position))
        codec = data[L.LEGACY_ATTRIBUTES_OFFSET] & L.COMPRESSION_MASK
        records = decode_records(entry)
        timestamp_type = records[0].timestamp_type if records else 0
        if groups and groups[-1][0] == codec and groups[-1][1] == timestamp_type:
            groups[-1][2].extend(records)
        else:
            groups.append((codec, timestamp_type, list(records)))
    return [_build(records, base_offset=records[0].offset, leader_epoch=-1, compression=codec,
                   timestamp_type=timestamp_type, transactional=False, producer_id=-1,
                   producer_epoch=-1, base_sequence=-1)
            for codec, timestamp_type, records in groups if records]
