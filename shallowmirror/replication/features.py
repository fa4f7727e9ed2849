"""Starts a flow's offset features (offset syncs, checkpoints) for ``mirror/flows.py``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from shallowmirror.mirror.config import FlowConfig
from shallowmirror.replication.checkpoints import CheckpointEmitter
from shallowmirror.replication.offset_syncs import OffsetSyncWriter
from shallowmirror.replication.translate import offset_syncs_cluster, offset_syncs_topic

log = logging.getLogger(__name__)


async def start_offset_features(flow: FlowConfig, stop: asyncio.Event, *,
                                timeout_s: float = 30.0
                                ) -> tuple[OffsetSyncWriter | None, CheckpointEmitter | None,
                                           list[asyncio.Task[Any]]]:
    """(offset-sync writer, checkpoint emitter, their tasks) as the flow's settings ask.

    Offset syncs need the shallow engine (its acknowledged batches); the deep path has no
    exact map. A writer that cannot create its topic is reported and left out: mirroring goes
    on, translation of what is mirrored meanwhile is not available."""
    s = flow.settings
    writer = emitter = None
    tasks: list[asyncio.Task[Any]] = []
    if s["emit.offset-syncs.enabled"] and flow.shallow:
        config, alias = offset_syncs_cluster(flow)
        writer = OffsetSyncWriter(config, offset_syncs_topic(flow), alias=alias,
                                  replication_factor=s["offset-syncs.topic.replication.factor"])
        try:
            await asyncio.to_thread(writer.start)
        except Exception as err:  # noqa: BLE001 - reported; the data keeps flowing
            log.error("flow %s: offset syncs disabled: %s", flow.name, err)
            writer = None
        else:
            tasks.append(asyncio.create_task(writer.run(stop)))
    if s["emit.checkpoints.enabled"] and flow.shallow:
        emitter = CheckpointEmitter(flow, timeout_s=timeout_s)
        tasks.append(asyncio.create_task(emitter.run(stop)))
    return writer, emitter, tasks
