"""The engine's hook points on real brokers: every forwarded batch is reported once with its source
and target ranges (matching the offset map and the target), commits report the positions they
wrote, ownership changes report the partitions; a hook that raises fails the engine by name."""

from __future__ import annotations

import asyncio

import pytest
from engine_support import caught_up, create_target, group, load_topic

from shallowmirror.engine import MirrorEngine
from shallowmirror.engine.hooks import BatchAck, HookError
from tests.map_rows import assert_map_holds

pytestmark = pytest.mark.integration

SETTINGS = {"partition.assignment": "all", "fetch.max.wait.ms": 100, "retry.backoff.ms": 10,
            "retry.backoff.max.ms": 50}


def _engine(source_cluster, target_cluster, topics: list[str], **settings) -> MirrorEngine:
    return MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                        topics=topics, settings={**SETTINGS, "group.id": group(), **settings})


def _contiguous(acks: list[BatchAck], end: int) -> None:
    """Source ranges tile [0, end) in order; target ranges tile [0, ...) of a fresh topic."""
    assert [a.source_base for a in acks] == [0] + [a.source_next for a in acks[:-1]]
    assert acks[-1].source_next == end
    assert [a.target_base for a in acks] == [0] + [a.target_next for a in acks[:-1]]
    assert all(a.record_count == a.source_next - a.source_base for a in acks)


def test_hooks_report_acks_commits_and_ownership(source_cluster, target_cluster, unique_topic):
    first, second = unique_topic("hook-a"), unique_topic("hook-b")
    load_topic(source_cluster, first, 3000, partitions=2)
    load_topic(source_cluster, second, 500, partitions=1)
    create_target(target_cluster, first, 2)
    create_target(target_cluster, second, 1)
    engine = _engine(source_cluster, target_cluster, [first],
                     **{"offset.commit.interval.ms": 600_000})   # only the commits made here
    acks: list[BatchAck] = []
    commits: list[dict] = []
    assigned: list[list] = []
    revoked: list[list] = []
    engine.hooks.batch_acknowledged.add(acks.append)
    engine.hooks.offsets_committed.add(lambda offsets: commits.append(dict(offsets)))
    engine.hooks.partitions_assigned.add(assigned.append)
    engine.hooks.partitions_revoked.add(revoked.append)

    async def scenario() -> dict:
        async with caught_up(engine):
            ends = {tp: p.position for tp, p in engine.stats().partitions.items()}
            await engine.commit_now()
            engine.set_topics([second])         # first's partitions revoked, second's assigned
            while not (revoked and (second, 0) in engine.partitions):
                await asyncio.sleep(0.05)
            assert await engine.wait_caught_up(60), engine.stats()
            ends[(second, 0)] = engine.stats().partitions[(second, 0)].position
        return ends

    ends = asyncio.run(scenario())
    assert assigned == [[(first, 0), (first, 1)], [(second, 0)]]
    # The stop gives up what is still owned, as a consumer's close does (it said nothing).
    assert revoked == [[(first, 0), (first, 1)], [(second, 0)]]
    for (topic, partition), end in ends.items():
        mine = [a for a in acks if (a.source_topic, a.source_partition) == (topic, partition)]
        assert {(a.target_topic, a.target_partition) for a in mine} == {(topic, partition)}
        _contiguous(mine, end)
        assert_map_holds(engine.offset_map(topic, partition),
                         [(a.source_base, a.record_count, a.target_base) for a in mine])
    assert sum(a.record_count for a in acks) == 3500
    assert commits[0] == {(first, 0): ends[(first, 0)], (first, 1): ends[(first, 1)]}
    assert commits[-1] == {(second, 0): ends[(second, 0)]}      # the final commit


def test_a_hook_that_raises_fails_the_engine(source_cluster, target_cluster, unique_topic):
    topic = unique_topic("hook-fail")
    load_topic(source_cluster, topic, 200, partitions=1)
    create_target(target_cluster, topic, 1)
    engine = _engine(source_cluster, target_cluster, [topic])

    def broken(ack: BatchAck) -> None:
        raise ValueError("checkpoint store unavailable")

    engine.hooks.batch_acknowledged.add(broken)
    # The HookError itself, as the hooks' documentation says: it was an EngineTaskError that
    # blamed "produce request to target broker ...", the work the callback interrupted.
    with pytest.raises(HookError) as caught:
        asyncio.run(asyncio.wait_for(engine.run(asyncio.Event()), 60))
    assert isinstance(caught.value.__cause__, ValueError)
    text = str(caught.value)
    assert "batch acknowledged hook" in text and "broken" in text
    assert "checkpoint store unavailable" in text
    assert "produce request" not in text
    # The batch the hook was told of counts in the stats as in the committed position.
    stats = engine.stats().partitions[(topic, 0)]
    assert stats.position > 0 and stats.records == stats.position, stats


@pytest.mark.needs_real_kafka("tansu 0.6 answers a Produce to a deleted topic with success, so "
                              "the target never says the partition is unknown")
def test_target_partition_unknown_reports_a_deleted_target_topic(source_cluster, target_cluster,
                                                                 unique_topic):
    """The target topic is deleted under a running engine: the hook names each target partition
    once, and an embedder that re-creates the topic then sees the next records land there (the
    batches waited; none was dropped or the partition stopped)."""
    import time

    from confluent_kafka.admin import AdminClient
    from engine_support import RunningEngine, wait_until

    from shallowmirror.testing.topics import read_topic
    from shallowmirror.testing.workload import Workload, create_topic

    topic = unique_topic("gone")
    load_topic(source_cluster, topic, 400, partitions=2)
    create_target(target_cluster, topic, 2)
    admin = AdminClient(target_cluster.client_config())
    unknown: list = []
    settings = {**SETTINGS, "retry.backoff.max.ms": 1000, "metadata.max.age.ms": 300_000}
    with RunningEngine(source_cluster, target_cluster, [topic], settings) as running:
        running.engine.hooks.target_partition_unknown.add(unknown.append)
        wait_until(lambda: running.stats().records == 400, 60, "the first 400 copies", running)
        admin.delete_topics([topic])[topic].result(15)
        wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, 30, "the deletion")
        load_topic(source_cluster, topic, 300, partitions=2, create_topic=False, seed=9)
        wait_until(lambda: sorted(unknown) == [(topic, 0), (topic, 1)], 30,
                   "the hook for both target partitions", running)
        create_topic(target_cluster.client_config(), Workload(topic=topic, partitions=2))
        wait_until(lambda: running.stats().records == 700, 60, "the 300 later copies", running)
        time.sleep(0.5)
        stats = running.stats()
    assert sorted(unknown) == [(topic, 0), (topic, 1)]          # once per partition
    assert not [p.error for p in stats.partitions.values() if p.error]
    copies = read_topic(target_cluster.client_config(), topic)
    assert sum(len(v) for v in copies.values()) == 300
