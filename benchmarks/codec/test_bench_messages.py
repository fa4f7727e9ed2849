"""Message codec speed: Fetch decode and Produce encode, native vs twin, beside a memcpy of the
same bytes (what a copying codec would pay at least).

Run: ``.venv/bin/python -m pytest benchmarks/codec/test_bench_messages.py --benchmark-only``.
Records are 256 KiB per partition; 8 and 64 partitions per message. Decoding and encoding are
zero-copy, so their cost depends on the partition count, not on the bytes.
"""

from __future__ import annotations

import os

import pytest
from kafka.protocol.consumer import FetchResponse as KFetchResponse

from shallowmirror.codec import messages as twin

try:
    from shallowmirror.codec import _cmessages as native
except ImportError:  # the native build is optional here; the twin still gets measured
    native = None

RECORDS_BYTES = 256 * 1024
PARTITIONS = [8, 64]
IMPLS = [pytest.param(twin, id="python"),
         pytest.param(native, id="native",
                      marks=pytest.mark.skipif(native is None, reason="native not built"))]

_KTopic = KFetchResponse.FetchableTopicResponse
_KPartition = _KTopic.PartitionData


def fetch_frame(partitions: int, version: int = 12) -> bytes:
    """A Fetch response with ``partitions`` partitions of 256 KiB records over two topics."""
    payload = os.urandom(RECORDS_BYTES)
    topics = []
    for t in range(2):
        parts = [_KPartition(partition_index=p, high_watermark=1000, last_stable_offset=1000,
                             log_start_offset=0, aborted_transactions=[], records=payload)
                 for p in range(partitions // 2)]
        topics.append(_KTopic(topic=f"bench-topic-{t}", partitions=parts))
    msg = KFetchResponse(version=version, responses=topics)
    msg.with_header(correlation_id=1)
    return bytes(msg.encode(header=True, framed=True))[4:]


def produce_topics(partitions: int) -> list:
    """``partitions`` batches of 256 KiB as (61-byte header, payload view) pieces, two topics."""
    batch = bytearray(os.urandom(RECORDS_BYTES))
    view = memoryview(batch)
    return [(f"bench-topic-{t}", [(p, [[bytes(view[:61]), view[61:]]])
                                  for p in range(partitions // 2)])
            for t in range(2)]


def encode(impl, topics):
    return impl.encode_produce_request(version=9, correlation_id=1, client_id="bench",
                                       transactional_id=None, acks=-1, timeout_ms=30_000,
                                       topics=topics)


@pytest.mark.parametrize("partitions", PARTITIONS)
@pytest.mark.parametrize("impl", IMPLS)
def test_fetch_decode(benchmark, impl, partitions):
    frame = fetch_frame(partitions)
    benchmark.group = f"fetch decode {partitions} x 256 KiB"
    result = benchmark(impl.decode_fetch_response, frame, 12)
    assert sum(len(t.partitions) for t in result.topics) == partitions


@pytest.mark.parametrize("partitions", PARTITIONS)
def test_fetch_memcpy_baseline(benchmark, partitions):
    frame = fetch_frame(partitions)
    benchmark.group = f"fetch decode {partitions} x 256 KiB"
    copy = benchmark(bytearray, frame)
    assert len(copy) == len(frame)


@pytest.mark.parametrize("partitions", PARTITIONS)
@pytest.mark.parametrize("impl", IMPLS)
def test_produce_encode_buffers(benchmark, impl, partitions):
    topics = produce_topics(partitions)
    benchmark.group = f"produce encode {partitions} x 256 KiB"
    buffers = benchmark(encode, impl, topics)
    assert len(buffers) >= 2 * partitions


@pytest.mark.parametrize("partitions", PARTITIONS)
@pytest.mark.parametrize("impl", IMPLS)
def test_produce_encode_joined(benchmark, impl, partitions):
    topics = produce_topics(partitions)
    benchmark.group = f"produce encode {partitions} x 256 KiB"
    frame = benchmark(lambda: impl.join_request(encode(impl, topics)))
    assert len(frame) > partitions * RECORDS_BYTES


@pytest.mark.parametrize("partitions", PARTITIONS)
def test_produce_memcpy_baseline(benchmark, partitions):
    frame = twin.join_request(encode(twin, produce_topics(partitions)))
    benchmark.group = f"produce encode {partitions} x 256 KiB"
    copy = benchmark(bytearray, frame)
    assert len(copy) == len(frame)
