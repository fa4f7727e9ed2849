"""The first batch of a partition under a producer identity goes alone.

Kafka accepts any first sequence from a producer it holds no state for (KIP-360; the fake target
models it). If a partition's first batch fails with a retriable error (NOT_LEADER_OR_FOLLOWER
right after a target topic is created, found on Kafka 3.7) while its next batches are already in
flight, the next one is written first and the records land out of order. The sink therefore
sends one batch per partition until the broker has acknowledged one under the current identity.
"""

from __future__ import annotations

import asyncio

import pytest
from test_engine_fake_target import _assert_stored_exactly, _caught_up, _mirror

from shallowmirror.testing.fake_cluster import (
    NOT_LEADER_OR_FOLLOWER,
    Attempt,
    FakeTargetCluster,
    write_source_batches,
)

pytestmark = pytest.mark.integration


def test_a_failed_first_batch_is_not_overtaken_by_the_next(source_cluster, unique_topic):
    topic = unique_topic("first")

    async def main():
        written = await write_source_batches(source_cluster, topic, 2, 8)
        failures = {"left": 1}

        def script(a: Attempt):
            if a.partition == 0 and a.base_sequence == 0 and failures["left"]:
                failures["left"] -= 1
                return NOT_LEADER_OR_FOLLOWER      # the leader the metadata named isn't yet
            return None

        async with FakeTargetCluster({topic: 2}, script=script) as fake:
            engine = await _mirror(source_cluster, fake, topic, _caught_up(topic, {0: 40, 1: 40}),
                                   **{"max.partition.fetch.bytes": 1 << 20})
            return written, fake, engine

    written, fake, engine = asyncio.run(main())
    _assert_stored_exactly(fake, topic, written)      # in source order, every batch once
    first = fake.attempts_for(topic, 0)
    assert first[0].error_code == NOT_LEADER_OR_FOLLOWER and first[0].base_sequence == 0
    # Nothing after the failed first batch was sent before it was written.
    sent_before_first_ok = next(i for i, a in enumerate(first) if a.error_code == 0)
    assert all(a.base_sequence == 0 for a in first[:sent_before_first_ok + 1])
    assert not engine.stats().stopped
