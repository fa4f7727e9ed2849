"""Source-side OFFSET_OUT_OF_RANGE, which a real (embedded) broker cannot be made to produce below
its log start: a SCRIPTED source (shallowmirror/testing/fake_cluster.py) wraps the real source's
connections and plays retention deleting offsets 0..9 right before the engine's first Fetch.
The target is the real target cluster."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from shallowmirror.engine import MirrorEngine
from shallowmirror.testing.fake_cluster import scripted_source_cluster, write_source_batches
from shallowmirror.testing.topics import read_topic
from shallowmirror.testing.workload import Workload, create_topic
from tests.map_rows import assert_map_holds

pytestmark = pytest.mark.integration


def test_offset_out_of_range_applies_reset_and_logs_the_skipped_range(
        source_cluster, target_cluster, unique_topic, caplog):
    topic = unique_topic("oor")
    scripted = scripted_source_cluster(log_start_offset=10)
    create_topic(target_cluster.client_config(), Workload(topic=topic, partitions=1))

    async def main():
        await write_source_batches(source_cluster, topic, 1, 6)             # offsets 0..29
        engine = MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                              topics=[topic], settings={
                                  "partition.assignment": "all", "fetch.max.wait.ms": 100,
                                  "group.id": f"g-{uuid.uuid4().hex[:8]}",
                                  "auto.offset.reset": "earliest", "retry.backoff.ms": 10},
                              cluster_factory=scripted)
        stop = asyncio.Event()
        task = asyncio.create_task(engine.run(stop))
        try:
            while not engine.ready:
                await asyncio.sleep(0.02)
            assert await engine.wait_caught_up(30), engine.stats()
        finally:
            stop.set()
            await task
        return engine

    with caplog.at_level(logging.WARNING, logger="shallowmirror.engine.source"):
        engine = asyncio.run(main())
    source_cluster_obj = next(c for c in scripted.instances if c.scripted)
    assert source_cluster_obj.out_of_range_answers == 1
    stats = engine.stats().partitions[(topic, 0)]
    assert stats.position == 30 and stats.records == 20 and stats.error is None
    # The reset moved to the new log start; offsets 0..9 are skipped, and the log says so.
    skipped = [r.getMessage() for r in caplog.records if "OFFSET_OUT_OF_RANGE" in r.getMessage()]
    assert len(skipped) == 1
    assert "skipping 0..9 (10 offsets, auto.offset.reset=earliest)" in skipped[0]
    assert f"{topic}-0" in skipped[0]
    assert_map_holds(engine.offset_map(topic, 0), [(10, 5, 0), (15, 5, 5), (20, 5, 10),
                                                   (25, 5, 15)])
    source = read_topic(source_cluster.client_config(), topic)[0]
    target = read_topic(target_cluster.client_config(), topic)[0]
    assert [r.value for r in target] == [r.value for r in source[10:]]
