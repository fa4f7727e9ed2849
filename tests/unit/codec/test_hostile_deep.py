"""Deep paths under hostile input (issue 14 items 2, 3, 5, 7): reproducers with their bytes
inline, and decompression bombs run in a child process under an address-space limit
(RLIMIT_AS), so a path that tried to hold the bomb would fail with MemoryError or abort instead
of passing. Views come from both implementations (the deep path must not care which)."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
import textwrap
import zlib

import lz4.frame
import pytest
import xxhash
import zstandard

from shallowmirror.codec import deep
from shallowmirror.codec import layout as L
from shallowmirror.errors import CorruptDataError, DecompressionLimitError, UnsupportedFormatError
from tests.unit.codec.batches import IMPLS, legacy_entry, recrc
from tests.unit.codec.batches import twin as TWIN

ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]
#: Address space for a bomb child: the interpreter with the codec imported takes ~45 MiB.
CHILD_AS_BYTES = 512 << 20


# --- builders (independent of the code under test) ------------------------------------------

def zigzag(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def v2_batch(payload: bytes, *, codec: int, record_count: int, last_offset_delta: int,
             base_offset: int = 0, base_timestamp: int = 1_700_000_000_000) -> bytes:
    """A CRC-valid v2 batch around an already encoded (and compressed) records section."""
    header = struct.pack(">qiibIhiqqqhii", base_offset, 49 + len(payload), 0, 2, 0, codec,
                         last_offset_delta, base_timestamp, base_timestamp, -1, -1, -1,
                         record_count)
    return recrc(header + payload)


def stream_compress(codec: str, chunk: bytes, repeat: int) -> bytes:
    """``chunk * repeat`` compressed without ever holding it."""
    if codec == "zstd":
        c = zstandard.ZstdCompressor().compressobj()
    elif codec == "gzip":
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
    else:
        c = lz4.frame.LZ4FrameCompressor()
        out = c.begin() + b"".join(c.compress(chunk) for _ in range(repeat)) + c.flush()
        return out
    return b"".join(c.compress(chunk) for _ in range(repeat)) + c.flush()


def record(offset_delta: int, body: bytes = b"\x01\x01\x00") -> bytes:
    inner = b"\x00" + zigzag(0) + zigzag(offset_delta) + body
    return zigzag(len(inner)) + inner


CHILD = """
    import resource, sys
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from shallowmirror.codec import deep, records
    data = sys.stdin.buffer.read()
    view = records.split_batches(data).batches[0]
    calls = ([("convert_legacy", lambda: deep.convert_legacy([view]))] if view.is_legacy else
             [("trim_batch", lambda: deep.trim_batch(view, view.base_offset + 1)),
              ("repack_batch", lambda: deep.repack_batch(view))])
    for name, call in [("decode_records", lambda: deep.decode_records(view))] + calls:
        try:
            call()
            print(name, "ok")
        except Exception as e:
            print(name, type(e).__name__, str(e)[:300].replace(chr(10), " "))
"""


def run_bomb(data: bytes) -> dict[str, str]:
    """Every deep path over ``data`` in a child limited to CHILD_AS_BYTES: name -> outcome."""
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), str(CHILD_AS_BYTES)],
                           input=data, cwd=ROOT, capture_output=True, timeout=300)
    assert child.returncode == 0, (child.returncode, child.stderr.decode()[-3000:])
    lines = child.stdout.decode().strip().splitlines()
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in lines}


def assert_all_over_limit(outcomes: dict[str, str]) -> None:
    assert outcomes and all(o.startswith("DecompressionLimitError") for o in outcomes.values()), (
        outcomes)


# --- item 3: decompression bombs --------------------------------------------------------------

def test_snappy_block_claiming_4_gib_is_refused_before_allocating():
    # repro_10: 87 bytes, CRC valid; a raw snappy block whose preamble claims 0xFFFFFFFF bytes.
    batch = bytes.fromhex(
        "00000000000000000000004b000000000280f58faa0002000000000000018bcfe568000000018bcfe5680"
        "0ffffffffffffffffffffffffffff0000000182534e4150505900000000010000000100000006ffffffff"
        "0f00")
    assert_all_over_limit(run_bomb(batch))


@pytest.mark.parametrize("codec", ["zstd", "gzip", "lz4"])
def test_compressed_zeros_stop_at_the_limit(codec):
    # 256 MiB of zeros: zstd ~8 KB, gzip ~250 KB, lz4 ~1 MB; the limit is 64x that at most.
    payload = stream_compress(codec, bytes(1 << 20), 256)
    batch = v2_batch(payload, codec={"gzip": 1, "lz4": 3, "zstd": 4}[codec],
                     record_count=3, last_offset_delta=2)
    assert_all_over_limit(run_bomb(batch))


def test_lz4_frame_claiming_a_huge_content_size_is_not_trusted():
    frame = bytearray(lz4.frame.compress(b"x" * 1000, store_size=True))
    assert frame[4] & 0x08                                     # content size present
    struct.pack_into("<Q", frame, 6, 1 << 40)
    frame[14] = xxhash.xxh32(bytes(frame[4:14])).digest()[2]   # header checksum
    outcomes = run_bomb(v2_batch(bytes(frame), codec=3, record_count=3, last_offset_delta=2))
    assert all(o.startswith("CorruptDataError") for o in outcomes.values()), outcomes


def test_tiny_identical_records_end_quickly():
    # The fuzzer's "38 KB of tiny records": one 7-byte record repeated, count claimed 2**31-1.
    payload = stream_compress("zstd", record(0) * 150_000, 100)
    outcomes = run_bomb(v2_batch(payload, codec=4, record_count=(1 << 31) - 1,
                                 last_offset_delta=(1 << 31) - 2))
    assert all(o.startswith(("DecompressionLimitError", "CorruptDataError"))
               for o in outcomes.values()), outcomes


def test_a_record_of_millions_of_empty_headers_stops_at_the_limit():
    headers = 50_000_000                                        # 100 MB of b"\x00\x01"
    body = zigzag(-1) + zigzag(-1) + zigzag(headers)
    inner = b"\x00" + zigzag(0) + zigzag(0) + body
    head = zigzag(len(inner) + 2 * headers) + inner
    c = zstandard.ZstdCompressor().compressobj()
    payload = c.compress(head) + b"".join(c.compress(b"\x00\x01" * (1 << 19))
                                          for _ in range(headers >> 19)) + c.flush()
    assert_all_over_limit(run_bomb(v2_batch(payload, codec=4, record_count=1,
                                            last_offset_delta=0)))


def test_valid_records_within_the_limit_decode_in_bounded_memory():
    # 100k real records (offset deltas 0..n-1): inside the limit, so every path succeeds.
    count = 100_000
    payload = zstandard.ZstdCompressor().compress(b"".join(record(i) for i in range(count)))
    outcomes = run_bomb(v2_batch(payload, codec=4, record_count=count,
                                 last_offset_delta=count - 1))
    assert set(outcomes.values()) == {"ok"}, outcomes


def test_legacy_wrapper_bomb_stops_at_the_limit():
    value = stream_compress("gzip", bytes(1 << 20), 256)
    body = struct.pack(">bbq", 1, 1, 1_700_000_000_000) + struct.pack(">i", -1)
    body += struct.pack(">i", len(value)) + value
    message = struct.pack(">I", zlib.crc32(body)) + body
    entry = struct.pack(">qi", 9, len(message)) + message
    assert_all_over_limit(run_bomb(entry))


@pytest.mark.parametrize("impl", IMPLS)
def test_the_limit_is_a_parameter(impl):
    payload = zstandard.ZstdCompressor().compress(b"".join(record(i) for i in range(2000)))
    view = impl.split_batches(v2_batch(payload, codec=4, record_count=2000,
                                       last_offset_delta=1999)).batches[0]
    assert len(deep.decode_records(view)) == 2000
    tight = deep.DecompressionLimit(ratio=1, max_bytes=1 << 20, floor_bytes=1000)
    for call in (lambda: deep.decode_records(view, limit=tight),
                 lambda: deep.trim_batch(view, 5, limit=tight),
                 lambda: deep.repack_batch(view, limit=tight)):
        with pytest.raises(DecompressionLimitError) as err:
            call()
        assert err.value.where.offset == 0
        assert isinstance(err.value, UnsupportedFormatError)


def test_limit_arithmetic():
    limit = deep.DecompressionLimit(ratio=64, max_bytes=256 << 20, floor_bytes=1 << 20)
    assert limit.for_batch(100) == 1 << 20
    assert limit.for_batch(100_000) == 6_400_000
    assert limit.for_batch(100 << 20) == 256 << 20


# --- item 2: legacy wrappers ------------------------------------------------------------------

#: repro_03: magic-1 gzip wrapper, outer CRC valid, 2nd inner message size -12.
INNER_LENGTH_HANG = bytes.fromhex(
    "000000000000000100000052721030b901010000018bcfe56800ffffffff0000003c1f8b0800c08f036b02ff"
    "6360800349cf12b5478c400663f7f9a7192011c66c20c154660055c0f8ffffff2f76c56225d814190200d0ee"
    "27294a000000")


def test_negative_inner_length_is_corrupt_not_a_hang():
    outcomes = run_bomb(INNER_LENGTH_HANG)
    assert set(outcomes) == {"decode_records", "convert_legacy"}
    for outcome in outcomes.values():
        assert outcome.startswith("CorruptDataError inner message 1: message size -12"), outcome


def legacy_message(offset, key, value, *, magic=1, attrs=0, ts=1_700_000_000_000,
                   bad_crc=False) -> bytes:
    body = struct.pack(">bb", magic, attrs) + (struct.pack(">q", ts) if magic else b"")
    body += struct.pack(">i", -1) if key is None else struct.pack(">i", len(key)) + key
    body += struct.pack(">i", len(value)) + value
    crc = zlib.crc32(body) ^ (0xFFFF if bad_crc else 0)
    message = struct.pack(">I", crc) + body
    return struct.pack(">qi", offset, len(message)) + message


@pytest.mark.parametrize("impl", IMPLS)
def test_inner_message_crc_is_checked(impl):
    # repro_12: the wrapper CRC is valid, the 2nd inner message's is not.
    inner = (legacy_message(0, b"k", b"good")
             + legacy_message(1, b"k", b"inner CRC is wrong", bad_crc=True))
    wrapper = legacy_message(11, None, gzip.compress(inner), attrs=1)
    view = impl.split_batches(wrapper).batches[0]
    for call in (lambda: deep.convert_legacy([view]), lambda: deep.decode_records(view)):
        with pytest.raises(CorruptDataError, match="inner message 1: CRC-32 mismatch") as err:
            call()
        assert err.value.where.offset == 11


@pytest.mark.parametrize("impl", IMPLS)
def test_nested_compression_and_mixed_magic_are_corrupt(impl):
    nested = legacy_message(0, None, gzip.compress(legacy_message(0, None, b"x")), attrs=1)
    for inner, reason in ((nested, "compressed again"),
                          (legacy_message(0, None, b"v", magic=0), "magic 0 inside a magic 1")):
        view = impl.split_batches(legacy_message(0, None, gzip.compress(inner),
                                                 attrs=1)).batches[0]
        with pytest.raises(CorruptDataError, match=reason):
            deep.convert_legacy([view])


# --- item 5: errors outside the contract --------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
def test_timestamps_that_overflow_int64_are_corrupt(impl):
    # repro_04 case A: baseTimestamp 2**63-1, deltas 0, 1, 2.
    case_a = bytes.fromhex(
        "00000000000000320000004c00000000027f5092720000000000027fffffffffffffff0000018bcfe568"
        "00ffffffffffffffffffffffffffff0000000310000000026b02760010000202026b02760010000404026b"
        "027600")
    view = impl.split_batches(case_a).batches[0]
    for call in (lambda: deep.trim_batch(view, 51), lambda: deep.repack_batch(view),
                 lambda: deep.decode_records(view)):
        with pytest.raises(CorruptDataError, match="record 1 timestamp .* does not fit int64"):
            call()


@pytest.mark.parametrize("impl", IMPLS)
def test_repack_of_a_batch_whose_offset_deltas_do_not_rise_is_corrupt(impl):
    # repro_04 case B (found by the fuzzer): snappy, lastOffsetDelta 2**31-1, deltas 0, 1, 0.
    case_b = bytes.fromhex(
        "000000000000000000000069000000000205632fc700027fffffff0000018bcfe568000000018bcfe568"
        "00ffffffffffffffff0000000000000000000382534e4150505900000000010000000100000024243010"
        "000000026b027600100002020509442200feffffffffffffffff0100026b027600")
    view = impl.split_batches(case_b).batches[0]
    with pytest.raises(CorruptDataError, match="offset delta") as err:
        deep.repack_batch(view)
    assert (err.value.where.offset, err.value.where.position) == (0, 0)


@pytest.mark.parametrize("impl", IMPLS)
def test_trim_keeps_every_timestamp_exactly(impl):
    # repro_08: deltas 0, 2**62+10, -2**62-10 from base -5; trimming at 1 used to wrap one.
    batch = bytes.fromhex(
        "00000000000000000000005c00000000024855ba2d000000000002fffffffffffffffbffffffffffffff"
        "fbffffffffffffffffffffffffffff00000003100000000261026200220094808080808080808001020261"
        "0262001e009380808080808080800104010100")
    view = impl.split_batches(batch).batches[0]
    before = [(r.offset, r.timestamp, r.key, r.value) for r in deep.decode_records(view)]
    trimmed = deep.trim_batch(view, 1)
    after = [(r.offset, r.timestamp, r.key, r.value) for r in deep.decode_records(trimmed)]
    assert after == before[1:]
    assert impl.split_batches(trimmed).batches[0].base_offset == 1


def test_convert_legacy_of_a_short_entry_is_corrupt():
    # repro_05: 17 bytes, length field 5, magic 0.
    entry = bytes.fromhex("0000000000000000" "00000005" "00000000" "00")
    for call in (lambda: deep.convert_legacy([entry]), lambda: deep.decode_records(entry)):
        with pytest.raises(CorruptDataError, match="below the minimum 14 for magic 0"):
            call()


def test_deep_paths_reject_what_is_not_a_batch():
    for call in (lambda: deep.decode_records(None), lambda: deep.trim_batch(3, 0),
                 lambda: deep.convert_legacy([1.5])):
        with pytest.raises(TypeError):
            call()
    with pytest.raises(TypeError):
        deep.trim_batch(b"\x00" * 70, 1.5)


# --- item 7: magic 0 LZ4 (Kafka 0.8.2-0.9) -----------------------------------------------------

@pytest.fixture
def magic0_lz4_entry() -> bytes:
    """A magic-0 LZ4 wrapper as Kafka 0.8.2-0.9 wrote it: kafka-python's legacy builder emits
    that framing (wrong frame-descriptor checksum, KAFKA-3160) now that xxhash is installed."""
    entry = legacy_entry(0, "lz4", 3, base_offset=70)
    start = L.LOG_OVERHEAD + 4 + 2 + 4 + 4                      # key -1, then value length
    frame = entry[start:]
    assert frame[:4] == b"\x04\x22\x4d\x18"
    header_size = 7 + (8 if frame[4] & 0x08 else 0)
    correct = xxhash.xxh32(frame[4:header_size - 1]).digest()[2]
    assert frame[header_size - 1] != correct                     # really the broken checksum
    return entry


@pytest.mark.parametrize("impl", IMPLS)
def test_magic0_lz4_converts(impl, magic0_lz4_entry):
    view = impl.split_batches(magic0_lz4_entry).batches[0]
    assert (view.magic, view.compression) == (0, L.COMPRESSION_LZ4)
    records = deep.decode_records(view)
    assert [r.offset for r in records] == [70, 71, 72]
    converted = deep.convert_legacy([view])
    out = impl.split_batches(converted[0]).batches[0]
    assert (out.magic, out.compression, out.base_offset, out.record_count) == (2, 3, 70, 3)
    assert [(r.offset, r.key, r.value) for r in deep.decode_records(out)] == [
        (r.offset, r.key, r.value) for r in records]


def test_magic0_lz4_with_a_correct_checksum_converts_too():
    # repro_11: a standard LZ4 frame in a magic-0 wrapper (what some clients wrote).
    inner = b"".join(legacy_message(70 + i, None, b"inner0-%d" % i, magic=0) for i in range(3))
    wrapper = legacy_message(72, None, lz4.frame.compress(inner, block_linked=False), magic=0,
                             attrs=3)
    view = TWIN.split_batches(wrapper).batches[0]
    converted = deep.convert_legacy([view])
    assert [r.value for r in deep.decode_records(converted[0])] == [
        b"inner0-0", b"inner0-1", b"inner0-2"]


def test_running_out_of_memory_is_a_located_codec_error():
    # With the limit raised far beyond the address space, the allocator fails first: that must
    # surface as CorruptDataError naming the batch, not a bare MemoryError (or an abort).
    payload = stream_compress("zstd", bytes(1 << 20), 512)
    batch = v2_batch(payload, codec=4, record_count=3, last_offset_delta=2, base_offset=77)
    child = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (256 << 20, 256 << 20))
        from shallowmirror.codec import deep
        from shallowmirror.errors import CorruptDataError
        data = sys.stdin.buffer.read()
        unlimited = deep.DecompressionLimit(ratio=1 << 40, max_bytes=1 << 40)
        try:
            deep.decode_records(data, limit=unlimited)
        except CorruptDataError as e:
            print(type(e).__name__, e.where.offset, "Memory" in str(e))
    """)], input=batch, cwd=ROOT, capture_output=True, timeout=300)
    assert child.returncode == 0, child.stderr.decode()[-3000:]
    assert child.stdout.decode().split() == ["CorruptDataError", "77", "True"]
