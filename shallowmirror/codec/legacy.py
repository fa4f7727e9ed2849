"""Legacy message sets (magic 0 and 1) read for the deep path: one entry and, for a compressed
wrapper, the messages inside it. Byte layout: ``layout.py``.

Checks, as Kafka's Java consumer makes them (``AbstractLegacyRecordBatch``) and a little more:
the wrapper's CRC-32 and every inner message's CRC-32; every size against the bytes left (an
inner size of -12 once made kafka-python's reader loop forever); inner messages have the
wrapper's magic and no compression of their own; magic 1 relative inner offsets resolve to
offsets >= 0. Decompression is bounded by ``limit`` (``compression.decompress``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from shallowmirror.codec import compression
from shallowmirror.codec import layout as L
from shallowmirror.errors import CorruptDataError

__all__ = ["LegacyMessage", "iter_messages"]

_HEADER = struct.Struct(">qiIbb")        # offset, size, crc, magic, attributes
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_NO_TIMESTAMP = -1


@dataclass(frozen=True, slots=True)
class LegacyMessage:
    offset: int
    timestamp: int              # -1 for magic 0
    timestamp_type: int         # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class _Parsed:
    offset: int
    end: int                    # position after this message
    magic: int
    attributes: int
    timestamp: int
    key: tuple[int, int]        # (start, length); length -1 for null
    value: tuple[int, int]


def _parse(data, pos: int, end: int, what: str) -> _Parsed:
    """The message at ``pos``: framing, lengths and CRC-32 checked; nothing copied."""
    if end - pos < L.LOG_OVERHEAD + 6:
        raise CorruptDataError(f"{what}: {end - pos} bytes cannot hold a message")
    offset, size, crc, magic, attributes = _HEADER.unpack_from(data, pos)
    if magic not in (0, 1):
        raise CorruptDataError(f"{what}: magic {magic} in a legacy message set")
    minimum = L.LEGACY_MIN_LENGTH_V1 if magic == 1 else L.LEGACY_MIN_LENGTH_V0
    if size < minimum or size > end - pos - L.LOG_OVERHEAD:
        raise CorruptDataError(f"{what}: message size {size} outside {minimum}.."
                               f"{end - pos - L.LOG_OVERHEAD}")
    message_end = pos + L.LOG_OVERHEAD + size
    computed = zlib.crc32(memoryview(data)[pos + L.MAGIC_OFFSET:message_end])
    if computed != crc:
        raise CorruptDataError(f"{what}: CRC-32 mismatch (stored {crc:#010x}, computed "
                               f"{computed:#010x})")
    field = pos + L.LEGACY_TIMESTAMP_OFFSET
    timestamp = _NO_TIMESTAMP
    if magic == 1:
        timestamp = _INT64.unpack_from(data, field)[0]
        field += 8
    key, field = _span(data, field, message_end, f"{what}: key")
    value, field = _span(data, field, message_end, f"{what}: value")
    if field != message_end:
        raise CorruptDataError(f"{what}: {message_end - field} bytes after the value")
    return _Parsed(offset, message_end, magic, attributes, timestamp, key, value)


def _span(data, pos: int, end: int, what: str) -> tuple[tuple[int, int], int]:
    if pos + 4 > end:
        raise CorruptDataError(f"{what} length truncated")
    length = _INT32.unpack_from(data, pos)[0]
    pos += 4
    if length < -1 or length > end - pos:
        raise CorruptDataError(f"{what} length {length} does not fit the {end - pos} bytes left")
    return (pos, length), pos + max(length, 0)


def _bytes(data, span: tuple[int, int]) -> bytes | None:
    start, length = span
    return None if length < 0 else bytes(data[start:start + length])


def _timestamp_type(magic: int, attributes: int) -> int:
    return L.LOG_APPEND_TIME if magic == 1 and attributes & L.TIMESTAMP_TYPE_MASK else 0


def iter_messages(entry: bytes, limit: int) -> Iterator[LegacyMessage]:
    """The records of one legacy entry (exactly one message; a compressed wrapper's value is
    decompressed to at most ``limit`` bytes and its inner messages read one by one)."""
    outer = _parse(entry, 0, len(entry), "legacy entry")
    if outer.end != len(entry):
        raise CorruptDataError(f"{len(entry) - outer.end} bytes after the legacy entry")
    codec = outer.attributes & L.COMPRESSION_MASK
    timestamp_type = _timestamp_type(outer.magic, outer.attributes)
    if codec == L.COMPRESSION_NONE:
        yield LegacyMessage(outer.offset, outer.timestamp, timestamp_type,
                            _bytes(entry, outer.key), _bytes(entry, outer.value))
        return
    if outer.value[1] < 0:
        raise CorruptDataError("compressed legacy wrapper with a null value")
    start, length = outer.value
    inner = compression.decompress(codec, memoryview(entry)[start:start + length], limit,
                                   legacy_lz4=outer.magic == 0)
    base = 0
    if outer.magic == 1:
        # Inner offsets are relative; the wrapper carries the absolute offset of the last one.
        last = _last_inner_offset(inner, outer.magic)
        base = outer.offset - last
        if base < 0:
            raise CorruptDataError(f"wrapper offset {outer.offset} is below its last inner "
                                   f"relative offset {last}")
    for message in _inner(inner, outer.magic):
        timestamp = (outer.timestamp if timestamp_type == L.LOG_APPEND_TIME
                     else message.timestamp)
        yield LegacyMessage(base + message.offset, timestamp, timestamp_type,
                            _bytes(inner, message.key), _bytes(inner, message.value))


def _inner(data: bytes, wrapper_magic: int) -> Iterator[_Parsed]:
    pos = 0
    index = 0
    while pos < len(data):
        message = _parse(data, pos, len(data), f"inner message {index}")
        if message.magic != wrapper_magic:
            raise CorruptDataError(f"inner message {index}: magic {message.magic} inside a "
                                   f"magic {wrapper_magic} wrapper")
        if message.attributes & L.COMPRESSION_MASK:
            raise CorruptDataError(f"inner message {index} is compressed again")
        yield message
        pos = message.end
        index += 1


def _last_inner_offset(data: bytes, wrapper_magic: int) -> int:
    last = None
    for message in _inner(data, wrapper_magic):
        last = message.offset
    if last is None:
        raise CorruptDataError("compressed legacy wrapper holds no message")
    return last
