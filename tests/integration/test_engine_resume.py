"""Exact resume refuses a target partition it did not write as recorded: foreign records written
to the target between two runs, or a target topic re-created (truncated). The partition stops
with an error naming both clusters, topic, partition and offsets; the others go on; a restart
refuses it again (the stored pair is kept, not overwritten)."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from engine_support import create_target, group, load_topic, run_until, run_until_caught_up

from shallowmirror.testing.topics import read_topic

pytestmark = [pytest.mark.integration,
              pytest.mark.needs_real_kafka("tansu 0.6 keeps no offset-commit metadata (OffsetFetch "
                                           "answers it empty), so there is no stored target "
                                           "position to check against")]


def _write_foreign(cluster, topic: str, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(count):
        producer.produce(topic, value=b"not from the mirror %d" % i, partition=partition)
    assert producer.flush(30) == 0


def _second_run(source_cluster, target_cluster, topic: str, settings: dict):
    """Run until every partition is stopped or caught up."""
    def settled(p) -> bool:
        return p is not None and (p.error is not None or
                                  (p.high_watermark >= 0 and p.position >= p.high_watermark))

    def done(stats) -> bool:
        return all(settled(stats.partitions.get((topic, p))) for p in (0, 1))

    return run_until(source_cluster, target_cluster, [topic], settings, done)


def _mirror_once(source_cluster, target_cluster, topic: str, records: int,
                 codec: str) -> tuple[dict, dict[int, int]]:
    """Load and mirror ``topic`` (2 partitions) until caught up; (settings, records per target
    partition)."""
    load_topic(source_cluster, topic, records, codec=codec, partitions=2)
    create_target(target_cluster, topic, partitions=2)
    settings = {"group.id": group(), "fetch.max.wait.ms": 100}
    asyncio.run(run_until_caught_up(source_cluster, target_cluster, [topic], settings=settings))
    target = read_topic(target_cluster.client_config(), topic)
    return settings, {p: len(rs) for p, rs in target.items()}


def test_resume_refuses_a_target_partition_written_by_someone_else(
        source_cluster, target_cluster, unique_topic):
    topic = unique_topic("foreign")
    settings, mirrored = _mirror_once(source_cluster, target_cluster, topic, 4_000, "zstd")
    _write_foreign(target_cluster, topic, 0, 3)
    load_topic(source_cluster, topic, 2_000, codec="zstd", partitions=2, create_topic=False,
               seed=5)

    for _ in range(2):              # refused again after a restart: the stored pair is kept
        stats = _second_run(source_cluster, target_cluster, topic, settings)
        error = stats.partitions[(topic, 0)].error
        assert error is not None, "partition 0 was not stopped"
        assert "resume refused" in error
        assert f"{topic}-0 of source cluster source" in error
        assert f"target batch at offset {mirrored[0]} is not the mirror's copy" in error
        assert f"cluster target, topic-partition {topic}-0, offset {mirrored[0]}" in error
        assert "resume.from.target=false" in error
        print(f"\n{error}")
        assert stats.partitions[(topic, 1)].error is None

    target = read_topic(target_cluster.client_config(), topic)
    source = read_topic(source_cluster.client_config(), topic)
    assert len(target[0]) == mirrored[0] + 3, "records of partition 0 forwarded after refusal"
    assert [r.value for r in target[1]] == [r.value for r in source[1]]

    # The operator's way out: at-least-once from the committed offset.
    stats = _second_run(source_cluster, target_cluster, topic,
                        {**settings, "resume.from.target": "false"})
    assert stats.partitions[(topic, 0)].error is None
    target = read_topic(target_cluster.client_config(), topic)
    assert [r.value for r in target[0][mirrored[0] + 3:]] == \
        [r.value for r in source[0][mirrored[0]:]]


def test_resume_refuses_a_truncated_target(source_cluster, target_cluster, unique_topic):
    topic = unique_topic("recreated")
    settings, mirrored = _mirror_once(source_cluster, target_cluster, topic, 3_000, "lz4")
    admin = AdminClient({"bootstrap.servers": target_cluster.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    for _ in range(100):            # deletion completes a moment after the answer
        try:
            create_target(target_cluster, topic, partitions=2)
            break
        except Exception:  # noqa: BLE001 - TOPIC_ALREADY_EXISTS while being deleted
            asyncio.run(asyncio.sleep(0.2))
    stats = _second_run(source_cluster, target_cluster, topic, settings)
    for p in (0, 1):
        error = stats.partitions[(topic, p)].error
        assert error is not None and "resume refused" in error, error
        assert f"no longer holds offset {mirrored[p]}" in error
