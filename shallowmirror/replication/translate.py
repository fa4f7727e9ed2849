"""Exact consumer-group offset translation for one flow: the Python API behind checkpoints,
``shallowmirror offsets translate``, failover and failback (MM2's ``RemoteClusterUtils``
equivalent, computed from the offset-syncs topic instead of read from checkpoints).

    translate_offsets(flow, group)   group's committed offsets on the flow's source ->
                                     the offsets to commit on the target (remote topic names)
    translate_back(flow, group)      group's committed offsets on the target (remote topics) ->
                                     the offsets to commit on the source (failback)

Both read the group's offsets and the offset-syncs topic, blocking (run them in a thread from
async code). A partition with no sync yet (nothing mirrored) is returned with
``downstream=None``: never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shallowmirror.mirror.config import FlowConfig
from shallowmirror.replication.groups import Groups
from shallowmirror.replication.mm2_records import InternalTopics
from shallowmirror.replication.offset_syncs import load_sync_table
from shallowmirror.replication.translation import SyncTable


@dataclass(frozen=True)
class Translated:
    """One partition of a group: ``upstream`` on ``from_topic`` is ``downstream`` on
    ``to_topic`` (None: not translatable yet)."""

    group: str
    from_topic: str
    to_topic: str
    partition: int
    upstream: int
    downstream: int | None
    metadata: str = ""


def internal_topics(flow: FlowConfig) -> InternalTopics:
    return InternalTopics.from_policy(
        flow.policy, flow.settings.get("replication.policy.internal.topic.separator.enabled",
                                       True))


def offset_syncs_cluster(flow: FlowConfig) -> tuple[dict[str, Any], str]:
    """(admin client config, alias) of the cluster holding the flow's offset-syncs topic."""
    if flow.settings.get("offset-syncs.topic.location", "source") == "target":
        return dict(flow.target_admin), flow.target
    return dict(flow.source_admin), flow.source


def offset_syncs_topic(flow: FlowConfig) -> str:
    return internal_topics(flow).offset_syncs(flow.target)


def load_flow_syncs(flow: FlowConfig, *, timeout_s: float = 30.0) -> SyncTable:
    config, alias = offset_syncs_cluster(flow)
    return load_sync_table(config, offset_syncs_topic(flow), alias=alias, timeout_s=timeout_s)


def remote_topic_name(flow: FlowConfig, topic: str) -> str:
    """MM2's ``renameTopicPartition``: a topic that came from the target goes back to its
    original name, any other gets the remote name (``A.orders``)."""
    if flow.policy.detects_cycles and flow.policy.topic_source(topic) == flow.target:
        return flow.policy.original_topic(topic)
    return flow.remote_topic(topic)


def source_topic_name(flow: FlowConfig, remote_topic: str) -> str | None:
    """The source topic ``remote_topic`` on the target was mirrored from, or None."""
    if not flow.policy.detects_cycles:          # identity: the same name
        return remote_topic if flow.should_replicate(remote_topic) else None
    if flow.policy.topic_source(remote_topic) != flow.source:
        return None
    upstream = flow.policy.upstream_topic(remote_topic)
    return upstream if upstream is not None and flow.should_replicate(upstream) else None


def translate_offsets(flow: FlowConfig, group: str, *, table: SyncTable | None = None,
                      timeout_s: float = 30.0) -> list[Translated]:
    """The target offsets of ``group``'s committed source offsets, exactly, for every
    partition of a topic the flow mirrors."""
    committed = Groups(flow.source_admin, alias=flow.source, timeout_s=timeout_s) \
        .committed(group)
    wanted = [c for c in committed if flow.should_replicate(c.topic)]
    if table is None:
        table = load_flow_syncs(flow, timeout_s=timeout_s)
    return [Translated(group, c.topic, remote_topic_name(flow, c.topic), c.partition, c.offset,
                       table.translate(c.topic, c.partition, c.offset), c.metadata)
            for c in wanted]


def translate_back(flow: FlowConfig, group: str, *, table: SyncTable | None = None,
                   timeout_s: float = 30.0) -> list[Translated]:
    """The source offsets of ``group``'s committed offsets on the flow's target (the group
    consumed the remote topics there), exactly: for failback."""
    committed = Groups(flow.target_admin, alias=flow.target, timeout_s=timeout_s) \
        .committed(group)
    pairs = [(c, source_topic_name(flow, c.topic)) for c in committed]
    pairs = [(c, topic) for c, topic in pairs if topic is not None]
    if table is None:
        table = load_flow_syncs(flow, timeout_s=timeout_s)
    return [Translated(group, c.topic, topic, c.partition, c.offset,
                       table.translate_back(topic, c.partition, c.offset), c.metadata)
            for c, topic in pairs]
