"""Fetch/Produce message codec, both implementations, against kafka-python's schema-generated
protocol classes (Kafka's own JSON schemas) for every supported version."""

from __future__ import annotations

import random
import struct

import pytest
from frames import (
    FETCH_PARTITION_FIELDS,
    FETCH_VERSIONS,
    IMPLS,
    PRODUCE_PARTITION_FIELDS,
    PRODUCE_VERSIONS,
    PartitionSpec,
    expected_partition,
    expected_produce_partition,
    fetch_frame,
    fields,
    kafka_encode_produce_request,
    kafka_produce_request,
    produce_response_frame,
    random_fetch_topics,
    random_produce_response_topics,
)

from shallowmirror.errors import CorruptDataError

pytestmark = pytest.mark.parametrize("impl", IMPLS)


# ------------------------------------------------------------------------------ Fetch decode

def _check_fetch(impl, version, frame, topics, **top):
    resp = impl.decode_fetch_response(frame, version)
    assert resp.correlation_id == top.get("correlation_id", 7)
    assert resp.throttle_time_ms == top.get("throttle_time_ms", 0)
    assert resp.error_code == (top.get("error_code", 0) if version >= 7 else 0)
    assert resp.session_id == (top.get("session_id", 0) if version >= 7 else 0)
    assert [t.topic for t in resp.topics] == [name for name, _ in topics]
    for got_topic, (_, parts) in zip(resp.topics, topics, strict=True):
        got = [fields(p, FETCH_PARTITION_FIELDS) for p in got_topic.partitions]
        assert got == [expected_partition(version, p) for p in parts]
    return resp


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_matches_kafka_python(impl, version):
    top = {"correlation_id": -5, "throttle_time_ms": 12, "error_code": 0, "session_id": 99}
    topics = [
        ("orders", [
            PartitionSpec(0, high_watermark=100, last_stable_offset=90, log_start_offset=3,
                          aborted_transactions=[(7, 10), (8, 2**40)], preferred_read_replica=2,
                          records=b"\x00" * 61 + b"batch", tagged=True),
            PartitionSpec(5, error_code=1, high_watermark=-1, aborted_transactions=None,
                          records=None),
            PartitionSpec(2, records=b"", aborted_transactions=[]),
        ]),
        ("", []),
        ("t" * 249, [PartitionSpec(2**31 - 1, high_watermark=2**63 - 1,
                                   last_stable_offset=-(2**63), records=b"r" * 1000)]),
    ]
    frame = fetch_frame(version, topics, **top)
    _check_fetch(impl, version, frame, topics, **top)


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@pytest.mark.parametrize("seed", range(8))
def test_fetch_random_matches_kafka_python(impl, version, seed):
    rng = random.Random(seed * 100 + version)
    topics = random_fetch_topics(rng)
    frame = fetch_frame(version, topics, session_id=seed, error_code=seed % 2)
    _check_fetch(impl, version, frame, topics, session_id=seed, error_code=seed % 2)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_fetch_records_are_views_of_the_frame(impl, kind):
    topics = [("t", [PartitionSpec(0, records=b"A" * 100), PartitionSpec(1, records=b"B" * 7)])]
    raw = fetch_frame(12, topics)
    frame = kind(raw) if kind is not memoryview else memoryview(bytearray(raw))
    owner = frame.obj if isinstance(frame, memoryview) else frame
    resp = impl.decode_fetch_response(frame, 12)
    for part in resp.topics[0].partitions:
        rec = part.records
        assert isinstance(rec, memoryview)
        assert rec.obj is owner          # a slice of the caller's buffer, not a copy
        assert rec.readonly == (kind is bytes)
    # Writing through the frame shows through the view: same memory.
    if kind is not bytes:
        first = resp.topics[0].partitions[0].records
        start = raw.index(b"A" * 100)
        owner[start] = ord("Z")
        assert first[0] == ord("Z")


def test_fetch_empty_response(impl):
    resp = impl.decode_fetch_response(fetch_frame(7, [], session_id=3, error_code=71), 7)
    assert (resp.topics, resp.session_id, resp.error_code) == ([], 3, 71)


@pytest.mark.parametrize("version", [3, 13, -1])
def test_fetch_unsupported_version(impl, version):
    with pytest.raises(ValueError, match="not supported"):
        impl.decode_fetch_response(fetch_frame(12, []), version)


@pytest.mark.parametrize("version", [4, 7, 11, 12])
def test_fetch_every_truncation_is_corrupt_data(impl, version):
    topics = [("tp", [PartitionSpec(3, aborted_transactions=[(1, 2)], records=b"xyz" * 5,
                                    tagged=True),
                      PartitionSpec(4, records=None)])]
    frame = fetch_frame(version, topics)
    for cut in range(len(frame)):
        with pytest.raises(CorruptDataError) as info:
            impl.decode_fetch_response(frame[:cut], version)
        where = info.value.where
        assert where.position is not None and 0 <= where.position <= cut
    # Inside the first partition's records the error names the topic-partition.
    cut = frame.index(b"xyz") + 2
    with pytest.raises(CorruptDataError, match=r"tp-3") as info:
        impl.decode_fetch_response(frame[:cut], version)
    assert (info.value.where.topic, info.value.where.partition) == ("tp", 3)


def test_fetch_trailing_bytes_are_corrupt(impl):
    frame = fetch_frame(11, [("t", [PartitionSpec(0)])])
    with pytest.raises(CorruptDataError, match="2 trailing bytes") as info:
        impl.decode_fetch_response(frame + b"\x00\x00", 11)
    assert info.value.where.position == len(frame)


def test_fetch_negative_lengths_are_corrupt(impl):
    frame = bytearray(fetch_frame(11, [("t", [PartitionSpec(0, records=b"abc")])]))
    pos = frame.index(b"\x00\x00\x00\x03abc")
    frame[pos:pos + 4] = struct.pack(">i", -2)
    with pytest.raises(CorruptDataError, match=r"records length -2 is invalid.*t-0"):
        impl.decode_fetch_response(bytes(frame), 11)
    # A null (-1) topic name is not allowed either.
    frame = bytearray(fetch_frame(11, [("t", [])]))
    pos = frame.index(b"\x00\x01t")
    frame[pos:pos + 2] = b"\xff\xff"
    with pytest.raises(CorruptDataError, match="topic length -1 is invalid"):
        impl.decode_fetch_response(bytes(frame), 11)


def test_fetch_huge_counts_fail_fast(impl):
    # responses count 2**31-1 in a tiny frame: an error, not a long loop or a big allocation.
    frame = struct.pack(">iihi", 1, 0, 0, 0) + struct.pack(">i", 2**31 - 1)
    with pytest.raises(CorruptDataError, match="responses count 2147483647 exceeds"):
        impl.decode_fetch_response(frame, 7)
    # Flexible: the same through a 5-byte varint, and a varint too long for 32 bits.
    head = struct.pack(">i", 1) + b"\x00" + struct.pack(">ihi", 0, 0, 0)
    with pytest.raises(CorruptDataError, match="responses count 4294967294 exceeds"):
        impl.decode_fetch_response(head + b"\xff\xff\xff\xff\x0f", 12)
    with pytest.raises(CorruptDataError, match="does not fit in 32 bits"):
        impl.decode_fetch_response(head + b"\xff\xff\xff\xff\x1f", 12)
    with pytest.raises(CorruptDataError, match=r"truncated responses \(unsigned varint\)"):
        impl.decode_fetch_response(head + b"\xff\xff", 12)


def test_fetch_invalid_utf8_topic(impl):
    frame = bytearray(fetch_frame(12, [("ab", [])]))
    pos = frame.index(b"\x03ab")
    frame[pos + 1] = 0xFF
    with pytest.raises(CorruptDataError, match="topic is not valid UTF-8"):
        impl.decode_fetch_response(bytes(frame), 12)


# ---------------------------------------------------------------------------- Produce encode

def _request_topics(rng: random.Random):
    """(our input with pieces, kafka-python input with joined records)."""
    ours, theirs = [], []
    for t in range(rng.randint(1, 3)):
        name = f"topic.{t}" + "ö" * rng.randint(0, 2)
        parts_ours, parts_theirs = [], []
        for p in rng.sample(range(100), rng.randint(1, 4)):
            pieces = [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 3))]
            pieces = [rng.choice([bytes, bytearray, memoryview])(piece) for piece in pieces]
            parts_ours.append((p, [pieces]))
            parts_theirs.append((p, b"".join(pieces)))
        ours.append((name, parts_ours))
        theirs.append((name, parts_theirs))
    return ours, theirs


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@pytest.mark.parametrize("seed", range(6))
def test_produce_request_matches_kafka_python(impl, version, seed):
    rng = random.Random(seed * 31 + version)
    ours, theirs = _request_topics(rng)
    args = {"correlation_id": rng.randint(-(2**31), 2**31 - 1),
            "client_id": rng.choice([None, "", "shallowmirror-1"]),
            "transactional_id": rng.choice([None, "", "tx-ü"]),
            "acks": rng.choice([-1, 0, 1]), "timeout_ms": rng.randint(0, 60_000)}
    buffers = impl.encode_produce_request(version=version, topics=ours, **args)
    frame = impl.join_request(buffers)
    assert isinstance(frame, bytes)
    # Byte-for-byte what Kafka's generated encoder produces ...
    assert frame == kafka_encode_produce_request(version, topics=theirs, **args)
    # ... and it decodes to the same fields.
    req = kafka_produce_request(frame, version)
    assert req.header.request_api_key == 0
    assert req.header.request_api_version == version
    assert req.header.correlation_id == args["correlation_id"]
    assert req.header.client_id == args["client_id"]
    assert (req.transactional_id, req.acks, req.timeout_ms) == (
        args["transactional_id"], args["acks"], args["timeout_ms"])
    assert [(t.name, [(p.index, p.records) for p in t.partition_data])
            for t in req.topic_data] == theirs


def test_produce_request_pieces_are_not_copied(impl):
    batch_a = [bytes(61), memoryview(bytearray(b"payload-a" * 50))]
    batch_b = [bytearray(b"whole-batch-b" * 9)]
    buffers = impl.encode_produce_request(
        version=9, correlation_id=1, client_id="c", transactional_id=None, acks=-1,
        timeout_ms=100, topics=[("a", [(0, [batch_a])]), ("b", [(3, [batch_b])])])
    assert struct.unpack(">i", bytes(buffers[0][:4]))[0] == sum(
        memoryview(b).nbytes for b in buffers) - 4
    pieces = [buf for buf in buffers if any(buf is p for p in batch_a + batch_b)]
    assert len(pieces) == 3
    assert buffers[1] is batch_a[0] and buffers[2] is batch_a[1] and buffers[4] is batch_b[0]
    # Nothing else in the list is a big copy: only small header chunks surround the pieces.
    others = [buf for buf in buffers if not any(buf is p for p in batch_a + batch_b)]
    assert all(isinstance(buf, bytes) and len(buf) < 64 for buf in others)


def test_produce_request_batches_as_any_iterable_of_pieces(impl):
    """A batch's pieces as a list, a tuple or a one-shot iterator: the same frame (the native
    encoder reads lists and tuples twice, other iterables once)."""
    pieces = [bytes(61), memoryview(b"payload" * 40)]

    def encode(batch_of):
        return impl.join_request(impl.encode_produce_request(
            version=9, correlation_id=1, client_id="c", transactional_id=None, acks=-1,
            timeout_ms=100, topics=[("t", [(p, [batch_of(pieces)]) for p in range(3)])]))

    expected = encode(list)
    assert encode(tuple) == expected
    assert encode(iter) == expected
    assert encode(lambda ps: (p for p in ps)) == expected
    assert kafka_produce_request(expected, 9).topic_data[0].partition_data[2].records == (
        bytes(61) + b"payload" * 40)


def test_produce_request_rejects_two_batches_per_partition(impl):
    topics = [("orders", [(1, [[b"one"]]), (4, [[b"first"], [b"second"]])])]
    with pytest.raises(ValueError, match=r"orders-4 has 2 batches"):
        impl.encode_produce_request(version=8, correlation_id=1, client_id=None,
                                    transactional_id=None, acks=1, timeout_ms=10, topics=topics)
    buffers = impl.encode_produce_request(version=8, correlation_id=1, client_id=None,
                                          transactional_id=None, acks=1, timeout_ms=10,
                                          topics=topics, allow_multiple_batches=True)
    req = kafka_produce_request(impl.join_request(buffers), 8)
    assert [p.records for p in req.topic_data[0].partition_data] == [b"one", b"firstsecond"]


@pytest.mark.parametrize("allow", [False, True])
def test_produce_request_rejects_partition_listed_twice(impl, allow):
    for topics in ([("t", [(2, [[b"a"]]), (2, [[b"b"]])])],
                   [("t", [(2, [[b"a"]])]), ("u", [(2, [[b"x"]])]), ("t", [(2, [[b"b"]])])]):
        with pytest.raises(ValueError, match=r"partition t-2 is listed twice"):
            impl.encode_produce_request(version=9, correlation_id=1, client_id=None,
                                        transactional_id=None, acks=1, timeout_ms=10,
                                        topics=topics, allow_multiple_batches=allow)


def test_produce_request_rejects_bad_input(impl):
    def encode(**kw):
        args = {"version": 9, "correlation_id": 1, "client_id": None, "transactional_id": None,
                "acks": 1, "timeout_ms": 10, "topics": [("t", [(0, [[b"x"]])])]}
        args.update(kw)
        return impl.encode_produce_request(**args)

    with pytest.raises(ValueError, match="t-0 has no batch"):
        encode(topics=[("t", [(0, [])])])
    with pytest.raises(ValueError, match="not supported"):
        encode(version=10)
    with pytest.raises(ValueError, match="not supported"):
        encode(version=2)
    with pytest.raises(ValueError, match="acks"):
        encode(acks=2**15)
    with pytest.raises(ValueError, match="partition"):
        encode(topics=[("t", [(2**31, [[b"x"]])])])
    with pytest.raises(TypeError, match="bytes-like"):
        encode(topics=[("t", [(0, [b"not a list of pieces"])])])
    with pytest.raises(ValueError, match="contiguous"):
        encode(topics=[("t", [(0, [[memoryview(b"abcdef")[::2]]])])])
    with pytest.raises(ValueError, match="topic must not be None"):
        encode(topics=[(None, [(0, [[b"x"]])])])


def test_produce_request_without_topics(impl):
    buffers = impl.encode_produce_request(version=9, correlation_id=5, client_id="c",
                                          transactional_id=None, acks=1, timeout_ms=10,
                                          topics=[])
    frame = impl.join_request(buffers)
    assert len(buffers) == 1
    assert frame == kafka_encode_produce_request(9, correlation_id=5, client_id="c",
                                                 transactional_id=None, acks=1, timeout_ms=10,
                                                 topics=[])


# --------------------------------------------------------------------------- Produce decode

@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@pytest.mark.parametrize("seed", range(6))
def test_produce_response_matches_kafka_python(impl, version, seed):
    rng = random.Random(seed * 7 + version)
    topics = random_produce_response_topics(rng)
    frame = produce_response_frame(version, topics, correlation_id=seed - 3,
                                   throttle_time_ms=seed * 10)
    resp = impl.decode_produce_response(frame, version)
    assert (resp.correlation_id, resp.throttle_time_ms) == (seed - 3, seed * 10)
    assert [name for name, _ in resp.topics] == [name for name, _ in topics]
    for (_, got), (_, parts) in zip(resp.topics, topics, strict=True):
        assert [fields(p, PRODUCE_PARTITION_FIELDS) for p in got] == [
            expected_produce_partition(version, p) for p in parts]


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@pytest.mark.parametrize("seed", range(6))
def test_produce_answer_is_the_response_and_fails_as_it_does(impl, version, seed):
    """``decode_produce_answer``: the native build's C rows (a ``ProduceAnswer``), whose
    ``topics`` are the decoded response's, record errors and messages included; the same
    errors for the same bad bytes."""
    rng = random.Random(seed * 11 + version)
    topics = random_produce_response_topics(rng)
    frame = produce_response_frame(version, topics, correlation_id=seed, throttle_time_ms=4)
    answer = impl.decode_produce_answer(frame, version)
    response = impl.decode_produce_response(frame, version)
    assert answer.correlation_id == response.correlation_id == seed
    assert answer.topics == response.topics
    assert answer.topics is answer.topics                 # made once
    for cut in (1, len(frame) // 2, len(frame) - 1):
        with pytest.raises(CorruptDataError) as from_answer:
            impl.decode_produce_answer(frame[:cut], version)
        with pytest.raises(CorruptDataError) as from_response:
            impl.decode_produce_response(frame[:cut], version)
        assert str(from_answer.value) == str(from_response.value)


@pytest.mark.parametrize("version", [3, 5, 8, 9])
def test_produce_response_every_truncation_is_corrupt_data(impl, version):
    frame = produce_response_frame(version, [("t", [
        {"index": 1, "record_errors": [(0, "x")], "error_message": "m"}])])
    for cut in range(len(frame)):
        with pytest.raises(CorruptDataError):
            impl.decode_produce_response(frame[:cut], version)
    with pytest.raises(CorruptDataError, match="trailing"):
        impl.decode_produce_response(frame + b"\x00", version)


def test_join_request(impl):
    assert impl.join_request([b"ab", bytearray(b"c"), memoryview(b"de")]) == b"abcde"


def test_receive_buffer(impl):
    """A frame is received over the whole buffer: its size is exact, it is writable in place, and
    a size no frame can have is refused like any other bad argument."""
    buf = impl.receive_buffer(3 << 20)
    assert type(buf) is bytearray and len(buf) == 3 << 20
    view = memoryview(buf)
    view[-4:] = b"tail"
    assert bytes(buf[-4:]) == b"tail"
    assert impl.receive_buffer(0) == bytearray()
    with pytest.raises(ValueError, match=">= 0"):
        impl.receive_buffer(-1)
    with pytest.raises(TypeError):
        impl.receive_buffer(1.5)
