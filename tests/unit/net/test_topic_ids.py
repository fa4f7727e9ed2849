"""A topic deleted and created again under the same name is told apart by its topic id
(Metadata v10+): ``Cluster`` remembers each topic's last id, across answers that lack the topic,
and tells its listeners when one changes."""

from __future__ import annotations

import uuid

from kafka.protocol.metadata import MetadataResponse

from shallowmirror.net.cluster import Cluster

Topic = MetadataResponse.MetadataResponseTopic
Partition = Topic.MetadataResponsePartition
Broker = MetadataResponse.MetadataResponseBroker
UNKNOWN_TOPIC_OR_PARTITION = 3


def _answer(*topics: tuple[str, uuid.UUID, int]) -> MetadataResponse:
    """A Metadata v12 answer with one broker and one partition per (name, id, error) topic."""
    return MetadataResponse(
        version=12, throttle_time_ms=0, cluster_id="c", controller_id=1,
        brokers=[Broker(node_id=1, host="127.0.0.1", port=9092, rack=None)],
        topics=[Topic(error_code=error, name=name, topic_id=tid, is_internal=False,
                      partitions=[] if error else [Partition(
                          error_code=0, partition_index=0, leader_id=1, leader_epoch=0,
                          replica_nodes=[1], isr_nodes=[1], offline_replicas=[])])
                for name, tid, error in topics])


def _cluster() -> tuple[Cluster, list[tuple[str, str, str]]]:
    cluster = Cluster({"bootstrap.servers": "127.0.0.1:9092"}, "A")
    seen: list[tuple[str, str, str]] = []
    cluster.topic_recreated_listeners.append(lambda *change: seen.append(change))
    return cluster, seen


def test_a_new_id_under_the_same_name_is_reported_once():
    cluster, seen = _cluster()
    old, new = uuid.uuid4(), uuid.uuid4()
    cluster._merge(_answer(("orders", old, 0)), ["orders"])
    cluster._merge(_answer(("orders", old, 0)), ["orders"])
    assert cluster.topic_id("orders") == str(old) and seen == []
    cluster._merge(_answer(("orders", new, 0)), None)
    assert seen == [("orders", str(old), str(new))]
    assert cluster.metadata.topics["orders"].topic_id == str(new)
    cluster._merge(_answer(("orders", new, 0)), None)
    assert len(seen) == 1


def test_the_old_id_is_kept_while_the_topic_is_missing():
    """The answers between deletion and re-creation (the topic unknown, its id all zeros, or
    the topic absent) do not erase the old id: the re-created topic is still recognised."""
    cluster, seen = _cluster()
    old, new = uuid.uuid4(), uuid.uuid4()
    cluster._merge(_answer(("orders", old, 0)), ["orders"])
    cluster._merge(_answer(("orders", uuid.UUID(int=0), UNKNOWN_TOPIC_OR_PARTITION)),
                   ["orders"])
    assert cluster.metadata.topics["orders"].topic_id is None
    cluster._merge(_answer(), None)
    assert cluster.topic_id("orders") == str(old) and seen == []
    cluster._merge(_answer(("orders", new, 0)), ["orders"])
    assert seen == [("orders", str(old), str(new))]


def test_answers_without_ids_change_nothing():
    """Metadata before v10 has no topic ids: nothing to compare, nothing reported."""
    cluster, seen = _cluster()
    cluster._merge(_answer(("orders", None, 0)), ["orders"])
    cluster._merge(_answer(("orders", uuid.uuid4(), 0)), ["orders"])
    assert seen == [] and cluster.topic_id("orders") is not None
