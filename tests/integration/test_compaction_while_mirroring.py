"""Kafka's log cleaner compacting the source partition while the mirror fetches it.

A colleague saw the compacted-gaps test (test_offset_translation.py) once end with the target one
record short of the source, the cleaner still working. Here the cleaner is made to run all the
time (``log.cleaner.backoff.ms`` 50) while keys are overwritten and a slow mirror (3 KB fetches)
reads the partition, so fetches meet logs rewritten between two of them: batches re-packed with
offset gaps, batches emptied or gone, a fetch position inside a region the cleaner removed.

What a correct mirror of a log that compacts under it guarantees: every record still on the
source at the end was there whenever the mirror passed its offset, so it is on the target, in
order; and the target holds nothing the source never had. Records the cleaner removed before
they were fetched may be absent. The remote topic's config sync is off: with it the target
compacts on its own schedule (the source's ``cleanup.policy=compact`` and cleaner settings are
copied), and a record superseded on the target but not yet cleaned on the source is then
legitimately absent from the target - not what this test is about.
"""

from __future__ import annotations

import threading
import time

import pytest
from test_mirror_cli import mm2_properties, run_until_caught_up

from shallowmirror.mirror.config import load_mm2
from shallowmirror.testing.topics import read_topic

COMPACT = {"cleanup.policy": "compact", "segment.ms": "100", "segment.bytes": "20000",
           "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100",
           "min.compaction.lag.ms": "0", "max.compaction.lag.ms": "1000",
           "compression.type": "producer"}
MIRROR = {"A->B.enabled": "true", "isolation.level": "read_committed",
          "sync.topic.configs.enabled": "false",
          "max.partition.fetch.bytes": "3000", "fetch.max.bytes": "3000"}


class Overwriter:
    """Keys overwritten in rounds on one partition until stopped; values unique and ordered."""

    def __init__(self, cluster, topic: str) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.producer = Producer({**cluster.client_config(), "compression.type": "lz4",
                                  "linger.ms": 5})
        self.values: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for _ in range(100):
                n = len(self.values)
                # Every 20th key is never written again: it survives between cleaned ones.
                key = b"keep-%d" % n if n % 20 == 0 else b"key-%d" % (n % 50)
                value = b"v%08d" % n + b"." * 40
                self.values.append(value)
                self.producer.produce(self.topic, key=key, value=value, partition=0)
            self.producer.flush(30)
            time.sleep(0.12)            # past segment.ms: the next round rolls a segment

    def __enter__(self) -> Overwriter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def _is_subsequence(small: list, big: list) -> bool:
    it = iter(big)
    return all(any(item == other for other in it) for item in small)


@pytest.mark.needs_real_kafka("tansu has no log cleaner")
def test_every_record_still_on_a_source_cleaned_while_mirroring_is_on_the_target(
        start_broker, target_cluster, tmp_path, unique_topic):
    from confluent_kafka.admin import NewTopic

    from shallowmirror.mirror.clients import admin_client

    source = start_broker("cleaning", overrides={"log.cleaner.backoff.ms": "50"})
    topic = unique_topic("cleaning")
    admin = admin_client(source.client_config(), what="test admin")
    admin.create_topics([NewTopic(topic, 1, 1, config=COMPACT)])[topic].result(30)
    props = mm2_properties(tmp_path / "mm2.properties", source, target_cluster, **MIRROR,
                           topics=topic)
    with Overwriter(source, topic) as writer:
        time.sleep(8)                   # a log the cleaner has started on
        run_until_caught_up("mirror", str(props), timeout_s=120)
    run_until_caught_up("mirror", str(props), timeout_s=120)     # what came after the first run
    produced = writer.values
    remote = load_mm2(props).flows[0].remote_topic(topic)
    source_end = [r.value for r in read_topic(source, topic)[0]]
    copied = [r.value for r in read_topic(target_cluster, remote)[0]]
    assert len(source_end) < len(produced) // 2, "the cleaner did not compact the source"
    on_target = set(copied)
    lost = [value[:9] for value in source_end if value not in on_target]
    assert not lost, f"{len(lost)} records still on the source missing on the target: {lost[:10]}"
    assert _is_subsequence(source_end, copied)
    assert _is_subsequence(copied, produced), "the target holds records out of order or invented"
