"""The deep path's runner (``mirror.deep.DeepFlowRunner``) driven directly, for states a whole
mirror reaches only by a race: here they are set up on purpose, against a real broker."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from engine_support import commit_offset, create_target, load_topic

from shallowmirror.mirror.deep import DeepFlowRunner
from shallowmirror.testing.topics import read_topic

pytestmark = pytest.mark.integration


async def _mirror_until_caught_up(runner: DeepFlowRunner, timeout_s: float = 60) -> None:
    stop = asyncio.Event()
    task = asyncio.ensure_future(runner.run(stop))
    deadline = time.monotonic() + timeout_s
    try:
        while not runner.caught_up():
            if task.done():
                task.result()
                raise AssertionError("the deep runner stopped before it caught up")
            if time.monotonic() > deadline:
                raise AssertionError(f"the deep runner did not catch up in {timeout_s:.0f}s: "
                                     f"{runner.stats()}")
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await task


@pytest.mark.parametrize("stale", [True, False], ids=["stale-commit", "own-commit"])
def test_an_offset_committed_for_the_deleted_topic_is_not_where_the_new_one_starts(
        source_cluster, target_cluster, unique_topic, stale):
    """The race CI saw: when a source topic vanishes, the revoke commits the old topic's offset;
    if the topic was already created again, that commit lands on the new topic, and the next
    assignment would start there, skipping the new topic's records below it. The runner
    remembers what it committed for the deleted topic (``_stale_commits``) and starts such a
    partition at auto.offset.reset instead. Any other committed offset is where it resumes."""
    topic = unique_topic("deep-stale")
    loaded = load_topic(source_cluster, topic, 100, partitions=1)
    create_target(target_cluster, topic, 1)
    group_id = f"deep-{uuid.uuid4().hex[:12]}"
    commit_offset(source_cluster, group_id, topic, 60)
    runner = DeepFlowRunner(flow="A->B", source_config=source_cluster.client_config(),
                            target_config=target_cluster.client_config(),
                            settings={"group.id": group_id, "offset.commit.interval.ms": 200},
                            topic_mapper=lambda name: name)
    if stale:
        runner._stale_commits[(topic, 0)] = 60
    runner.set_topics([topic])
    asyncio.run(_mirror_until_caught_up(runner))
    values = [r.value for r in loaded.records()[0]]
    got = [r.value for r in read_topic(target_cluster, topic).get(0, [])]
    assert got == (values if stale else values[60:])
