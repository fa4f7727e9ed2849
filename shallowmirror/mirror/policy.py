"""Replication policies and cycle detection, as MirrorMaker 2 defines them (KIP-382).

A *remote topic* names the cluster it came from: ``A.orders`` on cluster B is a replica of
``orders`` on cluster A (``DefaultReplicationPolicy``). Chains read right to left:
``B.A.orders`` on C came from ``A.orders`` on B, which came from ``orders`` on A.

    cluster A             cluster B               cluster C
    orders   --A->B-->    A.orders   --B->C-->    B.A.orders
                          orders     --B->A-->    (on A: B.orders)
    B.orders --A->B-->    never: its upstream cluster is B itself (a cycle)

Cycle detection (MirrorSourceConnector.isCycle): walk the topic's upstream chain; if any hop's
source alias is the flow's *target*, the records already live there and the topic is skipped.
With ``IdentityReplicationPolicy`` names carry no history, so cycles cannot be detected from
names: bidirectional identity flows need disjoint topic filters (a warning says so).

Internal topics are never replicated whatever the filters say: Kafka's own (``__*``, ``.*``),
Connect's and MM2's (``*.internal``, ``*-internal``), and the mirror's own (which end in
``.internal``). Out of scope here: custom policy classes (only the two stock ones exist).
"""

from __future__ import annotations

from dataclasses import dataclass

#: MM2's heartbeat topic name (MirrorClientConfig.HEARTBEATS_TOPIC).
HEARTBEATS_TOPIC = "heartbeats"

DEFAULT_POLICY = "org.apache.kafka.connect.mirror.DefaultReplicationPolicy"
IDENTITY_POLICY = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"
#: Accepted spellings of ``replication.policy.class`` -> canonical class name.
POLICY_NAMES = {
    DEFAULT_POLICY: DEFAULT_POLICY,
    "DefaultReplicationPolicy": DEFAULT_POLICY,
    "default": DEFAULT_POLICY,
    IDENTITY_POLICY: IDENTITY_POLICY,
    "IdentityReplicationPolicy": IDENTITY_POLICY,
    "identity": IDENTITY_POLICY,
    # MM2's LegacyReplicationPolicy never shipped; IdentityReplicationPolicy replaced it.
    "org.apache.kafka.connect.mirror.LegacyReplicationPolicy": IDENTITY_POLICY,
    "LegacyReplicationPolicy": IDENTITY_POLICY,
}


def is_internal_topic(topic: str) -> bool:
    """ReplicationPolicy.isInternalTopic: Kafka, Connect, MM2 and shallowmirror topics."""
    return (topic.startswith("__") or topic.startswith(".")
            or topic.endswith(".internal") or topic.endswith("-internal"))


@dataclass(frozen=True)
class DefaultReplicationPolicy:
    """``<source alias><separator><topic>``; the separator defaults to ``.``."""

    separator: str = "."

    def __post_init__(self) -> None:
        if not self.separator:
            raise ValueError("replication.policy.separator must not be empty")

    def format_remote_topic(self, source_alias: str, topic: str) -> str:
        return f"{source_alias}{self.separator}{topic}"

    def topic_source(self, topic: str) -> str | None:
        """Alias of the cluster ``topic`` was replicated from, or None for a local topic."""
        head, sep, rest = topic.partition(self.separator)
        # Java's String.split drops trailing empties: "a." and "." are not remote topics.
        if not sep or not rest.strip(self.separator) or not head:
            return None
        return head

    def upstream_topic(self, topic: str) -> str | None:
        """The topic's name one hop upstream, or None for a local topic."""
        source = self.topic_source(topic)
        return None if source is None else topic[len(source) + len(self.separator):]

    def original_topic(self, topic: str) -> str:
        """The name on the cluster where the records were first produced."""
        seen = set()
        while True:
            upstream = self.upstream_topic(topic)
            if upstream is None or upstream == topic or topic in seen:
                return topic
            seen.add(topic)
            topic = upstream

    def is_heartbeats_topic(self, topic: str) -> bool:
        return self.original_topic(topic) == HEARTBEATS_TOPIC

    def is_internal_topic(self, topic: str) -> bool:
        return is_internal_topic(topic)

    @property
    def detects_cycles(self) -> bool:
        return True

    @property
    def class_name(self) -> str:
        return DEFAULT_POLICY


@dataclass(frozen=True)
class IdentityReplicationPolicy(DefaultReplicationPolicy):
    """Topic names unchanged (MirrorMaker 1 behaviour); heartbeats still get the prefix."""

    source_alias: str | None = None

    def _looks_like_heartbeat(self, topic: str) -> bool:
        return topic.endswith(HEARTBEATS_TOPIC)

    def format_remote_topic(self, source_alias: str, topic: str) -> str:
        if self._looks_like_heartbeat(topic):
            return super().format_remote_topic(source_alias, topic)
        return topic

    def topic_source(self, topic: str) -> str | None:
        if self._looks_like_heartbeat(topic):
            return super().topic_source(topic)
        return self.source_alias

    def upstream_topic(self, topic: str) -> str | None:
        if self._looks_like_heartbeat(topic):
            return super().upstream_topic(topic)
        return topic

    @property
    def detects_cycles(self) -> bool:
        return False

    @property
    def class_name(self) -> str:
        return IDENTITY_POLICY


ReplicationPolicy = DefaultReplicationPolicy


def make_policy(class_name: str, separator: str = ".",
                source_alias: str | None = None) -> DefaultReplicationPolicy:
    """The policy named by ``replication.policy.class`` (any accepted spelling)."""
    canonical = POLICY_NAMES.get(class_name.strip())
    if canonical is None:
        raise ValueError(f"unknown replication.policy.class {class_name!r}; supported: "
                         f"{DEFAULT_POLICY}, {IDENTITY_POLICY}")
    if canonical == IDENTITY_POLICY:
        return IdentityReplicationPolicy(separator=separator, source_alias=source_alias)
    return DefaultReplicationPolicy(separator=separator)


def upstream_clusters(policy: DefaultReplicationPolicy, topic: str) -> list[str]:
    """Every cluster alias in the topic's upstream chain, nearest first (``B.A.t`` -> [B, A])."""
    aliases: list[str] = []
    seen: set[str] = set()
    while topic not in seen:
        seen.add(topic)
        source = policy.topic_source(topic)
        upstream = policy.upstream_topic(topic)
        if source is None or upstream is None:
            break
        aliases.append(source)
        if upstream == topic:
            break
        topic = upstream
    return aliases


def is_cycle(policy: DefaultReplicationPolicy, topic: str, target_alias: str) -> bool:
    """MirrorSourceConnector.isCycle: would replicating ``topic`` to ``target_alias`` send
    records back to a cluster they came from?"""
    return target_alias in upstream_clusters(policy, topic)


def should_replicate_topic(policy: DefaultReplicationPolicy, topic: str, target_alias: str,
                           topic_filter, *, heartbeats_replication: bool = True) -> bool:
    """MirrorSourceConnector.shouldReplicateTopic: (filter or heartbeats) and not internal and
    not a cycle. ``topic_filter`` is anything with ``should_replicate_topic(topic)``."""
    wanted = topic_filter.should_replicate_topic(topic) or (
        heartbeats_replication and policy.is_heartbeats_topic(topic))
    return wanted and not policy.is_internal_topic(topic) and not is_cycle(
        policy, topic, target_alias)
