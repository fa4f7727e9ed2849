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
    return admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader


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
