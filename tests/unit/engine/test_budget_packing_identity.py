"""Byte budget, request packing planner, producer identity, settings, metrics sink."""

from __future__ import annotations

import asyncio
import json
from collections import deque

import pytest

from shallowmirror.engine.budget import ByteBudget, FrameLease
from shallowmirror.engine.config import ENGINE_SETTINGS, resolve_settings
from shallowmirror.engine.metrics import FlowRecorder, JsonLinesMetricsSink, ListMetricsSink
from shallowmirror.engine.packing import Rotation, plan_request
from shallowmirror.engine.producer_identity import ProducerIdentity
from shallowmirror.errors import ConfigError
from shallowmirror.metrics_schema import FLOW_FIELDS


def test_budget_waits_until_released() -> None:
    async def scenario() -> list[str]:
        budget = ByteBudget(100)
        events: list[str] = []
        lease = FrameLease(budget, 80)
        assert not budget.has_room(50)

        async def fetcher() -> None:
            await budget.wait_room(50)
            events.append("room")

        task = asyncio.create_task(fetcher())
        await asyncio.sleep(0)
        events.append("before release")
        lease.hold()
        lease.drop()                 # the fetcher's own hold
        assert budget.in_use_bytes == 80
        lease.drop()                 # the last batch acknowledged
        await task
        assert budget.in_use_bytes == 0 and budget.peak_bytes == 80 and lease.released
        return events

    assert asyncio.run(scenario()) == ["before release", "room"]


def test_budget_oversize_fetch_never_deadlocks() -> None:
    budget = ByteBudget(10)
    assert budget.has_room(1000)     # nothing in use: one oversize fetch may go
    with pytest.raises(AssertionError):
        budget.release(1)


def _plan(queues, limit, can=lambda k: True, rot=None):
    order = list(queues) if rot is None else rot.next_order()
    return plan_request(queues, order, size_of=len, topic_of=lambda k: k[0], can_send=can,
                        max_request_bytes=limit)


def test_plan_one_batch_per_partition_up_to_limit() -> None:
    queues = {("t", p): deque([b"x" * 100, b"y" * 100]) for p in range(10)}
    plan = _plan(queues, 128 + 11 + 3 * 108)
    assert [k for k, _ in plan.picks] == [("t", 0), ("t", 1), ("t", 2)]
    assert len({k for k, _ in plan.picks}) == len(plan.picks)
    assert plan.request_bytes <= 128 + 11 + 3 * 108


def test_plan_skips_blocked_and_reports_too_large() -> None:
    queues = {("t", 0): deque([b"x" * 5000]), ("t", 1): deque([b"y" * 10]),
              ("t", 2): deque([b"z" * 10])}
    plan = _plan(queues, 1024, can=lambda k: k != ("t", 2))
    assert [k for k, _ in plan.picks] == [("t", 1)]
    assert [k for k, _ in plan.too_large] == [("t", 0)]


def test_rotation_is_fair() -> None:
    rot: Rotation[int] = Rotation()
    for k in range(3):
        rot.add(k)
    firsts = [rot.next_order()[0] for _ in range(6)]
    assert firsts == [0, 1, 2, 0, 1, 2]
    rot.remove(1)
    assert sorted(rot.next_order()) == [0, 2]


def test_producer_identity_sequences_and_reset() -> None:
    calls = []

    async def init_call(pid: int, epoch: int) -> tuple[int, int]:
        calls.append((pid, epoch))
        return 42, epoch + 1

    async def scenario() -> None:
        ident = ProducerIdentity(idempotent=True, init_call=init_call)
        await ident.init()
        s1 = ident.stamp("t", 0, 10)
        s2 = ident.stamp("t", 0, 5)
        s3 = ident.stamp("t", 1, 3)
        assert (s1.producer_id, s1.producer_epoch, s1.base_sequence) == (42, 0, 0)
        assert s2.base_sequence == 10 and s3.base_sequence == 0
        await ident.reset("OUT_OF_ORDER_SEQUENCE_NUMBER")
        s4 = ident.stamp("t", 0, 1)
        assert s4.base_sequence == 0 and s4.producer_epoch == 1
        assert s4.generation == s1.generation + 1
        assert calls == [(-1, -1), (42, 0)]
        ident._next_sequence[("t", 0)] = (1 << 31) - 2
        ident.stamp("t", 0, 5)
        assert ident.next_sequence("t", 0) == 3      # wraps like Kafka's producer

    asyncio.run(scenario())
    plain = ProducerIdentity(idempotent=False)
    assert plain.stamp("t", 0, 5).base_sequence == -1


def test_settings_defaults_and_cross_checks() -> None:
    values = resolve_settings({"fetch.max.wait.ms": "200", "acks": "1",
                               "enable.idempotence": "false"})
    assert values["fetch.max.wait.ms"] == 200 and values["isolation.level"] == "read_uncommitted"
    with pytest.raises(ConfigError) as info:
        resolve_settings({"max.in.flight.requests.per.connection": "8",
                          "fetch.max.bytes": str(10**9), "fetch.max.wait.ms": "0"})
    assert len(info.value.problems) == 1       # per-key problems first, all at once
    with pytest.raises(ConfigError) as info:
        resolve_settings({"max.in.flight.requests.per.connection": "8",
                          "fetch.max.bytes": str(10**9)})
    assert len(info.value.problems) == 2
    assert "buffer.memory" in ENGINE_SETTINGS.markdown()


def test_flow_records_follow_schema(tmp_path) -> None:
    path = tmp_path / "m.jsonl"
    sink = JsonLinesMetricsSink(path)
    rec = FlowRecorder(sink, run_id="r", flow="A->B", source_cluster="A", target_cluster="B",
                       interval_s=60)
    for latency in (10.0, 30.0):
        rec.batch_acked("t", 3, "A.t", compression=3, records=5, compressed_bytes=100,
                        latency_ms=latency, offset_lag=7)
    rec.flush()
    sink.close()
    (line,) = path.read_text().splitlines()
    record = json.loads(line)
    assert record["kind"] == "flow" and set(FLOW_FIELDS) <= set(record)
    assert (record["batches"], record["records"], record["codec"]) == (2, 10, "lz4")
    assert record["latency_ms"] == 20.0 and record["latency_ms_max"] == 30.0
    per_batch = ListMetricsSink()
    rec2 = FlowRecorder(per_batch, run_id="r", flow="A->B", source_cluster="A",
                        target_cluster="B", interval_s=0)
    rec2.batch_acked("t", 0, "t", compression=0, records=1, compressed_bytes=1, latency_ms=1,
                     offset_lag=0)
    assert len(per_batch.records) == 1
