"""Fuzz the deep paths (decode, trim, repack, legacy conversion) with mutated batches of every
codec: each outcome is a result or a documented error (``CorruptDataError``,
``UnsupportedFormatError`` including ``DecompressionLimitError``, or the ValueError a trim or
repack raises when no record is left), never another exception, a crash, a hang or unbounded
memory; views from the native build and the twin give the same outcome; and whatever succeeds
is right (a trimmed batch holds exactly the records at or past the fetch offset, a repacked one
the same records densely numbered, a converted one the legacy records).

Mutations re-seal the CRC often, so the checks behind it (record walking, decompression) are
reached, and include decompression bombs (compressed zeros claiming many records).

A few hundred cases by default; ``SHALLOWMIRROR_FUZZ_EXAMPLES=N`` runs N per test (``make fuzz``
runs this module in a child process under an address-space limit).
"""

from __future__ import annotations

import os
import struct
import zlib

import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shallowmirror.codec import deep
from shallowmirror.codec import layout as L
from shallowmirror.errors import CorruptDataError, UnsupportedFormatError
from tests.unit.codec.batches import (
    CODECS,
    NATIVE,
    build_batch,
    control_batch,
    legacy_entry,
    recrc,
)
from tests.unit.codec.batches import twin as TWIN

EXAMPLES = int(os.environ.get("SHALLOWMIRROR_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="SHALLOWMIRROR_FUZZ_EXAMPLES"
                not in os.environ, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.data_too_large])
IMPLS = [TWIN] + ([NATIVE] if NATIVE is not None else [])
#: Small enough that bombs reach it quickly, large enough for every seed.
LIMIT = deep.DecompressionLimit(ratio=64, max_bytes=8 << 20, floor_bytes=256 << 10)


def _bomb(codec: str) -> bytes:
    """A v2 batch of compressed zeros claiming 3 records (the payload is 16 MiB)."""
    if codec == "zstd":
        c = zstandard.ZstdCompressor().compressobj()
    else:
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
    payload = b"".join(c.compress(bytes(1 << 20)) for _ in range(16)) + c.flush()
    header = struct.pack(">qiibIhiqqqhii", 0, 49 + len(payload), 0, 2, 0, CODECS[codec], 2,
                         1_700_000_000_000, 1_700_000_000_000, -1, -1, -1, 3)
    return recrc(header + payload)


V2_SEEDS = [
    *(build_batch(codec, 4, base_offset=10) for codec in CODECS),
    *(build_batch(codec, offset_deltas=[0, 2, 5], base_offset=20, producer_id=3,
                  producer_epoch=1, base_sequence=7) for codec in CODECS),
    control_batch(3, 0, 5, abort=True),
    _bomb("zstd"), _bomb("gzip"),
]
LEGACY_SEEDS = [legacy_entry(magic, codec, 3, base_offset=30)
                for magic in (0, 1) for codec in ("none", "gzip", "snappy", "lz4")]
_V2_SPOTS = [8, 16, 21, 22, 23, 26, 27, 34, 57, 60, 61, 62, 63, 64, 65, 66, 70]
_LEGACY_SPOTS = [8, 11, 16, 17, 18, 25, 26, 29, 30, 33, 34, 37, 40, 44]


def _mutate(draw, data: bytearray, spots: list[int]) -> bytearray:
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        kind = draw(st.sampled_from(["flip", "spot", "cut", "append", "varint"]))
        if kind == "flip":
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        elif kind == "spot":
            pos = draw(st.sampled_from(spots))
            if pos < len(data):
                data[pos] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[draw(st.integers(0, len(data))):]
        elif kind == "append":
            data += draw(st.binary(max_size=20))
        elif kind == "varint" and len(data) > 62:
            pos = draw(st.integers(61, len(data) - 1))
            data[pos:pos + 1] = draw(st.sampled_from([b"\xff" * 10, b"\x80\x80\x80\x80\x10",
                                                      b"\x01", b"\x7f", b"\xfe\xff\xff\xff\x0f"]))
    return data


def _reseal(draw, data: bytearray) -> bytes:
    """Fix the length field (often) and the CRC (often) so the deeper checks are reached."""
    if len(data) >= L.LOG_OVERHEAD and draw(st.booleans()):
        struct.pack_into(">i", data, L.LENGTH_OFFSET, len(data) - L.LOG_OVERHEAD)
    if len(data) > L.HEADER_SIZE and data[L.MAGIC_OFFSET] == 2 and draw(st.booleans()):
        return recrc(data)
    if len(data) > L.MAGIC_OFFSET + 1 and data[L.MAGIC_OFFSET] in (0, 1) and draw(st.booleans()):
        struct.pack_into(">I", data, L.LEGACY_CRC_OFFSET,
                         zlib.crc32(memoryview(data)[L.MAGIC_OFFSET:]))
    return bytes(data)


@st.composite
def mutated_v2(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(V2_SEEDS)))
    return _reseal(draw, _mutate(draw, data, _V2_SPOTS))


@st.composite
def mutated_legacy(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(LEGACY_SEEDS)))
    return _reseal(draw, _mutate(draw, data, _LEGACY_SPOTS))


def outcome(call):
    """A result, or the documented error's class and text; anything else fails the test."""
    try:
        return ("ok", call())
    except (CorruptDataError, UnsupportedFormatError) as err:
        return ("error", type(err).__name__, str(err))
    except ValueError as err:
        assert "drop the batch" in str(err) or "skip it" in str(err), err
        return ("value", str(err))


def views(data: bytes) -> list:
    """The first batch view of ``data`` from each implementation, or the raw bytes when the
    hot path refuses it (the deep paths must then refuse it too, by themselves)."""
    out = []
    for impl in IMPLS:
        try:
            split = impl.split_batches(data, verify_crc=False)
        except CorruptDataError:
            return [data]
        if not split.batches:
            return [data]
        out.append(split.batches[0])
    return out


def records_of(batch) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in deep.decode_records(batch, limit=LIMIT)]


@FUZZ
@given(data=mutated_v2(), fetch_delta=st.integers(0, 6))
def test_deep_v2_paths_on_mutated_batches(data, fetch_delta):
    for batch in views(data):
        decoded = outcome(lambda batch=batch: records_of(batch))
        base = batch.base_offset if hasattr(batch, "base_offset") else 0
        fetch_offset = base + fetch_delta
        trimmed = outcome(lambda batch=batch, at=fetch_offset: deep.trim_batch(batch, at,
                                                                               limit=LIMIT))
        repacked = outcome(lambda batch=batch: deep.repack_batch(batch, limit=LIMIT))
        if decoded[0] != "ok":
            continue
        if trimmed[0] == "ok":
            assert records_of(trimmed[1]) == [r for r in decoded[1] if r[0] >= fetch_offset]
            assert TWIN.split_batches(trimmed[1]).batches[0].base_offset >= fetch_offset
        if repacked[0] == "ok":
            out = records_of(repacked[1])
            assert [r[1:] for r in out] == [r[1:] for r in decoded[1]]
            assert [r[0] for r in out] == [decoded[1][0][0] + i for i in range(len(out))]
            view = TWIN.split_batches(repacked[1]).batches[0]
            assert view.record_count == view.last_offset_delta + 1


@FUZZ
@given(data=mutated_legacy())
def test_deep_legacy_paths_on_mutated_entries(data):
    for batch in views(data):
        decoded = outcome(lambda batch=batch: records_of(batch))
        converted = outcome(lambda batch=batch: deep.convert_legacy([batch], limit=LIMIT))
        if decoded[0] == "ok" and converted[0] == "ok":
            out = [r for b in converted[1] for r in records_of(b)]
            assert [(r[2], r[3]) for r in out] == [(r[2], r[3]) for r in decoded[1]]


@FUZZ
@given(data=st.one_of(mutated_v2(), mutated_legacy(), st.binary(max_size=200)))
def test_native_and_twin_views_give_the_same_deep_outcome(data):
    found = views(data)
    results = [(outcome(lambda b=b: records_of(b)), outcome(lambda b=b: deep.repack_batch(
        b, limit=LIMIT))) for b in found]
    assert all(r == results[0] for r in results), results
