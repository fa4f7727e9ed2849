"""The records inside a v2 RecordBatch, walked and re-encoded as bytes (deep path).

Record layout (Kafka's ``DefaultRecord``), one after another in the (decompressed) payload::

    length          varint     bytes after this field
    attributes      int8       unused, kept as is
    timestampDelta  varlong    timestamp = baseTimestamp + delta
    offsetDelta     varint     offset = baseOffset + delta
    keyLength       varint     -1 for a null key
    key             bytes
    valueLength     varint     -1 for a null value
    value           bytes
    headerCount     varint
    headers         [keyLength varint (>= 0), key, valueLength varint (-1: null), value]...

Varints are zigzag-encoded (varint: 5 bytes at most, varlong: 10).

``iter_raw`` checks every length against the bytes left (so no field, count or loop can run past
the payload, whatever the header's recordCount claims), that offset deltas rise within
``lastOffsetDelta`` and that timestamps fit int64, and yields each record as its deltas plus a
view of its key/value/headers bytes: a trim or repack copies those bytes into the new batch
without making a Python object per field, so memory stays proportional to the batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from shallowmirror.codec.messages import uvarint
from shallowmirror.errors import CorruptDataError

__all__ = ["RawRecord", "iter_raw", "encode_record", "encode_body"]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
#: length(1) + attributes(1) + timestampDelta(1) + offsetDelta(1) + key(1) + value(1) + headers(1)
MIN_RECORD_BYTES = 7


Fields = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record: its deltas and attributes, its key/value/headers bytes as on the wire, and
    (when asked for) those decoded: (key, value, [(header key, header value)])."""

    index: int
    attributes: int
    timestamp_delta: int
    offset_delta: int
    body: memoryview
    fields: Fields | None = None


def _varint(data, pos: int, end: int, max_bytes: int, what: str, index: int = -1
            ) -> tuple[int, int]:
    """Zigzag varint at ``pos``: (value, next position); never reads at or past ``end``.
    ``what`` (of record ``index``) names the field in an error message."""
    if pos < end:
        byte = data[pos]
        if byte < 0x80:                      # one byte: most lengths, deltas and counts
            return (byte >> 1) ^ -(byte & 1), pos + 1
    if index >= 0:
        what = f"record {index} {what}"
    raw = 0
    for i in range(max_bytes):
        if pos + i >= end:
            raise CorruptDataError(f"{what}: truncated varint")
        byte = data[pos + i]
        raw |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            bits = 64 if max_bytes == 10 else 32
            if raw >> bits:
                raise CorruptDataError(f"{what}: varint does not fit in {bits} bits")
            return (raw >> 1) ^ -(raw & 1), pos + i + 1
    raise CorruptDataError(f"{what}: varint longer than {max_bytes} bytes")


def _field(data, pos: int, end: int, what: str, index: int, nullable: bool, take: bool
           ) -> tuple[bytes | None, int]:
    """A length-prefixed field: (its bytes if ``take`` and not null, else None; next pos)."""
    length, pos = _varint(data, pos, end, 5, what, index)
    if length < (-1 if nullable else 0) or length > end - pos:
        raise CorruptDataError(f"record {index} {what} length {length} does not fit the "
                               f"{end - pos} bytes left")
    if length <= 0:
        return (b"" if take and length == 0 else None), pos
    return (bytes(data[pos:pos + length]) if take else None), pos + length


def _walk_body(data, pos: int, end: int, index: int, take: bool) -> tuple[int, Fields | None]:
    """Check key, value and headers of record ``index``: where they end, and (if ``take``)
    their values."""
    key, pos = _field(data, pos, end, "key", index, True, take)
    value, pos = _field(data, pos, end, "value", index, True, take)
    count, pos = _varint(data, pos, end, 5, "header count", index)
    if count < 0 or count > (end - pos) // 2:           # a header takes 2 bytes at least
        raise CorruptDataError(f"record {index} header count {count} does not fit the "
                               f"{end - pos} bytes left")
    headers = []
    for _ in range(count):
        name, pos = _field(data, pos, end, "header key", index, False, take)
        header_value, pos = _field(data, pos, end, "header value", index, True, take)
        if take:
            try:
                headers.append((name.decode("utf-8"), header_value))
            except UnicodeDecodeError as err:
                raise CorruptDataError(f"record {index} header key is not UTF-8: {err}"
                                       ) from err
    return pos, ((key, value, headers) if take else None)


def iter_raw(data: bytes, *, record_count: int, last_offset_delta: int,
             base_timestamp: int, decode: bool = False) -> Iterator[RawRecord]:
    """Every record of an uncompressed v2 payload, checked (see the module docstring); with
    ``decode`` each also carries its key, value and headers (one walk for both)."""
    view = memoryview(data)
    end = len(data)
    if record_count > end // MIN_RECORD_BYTES:
        raise CorruptDataError(f"record count {record_count} cannot fit in {end} bytes of "
                               f"records ({MIN_RECORD_BYTES} bytes each at least)")
    pos = 0
    previous_delta = -1
    for index in range(record_count):
        length, pos = _varint(data, pos, end, 5, "length", index)
        if length < MIN_RECORD_BYTES - 1 or length > end - pos:
            raise CorruptDataError(f"record {index} length {length} does not fit the "
                                   f"{end - pos} bytes left")
        record_end = pos + length
        attributes = data[pos]
        timestamp_delta, pos = _varint(data, pos + 1, record_end, 10, "timestamp delta", index)
        offset_delta, pos = _varint(data, pos, record_end, 5, "offset delta", index)
        if not previous_delta < offset_delta <= last_offset_delta:
            raise CorruptDataError(f"record {index} offset delta {offset_delta} is not between "
                                   f"{previous_delta + 1} and the last offset delta "
                                   f"{last_offset_delta}")
        if not _INT64_MIN <= base_timestamp + timestamp_delta <= _INT64_MAX:
            raise CorruptDataError(f"record {index} timestamp {base_timestamp} + "
                                   f"{timestamp_delta} does not fit int64")
        body_start = pos
        body_end, fields = _walk_body(data, pos, record_end, index, decode)
        if body_end != record_end:
            raise CorruptDataError(f"record {index} fields end before its length {length}")
        previous_delta = offset_delta
        yield RawRecord(index, attributes, timestamp_delta, offset_delta,
                        view[body_start:record_end], fields)
        pos = record_end
    if pos != end:
        raise CorruptDataError(f"{end - pos} bytes after the last of {record_count} records")


def zigzag(value: int) -> bytes:
    """A zigzag varint/varlong (the caller keeps ``value`` within int64)."""
    return uvarint((value << 1) ^ (value >> 63))


def encode_body(key: bytes | None, value: bytes | None) -> bytes:
    """Key, value and no headers, as a record body."""
    out = bytearray()
    for field in (key, value):
        if field is None:
            out += zigzag(-1)
        else:
            out += zigzag(len(field)) + field
    out += zigzag(0)
    return bytes(out)


def encode_record(attributes: int, timestamp_delta: int, offset_delta: int, body) -> bytes:
    """One record with the given deltas around an existing body."""
    inner = bytes([attributes & 0xFF]) + zigzag(timestamp_delta) + zigzag(offset_delta)
    return zigzag(len(inner) + len(body)) + inner + bytes(body)
