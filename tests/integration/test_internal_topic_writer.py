"""An internal topic's writer when its cluster goes away: what it could not write is reported as
soon as librdkafka says every broker is down, not after the flush timeout. The mirror's shutdown
waited the full 30 s for offset syncs bound for a lost source cluster, past its own graceful
timeout, and exited 1 (seen when the source died within a second of the first batch)."""

from __future__ import annotations

import logging
import time

import pytest

from shallowmirror.engine.hooks import BatchAck
from shallowmirror.replication.offset_syncs import OffsetSyncWriter

pytestmark = pytest.mark.integration


def _ack(topic: str, base: int, count: int, target_base: int) -> BatchAck:
    return BatchAck(topic, 0, base, base + count, count, f"A.{topic}", 0, target_base, None)


def test_offset_syncs_for_a_lost_cluster_are_reported_at_once(start_broker, unique_topic,
                                                               caplog) -> None:
    cluster = start_broker("syncs")
    topic = unique_topic("orders")
    writer = OffsetSyncWriter(cluster.client_config(), f"mm2-offset-syncs.{topic}.internal",
                              alias="A")
    writer.start()
    writer.on_batch_ack(_ack(topic, 0, 10, 0))               # a partition's first: an anchor
    writer.flush_ends()
    assert writer._writer.flush(30) == 0
    assert writer._writer.down_for_s() is None
    cluster.stop()
    writer.on_batch_ack(_ack(topic, 20, 10, 10))             # a gap: another anchor, queued
    caplog.set_level(logging.ERROR, logger="shallowmirror.replication.offset_syncs")
    started = time.monotonic()
    writer.close(timeout_s=120)
    took = time.monotonic() - started
    assert writer._writer.down_for_s() is not None
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("offset syncs not written to mm2-offset-syncs." in text
               and "the cluster has been unreachable for" in text for text in errors), errors
    # Liveness, not speed: the flush used to wait out its whole timeout for the lost cluster.
    assert took < 60, took
