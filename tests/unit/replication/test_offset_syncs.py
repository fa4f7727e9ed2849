"""Offset-sync records: MM2-readable, replayed into the same map, MM2's own syncs skipped."""

from __future__ import annotations

from shallowmirror.engine.hooks import BatchAck, Hook
from shallowmirror.replication.groups import GroupFilter
from shallowmirror.replication.mm2_records import OffsetSync
from shallowmirror.replication.offset_syncs import OffsetSyncWriter, replay, sync_record
from shallowmirror.replication.translation import PartitionSyncs, Sync, SyncTable


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


def test_ends_the_engine_moved_itself_are_written_at_the_next_flush() -> None:
    """The engine extends the writer's run maps itself for usual batches (``runs=``, no call
    per batch): the flush still writes each moved partition's end once, the same records the
    callback path writes, and then nothing until an end moves again."""
    by_callback = OffsetSyncWriter({}, "mm2-offset-syncs.B.internal", alias="A")
    by_engine = OffsetSyncWriter({}, "mm2-offset-syncs.B.internal", alias="A")
    for writer in (by_callback, by_engine):
        writer._writer = Collect()
        for p in (0, 1):
            writer.on_batch_ack(BatchAck("t", p, 0, 10, 10, "A.t", p, 100))
        writer.flush_ends()
    for p in (0, 1):
        for base in (10, 20):
            by_callback.on_batch_ack(BatchAck("t", p, base, base + 10, 10, "A.t", p, 100 + base))
            run = by_engine.table.partition("t", p)
            assert run.extends(base, 100 + base)
            run.extend(base, base + 10, 100 + base)
    for writer in (by_callback, by_engine):
        writer.flush_ends()
        writer.flush_ends()                     # nothing moved since: nothing more
    assert by_engine._writer.records == by_callback._writer.records
    assert (by_engine.anchors_written, by_engine.ends_written) == (2, 4)
    assert replay(by_engine._writer.records).translate("t", 1, 25) == 125


def test_only_a_lone_callback_hands_the_engine_its_run_maps() -> None:
    hook: Hook[BatchAck] = Hook("batch acknowledged")
    table = SyncTable()
    hook.add(print, runs=table.partition)
    assert hook.runs == table.partition
    other = hook.add(lambda ack: None)
    assert hook.runs is None                # the other callback must see every batch
    hook.remove(other)
    assert hook.runs == table.partition
    hook.remove(print)
    assert hook.runs is None and not hook


def test_group_filter_is_mm2s_default_group_filter() -> None:
    groups = GroupFilter((".*",), ("console-consumer-.*", "connect-.*", "__.*"))
    assert groups.wanted("billing")
    assert not groups.wanted("console-consumer-1234")
    assert not groups.wanted("__shallowmirror")
    assert not GroupFilter(("bill.*",), ()).wanted("payments")
