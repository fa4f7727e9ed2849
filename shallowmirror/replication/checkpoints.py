"""Checkpoints: consumer-group offsets of a flow's source, translated exactly, written to
``<source>.checkpoints.internal`` on the target in MirrorMaker 2's encoding, so MM2's
``RemoteClusterUtils.translateOffsets`` (and ``read_checkpoints`` here) tell a failing-over group
where to resume on the target.

``CheckpointEmitter.run`` every ``emit.checkpoints.interval.seconds``: list the source's groups
(again every ``refresh.groups.interval.seconds``), keep those ``groups``/``groups.exclude``
select (never the mirror's own group), translate their committed offsets with the flow's
offset-syncs (``translate.translate_offsets``) and write a checkpoint for every partition whose
translation changed. A partition with nothing mirrored yet gets none (MM2 does the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from shallowmirror.mirror.config import FlowConfig
from shallowmirror.replication.groups import GroupFilter, Groups
from shallowmirror.replication.internal_topics import TopicWriter, ensure_topic, read_topic
from shallowmirror.replication.mm2_records import Checkpoint, MM2RecordError
from shallowmirror.replication.translate import (
    internal_topics,
    load_flow_syncs,
    translate_offsets,
)

log = logging.getLogger(__name__)


def checkpoints_topic(flow: FlowConfig) -> str:
    return internal_topics(flow).checkpoints(flow.source)


def group_filter(flow: FlowConfig) -> GroupFilter:
    s = flow.settings
    exclude = s["groups.blacklist"] if s.get("groups.blacklist") is not None \
        else s["groups.exclude"]
    return GroupFilter(tuple(s["groups"]), tuple(exclude))


def mirror_group(flow: FlowConfig) -> str:
    return flow.engine_settings.get("group.id") or f"shallowmirror-{flow.source}-{flow.target}"


def read_checkpoints(config: Mapping[str, Any], topic: str, *, alias: str, group: str,
                     timeout_s: float = 30.0) -> dict[tuple[str, int], Checkpoint]:
    """``RemoteClusterUtils.translateOffsets``: the latest checkpoint of each partition of
    ``group`` in checkpoints ``topic`` on cluster ``alias``, keyed by (topic on that cluster,
    partition). Records that are not checkpoints are skipped, as MM2 skips them."""
    latest: dict[tuple[str, int], Checkpoint] = {}
    for key, value in read_topic(config, topic, alias=alias, timeout_s=timeout_s):
        try:
            checkpoint = Checkpoint.decode(key, value)
        except MM2RecordError:
            continue
        if checkpoint.group == group:
            latest[(checkpoint.topic, checkpoint.partition)] = checkpoint
    return latest


class CheckpointEmitter:
    """Writes one flow's checkpoints (see the module docstring)."""

    def __init__(self, flow: FlowConfig, *, timeout_s: float = 30.0) -> None:
        self.flow = flow
        self.timeout_s = timeout_s
        self.topic = checkpoints_topic(flow)
        self.filter = group_filter(flow)
        self.own_group = mirror_group(flow)
        self.emitted: dict[tuple[str, str, int], tuple[int, int]] = {}
        self.checkpoints_written = 0
        self._groups: list[str] = []
        self._groups_listed_at: float | None = None
        self._writer: TopicWriter | None = None
        self._source_groups: Groups | None = None

    def start(self) -> None:
        """Create the checkpoints topic and the clients (blocking)."""
        self._writer, self._source_groups = open_checkpointing(self.flow, self.topic,
                                                               timeout_s=self.timeout_s)

    def _maybe_refresh_groups(self) -> list[str]:
        s = self.flow.settings
        now = time.monotonic()
        due = self._groups_listed_at is None or (
            s["refresh.groups.enabled"]
            and now - self._groups_listed_at >= s["refresh.groups.interval.seconds"])
        if due:
            assert self._source_groups is not None
            listed = self._source_groups.list()
            self._groups = [g for g in listed if g != self.own_group and self.filter.wanted(g)]
            self._groups_listed_at = now
        return self._groups

    def emit_once(self) -> int:
        """One round (blocking): returns how many checkpoints were written."""
        assert self._writer is not None
        groups = self._maybe_refresh_groups()
        if not groups:
            return 0
        table = load_flow_syncs(self.flow, timeout_s=self.timeout_s)
        translated = ((group, t) for group in groups
                      for t in translate_offsets(self.flow, group, table=table,
                                                 timeout_s=self.timeout_s)
                      if t.downstream is not None)
        written = write_checkpoints(self._writer, self.emitted, translated,
                                    timeout_s=self.timeout_s, what="checkpoints")
        self.checkpoints_written += written
        return written

    async def run(self, stop: asyncio.Event) -> None:
        """Emit every ``emit.checkpoints.interval.seconds`` until ``stop``; a failed round is
        logged (once per distinct error) and retried at the next interval."""
        await emit_every(self, stop, what="checkpoints", logger=log)


def open_checkpointing(flow: Any, topic: str, *, timeout_s: float) -> tuple[TopicWriter, Groups]:
    """Create the checkpoints ``topic`` on the flow's target and open its writer there and the
    group client on the flow's source (blocking); shared by forward and reverse checkpointing."""
    ensure_topic(flow.target_admin, topic, alias=flow.target,
                 replication_factor=flow.settings["checkpoints.topic.replication.factor"])
    writer = TopicWriter(flow.target_admin, topic, alias=flow.target)
    return writer, Groups(flow.source_admin, alias=flow.source, timeout_s=timeout_s)


def write_checkpoints(writer: TopicWriter, emitted: dict[tuple[str, str, int], tuple[int, int]],
                      translated: Iterable[tuple[str, Any]], *, timeout_s: float,
                      what: str) -> int:
    """Write a checkpoint for each (group, translation) whose offsets changed since the last
    one written (``emitted`` remembers them), then wait for all to be acknowledged; shared by
    forward and reverse checkpointing. Raises RuntimeError naming ``what`` was not acknowledged.
    """
    written = 0
    for group, t in translated:
        key = (group, t.to_topic, t.partition)
        if emitted.get(key) == (t.upstream, t.downstream):
            continue
        checkpoint = Checkpoint(group, t.to_topic, t.partition, t.upstream, t.downstream,
                                t.metadata)
        writer.write(checkpoint.key(), checkpoint.value())
        emitted[key] = (t.upstream, t.downstream)
        written += 1
    left = writer.flush(timeout_s)
    if left or writer.failed:
        raise RuntimeError(writer.failed or f"{left} {what} not acknowledged")
    return written


async def emit_every(emitter: Any, stop: asyncio.Event, *, what: str,
                     logger: logging.Logger) -> None:
    """Run ``emitter.start`` (until it succeeds) and ``emitter.emit_once`` every
    ``emit.checkpoints.interval.seconds`` of its flow until ``stop``; a failed round is logged
    once per distinct error to ``logger`` (the emitter's module logger), naming ``what``
    failed, and retried at the next interval."""
    flow = emitter.flow
    interval = flow.settings["emit.checkpoints.interval.seconds"]
    last_error = None
    while not stop.is_set():
        try:
            if emitter._writer is None:
                await asyncio.to_thread(emitter.start)
            await asyncio.to_thread(emitter.emit_once)
            last_error = None
        except Exception as err:  # noqa: BLE001 - reported, retried next interval
            if str(err) != last_error:
                logger.warning("flow %s: %s to %s on cluster %s failed (retrying every %gs): %s",
                               flow.name, what, emitter.topic, flow.target, interval, err)
                last_error = str(err)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
