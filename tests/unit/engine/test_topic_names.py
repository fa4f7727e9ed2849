"""What a topic mapper returns is checked: a str that Kafka takes as a topic name."""

from __future__ import annotations

import pytest

from shallowmirror.engine.topic_names import TopicMapperError, legal_topic, mapped_topic


@pytest.mark.parametrize("name, legal", [
    ("orders", True), ("A.orders-v2_x", True), ("x" * 249, True), ("x" * 250, False),
    ("", False), (".", False), ("..", False), ("has space", False), ("a/b", False),
    ("ünïcode", False),
])
def test_kafkas_rule(name, legal):
    assert legal_topic(name) is legal


def test_a_mapper_result_that_is_no_topic_name_is_refused_naming_both():
    def to_int(topic: str) -> int:
        return 5

    with pytest.raises(TopicMapperError, match=r"topic_mapper '.*to_int' returned int 5 for "
                                               r"source topic orders: it must return"):
        mapped_topic(to_int, "orders")
    with pytest.raises(TopicMapperError, match=r"returned 'src orders' for source topic "
                                               r"orders: not a legal Kafka topic name"):
        mapped_topic(lambda t: f"src {t}", "orders")
    with pytest.raises(TopicMapperError, match="returned NoneType None"):
        mapped_topic(lambda t: None, "orders")
    assert mapped_topic(lambda t: f"src.{t}", "orders") == "src.orders"
    assert isinstance(TopicMapperError("x"), ValueError)     # a bad value, as the API raises


def test_a_mapper_that_raises_or_names_a_kafka_topic_is_refused_naming_it():
    def routes(topic: str) -> str:
        raise KeyError(f"no route for {topic}")

    with pytest.raises(TopicMapperError, match=r"topic_mapper '.*routes' raised KeyError: 'no "
                                               r"route for orders' for source topic orders") as info:
        mapped_topic(routes, "orders")
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(TopicMapperError, match="'__consumer_offsets' for source topic orders: "
                                               "that is one of Kafka's own topics"):
        mapped_topic(lambda t: "__consumer_offsets", "orders")


def test_a_topics_predicate_that_answers_a_string_or_raises_is_refused():
    """A predicate returning "no" (a true value) mirrored every topic of the cluster."""
    import re

    from shallowmirror.engine.discovery import topic_predicate

    says_no, _ = topic_predicate(lambda t: "no")
    with pytest.raises(TopicMapperError, match=r"returned str 'no' for source topic orders: it "
                                               r"must return True or False"):
        says_no("orders")
    broken, _ = topic_predicate(lambda t: 1 / 0)
    with pytest.raises(TopicMapperError, match="raised ZeroDivisionError"):
        broken("orders")
    matches, _ = topic_predicate(lambda t: re.match("ord", t))
    assert matches("orders") is True and matches("payments") is False
