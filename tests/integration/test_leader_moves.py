"""Leaders that move on a two-broker source cluster (real Kafka: tansu runs a cluster as one
broker): a broker stopped for a rolling restart, and preferred leader election after it came
back. Records are compared on both sides, in order, per partition."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from engine_support import RunningEngine, create_target, wait_until

from shallowmirror.testing.topics import read_topic

pytestmark = pytest.mark.integration

#: Leaders go back to their preferred replica quickly once it is in sync again.
ELECTION = {"auto.leader.rebalance.enable": "true", "leader.imbalance.check.interval.seconds": "2",
            "leader.imbalance.per.broker.percentage": "0",
            "offsets.topic.replication.factor": "2"}


def _produce(cluster, topic: str, n: int, tag: str) -> None:
    p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5, "acks": "all",
                  "enable.idempotence": True})
    for partition in (0, 1):
        for i in range(n):
            p.produce(topic, value=f"{tag}-{i}".encode(), partition=partition)
    assert p.flush(30) == 0


def _leader(admin: AdminClient, topic: str, partition: int) -> int:
    """The partition's leader now (-1: none known, e.g. mid-restart)."""
    found = admin.list_topics(topic, timeout=10).topics.get(topic)
    part = found.partitions.get(partition) if found is not None else None
    return part.leader if part is not None else -1


def _fetched_from(running: RunningEngine, topic: str, partition: int) -> int | None:
    """The source broker whose fetch loop holds the partition now."""
    for node_id, source in list(running.engine.sources.by_node.items()):
        if (topic, partition) in source.partitions:
            return node_id
    return None


@pytest.mark.needs_real_kafka("tansu runs a cluster as one broker: no leader can move")
def test_source_partitions_follow_their_leader_through_a_rolling_restart(
        start_broker, add_broker, target_cluster, unique_topic):
    """Broker 2 leads partition 1 and is stopped (controlled shutdown: broker 1 leads at once).
    The partition used to wait on broker 2's fetch loop, retrying a connection to a broker gone
    from the metadata, until it came back; it is now fetched from broker 1 at once. Once broker
    2 is back and leads again (preferred leader election), the engine fetches from it again
    instead of staying on broker 1, now a follower that still answers Fetch v11+."""
    source = start_broker("leaders", overrides=ELECTION)
    second = add_broker(source)
    admin = AdminClient(source.client_config())
    wait_until(lambda: len(admin.list_topics(timeout=10).brokers) == 2, 60, "two brokers")
    topic = unique_topic("moving")
    admin.create_topics([NewTopic(topic, 2, replica_assignment=[[1, 2], [2, 1]])])[topic].result(30)
    wait_until(lambda: _leader(admin, topic, 1) == 2, 30, "broker 2 to lead partition 1")
    create_target(target_cluster, topic, 2)
    _produce(source, topic, 40, "before")

    def copies(partition: int) -> list[bytes]:
        got = read_topic(target_cluster.client_config(), topic)
        return [r.value for r in got.get(partition, [])]

    settings = {"metadata.max.age.ms": 1000, "retry.backoff.max.ms": 1000}
    with RunningEngine(source, target_cluster, [topic], settings) as running:
        wait_until(lambda: len(copies(1)) == 40 and len(copies(0)) == 40, 60,
                   "the first 40 copies of each partition", running)
        assert _fetched_from(running, topic, 1) == 2
        second.kill()                          # SIGTERM: a controlled shutdown
        wait_until(lambda: _leader(admin, topic, 1) == 1, 30, "broker 1 to lead partition 1")
        _produce(source, topic, 30, "during")
        # While broker 2 is down: the partition it led is mirrored from broker 1.
        wait_until(lambda: len(copies(1)) == 70, 30, "partition 1's records written while "
                   "its former leader is down", running)
        assert _fetched_from(running, topic, 1) == 1
        second.restart()
        wait_until(lambda: _leader(admin, topic, 1) == 2, 60, "broker 2 to lead again")
        wait_until(lambda: _fetched_from(running, topic, 1) == 2, 30,
                   "the engine to fetch partition 1 from broker 2 again", running)
        _produce(source, topic, 20, "after")
        wait_until(lambda: len(copies(1)) == 90 and len(copies(0)) == 90, 60,
                   "every copy", running)
        time.sleep(0.5)                          # anything extra (a duplicate) would show now
        stats = running.stats()
    want = ([f"before-{i}".encode() for i in range(40)] + [f"during-{i}".encode() for i in range(30)]
            + [f"after-{i}".encode() for i in range(20)])
    assert copies(0) == want and copies(1) == want
    assert not stats.stopped


class _Writer:
    """Writes "v-<i>" to partition 0 of a source topic from a thread, a few hundred records a
    second in small batches, until stopped."""

    def __init__(self, cluster, topic: str) -> None:
        import threading

        self.cluster, self.topic, self.written = cluster, topic, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        p = Producer({"bootstrap.servers": self.cluster.bootstrap, "linger.ms": 5,
                      "enable.idempotence": True})
        while not self._stop.is_set():
            for _ in range(20):
                p.produce(self.topic, value=f"v-{self.written}".encode(), partition=0)
                self.written += 1
            p.poll(0)
            time.sleep(0.05)
        assert p.flush(30) == 0

    def __enter__(self) -> _Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


class _Reading:
    """A cluster whose clients read its metadata every ``max_age_ms`` (new leaders seen soon)."""

    def __init__(self, cluster, max_age_ms: int) -> None:
        self.cluster, self.max_age_ms = cluster, max_age_ms

    def client_config(self) -> dict:
        return {**self.cluster.client_config(), "metadata.max.age.ms": str(self.max_age_ms)}


@pytest.mark.needs_real_kafka("tansu runs a cluster as one broker: no leader can move")
def test_target_batches_keep_their_order_when_the_leader_moves_back(
        source_cluster, start_broker, add_broker, unique_topic):
    """The target partition's preferred leader (broker 2) stops; broker 1 leads alone and, with
    min.insync.replicas=2, answers NOT_ENOUGH_REPLICAS, so batches pile up on its queue. When
    broker 2 is back and leads again, new batches used to be queued for broker 2 at once, ahead
    of the old ones still waiting for broker 1: one landed first, then OUT_OF_ORDER_SEQUENCE
    and a new producer identity let the rest in out of order. Every record must land once, in
    source order."""
    from shallowmirror.testing.workload import Workload, create_topic

    target = start_broker("ordered", overrides=ELECTION)
    second = add_broker(target)
    admin = AdminClient(target.client_config())
    wait_until(lambda: len(admin.list_topics(timeout=10).brokers) == 2, 60, "two brokers")
    topic = unique_topic("ordered")
    create_topic(source_cluster.client_config(), Workload(topic=topic, partitions=1))
    admin.create_topics([NewTopic(topic, 1, replica_assignment=[[2, 1]], config={
        "min.insync.replicas": "2", "compression.type": "producer"})])[topic].result(30)
    wait_until(lambda: _leader(admin, topic, 0) == 2, 30, "broker 2 to lead the target partition")

    def copies() -> list[bytes]:
        return [r.value for r in read_topic(target.client_config(), topic).get(0, [])]

    settings = {"metadata.max.age.ms": 1000, "retry.backoff.max.ms": 1000}
    with RunningEngine(source_cluster, _Reading(target, 500), [topic], settings) as running:
        with _Writer(source_cluster, topic) as writer:
            wait_until(lambda: running.stats().records >= 200, 60, "the first copies", running)
            second.kill()
            wait_until(lambda: _leader(admin, topic, 0) == 1, 30, "broker 1 to lead")
            time.sleep(3)                   # batches pile up behind NOT_ENOUGH_REPLICAS
            second.restart()
            wait_until(lambda: _leader(admin, topic, 0) == 2, 60, "broker 2 to lead again")
            time.sleep(3)                   # new batches come while the old ones wait
        wait_until(lambda: running.stats().records >= writer.written, 60, "every copy",
                   running)
        time.sleep(0.5)                     # anything extra (a duplicate) would show now
        stats = running.stats()
    got = copies()
    assert got == [f"v-{i}".encode() for i in range(writer.written)], (
        f"{len(got)} copies of {writer.written} records; first out of place at "
        f"{next((i for i, v in enumerate(got) if v != f'v-{i}'.encode()), None)}")
    assert stats.records == writer.written and not stats.stopped
