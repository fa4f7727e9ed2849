"""Reverse checkpointing (KIP-1098, ``reverse.checkpointing.enabled``) for A<->B.

A group fails over from A to B and consumes B's copy of A's topic (``A.orders`` on B). When it
fails back, A must know how far it got. Flow B->A cannot translate ``A.orders`` with its own
offset syncs (it does not mirror that topic: it would be a cycle); the opposite flow A->B's syncs
map ``orders`` on A to ``A.orders`` on B, exactly, and ``translate_back`` reads them backwards::

    A: orders        0 ........ 700 ......... 1000
                                 |  A->B syncs (exact, per batch)
    B: A.orders      0 ........ 700 ......... 1000
                                        ^ group G committed 940 on B
    reverse checkpoint (written by flow B->A, on A, in B.checkpoints.internal):
        Checkpoint(G, topic "orders", partition, upstream 940 (on B), downstream 940 (on A))

Every ``emit.checkpoints.interval.seconds`` the B->A flow lists B's groups (``groups`` /
``groups.exclude``, never the mirror's own groups), reads their committed offsets on topics that
came from A (``topicSource(topic) == A``, or the reverse topic filter when configured), translates
them with A->B's offset syncs and writes a checkpoint for each partition whose translation
changed. With ``sync.group.offsets.enabled`` the B->A flow's group offset sync then writes them
into the groups on A (``group_offset_sync.py``: idle groups only, never backwards).

Exact: the target position is translated to the source offset of the first mirrored record at or
after it (``PartitionSyncs.translate_back``), so failback re-reads nothing and skips nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from shallowmirror.mirror.filters import TopicFilter

log = logging.getLogger(__name__)


def came_from_target(flow: Any, topic: str) -> bool:
    """Whether ``topic`` on the flow's source is reverse checkpointed: with
    ``reverse.checkpointing.topic.filter.topics`` set, the filter decides; otherwise (KIP-1098)
    ``topicSource(topic)`` must be the flow's target. ``.topics.exclude`` applies to both."""
    s = flow.settings
    exclude = tuple(s.get("reverse.checkpointing.topic.filter.topics.exclude") or ())
    topics = s.get("reverse.checkpointing.topic.filter.topics")
    if topics:
        return TopicFilter(tuple(topics), exclude).should_replicate_topic(topic)
    if not TopicFilter((".*",), exclude).should_replicate_topic(topic):
        return False
    return flow.policy.detects_cycles and flow.policy.topic_source(topic) == flow.target


class ReverseCheckpointer:
    """Writes flow B->A's reverse checkpoints (see the module docstring)."""

    def __init__(self, flow: Any, *, timeout_s: float = 30.0) -> None:
        from shallowmirror.replication.checkpoints import (
            checkpoints_topic,
            group_filter,
            mirror_group,
        )

        if flow.opposite is None:
            raise ValueError(f"flow {flow.name}: reverse checkpointing needs the flow "
                             f"{flow.target}->{flow.source}")
        self.flow = flow
        self.opposite = flow.opposite
        self.timeout_s = timeout_s
        self.topic = checkpoints_topic(flow)
        self.filter = group_filter(flow)
        #: The mirror's own groups on B: flow B->A's, and any other shallowmirror flow group.
        self.own_groups = {mirror_group(flow), mirror_group(self.opposite)}
        self.emitted: dict[tuple[str, str, int], tuple[int, int]] = {}
        self.checkpoints_written = 0
        self._writer: Any = None
        self._source_groups: Any = None

    def start(self) -> None:
        """Create the checkpoints topic and the clients (blocking)."""
        from shallowmirror.replication.checkpoints import open_checkpointing

        self._writer, self._source_groups = open_checkpointing(self.flow, self.topic,
                                                               timeout_s=self.timeout_s)

    def emit_once(self) -> int:
        """One round (blocking): how many reverse checkpoints were written."""
        from shallowmirror.replication.checkpoints import write_checkpoints
        from shallowmirror.replication.translate import load_flow_syncs, translate_back

        assert self._writer is not None and self._source_groups is not None
        groups = [g for g in self._source_groups.list()
                  if g not in self.own_groups and self.filter.wanted(g)]
        if not groups:
            return 0
        table = load_flow_syncs(self.opposite, timeout_s=self.timeout_s)
        translated = ((group, t) for group in groups
                      for t in translate_back(self.opposite, group, table=table,
                                              timeout_s=self.timeout_s)
                      if t.downstream is not None and came_from_target(self.flow, t.from_topic))
        written = write_checkpoints(self._writer, self.emitted, translated,
                                    timeout_s=self.timeout_s, what="reverse checkpoints")
        self.checkpoints_written += written
        return written

    async def run(self, stop: asyncio.Event) -> None:
        """Emit every ``emit.checkpoints.interval.seconds`` until ``stop``; a failed round is
        logged once per distinct error and retried at the next interval."""
        from shallowmirror.replication.checkpoints import emit_every

        await emit_every(self, stop, what="reverse checkpoints", logger=log)
