"""Remote topic creation, growth and config sync against real brokers (no engine involved)."""

import time
import uuid

import pytest
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from shallowmirror.mirror.clients import admin_client
from shallowmirror.mirror.config import resolve_mm2
from shallowmirror.mirror.topic_sync import TopicSync, explicit_configs
from shallowmirror.testing.topics import wait_for_partitions

pytestmark = pytest.mark.integration


def _flow(source, target, **extra):
    props = {"clusters": "A, B", "A.bootstrap.servers": source.bootstrap,
             "B.bootstrap.servers": target.bootstrap, "A->B.enabled": "true", **extra}
    return resolve_mm2(props).flows[0]


def _sync(source, target, **extra):
    flow = _flow(source, target, **extra)
    return TopicSync(flow, admin_client(flow.source_admin, what="A admin"),
                     admin_client(flow.target_admin, what="B admin"))


def _refresh(sync, prefix: str) -> list[str]:
    """``sync.refresh()``, keeping this test's topics: MirrorMaker 2 (and so TopicSync) always
    replicates ``heartbeats`` topics, whatever the filter, and the session's clusters are shared
    (other tests and MirrorMaker 2 in the bench tests create them)."""
    return [topic for topic in sync.refresh() if topic.startswith(prefix)]


def _metadata_with(admin, topic: str, timeout_s: float = 15.0):
    """Metadata once ``topic`` shows in it: Kafka lists a just-created topic a moment later."""
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(timeout=10)
        if topic in md.topics or time.monotonic() > deadline:
            return md
        time.sleep(0.1)


def _create(admin, name, partitions, config=None):
    """Create a topic and return once Metadata lists it with leaders (Kafka lags a little)."""
    admin.create_topics([NewTopic(name, partitions, -1, config=config or {})])[name].result(15)
    wait_for_partitions(admin, name, partitions)


def _configs_once(sync, topic, key, value, timeout_s=15):
    """The target topic's explicit configs once ``key`` reads ``value`` (or at the timeout): Kafka
    applies an IncrementalAlterConfigs through its metadata log, so DescribeConfigs right after
    the call can still answer the old value."""
    deadline = time.monotonic() + timeout_s
    while True:
        configs = explicit_configs(sync.describe(sync.target_admin, topic))
        if configs.get(key) == value or time.monotonic() >= deadline:
            return configs
        time.sleep(0.1)


def test_creates_remote_topics_like_the_source_and_syncs_config_changes(
        source_cluster, target_cluster):
    prefix = f"ts{uuid.uuid4().hex[:6]}"
    sync = _sync(source_cluster, target_cluster, topics=f"{prefix}.*")
    _create(sync.source_admin, f"{prefix}-orders", 3,
            {"retention.ms": "3600000", "min.insync.replicas": "1", "cleanup.policy": "delete",
             "compression.type": "gzip"})
    _create(sync.source_admin, f"{prefix}-skipped.internal", 1)

    ready = _refresh(sync, prefix)
    assert ready == [f"{prefix}-orders"]
    remote = f"A.{prefix}-orders"
    md = _metadata_with(sync.target_admin, remote)
    assert len(md.topics[remote].partitions) == 3
    assert f"A.{prefix}-skipped.internal" not in md.topics
    configs = explicit_configs(sync.describe(sync.target_admin, remote))
    assert configs["retention.ms"] == "3600000"
    assert configs["compression.type"] == "producer"      # forced, never the source's gzip
    assert "min.insync.replicas" not in configs            # MM2's property filter

    # A config change on the source reaches the remote topic.
    resource = ConfigResource(ResourceType.TOPIC, f"{prefix}-orders", incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])
    sync.source_admin.incremental_alter_configs([resource])[resource].result(15)
    # Kafka applies the change through its metadata log: DescribeConfigs may show the old value
    # for a moment, and the mirror's periodic sync picks the change up on a later round.
    deadline = time.monotonic() + 15
    changed = sync.sync_configs()
    while changed == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        changed = sync.sync_configs()
    assert changed == 1
    assert _configs_once(sync, remote, "retention.ms", "7200000")["retention.ms"] == "7200000"
    assert sync.sync_configs() == 0                       # nothing left to change

    # A new topic appears at the next refresh.
    _create(sync.source_admin, f"{prefix}-payments", 2)
    assert _refresh(sync, prefix) == [f"{prefix}-orders", f"{prefix}-payments"]


@pytest.mark.tansu_workaround("tansu has no CreatePartitions, so a narrow remote topic stays")
def test_partition_count_that_cannot_be_matched_is_a_clear_error_for_that_topic_only(
        source_cluster, target_cluster, on_tansu):
    prefix = f"tp{uuid.uuid4().hex[:6]}"
    sync = _sync(source_cluster, target_cluster, topics=f"{prefix}.*")
    _create(sync.source_admin, f"{prefix}-wide", 4)
    _create(sync.source_admin, f"{prefix}-fine", 1)
    _create(sync.target_admin, f"A.{prefix}-wide", 2)      # made by hand, too narrow
    ready = _refresh(sync, prefix)
    if not on_tansu:
        # Kafka: widened to the source's count with CreatePartitions, as MirrorMaker 2 does.
        assert ready == [f"{prefix}-fine", f"{prefix}-wide"]
        assert wait_for_partitions(sync.target_admin, f"A.{prefix}-wide", 4), \
            "the remote topic was not widened to 4 partitions"
        return
    assert ready == [f"{prefix}-fine"]
    error = sync.errors()[f"{prefix}-wide"]
    assert "has 4 partitions but remote topic" in error and "has 2" in error


def test_identity_policy_keeps_names_and_forces_compression_on_existing_topics(
        source_cluster, target_cluster):
    name = f"ti{uuid.uuid4().hex[:6]}"
    sync = _sync(source_cluster, target_cluster, topics=name,
                 **{"replication.policy.class": "IdentityReplicationPolicy",
                    "sync.topic.configs.enabled": "false"})
    _create(sync.source_admin, name, 2, {"retention.ms": "1000000"})
    _create(sync.target_admin, name, 2, {"compression.type": "gzip"})
    assert _refresh(sync, name) == [name]
    sync.sync_configs()
    configs = _configs_once(sync, name, "compression.type", "producer")
    assert configs["compression.type"] == "producer"
    assert "retention.ms" not in configs                  # sync off: configs not copied


@pytest.mark.needs_real_kafka("tansu cannot add partitions (no CreatePartitions)")
def test_new_source_partitions_are_added_to_the_remote_topic(source_cluster, target_cluster):
    from confluent_kafka.admin import NewPartitions

    name = f"tg{uuid.uuid4().hex[:6]}"
    sync = _sync(source_cluster, target_cluster, topics=name)
    _create(sync.source_admin, name, 2)
    assert _refresh(sync, name) == [name]
    sync.source_admin.create_partitions([NewPartitions(name, 5)])[name].result(15)
    # Kafka's Metadata shows the widened source a moment after CreatePartitions returns (under
    # CI load the sync round read 2 partitions and had nothing to widen), and the widened remote
    # topic a moment after the sync's own CreatePartitions.
    assert wait_for_partitions(sync.source_admin, name, 5), "the source was not widened to 5"
    assert _refresh(sync, name) == [name]
    assert wait_for_partitions(sync.target_admin, f"A.{name}", 5), \
        "the remote topic was not widened to 5 partitions"


def test_a_remote_topic_deleted_on_the_target_is_created_again_with_a_warning(
        source_cluster, target_cluster, caplog):
    name = f"tdel{uuid.uuid4().hex[:6]}"
    sync = _sync(source_cluster, target_cluster, topics=name)
    _create(sync.source_admin, name, 2)
    assert _refresh(sync, name) == [name]
    assert wait_for_partitions(sync.target_admin, f"A.{name}", 2)
    sync.target_admin.delete_topics([f"A.{name}"])[f"A.{name}"].result(15)
    deadline = time.monotonic() + 15
    while f"A.{name}" in sync.target_admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "the remote topic was not deleted"
        time.sleep(0.1)
    with caplog.at_level("WARNING", logger="shallowmirror.mirror.topic_sync"):
        assert _refresh(sync, name) == [name]
    assert f"remote topic A.{name} is gone from B (deleted there?); created it again" \
        in caplog.text, caplog.text
    assert wait_for_partitions(sync.target_admin, f"A.{name}", 2)
