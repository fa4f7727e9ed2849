"""A target partition's batches in flight all ride one connection (engine/sink.py).

A broker answers one connection's requests in order, and a lost connection fails all of them;
so as long as a partition's unanswered batches are on one connection, they are acknowledged, or
resent, in source order. Here the target's connection is replaced while a batch is in flight on
the old one (its failure not reported yet): the partition's next batch must wait, and go after
the resend of the failed one. FAKE connections stand in for the target: what is checked is only
which request carries which batch, on which connection.
"""

from __future__ import annotations

import asyncio

import pytest
from kafka.protocol.producer import ProduceResponse as KProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from shallowmirror import codec
from shallowmirror.engine.batch import FetchedBatch
from shallowmirror.engine.engine import MirrorEngine
from shallowmirror.net.connection import ConnectionFailedError

TOPIC = "t"


def _batch(base_offset: int) -> FetchedBatch:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    builder.append(0, 1_700_000_000_000, None, b"v", [])
    data = bytearray(builder.build())
    data[0:8] = base_offset.to_bytes(8, "big")
    view = codec.split_batches(bytes(data)).batches[0]
    return FetchedBatch(TOPIC, 0, view, None, base_offset, base_offset + 1)


def _success_frame() -> memoryview:
    part = KProduceResponse.TopicProduceResponse.PartitionProduceResponse(
        index=0, error_code=0, base_offset=0, log_append_time_ms=-1, log_start_offset=0,
        record_errors=[], error_message=None)
    msg = KProduceResponse(version=8, throttle_time_ms=0, responses=[
        KProduceResponse.TopicProduceResponse(name=TOPIC, partition_responses=[part])])
    msg.with_header(correlation_id=0)
    return memoryview(bytes(msg.encode(header=True, framed=True))[4:])


class FakeConnection:
    """FAKE: keeps each request's buffers and callback; answers only when the test says."""

    client_id = "test"

    def __init__(self, name: str) -> None:
        self.name = name
        self.requests: list[tuple[list, object]] = []
        self.cid = 0
        self.coalesced = 0

    def api_version(self, key: int, bounds: object) -> int:
        return 8

    def next_correlation_id(self) -> int:
        self.cid += 1
        return self.cid

    def coalesce_answers(self, answers: int) -> None:
        self.coalesced = answers

    def send_with_callback(self, buffers, cid, callback, timeout_ms=None,
                           min_response_bytes=0) -> None:
        self.requests.append((buffers, callback))

    def carries(self, index: int, batch: FetchedBatch) -> bool:
        """Whether request ``index`` holds ``batch`` as stamped (its header, with its own
        sequence, is what tells these one-record batches apart)."""
        request = b"".join(bytes(piece) for piece in self.requests[index][0])
        header, _rest = codec.rewrite_for_produce(
            batch.view, producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence)
        return header in request


class FakeCluster:
    """FAKE: one broker leading the partition; ``live`` is its open connection."""

    def __init__(self, live: FakeConnection) -> None:
        self.live = live

    def live_connection(self, node_id: int, lane: int = 0) -> FakeConnection:
        return self.live

    async def connection(self, node_id: int, lane: int = 0) -> FakeConnection:
        return self.live

    def leader(self, topic: str, partition: int) -> int:
        return 1

    def partitions(self, topic: str) -> list[int]:
        return [0]

    async def refresh_metadata(self, topics=None) -> None:
        return None


def test_next_batch_waits_for_the_old_connections_answer_then_follows_the_resend():
    async def scenario() -> None:
        engine = MirrorEngine({"bootstrap.servers": "fake:1"}, {"bootstrap.servers": "fake:2"},
                              topics=[TOPIC], settings={"producer.id": 7,
                                                        "retry.backoff.ms": 1,
                                                        "retry.backoff.max.ms": 1})
        engine.runtime.loop = asyncio.get_running_loop()
        old, new = FakeConnection("old"), FakeConnection("new")
        cluster = FakeCluster(old)
        await engine.sinks.start(cluster)
        b0, b1, b2 = _batch(0), _batch(1), _batch(2)
        engine.sinks.forward(b0, TOPIC, 0)
        (sink,) = engine.sinks.values()
        sink._pump()
        assert len(old.requests) == 1 and old.carries(0, b0)
        old.requests[0][1](_success_frame(), None)       # the broker now knows the producer
        engine.sinks.forward(b1, TOPIC, 0)
        sink._pump()
        assert len(old.requests) == 2 and old.carries(1, b1)
        # The connection is replaced; b1's request on the old one has not failed yet.
        cluster.live = new
        engine.sinks.forward(b2, TOPIC, 0)
        sink._pump()
        assert new.requests == [], "b2 went out on a new connection while b1 was in flight"
        old.requests[1][1](None, ConnectionFailedError("connection lost"))   # b1 failed
        for _ in range(100):
            if new.requests:
                break
            sink._pump()
            await asyncio.sleep(0.002)                      # b1's resend waits out a backoff
        assert new.carries(0, b1) and not new.carries(0, b2)
        assert b1.base_sequence < b2.base_sequence

    asyncio.run(scenario())


@pytest.mark.parametrize(("setting", "in_flight", "awaited"), [
    (None, 5, 3),      # the defaults: three answers, two requests left with the broker
    (5, 5, 4),         # one request always left for the broker to work on
    (3, 2, 1),         # two in flight: wake for each answer
    (2, 3, 2),
    (1, 5, 1),         # off
])
def test_answers_awaited_per_wakeup_leave_the_broker_a_request(
        setting: int | None, in_flight: int, awaited: int) -> None:
    async def scenario() -> None:
        settings: dict = {"producer.id": 7, "max.in.flight.requests.per.connection": in_flight}
        if setting is not None:
            settings["target.answers.per.wakeup"] = setting
        engine = MirrorEngine({"bootstrap.servers": "fake:1"}, {"bootstrap.servers": "fake:2"},
                              topics=[TOPIC], settings=settings)
        engine.runtime.loop = asyncio.get_running_loop()
        conn = FakeConnection("only")
        await engine.sinks.start(FakeCluster(conn))
        engine.sinks.forward(_batch(0), TOPIC, 0)
        (sink,) = engine.sinks.values()
        sink._pump()
        assert len(conn.requests) == 1 and conn.coalesced == awaited

    asyncio.run(scenario())
