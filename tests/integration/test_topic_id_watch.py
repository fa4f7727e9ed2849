"""``mirror.topic_ids.TopicIdWatch``: the deep path's way of seeing a source topic deleted and
created again (librdkafka's consumer keeps no topic ids). Looks are driven by hand here; the
thread only repeats them."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import NewTopic
from engine_support import wait_until

from shallowmirror.mirror.clients import admin_client
from shallowmirror.mirror.topic_ids import TopicIdWatch

pytestmark = pytest.mark.integration


def _recreate(admin, topic: str, *, gone=None) -> None:
    admin.delete_topics([topic], operation_timeout=30)[topic].result(30)
    wait_until(lambda: topic not in admin.list_topics(timeout=10).topics, 30, "topic gone")
    if gone is not None:
        gone()
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    wait_until(lambda: topic in admin.list_topics(timeout=10).topics, 30, "topic back")


def test_a_topic_created_again_is_reported_once_with_its_old_and_new_id(source_cluster,
                                                                          unique_topic):
    topic, other = unique_topic("again"), unique_topic("stays")
    admin = admin_client(source_cluster.client_config(), what="test")
    for name in (topic, other):
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    watch = TopicIdWatch(source_cluster.client_config(), lambda: [topic, other],
                         interval_s=3600, what="test")
    watch.look(admin)
    watch.look(admin)
    assert watch.take_changes() == {}, "the same ids twice are no change"
    first_id = watch.topic_id(topic)

    # Seen gone in between: the change says since when.
    _recreate(admin, topic, gone=lambda: watch.look(admin))
    watch.look(admin)
    (name, change), = watch.take_changes().items()
    assert name == topic and change.old == first_id and change.new == watch.topic_id(topic)
    assert change.old != change.new and change.missing_since is not None
    assert watch.take_changes() == {}, "reported once"

    # Deleted and created again between two looks: still seen, never seen gone.
    second_id = watch.topic_id(topic)
    _recreate(admin, topic)
    watch.look(admin)
    change = watch.take_changes()[topic]
    assert change.old == second_id and change.missing_since is None


def test_the_thread_keeps_looking_and_stops(source_cluster, unique_topic):
    topic = unique_topic("watched")
    admin = admin_client(source_cluster.client_config(), what="test")
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    watch = TopicIdWatch(source_cluster.client_config(), lambda: [topic], interval_s=0.2,
                         what="test")
    watch.start()
    try:
        wait_until(lambda: watch.topic_id(topic) is not None, 10, "the first look")
        _recreate(admin, topic)
        wait_until(lambda: topic in watch.take_changes(), 10, "the watch thread to see it")
    finally:
        watch.stop()
    assert watch._thread is not None and not watch._thread.is_alive()
