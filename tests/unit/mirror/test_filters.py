"""Topic and config-property filters, as MM2's DefaultTopicFilter / DefaultConfigPropertyFilter."""

import re

import pytest

from shallowmirror.mirror.filters import (
    ConfigPropertyFilter,
    TopicFilter,
    compile_pattern_list,
    pattern_problem,
)


def test_default_topic_filter_matches_mm2_defaults():
    f = TopicFilter()
    assert f.should_replicate_topic("orders")
    for topic in ("__consumer_offsets", "x.internal", "x-internal", "orders.replica"):
        assert not f.should_replicate_topic(topic), topic


def test_patterns_match_the_whole_name():
    f = TopicFilter(("orders",), ())
    assert f.should_replicate_topic("orders")
    assert not f.should_replicate_topic("orders2")
    assert not f.should_replicate_topic("my-orders")


def test_names_and_regexes_in_one_list():
    f = TopicFilter(("orders", "pay.*"), ("payments-dlq",))
    assert f.should_replicate_topic("payments")
    assert not f.should_replicate_topic("payments-dlq")
    assert not f.should_replicate_topic("users")


def test_empty_include_replicates_nothing():
    assert not TopicFilter((), ()).should_replicate_topic("orders")


def test_bad_regex_is_named():
    with pytest.raises(re.error, match="ord\\[ers"):
        compile_pattern_list(["ok", "ord[ers"])
    assert "ord[ers" in pattern_problem(["ord[ers"])
    assert pattern_problem([".*"]) is None


def test_config_property_filter_defaults_and_forced_compression():
    f = ConfigPropertyFilter()
    source = {"retention.ms": "1000", "min.insync.replicas": "2", "cleanup.policy": "compact",
              "leader.replication.throttled.replicas": "*", "compression.type": "gzip",
              "message.timestamp.type": "LogAppendTime"}
    assert f.target_configs(source) == {"retention.ms": "1000", "cleanup.policy": "compact",
                                        "compression.type": "producer"}


def test_a_topic_name_in_the_list_that_names_no_topic_is_said_with_the_closest():
    """'orders,Orders' mirrored orders and said nothing of 'Orders' (a wrong case, a typo):
    only a list that matches nothing at all was refused."""
    from shallowmirror.engine.topic_names import unmatched_names

    lines = unmatched_names(["orders", "Orders", "ordrs", "nosuch", "A.orders", "pay.*"],
                            ["orders", "payments", "A.orders"], "A")
    assert lines == [
        "topics entry 'Orders' names no topic on cluster A (it is mirrored once it is created); "
        "did you mean 'orders'?",
        "topics entry 'ordrs' names no topic on cluster A (it is mirrored once it is created); "
        "did you mean 'orders'?",
        "topics entry 'nosuch' names no topic on cluster A (it is mirrored once it is "
        "created)"]
