"""Offset-sync records: MM2-readable, replayed into the same map, MM2's own syncs skipped."""

from __future__ import annotations

from shallowmirror.engine.hooks import BatchAck
from shallowmirror.replication.groups import GroupFilter
from shallowmirror.replication.mm2_records import OffsetSync
from shallowmirror.replication.offset_syncs import OffsetSyncWriter, replay, sync_record
from shallowmirror.replication.translation import PartitionSyncs, Sync


def test_records_are_mm2_offset_syncs_with_a_slot_suffix() -> None:
    key, value = sync_record("orders", 2, Sync(100, 1000))
    assert OffsetSync.decode(key, value) == OffsetSync("orders", 2, 100, 1000)
    assert key.endswith((100).to_bytes(8, "big"))
    end_key, _ = sync_record("orders", 2, Sync(180, 1078), end=True)
    assert end_key.endswith(b"\xff" * 8)
    assert end_key[:-8] == key[:-8] == OffsetSync("orders", 2, 0, 0).key()


def test_replay_rebuilds_the_live_map_and_skips_mm2s_own_syncs() -> None:
    live = PartitionSyncs()
    records = []
    for base, end, target in ((100, 130, 1000), (130, 150, 1030), (152, 180, 1050)):
        records += [sync_record("t", 0, a) for a in live.add_batch(base, end, target)]
    records.append(sync_record("t", 0, live.end, end=True))
    records.append((OffsetSync("t", 0, 5, 5).key(), OffsetSync("t", 0, 5, 5).value()))
    records.append((b"\x00", b"junk"))
    table = replay(records)
    assert [table.translate("t", 0, p) for p in range(90, 200)] == \
        [live.translate(p) for p in range(90, 200)]


class Collect:
    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes]] = []
        self.failed = None

    def write(self, key: bytes, value: bytes) -> None:
        self.records.append((key, value))


def test_the_writer_turns_acknowledged_batches_into_anchors_and_ends() -> None:
    writer = OffsetSyncWriter({}, "mm2-offset-syncs.B.internal", alias="A")
    writer._writer = Collect()          # what TopicWriter would send
    for base, nxt, target in ((0, 10, 0), (10, 20, 10), (25, 30, 20)):
        writer.on_batch_ack(BatchAck("t", 1, base, nxt, nxt - base, "A.t", 1, target))
    writer.on_batch_ack(BatchAck("t", 1, 30, 40, 10, "A.t", 1, None))   # offset unknown
    writer.flush_ends()
    assert (writer.anchors_written, writer.ends_written) == (2, 1)
    table = replay(writer._writer.records)
    assert [table.translate("t", 1, p) for p in (5, 20, 24, 25, 29, 30, 99)] == \
        [5, 20, 20, 20, 24, 25, 25]


def test_group_filter_is_mm2s_default_group_filter() -> None:
    groups = GroupFilter((".*",), ("console-consumer-.*", "connect-.*", "__.*"))
    assert groups.wanted("billing")
    assert not groups.wanted("console-consumer-1234")
    assert not groups.wanted("__shallowmirror")
    assert not GroupFilter(("bill.*",), ()).wanted("payments")
