"""Kafka's record compression codecs for the deep path, with a hard bound on decompressed size.

A RecordBatch's compressed payload is attacker-sized: 87 bytes of snappy can claim 4 GiB, 39 KB
of zstd can expand to gigabytes. ``decompress`` therefore takes a ``limit`` and never holds (or
asks the allocator for) more than about that many output bytes: snappy's claimed length is read
before anything is allocated, gzip, lz4 and zstd are inflated in bounded steps. Going over the
limit raises ``DecompressionLimitError``; malformed payloads raise ``CorruptDataError``. Neither
carries a location: the caller (``deep``) adds topic, partition, offset and byte position.

Formats, as Kafka's Java client reads them:
- gzip: one or more gzip members (RFC 1952); bytes after the last member that do not start a
  new member are ignored, as ``GZIPInputStream`` does.
- snappy: xerial framing (``\\x82SNAPPY\\x00``, version, compat, then [int32 length, raw snappy
  block]...) or one raw snappy block; each raw block starts with its uncompressed length.
- lz4: LZ4 frames. Magic 0 messages (Kafka 0.8.2-0.9) carry a wrong frame-descriptor checksum
  (KAFKA-3160: computed over the magic number too); it is recomputed with xxhash first.
- zstd: zstd frames, read across frame boundaries.

``compress`` uses kafka-python's encoders (Kafka-compatible framing), over ``cramjam`` for snappy.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import kafka.codec
import lz4.frame
import xxhash
import zstandard

from shallowmirror.codec import layout as L
from shallowmirror.errors import CorruptDataError, DecompressionLimitError

__all__ = ["compress", "decompress"]

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16
_GZIP_MAGIC = b"\x1f\x8b"
_INT32 = struct.Struct(">i")
_ZSTD_STEP_INPUT_BYTES = 32    # at most 8 blocks of 128 KiB out per step (RLE: 4 bytes each)
_ZSTD_MIN_WINDOW = 1 << 23     # what zstd levels up to 19 use; below this no real frame fits
_ZSTD_MAX_WINDOW = 1 << 27     # zstd's own default limit


class _CramjamSnappy:
    """The two functions of python-snappy's API that ``kafka.codec`` calls, over cramjam."""

    @staticmethod
    def compress(data) -> bytes:
        return bytes(cramjam.snappy.compress_raw(bytes(data)))

    @staticmethod
    def decompress(data) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(bytes(data)))


# kafka-python imports python-snappy (not a dependency: python-snappy >= 0.7 wraps cramjam too).
if kafka.codec.snappy is None:
    kafka.codec.snappy = _CramjamSnappy


def _name(codec: int) -> str:
    return L.COMPRESSION_NAMES.get(codec, str(codec))


def _over(codec: int, limit: int) -> DecompressionLimitError:
    return DecompressionLimitError(
        f"{_name(codec)} payload decompresses to more than {limit} bytes, the deep path's limit "
        "for this batch (deep.max.decompression.ratio x its size, at most "
        "deep.max.decompressed.bytes)")


def decompress(codec: int, payload, limit: int, *, legacy_lz4: bool = False) -> bytes:
    """The decompressed payload, at most ``limit`` bytes (else DecompressionLimitError)."""
    data = bytes(payload)
    try:
        if codec == L.COMPRESSION_GZIP:
            return _gunzip(data, limit)
        if codec == L.COMPRESSION_SNAPPY:
            return _unsnappy(data, limit)
        if codec == L.COMPRESSION_LZ4:
            return _unlz4(_fix_legacy_lz4_header(data) if legacy_lz4 else data, limit)
        if codec == L.COMPRESSION_ZSTD:
            return _unzstd(data, limit)
    except (zlib.error, cramjam.DecompressionError, RuntimeError, zstandard.ZstdError) as err:
        raise CorruptDataError(f"{_name(codec)} payload does not decompress: {err}") from err
    raise CorruptDataError(f"unknown compression codec {codec}")


def compress(codec: int, data: bytes) -> bytes:
    """``data`` compressed as Kafka producers do (kafka-python's encoders)."""
    encode = {
        L.COMPRESSION_GZIP: kafka.codec.gzip_encode,
        L.COMPRESSION_SNAPPY: kafka.codec.snappy_encode,
        L.COMPRESSION_LZ4: kafka.codec.lz4_encode,
        L.COMPRESSION_ZSTD: kafka.codec.zstd_encode,
    }[codec]
    return encode(data)


def _gunzip(data: bytes, limit: int) -> bytes:
    out = bytearray()
    while data[:2] == _GZIP_MAGIC:
        inflater = zlib.decompressobj(wbits=31)
        pending = data
        while not inflater.eof:
            if not pending:
                raise CorruptDataError("gzip stream ends inside a member")
            # max_length > 0 always: 0 would mean "no limit" to zlib.
            out += inflater.decompress(pending, limit + 1 - len(out))
            if len(out) > limit:
                raise _over(L.COMPRESSION_GZIP, limit)
            pending = inflater.unconsumed_tail
        data = inflater.unused_data
    if not out and data:
        raise CorruptDataError("gzip payload does not start with a gzip member")
    return bytes(out)


def _unsnappy(data: bytes, limit: int) -> bytes:
    if len(data) <= _XERIAL_HEADER_SIZE or data[:8] != _XERIAL_MAGIC:
        return _snappy_block(data, limit, limit)
    out = bytearray()
    pos = _XERIAL_HEADER_SIZE
    while pos < len(data):
        if pos + 4 > len(data):
            raise CorruptDataError(f"xerial snappy block length truncated at byte {pos}")
        size = _INT32.unpack_from(data, pos)[0]
        pos += 4
        if size < 0 or size > len(data) - pos:
            raise CorruptDataError(f"xerial snappy block of {size} bytes at byte {pos - 4} "
                                   f"does not fit the {len(data) - pos} bytes left")
        out += _snappy_block(data[pos:pos + size], limit - len(out), limit)
        pos += size
    return bytes(out)


def _snappy_block(block: bytes, room: int, limit: int) -> bytes:
    """One raw snappy block; its claimed length is checked before anything is allocated."""
    claimed = 0
    for i in range(5):
        if i >= len(block):
            raise CorruptDataError("snappy block length truncated")
        claimed |= (block[i] & 0x7F) << (7 * i)
        if not block[i] & 0x80:
            break
    else:
        raise CorruptDataError("snappy block length is not a 32-bit varint")
    if claimed > room:
        raise _over(L.COMPRESSION_SNAPPY, limit)
    return bytes(cramjam.snappy.decompress_raw(block))


def _fix_legacy_lz4_header(data: bytes) -> bytes:
    """Recompute the frame descriptor checksum Kafka 0.8.2-0.9 wrote wrongly (KAFKA-3160)."""
    if len(data) < 7:
        raise CorruptDataError("lz4 frame shorter than its header")
    header_size = 7 + (8 if data[4] & 0x08 else 0)       # FLG bit 3: content size present
    if len(data) < header_size:
        raise CorruptDataError("lz4 frame shorter than its header")
    checksum = xxhash.xxh32(data[4:header_size - 1]).digest()[2:3]
    return data[:header_size - 1] + checksum + data[header_size:]


def _unlz4(data: bytes, limit: int) -> bytes:
    out = bytearray()
    while data:
        frame = lz4.frame.LZ4FrameDecompressor()
        out += frame.decompress(data, max_length=limit + 1 - len(out))
        if len(out) > limit:
            raise _over(L.COMPRESSION_LZ4, limit)
        if not frame.eof:
            raise CorruptDataError("lz4 frame is truncated")
        data = frame.unused_data
    return bytes(out)


def _zstd_window(limit: int) -> int:
    return min(_ZSTD_MAX_WINDOW, max(_ZSTD_MIN_WINDOW, 1 << max(limit - 1, 1).bit_length()))


def _unzstd(data: bytes, limit: int) -> bytes:
    """Frame by frame, fed a few bytes at a time: one zstd block (4 bytes of RLE) can yield
    128 KiB, so a small step bounds what one call may produce beyond the limit."""
    out = bytearray()
    decompressor = zstandard.ZstdDecompressor(max_window_size=_zstd_window(limit))
    while data:
        frame = decompressor.decompressobj()
        pos = 0
        while not frame.eof:
            if pos >= len(data):
                raise CorruptDataError("zstd frame is truncated")
            out += frame.decompress(data[pos:pos + _ZSTD_STEP_INPUT_BYTES])
            pos += _ZSTD_STEP_INPUT_BYTES
            if len(out) > limit:
                raise _over(L.COMPRESSION_ZSTD, limit)
        data = frame.unused_data + data[pos:]
    return bytes(out)
