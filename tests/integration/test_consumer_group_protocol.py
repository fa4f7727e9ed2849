"""``group.protocol=consumer``: partitions shared through KIP-848's consumer group protocol, on a
real Kafka 3.7 source with the protocol turned on (Kafka 4.0+ serves it by default). The broker
assigns at the first heartbeat, so a new group starts without ``group.initial.rebalance.delay.ms``;
commits carry the member epoch; partitions move between members with their final positions
committed first. Brokers without the protocol, and a group id a classic group already holds,
are refused with what to do."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from engine_support import create_target, group, load_topic, run_until_caught_up, until
from kafka import errors as Errors

from shallowmirror.engine import MirrorEngine
from shallowmirror.engine.consumer_group import ConsumerGroupMembership
from shallowmirror.engine.membership import GroupMembershipError
from shallowmirror.errors import BrokerError
from shallowmirror.net import Cluster
from shallowmirror.net.coordinators import GROUP_KEY, Coordinators
from shallowmirror.net.group_api import ConsumerGroupHeartbeatRequest
from shallowmirror.testing.topics import group_offsets, read_topic, tally_copies

pytestmark = pytest.mark.integration

KIP_848 = {"group.coordinator.rebalance.protocols": "classic,consumer"}


@pytest.fixture(scope="module")
def kip848(start_module_broker) -> Any:
    """A Kafka 3.7 source cluster with the consumer group protocol on, shared by this file's
    tests (topics and groups of their own; none stops it). Only real Kafka gets this far: every
    test asking for it is ``needs_real_kafka``."""
    return start_module_broker("kip848", overrides=KIP_848)


def _settings(group_id: str, **more) -> dict:
    return {"partition.assignment": "group", "group.protocol": "consumer", "group.id": group_id,
            "fetch.max.wait.ms": 100, "offset.commit.interval.ms": 200, **more}


async def _coordinator(cluster: Cluster, group_id: str) -> int:
    """The group's coordinator, waited for (a fresh cluster creates __consumer_offsets first)."""
    for _ in range(300):
        try:
            return await Coordinators(cluster, "probe").node(GROUP_KEY, group_id)
        except BrokerError as err:
            if not err.retriable:
                raise
            await asyncio.sleep(0.1)
    raise AssertionError(f"no coordinator for {group_id} in 30 s")


def _join_answer(cluster, group_id: str, topic: str):
    """A bare member's first heartbeat to ``group_id`` (it leaves again at once)."""

    async def probe():
        conn_cluster = Cluster(cluster.client_config(), "probe")
        await conn_cluster.start()
        try:
            node = await _coordinator(conn_cluster, group_id)
            conn = await conn_cluster.connection(node)
            resp = await conn.request(ConsumerGroupHeartbeatRequest(
                version=0, group_id=group_id, member_id="", member_epoch=0,
                rebalance_timeout_ms=10000, subscribed_topic_names=[topic],
                topic_partitions=[]))
            if resp.error_code == 0:
                await conn.request(ConsumerGroupHeartbeatRequest(
                    version=0, group_id=group_id, member_id=resp.member_id, member_epoch=-1))
            return resp
        finally:
            await conn_cluster.close()

    return asyncio.run(probe())


def _serves_kip_848(cluster) -> bool:
    """Whether a first heartbeat is answered (Kafka 3.7 offers the API in ApiVersions even
    with the protocol off, and answers UNSUPPORTED_VERSION; tansu does not offer it)."""

    async def offered() -> bool:
        probe = Cluster(cluster.client_config(), "probe")
        await probe.start()
        try:
            conn = await probe.any_connection()
            return ConsumerGroupHeartbeatRequest.API_KEY in conn.api_versions
        finally:
            await probe.close()

    if not asyncio.run(offered()):
        return False
    answer = _join_answer(cluster, group(), "kip-848-probe")
    return answer.error_code != Errors.UnsupportedVersionError.errno


def _assert_exact_copy(source, target, topic: str) -> None:
    tally = tally_copies(read_topic(source.client_config(), topic),
                         read_topic(target.client_config(), topic))
    assert (tally.lost, tally.duplicates, tally.order_kept) == (0, 0, True), tally


@pytest.mark.needs_real_kafka("tansu does not serve the KIP-848 consumer group protocol")
def test_a_lone_engine_mirrors_and_resumes_through_the_consumer_protocol(
        kip848, target_cluster, unique_topic):
    """One engine: every record mirrored once, offsets committed under the member epoch, and
    a second run of the same group goes on from them (only the new records). The group is a
    consumer-protocol group: a bare KIP-848 member can join it afterwards, which a classic group
    refuses (next test)."""
    source = kip848
    topic = unique_topic("cgp")
    load_topic(source, topic, 3000, partitions=4)
    create_target(target_cluster, topic, 4)
    group_id = group()
    engines: list[MirrorEngine] = []
    first = asyncio.run(run_until_caught_up(source, target_cluster, [topic],
                                            settings=_settings(group_id), engine_out=engines))
    assert first.records == 3000
    assert isinstance(engines[0].membership, ConsumerGroupMembership)
    assert "assigned" in first.startup and "offsets fetched" in first.startup
    ends = group_offsets(source, group_id, topic, range(4))
    assert sum(ends.values()) == 3000 and min(ends.values()) > 0, ends

    load_topic(source, topic, 700, partitions=4, create_topic=False, seed=7)
    second = asyncio.run(run_until_caught_up(source, target_cluster, [topic],
                                             settings=_settings(group_id)))
    assert second.records == 700
    _assert_exact_copy(source, target_cluster, topic)
    assert _join_answer(source, group_id, topic).error_code == 0

    # Back to the classic protocol on this group: refused with what to do (librdkafka retried
    # the JoinGroup's GROUP_ID_NOT_FOUND silently for ever).
    text = _refusal(source, target_cluster, topic, group_id, protocol="classic")
    assert "exists with the consumer protocol" in text and "group.protocol=consumer" in text


@pytest.mark.needs_real_kafka("tansu does not serve the KIP-848 consumer group protocol")
def test_two_engines_share_partitions_and_hand_them_over(kip848, target_cluster,
                                                         unique_topic):
    """Two engines of one group split the partitions between them (the broker's uniform
    assignor); when one stops, its partitions move to the other from the positions it
    committed as it released them: every record on the target exactly once."""
    source = kip848
    topic = unique_topic("cgp-share")
    load_topic(source, topic, 4000, partitions=4)
    create_target(target_cluster, topic, 4)
    group_id = group()

    async def scenario() -> tuple[list, list, int]:
        engines = [MirrorEngine(source.client_config(), target_cluster.client_config(),
                                topics=[topic], settings=_settings(group_id))
                   for _ in range(2)]
        stops = [asyncio.Event(), asyncio.Event()]
        tasks = [asyncio.create_task(e.run(s)) for e, s in zip(engines, stops, strict=True)]
        try:
            split = await until(lambda: [len(e.partitions) for e in engines] == [2, 2], 60)
            shares = [sorted(e.partitions) for e in engines]
            assert split, [sorted(e.partitions) for e in engines]
            assert await engines[0].wait_caught_up(60) and await engines[1].wait_caught_up(60)
            stops[0].set()
            await tasks[0]
            took_over = await until(lambda: len(engines[1].partitions) == 4, 60)
            assert took_over, sorted(engines[1].partitions)
            await asyncio.to_thread(load_topic, source, topic, 1000, partitions=4,
                                    create_topic=False, seed=11)
            assert await engines[1].wait_caught_up(60)
            return shares, sorted(engines[1].partitions), engines[1].stats().records
        finally:
            for stop in stops:
                stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    shares, last, records = asyncio.run(scenario())
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == last == [(topic, p) for p in range(4)]
    assert records >= 1000
    _assert_exact_copy(source, target_cluster, topic)


def _refusal(source, target, topic: str, group_id: str, protocol: str = "consumer") -> str:
    """Run an engine expected to stop on a group error; the error's text."""
    settings = _settings(group_id, **{"group.protocol": protocol})
    with pytest.raises(Exception) as caught:   # noqa: PT011 - the text is what is checked
        asyncio.run(run_until_caught_up(source, target, [topic], settings=settings,
                                        timeout_s=60))
    error = caught.value
    assert isinstance(getattr(error, "error", error), GroupMembershipError), repr(error)
    return str(error)


@pytest.mark.needs_real_kafka("tansu does not serve the KIP-848 consumer group protocol")
def test_a_group_id_held_by_a_classic_group_is_refused_with_what_to_do(
        kip848, target_cluster, unique_topic):
    source = kip848
    topic = unique_topic("cgp-classic")
    load_topic(source, topic, 100, partitions=2)
    create_target(target_cluster, topic, 2)
    group_id = group()
    consumer = Consumer({**source.client_config(), "group.id": group_id})
    consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    consumer.close()
    text = _refusal(source, target_cluster, topic, group_id)
    assert f"consumer group {group_id!r}" in text and "classic" in text
    assert "new group.id" in text, text
    assert _join_answer(source, group_id, topic).error_code != 0      # what the probe tells


def test_a_cluster_without_the_consumer_protocol_is_refused_with_what_to_do(
        source_cluster, target_cluster, unique_topic):
    """The session's source (tansu, or Kafka 3.7 with its default config) does not serve
    KIP-848: the engine stops at once with the broker versions that do, not a hang."""
    if _serves_kip_848(source_cluster):
        pytest.skip("this source cluster serves KIP-848 (e.g. Kafka 4): nothing to refuse")
    topic = unique_topic("cgp-none")
    load_topic(source_cluster, topic, 100, partitions=2)
    create_target(target_cluster, topic, 2)
    text = _refusal(source_cluster, target_cluster, topic, group())
    assert "group.protocol=consumer" in text and "Kafka 4.0" in text, text
    assert "group.coordinator.rebalance.protocols=classic,consumer" in text, text


# ---- group.protocol=auto (the default) ----

def _auto(group_id: str, **more) -> dict:
    settings = _settings(group_id, **more)
    del settings["group.protocol"]                 # the default: auto
    return settings


def _mirror_new_topic(source, target, name: str, records: int, partitions: int,
                      settings_of=_auto) -> tuple[str, str, Any, MirrorEngine]:
    """A loaded topic mirrored by one engine of a new group until caught up: (topic, group
    id, the engine's stats, the engine)."""
    topic = name
    load_topic(source, topic, records, partitions=partitions)
    create_target(target, topic, partitions)
    group_id = group()
    engines: list[MirrorEngine] = []
    stats = asyncio.run(run_until_caught_up(source, target, [topic],
                                            settings=settings_of(group_id), engine_out=engines))
    return topic, group_id, stats, engines[0]


def test_the_default_picks_the_protocol_the_source_cluster_serves(
        source_cluster, target_cluster, unique_topic):
    """The session's source: tansu (no ConsumerGroupHeartbeat API) and Kafka 3.7 with its default
    config (UNSUPPORTED_VERSION) go on with the classic protocol; a cluster serving KIP-848 is
    joined with it. Every record either way, and the commits are the group's."""
    expected = "consumer" if _serves_kip_848(source_cluster) else "classic"
    topic, group_id, stats, engine = _mirror_new_topic(
        source_cluster, target_cluster, unique_topic("cgp-auto"), 1200, 3)
    assert engine.membership.protocol == expected
    assert stats.records == 1200 and "assigned" in stats.startup and "subscribed" in stats.startup
    _assert_exact_copy(source_cluster, target_cluster, topic)
    assert sum(group_offsets(source_cluster, group_id, topic, range(3)).values()) == 1200


@pytest.mark.needs_real_kafka("tansu does not serve the KIP-848 consumer group protocol")
def test_the_default_joins_with_the_consumer_protocol_where_it_is_served(
        kip848, target_cluster, unique_topic):
    """Kafka with KIP-848 on: the default joins as a consumer-protocol member (no initial
    rebalance delay), and the group it made is a consumer-protocol group."""
    source = kip848
    topic, group_id, stats, engine = _mirror_new_topic(
        source, target_cluster, unique_topic("cgp-auto-848"), 2000, 4)
    assert engine.membership.protocol == "consumer"
    assert isinstance(engine.membership.current, ConsumerGroupMembership)
    assert stats.records == 2000
    _assert_exact_copy(source, target_cluster, topic)
    assert _join_answer(source, group_id, topic).error_code == 0


@pytest.mark.needs_real_kafka("tansu does not serve the KIP-848 consumer group protocol")
def test_the_default_keeps_a_classic_group_classic_and_resumes_from_its_commits(
        kip848, target_cluster, unique_topic):
    """A group an earlier classic run committed (an upgrade from before auto, on a broker that
    serves KIP-848): the heartbeat is refused with GROUP_ID_NOT_FOUND, the engine goes on with
    the classic protocol and mirrors only what came after those commits."""
    source = kip848
    topic, group_id, first, _ = _mirror_new_topic(
        source, target_cluster, unique_topic("cgp-auto-classic"), 1500, 3,
        settings_of=lambda g: _settings(g, **{"group.protocol": "classic"}))
    assert first.records == 1500
    load_topic(source, topic, 600, partitions=3, create_topic=False, seed=5)
    engines: list[MirrorEngine] = []
    second = asyncio.run(run_until_caught_up(source, target_cluster, [topic],
                                             settings=_auto(group_id), engine_out=engines))
    assert engines[0].membership.protocol == "classic"
    assert second.records == 600
    _assert_exact_copy(source, target_cluster, topic)
    assert sum(group_offsets(source, group_id, topic, range(3)).values()) == 2100


@pytest.mark.needs_real_kafka("tansu does not serve the KIP-848 consumer group protocol")
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_a_member_that_lost_its_session_gets_its_partitions_back_at_once(
        kip848, target_cluster, unique_topic, static, caplog):
    """A member that heard nothing from the coordinator for session.timeout.ms drops its
    partitions without committing (simulated here: ``_lose``, what that check calls). It joins
    again under the same member id, so the coordinator hands the partitions straight back; under
    a new id they stayed with the old, silent member until the broker's
    group.consumer.session.timeout.ms (45 s) expired it. A static member (group.instance.id)
    first leaves with epoch -2: Kafka 3.7 refused its rejoin (UNRELEASED_INSTANCE_ID) and the
    engine stopped. Every record still arrives once, and no warning claims that what was mirrored
    after the last commit is mirrored again (resume from the target skips it)."""
    source = kip848
    topic = unique_topic("cgp-lost")
    load_topic(source, topic, 2000, partitions=4)
    create_target(target_cluster, topic, 4)
    group_id = group()
    caplog.set_level(logging.INFO, logger="shallowmirror.engine")
    # No periodic commit before the loss: the group still holds the first start's offsets, so
    # the partitions come back below what was mirrored, every time.
    settings = _auto(group_id, **{"offset.commit.interval.ms": 600_000},
                     **({"group.instance.id": f"{group_id}-1"} if static else {}))

    async def scenario() -> float:
        engine = MirrorEngine(source.client_config(), target_cluster.client_config(),
                              topics=[topic], settings=settings)
        stop = asyncio.Event()
        task = asyncio.create_task(engine.run(stop))
        try:
            assert await until(lambda: len(engine.partitions) == 4, 60)
            assert await engine.wait_caught_up(60)
            member = engine.membership.current
            member_id = member.member_id
            before = dict(engine.partitions)
            lost_at = asyncio.get_running_loop().time()
            member._lose()
            # Dropped and handed back: each partition a new ownership (both can happen between
            # two looks at engine.partitions on a busy machine).
            assert await until(lambda: len(engine.partitions) == 4 and all(
                engine.partitions[tp] is not sp for tp, sp in before.items()), 15), \
                engine.partitions
            back_s = asyncio.get_running_loop().time() - lost_at
            assert member.epoch > 0 and (member.member_id != member_id) == static
            await asyncio.to_thread(load_topic, source, topic, 500, partitions=4,
                                    create_topic=False, seed=13)
            assert await engine.wait_caught_up(60)
            return back_s
        finally:
            stop.set()
            await task

    back_s = asyncio.run(scenario())
    assert back_s < 15
    _assert_exact_copy(source, target_cluster, topic)
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [m for level, m in said if level >= logging.WARNING and "mirrored again" in m] == []
    assert sum("resume from the target skips what the target already holds" in m
               for _, m in said) == 4, said


@pytest.mark.needs_real_kafka("tansu does not serve the KIP-848 consumer group protocol")
def test_exactly_once_through_the_consumer_protocol(kip848, target_cluster, unique_topic):
    """The default on a KIP-848 source with exactly-once on: partitions come from the consumer
    protocol, offsets go to the target's group in the mirror's transactions, and a second run
    resumes from those (only the new records), every record once in committed transactions."""
    from shallowmirror.testing.topics import assert_same_records

    eos = {"exactly.once": "true", "transaction.interval.ms": "200"}
    source = kip848
    topic, group_id, first, engine = _mirror_new_topic(
        source, target_cluster, unique_topic("cgp-eos"), 1800, 3,
        settings_of=lambda g: _auto(g, **eos))
    assert engine.membership.protocol == "consumer" and first.records == 1800
    load_topic(source, topic, 600, partitions=3, create_topic=False, seed=9)
    second = asyncio.run(run_until_caught_up(source, target_cluster, [topic],
                                             settings=_auto(group_id, **eos)))
    assert second.records == 600
    assert_same_records(read_topic(source, topic),
                        read_topic(target_cluster, topic, isolation_level="read_committed"))
