"""Fetch sessions (KIP-227) on real brokers: once the broker holds a session, a request carries
only the partitions whose position changed (none when nothing changed), so requests do not grow
with the partition count; a broker that makes no session (tansu) is fetched in full, and
``fetch.session.enable=false`` is sessionless. Every record arrives either way."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Producer
from engine_support import caught_up, create_target, group, load_topic

from shallowmirror.engine import MirrorEngine
from shallowmirror.net.connection import BrokerConnection
from shallowmirror.net.protocol import FETCH_API_KEY

pytestmark = pytest.mark.integration

PARTITIONS = 12


def _record_fetches(monkeypatch) -> list:
    """Every Fetch request the engine sends (observed on the way out; nothing is changed)."""
    sent: list = []
    original = BrokerConnection.request_frame

    async def observed(self, req, *args, **kwargs):
        if req.API_KEY == FETCH_API_KEY:
            sent.append(req)
        return await original(self, req, *args, **kwargs)

    monkeypatch.setattr(BrokerConnection, "request_frame", observed)
    return sent


def _append(cluster, topic: str, partition: int, records: int) -> None:
    producer = Producer({**cluster.client_config(), "compression.type": "lz4",
                         "linger.ms": 20})
    for i in range(records):
        producer.produce(topic, value=b"x" * 200, key=str(i).encode(), partition=partition)
    assert producer.flush(30) == 0


def _partitions(req) -> list[tuple[str, int]]:
    return [(t.topic, p.partition) for t in req.topics for p in t.partitions]


def _mirror_then_append(source_cluster, target_cluster, topic: str, settings: dict,
                        sent: list) -> tuple[int, list, list]:
    """Mirror ``topic``, idle a few fetches, append to partition 3 only, mirror that too.
    Returns (records mirrored, requests before the append, requests after it)."""
    engine = MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                          topics=[topic], settings={
                              "partition.assignment": "all", "group.id": group(),
                              "fetch.max.wait.ms": 100, **settings})

    async def scenario() -> tuple[int, int]:
        async with caught_up(engine):
            idle_from = len(sent)
            while len(sent) < idle_from + 4:            # a few fetches with nothing new
                await asyncio.sleep(0.05)
            mark = len(sent)
            await asyncio.to_thread(_append, source_cluster, topic, 3, 300)
            while engine.stats().records < 1500:
                await asyncio.sleep(0.05)
            assert await engine.wait_caught_up(60), engine.stats()
        return engine.stats().records, mark

    records, mark = asyncio.run(scenario())
    return records, sent[:mark], sent[mark:]


def test_session_sends_only_changed_partitions(source_cluster, target_cluster, unique_topic,
                                               monkeypatch, on_tansu):
    topic = unique_topic("session")
    load_topic(source_cluster, topic, 1200, partitions=PARTITIONS)
    create_target(target_cluster, topic, PARTITIONS)
    sent = _record_fetches(monkeypatch)
    records, before, after = _mirror_then_append(source_cluster, target_cluster, topic, {}, sent)
    assert records == 1500
    everything = sorted((topic, p) for p in range(PARTITIONS))
    assert sorted(_partitions(before[0])) == everything          # the first request is full
    assert (before[0].session_id, before[0].session_epoch) == (0, 0)
    if on_tansu and all(r.session_id == 0 for r in before):
        # tansu makes no session: every request stays full (and correct).
        assert all(sorted(_partitions(r)) == everything for r in before + after)
        return
    idle = before[-3:]
    assert all(r.session_id != 0 and r.session_epoch > 0 for r in idle)
    assert [_partitions(r) for r in idle] == [[], [], []]     # nothing changed: nothing sent
    epochs = [r.session_epoch for r in before + after if r.session_id]
    assert epochs == list(range(1, len(epochs) + 1))
    # After the append only partition 3 moves: no request names another partition.
    moved = {tp for r in after for tp in _partitions(r)}
    assert moved == {(topic, 3)}


def test_sessions_off_fetches_every_partition_every_time(source_cluster, target_cluster,
                                                         unique_topic, monkeypatch):
    topic = unique_topic("sessionless")
    load_topic(source_cluster, topic, 1200, partitions=PARTITIONS)
    create_target(target_cluster, topic, PARTITIONS)
    sent = _record_fetches(monkeypatch)
    records, before, after = _mirror_then_append(
        source_cluster, target_cluster, topic, {"fetch.session.enable": False}, sent)
    assert records == 1500
    everything = sorted((topic, p) for p in range(PARTITIONS))
    assert all(r.session_epoch == -1 and r.session_id == 0 for r in before + after)
    assert all(sorted(_partitions(r)) == everything for r in before + after)


@pytest.mark.needs_real_kafka("tansu makes no fetch session, so every request answers every "
                              "partition anyway")
def test_partitions_assigned_again_learn_their_high_watermark_while_idle(
        source_cluster, target_cluster, unique_topic):
    """A rebalance that revokes idle partitions and assigns them back to the same engine (here:
    a second topic joins the subscription) hands them to new partition objects at the position
    the broker's session already holds. An incremental Fetch answers a partition only when it
    has records or its high watermark moved, so they would never learn their high watermark and
    "caught up" (``--exit-when-caught-up``, lag in the status line) would wait for new records;
    the engine fetches in full once instead."""
    first, second = unique_topic("again-a"), unique_topic("again-b")
    for topic in (first, second):
        load_topic(source_cluster, topic, 2000, partitions=4)
        create_target(target_cluster, topic, 4)
    engine = MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                          topics=[first], settings={
                              "partition.assignment": "group", "group.id": group(),
                              "fetch.max.wait.ms": 100})

    async def scenario() -> None:
        async with caught_up(engine):
            before = {tp for tp in engine.partitions}
            engine.set_topics([first, second])
            await engine.runtime.progress.wait_until(
                lambda: {t for t, _ in engine.partitions} == {first, second}, 60)
            assert all(engine.partitions[tp] is not None for tp in before)
            assert await engine.wait_caught_up(30), engine.stats()
            stats = engine.stats()
            assert all(p.high_watermark > 0 and p.lag == 0
                       for tp, p in stats.partitions.items() if tp[0] == first), stats

    asyncio.run(scenario())
