"""``partition.assignment=all``: a process owns every partition without joining a group, so a
second one on the same group.id would mirror everything again. It is found at the next commit
(an offset this process did not commit) and the run stops with ``OtherCommitterError``."""

from __future__ import annotations

import asyncio
import threading

import pytest
from engine_support import create_target, group, load_topic

from shallowmirror.engine import MirrorEngine
from shallowmirror.engine.membership import OtherCommitterError

pytestmark = pytest.mark.integration

SETTINGS = {"partition.assignment": "all", "fetch.max.wait.ms": 100,
            "offset.commit.interval.ms": 300}


def test_a_second_process_on_the_same_group_with_all_is_found_and_stopped(
        source_cluster, target_cluster, unique_topic):
    """Two such mirrors each copied all 3,000 records (6,000 on the target), committed, and
    exited 0 without a word."""
    topic = unique_topic("all-twice")
    load_topic(source_cluster, topic, 3000, partitions=2)
    create_target(target_cluster, topic, 2)
    shared = {**SETTINGS, "group.id": group()}
    engines = [MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                            topics=[topic], settings=shared) for _ in range(2)]
    # Records keep coming, as in a real mirror: two engines that each commit only the end of
    # one backlog, at the same moment, commit the same offsets (nothing to tell them apart).
    feeding = threading.Event()

    def feed() -> None:
        for round_ in range(1, 200):
            if feeding.wait(0.3):
                return
            load_topic(source_cluster, topic, 100, partitions=2, create_topic=False,
                       seed=round_)

    async def scenario() -> list:
        stop = asyncio.Event()
        runs = [asyncio.ensure_future(engines[0].run(stop))]
        await asyncio.sleep(1.0)
        runs.append(asyncio.ensure_future(engines[1].run(stop)))
        await asyncio.wait(runs, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        await asyncio.wait(runs, timeout=60)
        return [r.exception() if r.done() and not r.cancelled() else None for r in runs]

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        errors = asyncio.run(scenario())
    finally:
        feeding.set()
        feeder.join(30)
    found = [e for e in errors if isinstance(e, OtherCommitterError)]
    assert found, errors
    text = str(found[0])
    assert f"another process commits offsets under group {shared['group.id']}" in text
    assert "partition.assignment=all" in text and "own group.id" in text


def test_one_process_with_all_restarted_is_not_taken_for_two(source_cluster, target_cluster,
                                                             unique_topic):
    """Its own earlier commits (the offsets found at the start) are its own."""
    topic = unique_topic("all-once")
    load_topic(source_cluster, topic, 2000, partitions=2)
    create_target(target_cluster, topic, 2)
    shared = {**SETTINGS, "group.id": group()}

    async def run_once(extra: int) -> None:
        if extra:
            load_topic(source_cluster, topic, extra, partitions=2, create_topic=False, seed=extra)
        engine = MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                              topics=[topic], settings=shared)
        stop = asyncio.Event()
        run = asyncio.ensure_future(engine.run(stop))
        assert await engine.wait_caught_up(60), engine.stats()
        await asyncio.sleep(1.0)                    # a few commit intervals
        stop.set()
        await run                                   # raises what stopped it

    asyncio.run(run_once(0))
    asyncio.run(run_once(500))
