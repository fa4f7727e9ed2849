"""A stop while the target takes requests but answers none (its broker frozen: SIGSTOP): the
engine waits up to request.timeout.ms for the batches it sent, and says so while it waits, and the
connection it gives up on when its requests time out is told once, not once per request that was
in flight on it.

The frozen target is a broker of this test's own (tansu, started here and stopped by pid), since
freezing the session's target would stall every test after it; the source is the session's."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import pytest
from confluent_kafka import Producer
from engine_support import create_target, group, load_topic

from shallowmirror.engine import MirrorEngine, core
from shallowmirror.testing.embedded import start_cluster

pytestmark = pytest.mark.integration

TIMEOUT_MS = 4000


def _produce(cluster, topic: str, records: int) -> None:
    producer = Producer({**cluster.client_config(), "linger.ms": 5,
                         "compression.type": "lz4", "batch.size": 4096})
    for i in range(records):
        producer.produce(topic, value=b"v" * 200, key=str(i).encode(), partition=i % 2)
    assert producer.flush(30) == 0


async def _stop_after(source_cluster, target, topic: str, timeout_ms: int, break_target,
                      ready) -> float:
    """Mirror ``topic`` until caught up, ``break_target()``, write more to the source, wait until
    batches wait for the target and ``ready(engine)``, then stop the engine: the seconds the
    stop took."""
    engine = MirrorEngine(
        source_cluster.client_config(),
        {**target.client_config(), "request.timeout.ms": timeout_ms}, topics=[topic],
        settings={"partition.assignment": "all", "group.id": group(),
                  "fetch.max.wait.ms": 100, "request.timeout.ms": timeout_ms})
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    try:
        await engine.runtime.progress.wait_until(lambda: engine.ready or task.done())
        assert await engine.wait_caught_up(60), engine.stats()
        break_target()
        await asyncio.to_thread(_produce, source_cluster, topic, 3000)
        began = time.monotonic()
        while time.monotonic() - began < 30 and not (
                engine.sinks.pending_batches() and ready(engine)):
            await asyncio.sleep(0.05)
        assert engine.sinks.pending_batches(), "nothing waited for the target"
        stopped_at = time.monotonic()
        stop.set()
        await task
        return time.monotonic() - stopped_at
    finally:
        stop.set()
        if not task.done():
            await task


def test_a_stop_while_the_target_does_not_answer_says_what_it_waits_for(
        source_cluster, unique_topic, caplog, monkeypatch):
    monkeypatch.setattr(core, "DRAIN_TELL_S", 1.0)
    caplog.set_level(logging.INFO)
    topic = unique_topic("frozen")
    load_topic(source_cluster, topic, 500, partitions=2)
    with start_cluster("frozen") as target:
        create_target(target, topic, 2)
        frozen_at: list[float] = []

        def freeze() -> None:
            os.kill(target.pid, signal.SIGSTOP)
            frozen_at.append(time.monotonic())

        def timed_out(_engine) -> bool:
            # The requests in flight time out: their connection is closed under them.
            return time.monotonic() - frozen_at[0] > TIMEOUT_MS / 1000 + 2

        try:
            waited_s = asyncio.run(_stop_after(source_cluster, target, topic, TIMEOUT_MS,
                                               freeze, timed_out))
        finally:
            os.kill(target.pid, signal.SIGCONT)
    told = [r.getMessage() for r in caplog.records
            if "stopping;" in r.getMessage() and "not yet acknowledged" in r.getMessage()]
    # The wait lasts about request.timeout.ms; it is told every DRAIN_TELL_S meanwhile.
    assert waited_s >= TIMEOUT_MS / 1000 - 1.5, waited_s
    assert len(told) >= 2, caplog.text[-3000:]
    assert "by cluster target, waiting up to" in told[0] and "request.timeout.ms=4000" in told[0]
    assert "mirrored again by the next start" in told[0]
    resent = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING and "will be resent" in r.getMessage()]
    assert len(resent) == 1, resent
    assert "requests in flight)" in resent[0], resent


def test_a_stop_while_the_target_is_down_does_not_wait_for_it(
        source_cluster, unique_topic, caplog):
    """The target's broker gone (connections refused): what is unacknowledged cannot be until it
    is back, so a stop leaves it at once (the next start mirrors it again), instead of waiting
    request.timeout.ms (30 s by default) with the operator's Ctrl-C."""
    caplog.set_level(logging.INFO)
    topic = unique_topic("gone")
    load_topic(source_cluster, topic, 500, partitions=2)
    patient_ms = 20000
    target = start_cluster("gone")
    try:
        create_target(target, topic, 2)
        waited_s = asyncio.run(_stop_after(
            source_cluster, target, topic, patient_ms, target.stop,
            lambda engine: engine.target.unreachable_for_s() is not None))
    finally:
        target.stop()
    left = [r.getMessage() for r in caplog.records if "at shutdown; abandoned" in r.getMessage()]
    assert len(left) == 1 and "(cluster target has been unreachable for" in left[0], left
    assert "not waited for" in left[0]
    assert not [r for r in caplog.records if "waiting up to" in r.getMessage()]
    assert waited_s < patient_ms / 2000, waited_s     # it did not wait the request timeout
