"""The offset-syncs topic (``mm2-offset-syncs.<target>.internal``): the persistent, exact
source->target map of a flow, in MirrorMaker 2's encoding.

Design. MM2 keys offset syncs by (topic, partition) in a compacted topic, so compaction keeps
only the latest sync of a partition: fine for MM2's approximate translation, useless for an
exact one. A shallow mirror needs a sync only where the offset delta changes (see
``translation.py``); those are few, and every one must survive. So each record's key is MM2's
key followed by 8 more bytes::

    key    topic STRING | partition INT32 | slot INT64      (MM2's KEY_SCHEMA + a suffix)
    value  upstreamOffset INT64 | offset INT64               (MM2's VALUE_SCHEMA, unchanged)

    slot = the anchor's upstream offset   an anchor: kept for good by compaction
    slot = -1                             the partition's end sync: compaction keeps the latest

MM2's readers (``OffsetSync.deserializeRecord``, ``OffsetSyncStore``, the console formatter)
read a key with Kafka's ``Schema.read``, which ignores trailing bytes, so every record is a
valid MM2 offset sync to them (and a true one: upstream U is downstream D). No tombstones are
written (MM2 3.7's ``OffsetSyncStore`` fails on a null value).

Size: an anchor is written per change of the delta (a control batch, an aborted transaction, a
compaction gap, a restart), not per batch; the end sync is rewritten at most once per
``FLUSH_INTERVAL_S`` per partition and compacted away. A topic without gaps costs one anchor per
partition and restart whatever the batch count. Old anchors are not pruned when the source's
retention deletes what they describe (bounded by the gaps ever mirrored; see the README).

Replaying the topic in log order into a ``SyncTable`` rebuilds the map (``load_sync_table``).
Records without the suffix (written by MM2 itself) are skipped: they are approximate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from shallowmirror.engine.hooks import BatchAck
from shallowmirror.replication.internal_topics import TopicWriter, ensure_topic, read_topic
from shallowmirror.replication.mm2_records import (
    MM2RecordError,
    OffsetSync,
    decode_offset_sync_key,
    encode_offset_sync_key,
)
from shallowmirror.replication.translation import Sync, SyncTable

log = logging.getLogger(__name__)

END_SLOT = -1
FLUSH_INTERVAL_S = 0.2
_SLOT = struct.Struct(">q")


def sync_record(topic: str, partition: int, sync: Sync, *, end: bool = False
                ) -> tuple[bytes, bytes]:
    """(key, value) of one anchor or end sync."""
    slot = END_SLOT if end else sync.upstream
    key = encode_offset_sync_key(topic, partition) + _SLOT.pack(slot)
    return key, OffsetSync(topic, partition, sync.upstream, sync.downstream).value()


def replay(records: Iterable[tuple[bytes | None, bytes | None]],
           table: SyncTable | None = None) -> SyncTable:
    """Apply offset-sync records in log order; returns the table. Records this module did not
    write (no slot suffix) and undecodable ones are skipped with one warning."""
    table = table if table is not None else SyncTable()
    skipped = 0
    for key, value in records:
        try:
            sync = OffsetSync.decode(key, value)
            _, _, rest = decode_offset_sync_key(key)
        except MM2RecordError:
            skipped += 1
            continue
        if len(rest) != _SLOT.size:
            skipped += 1
            continue
        slot = _SLOT.unpack(rest)[0]
        syncs = table.partition(sync.topic, sync.partition)
        point = Sync(sync.upstream_offset, sync.downstream_offset)
        if slot == END_SLOT:
            syncs.set_end(point)
        else:
            syncs.add_anchor(point)
    if skipped:
        log.warning("offset syncs: %d records not written by shallowmirror skipped (MM2's own "
                    "syncs are approximate)", skipped)
    return table


def load_sync_table(config: Mapping[str, Any], topic: str, *, alias: str,
                    timeout_s: float = 30.0) -> SyncTable:
    """The exact map of every partition synced to ``topic`` (blocking)."""
    return replay(read_topic(config, topic, alias=alias, timeout_s=timeout_s))


class OffsetSyncWriter:
    """Turns acknowledged batches (the engine's ``batch_acknowledged`` hook) into offset syncs.

    Anchors are produced from the hook at once (the producer queues them; the engine's loop
    never blocks); end syncs of partitions that moved are produced every ``FLUSH_INTERVAL_S``
    by ``run``. ``source_topic`` keys the map: syncs name the *source* topic-partition, as
    MM2's do. Shared by every engine of a flow in this process."""

    def __init__(self, config: Mapping[str, Any], topic: str, *, alias: str,
                 replication_factor: int = -1) -> None:
        self.config, self.topic, self.alias = dict(config), topic, alias
        self.replication_factor = replication_factor
        self.table = SyncTable()
        self.anchors_written = 0
        self.ends_written = 0
        self._writer: TopicWriter | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Create the topic if needed and open the producer (blocking: call in a thread)."""
        ensure_topic(self.config, self.topic, alias=self.alias,
                     replication_factor=self.replication_factor)
        self._writer = TopicWriter(self.config, self.topic, alias=self.alias)

    def on_batch_ack(self, ack: BatchAck) -> None:
        """Hook callback: record the batch; write the anchors it creates."""
        if ack.target_base is None:
            return          # written before (tansu's DUPLICATE_SEQUENCE_NUMBER): nothing new
        with self._lock:
            syncs = self.table.partition(ack.source_topic, ack.source_partition)
            anchors = syncs.add_batch(ack.source_base, ack.source_next, ack.target_base,
                                      ack.record_offsets)
            syncs.moved = True
            for anchor in anchors:
                self._write(ack.source_topic, ack.source_partition, anchor, end=False)

    def _write(self, topic: str, partition: int, sync: Sync, *, end: bool) -> None:
        if self._writer is None:
            raise RuntimeError("OffsetSyncWriter.start() was not called")
        self._writer.write(*sync_record(topic, partition, sync, end=end))
        if end:
            self.ends_written += 1
        else:
            self.anchors_written += 1

    def flush_ends(self) -> None:
        """Write the end sync of every partition that moved since the last call (by the hook
        or by the engine itself: ``engine.hooks.AckRun.moved``)."""
        with self._lock:
            moved = sorted(tp for tp, syncs in self.table.partitions.items() if syncs.moved)
            for topic, partition in moved:
                syncs = self.table.partitions[(topic, partition)]
                syncs.moved = False
                end = syncs.end
                if end is not None:
                    self._write(topic, partition, end, end=True)

    @property
    def failed(self) -> str | None:
        return None if self._writer is None else self._writer.failed

    async def run(self, stop: asyncio.Event) -> None:
        """Write end syncs every ``FLUSH_INTERVAL_S`` until ``stop``; then flush everything."""
        try:
            while not stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), FLUSH_INTERVAL_S)
                self.flush_ends()
                if self._writer is not None:
                    self._writer._producer.poll(0)
        finally:
            await asyncio.to_thread(self.close)

    def close(self, timeout_s: float = 30.0) -> None:
        self.flush_ends()
        if self._writer is not None:
            left = self._writer.flush(timeout_s)
            if not left:
                return
            down_s = self._writer.down_for_s()
            if down_s is not None:
                log.error("cluster %s: %d offset syncs not written to %s: the cluster has been "
                          "unreachable for %.0f s", self.alias, left, self.topic, down_s)
            else:
                log.error("cluster %s: %d offset syncs not written to %s within %.0fs",
                          self.alias, left, self.topic, timeout_s)
