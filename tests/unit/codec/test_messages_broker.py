"""The message codec against a real Kafka-protocol broker (embedded tansu, or the cluster in
``SHALLOWMIRROR_TARGET_BOOTSTRAP``): our Produce request over a plain socket, our decoding of the
Produce and Fetch responses, and confluent-kafka reading back what we wrote.

With an external cluster the raw socket talks to the first bootstrap broker, which must lead the
test partitions (true for a one-broker cluster).
"""

from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from frames import IMPLS
from kafka.protocol.consumer import FetchRequest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

pytestmark = pytest.mark.integration

_FetchTopic = FetchRequest.FetchTopic
_FetchPartition = _FetchTopic.FetchPartition


@pytest.fixture(scope="module")
def bootstrap(target_cluster):
    """The session's target cluster (tansu, Apache Kafka or external): topic names are unique."""
    return target_cluster.bootstrap


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return bytes(buf)


def _call(sock: socket.socket, buffers: list) -> bytes:
    """Send a request given as a buffer list (scatter/gather) and return the response frame."""
    total = sum(memoryview(b).nbytes for b in buffers)
    sent = sock.sendmsg(buffers)
    if sent < total:   # a short write: send the rest the simple way
        sock.sendall(b"".join(bytes(b) for b in buffers)[sent:])
    size = struct.unpack(">i", _recv_exact(sock, 4))[0]
    return _recv_exact(sock, size)


def _batch(compression: int, values: list[bytes]) -> bytes:
    """A client-style v2 batch (base offset 0) built by kafka-python."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=compression, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"key-%d" % i, value=value,
                       headers=[("h", b"x")])
    return bytes(builder.build())


def _records(view) -> list[tuple[int, bytes | None, bytes | None]]:
    records = MemoryRecords(bytes(view))
    out = []
    while (batch := records.next_batch()) is not None:
        out.extend((r.offset, r.key, r.value) for r in batch)
    return out


def _create_topic(bootstrap: str, partitions: int) -> str:
    topic = f"codec-messages-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=30)
    return topic


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("produce_version", "fetch_version"), [(3, 4), (5, 7), (8, 11), (9, 12)])
def test_round_trip_through_a_broker(impl, bootstrap, produce_version, fetch_version):
    topic = _create_topic(bootstrap, 2)
    # Records that were there before: ours must land after them.
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    before = {0: [b"c0-a", b"c0-b", b"c0-c"], 1: [b"c1-a", b"c1-b"]}
    for partition, values in before.items():
        for value in values:
            producer.produce(topic, value=value, key=b"ck", partition=partition)
    assert producer.flush(30) == 0

    ours = {0: [b"gzip-%d" % i * 20 for i in range(4)], 1: [b"lz4-%d" % i * 20 for i in range(3)]}
    batches = {0: _batch(1, ours[0]), 1: _batch(3, ours[1])}
    # Header and payload as separate views of the batch: the pieces go out uncopied.
    topics = [(topic, [(p, [[memoryview(b)[:61], memoryview(b)[61:]]])
                       for p, b in batches.items()])]
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        request = impl.encode_produce_request(
            version=produce_version, correlation_id=41, client_id="shallowmirror-test",
            transactional_id=None, acks=-1, timeout_ms=10_000, topics=topics)
        resp = impl.decode_produce_response(_call(sock, request), produce_version)
        assert resp.correlation_id == 41
        [(name, parts)] = resp.topics
        assert name == topic
        by_partition = {p.partition: p for p in parts}
        assert sorted(by_partition) == [0, 1]
        for partition, part in by_partition.items():
            assert part.error_code == 0, part
            assert part.base_offset == len(before[partition])
            assert part.record_errors == [] and part.error_message is None

        fetch = FetchRequest(
            version=fetch_version, replica_id=-1, max_wait_ms=500, min_bytes=1,
            max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[_FetchTopic(topic=topic, partitions=[
                _FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20,
                                current_leader_epoch=-1, log_start_offset=-1)
                for p in (0, 1)])],
            forgotten_topics_data=[], rack_id="")
        fetch.with_header(correlation_id=42, client_id="shallowmirror-test")
        frame = _call(sock, [bytes(fetch.encode(header=True, framed=True))])
    decoded = impl.decode_fetch_response(frame, fetch_version)
    assert decoded.correlation_id == 42 and decoded.error_code == 0
    [fetched_topic] = decoded.topics
    assert fetched_topic.topic == topic
    for part in fetched_topic.partitions:
        p = part.partition
        expected = len(before[p]) + len(ours[p])
        assert part.error_code == 0
        assert part.high_watermark == expected
        assert part.records is not None and part.records.obj is frame
        got = _records(part.records)
        assert [o for o, _, _ in got] == list(range(expected))
        assert [v for _, _, v in got] == before[p] + ours[p]
        # The compressed batch came back byte-for-byte from the magic byte on (the broker
        # only assigns base offset and leader epoch, which lie outside the CRC).
        assert batches[p][16:] in part.records.tobytes()

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        seen: dict[int, list[bytes]] = {0: [], 1: []}
        want = sum(len(before[p]) + len(ours[p]) for p in (0, 1))
        deadline = time.monotonic() + 30
        while sum(map(len, seen.values())) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            seen[msg.partition()].append(msg.value())
        assert seen == {p: before[p] + ours[p] for p in (0, 1)}
    finally:
        consumer.close()
