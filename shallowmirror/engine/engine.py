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
        return (self.topic_mapper(tp[0]), tp[1])

    def _by_topic(self, batch: FetchedBatch) -> None:
        """The router: same partition of the mapped topic (the mapping cached per topic)."""
        target_topic = self._mapped.get(batch.topic)
        if target_topic is None:
            target_topic = self._mapped[batch.topic] = self.topic_mapper(batch.topic)
        self.sinks.forward(batch, target_topic, batch.partition)     # what route() does

    def _by_topic_all(self, batches: list[FetchedBatch]) -> None:
        """``_by_topic`` for one source partition's batches at once (one routing decision)."""
        topic = batches[0].topic
        target_topic = self._mapped.get(topic)
        if target_topic is None:
            target_topic = self._mapped[topic] = self.topic_mapper(topic)
        forward_all = getattr(self.sinks, "forward_all", None)
        if forward_all is not None:
            forward_all(batches, target_topic, batches[0].partition)
            return
        for batch in batches:
            self.sinks.forward(batch, target_topic, batch.partition)
