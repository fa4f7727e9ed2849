"""``MirrorEngine``: one flow source->target, every fetched batch routed by a topic mapper.

Partition i of a source topic goes to partition i of ``topic_mapper(topic)`` on the target: that
is the router this class passes to ``EngineCore``, which does everything else (fetching,
producing, offsets, membership, metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shallowmirror.engine.batch import FetchedBatch
from shallowmirror.engine.core import ClusterFactory, EngineCore, MembershipFactory
from shallowmirror.engine.discovery import TopicsSpec
from shallowmirror.engine.metrics import MetricsSink
from shallowmirror.engine.topic_names import mapped_topic
from shallowmirror.errors import ConfigError, OperatorActionRequired


def identity_mapper(topic: str) -> str:
    """Same topic name on the target."""
    return topic


def prefix_mapper(alias: str, separator: str = ".") -> Callable[[str], str]:
    """MirrorMaker 2's default replication policy: ``<alias><separator><topic>`` ("A.orders")."""
    prefix = f"{alias}{separator}"

    def mapper(topic: str) -> str:
        return prefix + topic

    mapper.__name__ = f"prefix_mapper({alias!r})"
    return mapper


class CopyIntoItselfError(ConfigError, OperatorActionRequired):
    """Source and target are one cluster and a topic keeps its name: each record would be read
    back and copied again without end. Only another target or topic mapping fixes it (a flow
    stops with it rather than restarting)."""


class MirrorEngine(EngineCore):
    """Mirror ``topics`` from the source cluster to the target cluster, batch for batch."""

    routes_by_partition = True

    def __init__(self, source_config: Mapping[str, Any], target_config: Mapping[str, Any], *,
                 topics: TopicsSpec, topic_mapper: Callable[[str], str] = identity_mapper,
                 flow: str | None = None, source_alias: str = "source",
                 target_alias: str = "target", settings: Mapping[str, Any] | None = None,
                 metrics_sink: MetricsSink | None = None,
                 cluster_factory: ClusterFactory | None = None,
                 membership_factory: MembershipFactory | None = None) -> None:
        super().__init__(source_config, target_config, topics=topics, flow=flow,
                         source_alias=source_alias, target_alias=target_alias,
                         settings=settings, metrics_sink=metrics_sink, router=self._by_topic,
                         cluster_factory=cluster_factory,
                         membership_factory=membership_factory)
        self.topic_mapper = topic_mapper
        self._mapped: dict[str, str] = {}
        self.sources.route_all = self._by_topic_all

    def target_partition_of(self, tp: tuple[str, int]) -> tuple[str, int]:
        return (mapped_topic(self.topic_mapper, tp[0]), tp[1])

    def check_clusters(self) -> None:
        """Refuse a listed topic that would be copied into itself: source and target are one
        cluster (whatever addresses reach it) and its name is kept."""
        for topic in self.discovery.listed or ():
            self._refuse_copy_into_itself(topic, mapped_topic(self.topic_mapper, topic))

    def _one_cluster(self) -> str | None:
        """The cluster id when source and target are one cluster: the same id and the same
        brokers at the same advertised addresses (a cluster restored from another's disks
        keeps its cluster id, on other hosts)."""
        source, target = self.source, self.target
        if source is None or target is None or source.cluster_id is None:
            return None
        if source.cluster_id != target.cluster_id:
            return None

        def endpoints(cluster: Any) -> set:
            return {(b.node_id, b.host, b.port) for b in cluster.brokers.values()}
        return source.cluster_id if endpoints(source) == endpoints(target) else None

    def _refuse_copy_into_itself(self, topic: str, target_topic: str) -> None:
        if target_topic != topic:
            return
        cluster_id = self._one_cluster()
        if cluster_id is None:
            return
        raise CopyIntoItselfError(
            f"{self.flow}: {self.source_alias} and {self.target_alias} are the same cluster "
            f"(cluster id {cluster_id}) and topic {topic} keeps its name on the target: its "
            "records would be read back and copied again without end; point the target at "
            "another cluster, or keep a replication policy that renames topics")

    def _target_topic(self, topic: str) -> str:
        """``topic_mapper(topic)``, cached per topic; a topic copied into itself is refused on
        its first batch (a pattern's topics are not known before)."""
        target_topic = self._mapped.get(topic)
        if target_topic is None:
            target_topic = mapped_topic(self.topic_mapper, topic)
            self._refuse_copy_into_itself(topic, target_topic)
            self._mapped[topic] = target_topic
        return target_topic

    def _by_topic(self, batch: FetchedBatch) -> None:
        """The router: same partition of the mapped topic."""
        self.sinks.forward(batch, self._target_topic(batch.topic), batch.partition)

    def _by_topic_all(self, batches: list[FetchedBatch]) -> None:
        """``_by_topic`` for one source partition's batches at once (one routing decision)."""
        target_topic = self._target_topic(batches[0].topic)
        forward_all = getattr(self.sinks, "forward_all", None)
        if forward_all is not None:
            forward_all(batches, target_topic, batches[0].partition)
            return
        for batch in batches:
            self.sinks.forward(batch, target_topic, batch.partition)
