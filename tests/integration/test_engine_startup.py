"""Start-up on real brokers: start positions come from one ListOffsets per leader (not one per
partition), the engine reports when each start-up phase was reached, and static membership
(``group.instance.id``) keeps the member in the group across a stop, which is what lets a restart
skip the rebalance (and Kafka's ``group.initial.rebalance.delay.ms``)."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka.admin import AdminClient
from engine_support import create_target, group, load_topic, run_until_caught_up
from kafka.protocol.consumer import ListOffsetsRequest
from test_mirror_cli import group_timings

from shallowmirror.engine.config import resolve_settings
from shallowmirror.engine.runtime import Runtime
from shallowmirror.engine.source import Sources
from shallowmirror.engine.startup import PHASES
from shallowmirror.net import Cluster

pytestmark = pytest.mark.integration


def _list_offsets_counted(cluster_config: dict, tps: list, timestamp: int):
    """``Sources.list_offsets`` on a real cluster, with every request it sends recorded."""

    async def scenario():
        runtime = Runtime(resolve_settings({"retry.backoff.ms": 10}), fail=lambda err: None)
        sources = Sources(runtime, {}, lambda batch: None, alias="source")
        cluster = Cluster(cluster_config, "source")
        await cluster.start()
        sent: list = []
        try:
            await cluster.refresh_metadata(sorted({t for t, _ in tps}))
            for node in {cluster.leader(*tp) for tp in tps}:
                conn = await cluster.connection(node)
                original = conn.request

                async def counting(req, *args, _original=original, **kwargs):
                    sent.append(req)
                    return await _original(req, *args, **kwargs)

                conn.request = counting
            sources.start(cluster)
            found = await sources.list_offsets(tps, timestamp)
        finally:
            await cluster.close()
        return found, sent

    return asyncio.run(scenario())


def test_start_positions_need_one_list_offsets_per_leader(source_cluster, unique_topic,
                                                           on_tansu):
    """Eleven partitions of two topics without committed offsets: one ListOffsets request to the
    (single) leader carries all of them, where one request per partition cost a round trip each
    before the first fetch."""
    first, second = unique_topic("lo-a"), unique_topic("lo-b")
    loaded = load_topic(source_cluster, first, 2000, partitions=8)
    load_topic(source_cluster, second, 300, partitions=3)
    tps = [(first, p) for p in range(8)] + [(second, p) for p in range(3)]

    earliest, sent = _list_offsets_counted(source_cluster.client_config(), tps, -2)
    assert earliest == dict.fromkeys(tps, 0)
    lists = [r for r in sent if r.API_KEY == ListOffsetsRequest.API_KEY]
    assert len(lists) == 1
    assert sorted((t.name, p.partition_index) for t in lists[0].topics
                  for p in t.partitions) == sorted(tps)

    latest, sent = _list_offsets_counted(source_cluster.client_config(), tps, -1)
    assert len([r for r in sent if r.API_KEY == ListOffsetsRequest.API_KEY]) == 1
    if not on_tansu:     # tansu answers "latest" with the last batch's base offset + 1
        assert sum(latest[(first, p)] for p in range(8)) == loaded.workload.records


@pytest.mark.parametrize("assignment", ["all", "group"])
def test_startup_phases_reported_in_order(source_cluster, target_cluster, unique_topic,
                                          assignment):
    topic = unique_topic("phases")
    load_topic(source_cluster, topic, 2000, partitions=4)
    create_target(target_cluster, topic, 4)
    settings = {"partition.assignment": assignment, **group_timings(source_cluster)}
    stats = asyncio.run(run_until_caught_up(source_cluster, target_cluster, [topic],
                                            settings=settings))
    assert stats.records == 2000
    expected = [p for p in PHASES if p != "target read"]      # resume.from.target: optional
    assert [p for p in stats.startup if p != "target read"] == expected
    seconds = list(stats.startup.values())
    assert seconds == sorted(seconds), stats.startup


def _members(cluster, group_id: str) -> list:
    admin = AdminClient(cluster.client_config())
    description = admin.describe_consumer_groups([group_id])[group_id].result(timeout=30)
    return list(description.members)


@pytest.mark.needs_real_kafka("tansu has no static membership (KIP-345)")
def test_static_member_stays_in_the_group_across_a_restart(source_cluster, target_cluster,
                                                           unique_topic):
    """With group.instance.id the stopped engine does not leave the group (so a restart within
    session.timeout.ms finds it Stable and gets its partitions back without a rebalance), and the
    restarted engine goes on from the committed offsets: nothing lost, nothing twice."""
    topic = unique_topic("static")
    load_topic(source_cluster, topic, 1000, partitions=2)
    create_target(target_cluster, topic, 2)
    group_id = group()
    settings = {"partition.assignment": "group", "group.id": group_id,
                "group.instance.id": f"{group_id}-a", "session.timeout.ms": 30000,
                "heartbeat.interval.ms": 1000}
    first = asyncio.run(run_until_caught_up(source_cluster, target_cluster, [topic],
                                            settings=settings))
    assert first.records == 1000
    members = _members(source_cluster, group_id)
    assert [m.group_instance_id for m in members] == [f"{group_id}-a"]

    load_topic(source_cluster, topic, 500, partitions=2, create_topic=False)
    second = asyncio.run(run_until_caught_up(source_cluster, target_cluster, [topic],
                                             settings=settings))
    assert second.records == 500
    assert "assigned" in second.startup


@pytest.mark.parametrize("unreachable", ["source", "target"])
def test_stop_during_start_up_ends_run_at_once(source_cluster, target_cluster, unique_topic,
                                               unreachable, caplog):
    """A stop while one cluster does not answer yet: ``run`` returned only when
    ``reconnect.deadline.ms`` (120 s) ran out, and then raised the connection error the caller
    no longer cared about. Now start-up is raced against the stop: run returns, nothing raised,
    nothing mirrored, and the log says so. The reachable cluster is real, so its side of
    start-up does happen."""
    from shallowmirror.engine import MirrorEngine
    from shallowmirror.testing.embedded import free_port

    topic = unique_topic("stop-start")
    dead = f"127.0.0.1:{free_port()}"
    source = dead if unreachable == "source" else source_cluster.bootstrap
    target = dead if unreachable == "target" else target_cluster.bootstrap

    async def scenario():
        engine = MirrorEngine({"bootstrap.servers": source}, {"bootstrap.servers": target},
                              topics=[topic], settings={"group.id": group()})
        stop = asyncio.Event()
        task = asyncio.create_task(engine.run(stop))
        await asyncio.sleep(1.5)              # several refused connects, retried
        assert not task.done() and not engine.ready
        stop.set()
        await asyncio.wait_for(task, 20)      # well under reconnect.deadline.ms
        return engine

    with caplog.at_level("INFO", logger="shallowmirror.engine.core"):
        engine = asyncio.run(scenario())
    assert not engine.ready
    assert engine.stats().records == 0
    said = [r.getMessage() for r in caplog.records if "stopped during start-up" in r.getMessage()]
    assert said and "nothing was mirrored" in said[0], caplog.text[-2000:]
    if unreachable == "target":            # the source answered: its phase is named
        assert "source metadata" in said[0], said
    else:
        assert "clusters not reached yet" in said[0], said
