"""Record-set codec throughput: parse + verify + filter + rewrite + pack, per codec and batch size.

Each round forwards one fetched record set of ``BATCHES`` batches (one partition each, as a
Produce request carries one batch per partition) of 16 KiB, 256 KiB or 1 MiB compressed batches:
``split_batches`` (CRC-32C verified), ``filter_batches``, ``rewrite_for_produce`` stamping an
idempotent producer (so the CRC is recomputed: the worst case), and ``encode_produce_request``
(the list of buffers handed to ``sendmsg``). Side by side, on the same bytes:
- ``native`` and ``twin``: the two codec implementations;
- ``memcpy``: one plain copy of the record set (a floor for "touching every byte once");
- ``deep``: decode every record and re-encode the batch with kafka-python (what a deep mirror
  does), run for fewer rounds because it is slow.

Run: ``.venv/bin/python -m pytest benchmarks/codec/test_bench_records.py --benchmark-only``;
``extra_info["bytes"]`` gives the bytes per round, so GB/s = bytes / mean time.
"""

from __future__ import annotations

import random
import struct

import pytest

from shallowmirror.codec import deep
from shallowmirror.codec import records as twin
from shallowmirror.codec.deep import _SameCodecBuilder

try:
    from shallowmirror.codec import _crecords as native
except ImportError:  # the twin still gets measured
    native = None
try:
    from shallowmirror.codec import messages as _py_messages

    try:
        from shallowmirror.codec import _cmessages as _native_messages
    except ImportError:
        _native_messages = _py_messages
except ImportError:  # framing not available: measure without packing
    _py_messages = _native_messages = None

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
SIZES = {"16KiB": 16 << 10, "256KiB": 256 << 10, "1MiB": 1 << 20}
BATCHES = 8
VALUE_SIZE = 200
_CACHE: dict[tuple[str, int], bytes] = {}


def _values(rng: random.Random, count: int) -> list[bytes]:
    # Half random, half repeated text: compresses about 2x, like typical JSON-ish payloads.
    words = [b"alpha", b"beta", b"gamma", b"delta", b"epsilon", b"user", b"event", b"ts"]
    out = []
    for _ in range(count):
        text = b" ".join(rng.choice(words) for _ in range(VALUE_SIZE // 12))
        out.append(rng.randbytes(VALUE_SIZE // 2) + text[:VALUE_SIZE // 2])
    return out


def _build(codec: int, count: int, base_offset: int, rng: random.Random) -> bytes:
    builder = _SameCodecBuilder(2, codec, False, -1, -1, -1, 1 << 30)
    for i, value in enumerate(_values(rng, count)):
        builder.append(i, 1_700_000_000_000 + i, b"key-%d" % i, value, [])
    out = bytearray(builder.build())
    struct.pack_into(">q", out, 0, base_offset)
    return bytes(out)


def batch_of_size(codec: str, target: int) -> bytes:
    """One batch whose compressed size is close to ``target`` (within ~5%)."""
    key = (codec, target)
    if key not in _CACHE:
        rng = random.Random(target + CODECS[codec])
        count = max(1, target // VALUE_SIZE)
        for _ in range(6):
            batch = _build(CODECS[codec], count, 0, rng)
            if abs(len(batch) - target) < target * 0.05:
                break
            count = max(1, int(count * target / len(batch)))
        _CACHE[key] = batch
    return _CACHE[key]


def record_set(codec: str, target: int) -> bytes:
    one = bytearray(batch_of_size(codec, target))
    parts = []
    records = struct.unpack_from(">i", one, 57)[0]
    for i in range(BATCHES):
        struct.pack_into(">q", one, 0, i * records)      # base offset: outside the CRC
        parts.append(bytes(one))
    return b"".join(parts)


def forward(impl, messages, data: bytes) -> int:
    """The hot path for one fetched record set; returns the bytes it would send."""
    result = impl.split_batches(data, topic="bench", partition=0)
    kept = impl.filter_batches(result.batches, fetch_offset=0, aborted_transactions=[])
    partitions = []
    sequence = 0
    for partition, view in enumerate(kept):
        header, rest = impl.rewrite_for_produce(view, producer_id=1000, producer_epoch=0,
                                                base_sequence=sequence)
        sequence += view.record_count
        partitions.append((partition, [(header, rest)]))
    if messages is None:
        return sum(len(h) + len(r) for _, [(h, r)] in partitions)
    request = messages.encode_produce_request(
        version=7, correlation_id=1, client_id="bench", transactional_id=None, acks=-1,
        timeout_ms=30000, topics=[("bench", partitions)])
    return sum(memoryview(piece).nbytes for piece in request)


def deep_forward(data: bytes) -> int:
    """Decode every record and re-encode each batch (what a deep mirror does)."""
    total = 0
    for view in twin.split_batches(data).batches:
        records = deep.decode_records(view)
        builder = _SameCodecBuilder(2, view.compression, False, -1, -1, -1, 1 << 30)
        for delta, record in enumerate(records):
            builder.append(delta, record.timestamp, record.key, record.value, record.headers)
        total += len(builder.build())
    return total


IMPLS = [pytest.param("native", marks=pytest.mark.skipif(native is None, reason="not built")),
         "twin", "memcpy", "deep"]


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("impl", IMPLS)
def test_forward(benchmark, impl, codec, size):
    data = record_set(codec, SIZES[size])
    benchmark.group = f"{codec}-{size}"
    benchmark.extra_info.update(bytes=len(data), batches=BATCHES,
                                batch_bytes=len(data) // BATCHES, impl=impl, codec=codec)
    if impl == "memcpy":
        source = bytearray(data)
        result = benchmark(bytes, source)
        assert len(result) == len(data)
    elif impl == "deep":
        result = benchmark.pedantic(deep_forward, args=(data,), rounds=3, iterations=1)
        assert result > 0
    else:
        module, messages = (native, _native_messages) if impl == "native" else (
            twin, _py_messages)
        sent = benchmark(forward, module, messages, data)
        assert sent >= len(data)


@pytest.mark.parametrize("verify_crc", [True, False], ids=["crc", "nocrc"])
@pytest.mark.parametrize("impl", IMPLS[:2])
def test_split_16kib(benchmark, impl, verify_crc):
    """Parse (+ verify) alone on 16 KiB lz4 batches: the native/twin ratio with and without the
    CRC pass. Both implementations call the same SSE4.2 crc32c routine, so with verification on,
    the shared CRC time bounds the ratio; without it the ratio is the parsers' own."""
    data = record_set("lz4", SIZES["16KiB"])
    module = native if impl == "native" else twin
    benchmark.group = f"split-16KiB-{'crc' if verify_crc else 'nocrc'}"
    benchmark.extra_info.update(bytes=len(data), batches=BATCHES, impl=impl)
    result = benchmark(module.split_batches, data, verify_crc=verify_crc)
    assert len(result.batches) == BATCHES
