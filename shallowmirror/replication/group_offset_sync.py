"""Consumer-group offset sync (``sync.group.offsets.enabled``): the checkpoints of a flow written
into the consumer groups on its target, so a group that fails over simply starts consuming there.

Every ``sync.group.offsets.interval.seconds`` (MM2's ``MirrorCheckpointTask.syncGroupOffset``):

    read the flow's checkpoints topic on the target (<source>.checkpoints.internal): the latest
      checkpoint of every (group, topic on the target, partition) -- forward checkpoints and, on
      a flow with reverse.checkpointing.enabled, reverse ones (reverse_checkpoints.py)
    for each group:
      active on the target (members)        -> left alone; logged once until it is idle again
      otherwise, per partition:
        no committed offset on the target   -> write the checkpoint's offset
        committed >= checkpoint's offset    -> left alone (MM2: never moves a group backwards)
        committed <  checkpoint's offset    -> write the checkpoint's offset

Reading the checkpoints from their topic (not from the emitter's memory) makes forward and
reverse checkpoints one stream and lets a restarted mirror sync what it checkpointed before.
A group that becomes active between the check and the write makes the broker refuse the write
(UNKNOWN_MEMBER_ID, as in MM2): it counts as active (logged once, retried next interval). tansu
0.6 reports no members for an active group, so there the refused write is the only sign.
A group whose write fails otherwise is logged and retried; the other groups go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from shallowmirror.replication.mm2_records import Checkpoint, MM2RecordError

log = logging.getLogger(__name__)

TP = tuple[str, int]


def latest_checkpoints(records: Iterable[tuple[bytes | None, bytes | None]]
                       ) -> dict[str, dict[TP, Checkpoint]]:
    """The latest checkpoint per group and (topic, partition), from records in log order.
    Records that are not checkpoints are skipped (MM2 skips them too)."""
    latest: dict[str, dict[TP, Checkpoint]] = {}
    for key, value in records:
        try:
            checkpoint = Checkpoint.decode(key, value)
        except MM2RecordError:
            continue
        latest.setdefault(checkpoint.group, {})[(checkpoint.topic, checkpoint.partition)] = \
            checkpoint
    return latest


def offsets_to_sync(checkpoints: Mapping[TP, int], committed: Mapping[TP, int]
                    ) -> dict[TP, int]:
    """MM2's rule: a partition's checkpointed offset is written unless the group's committed
    offset on the target is already at or past it."""
    return {tp: offset for tp, offset in checkpoints.items()
            if tp not in committed or committed[tp] < offset}


class GroupOffsetSync:
    """Writes one flow's checkpoints into the target's idle consumer groups."""

    def __init__(self, flow: Any, *, timeout_s: float = 30.0) -> None:
        from shallowmirror.replication.checkpoints import checkpoints_topic

        self.flow = flow
        self.timeout_s = timeout_s
        self.topic = checkpoints_topic(flow)
        self.groups_synced: dict[str, dict[TP, int]] = {}
        self._active_logged: set[str] = set()
        self._target_groups: Any = None

    def _groups(self) -> Any:
        if self._target_groups is None:
            from shallowmirror.replication.groups import Groups

            self._target_groups = Groups(self.flow.target_admin, alias=self.flow.target,
                                         timeout_s=self.timeout_s)
        return self._target_groups

    def sync_once(self) -> dict[str, dict[TP, int]]:
        """One round (blocking): {group: {(topic, partition): offset written}}."""
        from shallowmirror.replication.groups import CommittedOffset, GroupError
        from shallowmirror.replication.internal_topics import read_topic

        records = read_topic(self.flow.target_admin, self.topic, alias=self.flow.target,
                             timeout_s=self.timeout_s)
        groups = self._groups()
        written: dict[str, dict[TP, int]] = {}
        for group, checkpoints in sorted(latest_checkpoints(records).items()):
            if groups.active_members(group):
                self._note_active(group)
                continue
            committed = {(c.topic, c.partition): c.offset for c in groups.committed(group)}
            wanted = offsets_to_sync({tp: c.downstream_offset for tp, c in checkpoints.items()},
                                     committed)
            if not wanted:
                self._active_logged.discard(group)
                continue
            try:
                groups.commit(group, [CommittedOffset(t, p, offset, checkpoints[(t, p)].metadata)
                                      for (t, p), offset in sorted(wanted.items())])
            except GroupError as err:
                if "UNKNOWN_MEMBER_ID" in str(err):
                    self._note_active(group)
                else:
                    log.warning("flow %s: %s", self.flow.name, err)
                continue
            self._active_logged.discard(group)
            written[group] = wanted
            log.debug("flow %s: synced %d offsets of group %r on cluster %s", self.flow.name,
                      len(wanted), group, self.flow.target)
        for group, offsets in written.items():
            self.groups_synced.setdefault(group, {}).update(offsets)
        return written

    def _note_active(self, group: str) -> None:
        """Log once (until the group is idle again) that an active group is left alone."""
        if group not in self._active_logged:
            self._active_logged.add(group)
            log.info("flow %s: group %r has active members on cluster %s: its offsets are not "
                     "synced while it consumes there", self.flow.name, group, self.flow.target)

    async def run(self, stop: asyncio.Event) -> None:
        """Sync every ``sync.group.offsets.interval.seconds`` until ``stop``; a failed round is
        logged once per distinct error and retried at the next interval."""
        interval = self.flow.settings["sync.group.offsets.interval.seconds"]
        last_error = None
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            if stop.is_set():
                return
            try:
                await asyncio.to_thread(self.sync_once)
                last_error = None
            except Exception as err:  # noqa: BLE001 - reported, retried next interval
                if str(err) != last_error:
                    log.warning("flow %s: group offset sync on cluster %s failed (retrying "
                                "every %gs): %s", self.flow.name, self.flow.target, interval,
                                err)
                    last_error = str(err)
