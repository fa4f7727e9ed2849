"""Starts a flow's consumer-group features (reverse checkpoints, group offset sync) for
``mirror/flows.py``."""

from __future__ import annotations

import asyncio
from typing import Any

from shallowmirror.replication.group_offset_sync import GroupOffsetSync
from shallowmirror.replication.reverse_checkpoints import ReverseCheckpointer


async def start_group_features(flow: Any, stop: asyncio.Event, *, timeout_s: float = 30.0
                               ) -> list[asyncio.Task[Any]]:
    """Tasks of the flow's reverse checkpoints and group offset sync, as its settings ask."""
    s = flow.settings
    tasks: list[asyncio.Task[Any]] = []
    if not s.get("emit.checkpoints.enabled", True):
        return tasks                    # nothing checkpointed: nothing to sync (config warns)
    if s.get("reverse.checkpointing.enabled") and flow.opposite is not None:
        tasks.append(asyncio.create_task(ReverseCheckpointer(flow, timeout_s=timeout_s)
                                         .run(stop)))
    if s.get("sync.group.offsets.enabled"):
        tasks.append(asyncio.create_task(GroupOffsetSync(flow, timeout_s=timeout_s).run(stop)))
    return tasks
