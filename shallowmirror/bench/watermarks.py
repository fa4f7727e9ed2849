"""Where a topic's partitions end (high watermarks) and how many bytes a topic holds.

The harness must see "the last record is on the target" without consuming the target (which would
cost as much CPU as a mirror, on the same machine). It sends a raw Fetch v4 to each partition's
leader at an offset far past the end: Kafka answers OFFSET_OUT_OF_RANGE, tansu answers with the
high watermark and no records (cheap). ListOffsets "latest" is wrong on tansu (it returns the last
batch's base offset + 1), so it is only the fallback, for brokers that refuse the cheap fetch —
where it is right (Apache Kafka).

``scan`` reads a whole topic once with raw Fetches and adds up the sizes of its RecordBatches: the
compressed bytes a mirror moves (the same number for every mode, so CPU per GB is comparable).
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import struct
import time
from dataclasses import dataclass

from shallowmirror import codec
from shallowmirror.mirror.clients import NOT_ANSWERING

_FETCH_VERSION = 4
_FAR_OFFSET = 1 << 62
_OFFSET_OUT_OF_RANGE = 1
_CLIENT_ID = b"shallowmirror-bench"
#: Longest single ListOffsets call into librdkafka (see ``HighWatermarks._list_offset``).
LIST_OFFSET_CALL_S = 0.5


@dataclass
class TopicScan:
    records: int
    compressed_bytes: int
    batches: int
    end_offsets: dict[int, int]


class _Conn:
    """One blocking connection to one broker, one request at a time."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.correlation = itertools.count(1)

    def fetch(self, topic: str, offsets: dict[int, int], *, max_wait_ms: int, min_bytes: int,
              max_bytes: int):
        correlation_id = next(self.correlation)
        name = topic.encode()
        req = [struct.pack(">hhih", 1, _FETCH_VERSION, correlation_id, len(_CLIENT_ID)),
               _CLIENT_ID,
               # replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level
               struct.pack(">iiiib", -1, max_wait_ms, min_bytes, max_bytes, 0),
               struct.pack(">ih", 1, len(name)), name, struct.pack(">i", len(offsets))]
        for partition, offset in offsets.items():
            req.append(struct.pack(">iqi", partition, offset, max_bytes))
        body = b"".join(req)
        self.sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", self._recv(4))[0]
        frame = self._recv(size)
        response = codec.decode_fetch_response(frame, _FETCH_VERSION)
        if response.correlation_id != correlation_id:
            raise ConnectionError(f"correlation id {response.correlation_id} != {correlation_id}")
        return [p for t in response.topics if t.topic == topic for p in t.partitions]

    def _recv(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if not k:
                raise ConnectionError("connection closed by broker")
            got += k
        return buf

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def partition_leaders(bootstrap: str, topic: str, timeout_s: float = 10.0
                      ) -> dict[int, tuple[str, int]]:
    """partition -> (host, port) of its leader, from Metadata (confluent-kafka AdminClient)."""
    from shallowmirror.bench import topics

    md = topics.list_topics(topics.admin(bootstrap), topic, timeout_s=timeout_s)
    brokers = {b.id: (b.host, b.port) for b in md.brokers.values()}
    meta = md.topics.get(topic)
    if meta is None or meta.error is not None:
        raise LookupError(f"topic {topic} not found on {bootstrap}: {meta and meta.error}")
    return {p.id: brokers[p.leader] for p in meta.partitions.values() if p.leader in brokers}


class HighWatermarks:
    """Reads the high watermarks of one topic's partitions, cheaply and repeatedly."""

    def __init__(self, bootstrap: str, topic: str, partitions: int | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        leaders = partition_leaders(bootstrap, topic)
        if partitions is not None:
            leaders = {p: a for p, a in leaders.items() if p < partitions}
        self._by_leader: dict[tuple[str, int], list[int]] = {}
        for partition, address in sorted(leaders.items()):
            self._by_leader.setdefault(address, []).append(partition)
        self._conns: dict[tuple[str, int], _Conn] = {}
        self._fallback = None  # confluent Consumer for ListOffsets, once Fetch is refused
        self.method = "fetch"

    @property
    def partitions(self) -> list[int]:
        return sorted(p for ps in self._by_leader.values() for p in ps)

    def read(self) -> dict[int, int]:
        """partition -> high watermark, now."""
        if self.method == "fetch":
            try:
                return self._read_fetch()
            except _FetchRefused:
                self.method = "list-offsets"
        return self._read_list_offsets()

    def _read_fetch(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for address, partitions in self._by_leader.items():
            conn = self._conns.get(address)
            if conn is None:
                conn = self._conns[address] = _Conn(*address)
            # min_bytes 0: answer at once (tansu holds a min_bytes>0 fetch for max_wait_ms).
            answers = conn.fetch(self.topic, dict.fromkeys(partitions, _FAR_OFFSET),
                                 max_wait_ms=10, min_bytes=0, max_bytes=1)
            for p in answers:
                if p.error_code == _OFFSET_OUT_OF_RANGE or p.high_watermark < 0:
                    raise _FetchRefused()
                if p.error_code:
                    raise ConnectionError(f"{self.topic}[{p.partition}]: fetch error "
                                          f"{p.error_code}")
                out[p.partition] = p.high_watermark
        return out

    def _read_list_offsets(self) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        if self._fallback is None:
            from shallowmirror.rdkafka_logs import with_log_config

            self._fallback = Consumer(with_log_config({
                "bootstrap.servers": self.bootstrap, "group.id": "shallowmirror-bench-watermarks",
                "enable.auto.commit": False}))
        return {p: self._list_offset(TopicPartition(self.topic, p)) for p in self.partitions}

    def _list_offset(self, tp, timeout_s: float = 30.0, answer_s: float = 10.0) -> int:
        """ListOffsets "latest" of one partition, retried while the error is retriable (for up
        to ``timeout_s``): a topic created a moment ago answers NOT_LEADER_FOR_PARTITION until
        its leader is known. A broker that does not answer fails it after ``answer_s``, asked
        in calls of ``LIST_OFFSET_CALL_S``: Python sees Ctrl-C only between two calls into
        librdkafka, so one call of ``answer_s`` held it that long."""
        from confluent_kafka import KafkaError, KafkaException

        not_yet = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                   KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                   KafkaError._UNKNOWN_TOPIC}
        now = time.monotonic()
        deadline, silent_until = now + timeout_s, now + answer_s
        while True:
            call_s = max(0.01, min(LIST_OFFSET_CALL_S, silent_until - time.monotonic()))
            try:
                return self._fallback.get_watermark_offsets(tp, timeout=call_s, cached=False)[1]
            except KafkaException as err:
                error = err.args[0]
                now = time.monotonic()
                if error.code() in NOT_ANSWERING:    # no answer in its time: not an error yet
                    if now < silent_until:
                        continue            # no answer yet: ask again (Ctrl-C is seen here)
                    raise
                if not (error.retriable() or error.code() in not_yet) or now > deadline:
                    raise
                silent_until = now + answer_s       # it answered: the wait starts again
            time.sleep(0.05)

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None

    def __enter__(self) -> HighWatermarks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _FetchRefused(Exception):
    """The broker does not report the high watermark for an out-of-range fetch (Kafka)."""


def scan(bootstrap: str, topic: str, max_bytes: int = 8 << 20) -> TopicScan:
    """Read the whole topic once; count records and RecordBatch bytes (as stored, compressed).

    Fetches one partition per request because tansu gives the whole response budget to the first
    partition of a request anyway."""
    with HighWatermarks(bootstrap, topic) as hw:
        ends = hw.read()
        leaders = {p: a for a, ps in hw._by_leader.items() for p in ps}
    conns: dict[tuple[str, int], _Conn] = {}
    total = TopicScan(0, 0, 0, dict(ends))
    try:
        for partition, end in sorted(ends.items()):
            address = leaders[partition]
            conn = conns.get(address) or conns.setdefault(address, _Conn(*address))
            offset = 0
            while offset < end:
                (answer,) = conn.fetch(topic, {partition: offset}, max_wait_ms=100, min_bytes=1,
                                       max_bytes=max_bytes)
                if answer.error_code:
                    raise ConnectionError(f"{topic}[{partition}] fetch at {offset}: error "
                                          f"{answer.error_code}")
                split = codec.split_batches(answer.records or b"", verify_crc=False)
                progressed = False
                for batch in split.batches:
                    if batch.next_offset <= offset:
                        continue
                    total.records += batch.record_count
                    total.compressed_bytes += batch.size
                    total.batches += 1
                    offset = batch.next_offset
                    progressed = True
                if not progressed:
                    raise ConnectionError(f"{topic}[{partition}]: no progress at offset {offset}"
                                          f" (high watermark {end})")
    finally:
        for conn in conns.values():
            conn.close()
    return total
