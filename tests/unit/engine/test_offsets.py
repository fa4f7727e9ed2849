"""Offset tracker and source->target map: committed position never passes an unacked batch."""

from __future__ import annotations

import random

import pytest

from shallowmirror.engine.offsets import MapRow, OffsetMap, PartitionOffsets


def test_committed_is_end_of_contiguous_acked_prefix() -> None:
    po = PartitionOffsets(100)
    a = po.add_batch(110, 100, 10)
    b = po.add_batch(125, 110, 15)
    po.add_gap(130)
    c = po.add_batch(150, 130, 20)
    assert po.committed == 100
    po.ack(a, 7000)
    assert po.committed == 110
    po.ack(c, 7025)
    assert po.committed == 110          # B still in flight: never beyond it
    po.ack(b, 7010)
    assert po.committed == 150
    assert po.pending == 0
    m = po.offset_map
    # A and B follow each other on both sides: one run; C comes after a gap: a row of its own.
    assert m.rows() == [MapRow(100, 25, 7000), MapRow(130, 20, 7025)]
    assert m.translate(117) == 7017
    assert m.translate(127) is None     # gap: not mirrored
    assert m.translate(149) == 7044
    assert m.translate(150) is None
    assert m.translate(99) is None


def test_filtered_offsets_before_a_batch_belong_to_its_range() -> None:
    po = PartitionOffsets(0)
    e = po.add_batch(20, 15, 5)         # 0..14 were control/aborted batches
    po.ack(e, 0)
    assert po.committed == 20
    assert po.offset_map.translate(14) is None
    assert po.offset_map.translate(15) == 0


def test_gap_only_advances_immediately() -> None:
    po = PartitionOffsets(5)
    po.add_gap(9)
    assert po.committed == 9 and po.end == 9


def test_unknown_target_base_translates_to_none() -> None:
    po = PartitionOffsets(0)
    e = po.add_batch(10, 0, 10)
    po.ack(e, None)
    assert po.offset_map.translate(3) is None
    assert po.offset_map.unknown_rows == 1


def test_double_ack_and_backwards_batch_are_refused() -> None:
    po = PartitionOffsets(0)
    e = po.add_batch(10, 0, 10)
    po.ack(e, 0)
    with pytest.raises(AssertionError):
        po.ack(e, 0)
    with pytest.raises(AssertionError):
        po.add_batch(15, 5, 10)



@pytest.mark.parametrize("pending", [0, 1], ids=["nothing pending", "a later batch pending"])
def test_an_entry_of_an_earlier_ownership_is_refused_and_changes_nothing(pending: int) -> None:
    """A batch registered with one ownership's offsets, acknowledged into the next one's (the
    partition revoked and assigned again): it was an IndexError with nothing pending, and with
    something pending it was marked acknowledged and dropped without a word."""
    earlier = PartitionOffsets(100)
    stale = earlier.add_batch(110, 100, 10)
    again = PartitionOffsets(100)
    if pending:                          # the same offsets fetched again by the new owner
        again.add_batch(110, 100, 10)
    before = (again.committed, again.end, again.pending)
    with pytest.raises(AssertionError, match=r"offsets 100\.\.109 are not pending"):
        again.ack(stale, 7000)
    assert (again.committed, again.end, again.pending) == before
    assert not stale.acked and again.offset_map.rows() == []

def test_abandon_and_reset() -> None:
    po = PartitionOffsets(0)
    a = po.add_batch(10, 0, 10)
    po.add_batch(20, 10, 10)
    po.ack(a, 0)
    abandoned = po.abandon_pending()
    assert [e.start for e in abandoned] == [10]
    assert po.end == po.committed == 10
    po.reset(50)                        # forward: a gap
    assert po.committed == 50
    po.reset(3)                         # backward with nothing pending
    assert po.committed == po.end == 3


def test_random_ack_order_property() -> None:
    rng = random.Random(7)
    for _ in range(50):
        po = PartitionOffsets(0)
        entries, pos = [], 0
        for _ in range(30):
            if rng.random() < 0.2:
                pos += rng.randint(1, 5)
                po.add_gap(pos)
            else:
                n = rng.randint(1, 20)
                entries.append(po.add_batch(pos + n, pos, n))
                pos += n
        order = entries[:]
        rng.shuffle(order)
        acked: set[int] = set()
        for e in order:
            before = po.committed
            po.ack(e, e.source_base + 1000)
            acked.add(id(e))
            first_unacked = next((x for x in entries if id(x) not in acked), None)
            assert po.committed >= before
            if first_unacked is not None:
                assert po.committed <= first_unacked.start
        assert po.committed == pos
        for e in entries:
            assert po.offset_map.translate(e.source_base) == e.source_base + 1000


def test_offset_map_bounded_and_position_translation() -> None:
    m = OffsetMap(max_rows=2)
    m.add(MapRow(0, 10, 100))
    m.add(MapRow(10, 10, 115))                # a gap on the target: a row of its own
    m.add(MapRow(25, 5, 130))
    assert len(m) == 2 and m.first_source_offset == 10
    assert m.translate(5) is None
    assert m.translate_position(20) == 125
    assert m.translate_position(22) == 125    # inside a gap: after the last mirrored record
    assert m.translate_position(27) == 132
    with pytest.raises(AssertionError):
        m.add(MapRow(26, 1, 0))


def test_batches_that_follow_each_other_on_both_sides_share_a_row() -> None:
    """One row per run, not per batch: a gap on either side, an unknown target offset or a seal
    starts a new one, and every offset translates as it would with a row per batch."""
    batches = [MapRow(0, 10, 500), MapRow(10, 5, 510), MapRow(15, 7, 515),   # one run
               MapRow(30, 4, 522),                  # source gap (filtered batches): new row
               MapRow(34, 6, 530),                  # target gap (another writer): new row
               MapRow(40, 2, None),                 # target offset unknown: new row
               MapRow(42, 3, 540),                  # after an unknown one: new row
               MapRow(45, 5, 543)]                  # continues it
    m = OffsetMap(max_rows=1_000)
    for row in batches:
        m.add(row)
    assert m.rows() == [MapRow(0, 22, 500), MapRow(30, 4, 522), MapRow(34, 6, 530),
                        MapRow(40, 2, None), MapRow(42, 8, 540)]
    for row in batches:
        for offset in range(row.source_base, row.source_end):
            expected = None if row.target_base is None else \
                row.target_base + offset - row.source_base
            assert m.translate(offset) == expected, offset
        assert m.translate_position(row.source_end) == (
            None if row.target_base is None else row.target_base + row.count)
    assert [m.translate(o) for o in (22, 29, 50)] == [None, None, None]
    m.seal()                                    # a new ownership starts here
    m.add(MapRow(50, 5, 548))                   # would continue the last run
    assert m.rows()[-2:] == [MapRow(42, 8, 540), MapRow(50, 5, 548)]
    m.add(MapRow(55, 5, 553))                   # the seal holds for one row only
    assert m.rows()[-1] == MapRow(50, 10, 548)


def test_a_mirror_without_gaps_keeps_one_row_however_many_batches() -> None:
    po = PartitionOffsets(0)
    for i in range(100_000):
        entry = po.add_batch(50 * i + 50, 50 * i, 50)
        po.ack(entry, 1_000 + 50 * i)
    assert po.offset_map.rows() == [MapRow(0, 5_000_000, 1_000)]
    assert po.offset_map.translate(4_999_999) == 5_000_999


def test_a_source_log_restarting_below_the_mirrored_rows_forgets_them():
    """Topic re-created (or truncated) on the source: offsets restart below what was mirrored, so
    translation from the new position on becomes unknown; below it every row stays exact (a row
    reaching past it is cut, not dropped), and new rows can be added from the new position
    without an overlap."""
    omap = OffsetMap()
    omap.add(MapRow(0, 300, 0))
    omap.add(MapRow(300, 200, 310))            # after a target gap: a row of its own
    assert omap.source_end == 500
    assert omap.forget_from(350) == 150        # the straddling row is cut at 350
    assert omap.rows() == [MapRow(0, 300, 0), MapRow(300, 50, 310)]
    assert omap.translate(349) == 359 and omap.translate(350) is None
    assert omap.translate_position(350) == 360          # after the last record kept
    assert omap.forget_from(350) == 0 and omap.forget_from(10_000) == 0
    assert omap.forget_from(0) == 350 and len(omap) == 0 and omap.source_end is None
    omap.add(MapRow(0, 300, 500))              # the re-created topic's records, mirrored after
    assert omap.translate(10) == 510
    omap.add(MapRow(300, 100, 800))            # one run with it: 0..399 -> 500..899
    assert len(omap) == 1
    assert omap.forget_from(350) == 50         # one run of all history: its head is kept
    assert omap.rows() == [MapRow(0, 350, 500)] and omap.translate(349) == 849
    omap.add(MapRow(350, 10, 850))             # continues on both sides, still a row of its own
    assert len(omap) == 2 and omap.translate(355) == 855


def test_partition_offsets_reset_backwards_clears_the_map_from_there():
    offsets = PartitionOffsets(0)
    offsets.offset_map.add(MapRow(0, 500, 0))
    offsets.reset(500)                          # forward or equal: nothing forgotten
    assert offsets.offset_map.translate(499) == 499
    offsets.reset(0)
    assert offsets.offset_map.translate(0) is None and len(offsets.offset_map) == 0


def test_the_engine_keeps_at_most_offset_map_max_rows_per_partition() -> None:
    from shallowmirror.engine import MirrorEngine
    from shallowmirror.errors import ConfigError

    engine = MirrorEngine({"bootstrap.servers": "127.0.0.1:1"},
                          {"bootstrap.servers": "127.0.0.1:2"}, topics=["t"],
                          settings={"offset.map.max.rows": 3})
    omap = engine.offset_map("t", 0)
    assert engine.offset_map("t", 0) is omap and omap.max_rows == 3
    for i in range(5):                  # a gap after every batch: a row each
        omap.add(MapRow(10 * i, 5, 100 * i))
    assert [row.source_base for row in omap.rows()] == [20, 30, 40]
    assert omap.first_source_offset == 20 and omap.translate(7) is None
    default = MirrorEngine({"bootstrap.servers": "127.0.0.1:1"},
                           {"bootstrap.servers": "127.0.0.1:2"}, topics=["t"])
    assert default.offset_map("t", 0).max_rows == 10_000
    with pytest.raises(ConfigError, match="offset.map.max.rows"):
        MirrorEngine({"bootstrap.servers": "127.0.0.1:1"},
                     {"bootstrap.servers": "127.0.0.1:2"}, topics=["t"],
                     settings={"offset.map.max.rows": 0})
