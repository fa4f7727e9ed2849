"""Replication policies and cycle detection, checked against MirrorMaker 2's behaviour."""

import pytest

from shallowmirror.mirror.filters import TopicFilter
from shallowmirror.mirror.policy import (
    DEFAULT_POLICY,
    IDENTITY_POLICY,
    DefaultReplicationPolicy,
    IdentityReplicationPolicy,
    is_cycle,
    is_internal_topic,
    make_policy,
    should_replicate_topic,
    upstream_clusters,
)


def test_default_policy_names_remote_topics_and_reads_them_back():
    p = DefaultReplicationPolicy()
    assert p.format_remote_topic("us-west", "orders") == "us-west.orders"
    assert p.topic_source("us-west.orders") == "us-west"
    assert p.upstream_topic("us-west.orders") == "orders"
    assert p.topic_source("orders") is None
    assert p.upstream_topic("orders") is None
    assert p.original_topic("B.A.orders") == "orders"
    # Java's split drops trailing empty strings: "a." is not a remote topic.
    assert p.topic_source("a.") is None


def test_custom_separator():
    p = DefaultReplicationPolicy(separator="_")
    assert p.format_remote_topic("A", "my.topic") == "A_my.topic"
    assert p.topic_source("A_my.topic") == "A"
    assert p.upstream_topic("A_my.topic") == "my.topic"
    with pytest.raises(ValueError):
        DefaultReplicationPolicy(separator="")


def test_upstream_chain_nearest_first():
    assert upstream_clusters(DefaultReplicationPolicy(), "C.B.A.orders") == ["C", "B", "A"]
    assert upstream_clusters(DefaultReplicationPolicy(), "orders") == []


@pytest.mark.parametrize("topic,target,cycle", [
    ("orders", "A", False),
    ("B.orders", "B", True),        # came from B: never back to B
    ("B.orders", "C", False),
    ("C.B.orders", "B", True),      # any hop counts, not only the nearest
    ("A.B.orders", "C", False),
])
def test_cycle_detection(topic, target, cycle):
    assert is_cycle(DefaultReplicationPolicy(), topic, target) is cycle


def test_identity_policy_keeps_names_and_cannot_see_cycles():
    p = IdentityReplicationPolicy(source_alias="A")
    assert p.format_remote_topic("A", "orders") == "orders"
    assert p.upstream_topic("orders") == "orders"
    assert p.topic_source("orders") == "A"
    assert not is_cycle(p, "orders", "B")
    # heartbeats keep the prefix, as in MM2
    assert p.format_remote_topic("A", "heartbeats") == "A.heartbeats"
    assert not p.detects_cycles


@pytest.mark.parametrize("topic", ["__consumer_offsets", "__transaction_state", ".hidden",
                                   "mm2-offset-syncs.B.internal", "connect-configs-internal",
                                   "A.checkpoints.internal"])
def test_internal_topics(topic):
    assert is_internal_topic(topic)


def test_should_replicate_combines_filter_internal_and_cycle():
    p, f = DefaultReplicationPolicy(), TopicFilter(("orders", "B\\..*"), ())
    assert should_replicate_topic(p, "orders", "B", f)
    assert not should_replicate_topic(p, "payments", "B", f)          # filter
    assert not should_replicate_topic(p, "B.orders", "B", f)          # cycle
    assert should_replicate_topic(p, "B.orders", "C", f)
    assert not should_replicate_topic(p, "__consumer_offsets", "B", TopicFilter((".*",), ()))
    # heartbeats are replicated even when the filter does not name them
    assert should_replicate_topic(p, "heartbeats", "B", f)
    assert not should_replicate_topic(p, "heartbeats", "B", f, heartbeats_replication=False)


def test_make_policy_accepts_java_and_short_names():
    assert make_policy(DEFAULT_POLICY).class_name == DEFAULT_POLICY
    assert make_policy("IdentityReplicationPolicy").class_name == IDENTITY_POLICY
    with pytest.raises(ValueError, match="unknown replication.policy.class"):
        make_policy("com.example.MyPolicy")
