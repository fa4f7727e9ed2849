"""Exact resume's commit metadata: the format (versioned; foreign or garbled metadata is a
reason, not a crash) and which target position goes with a committed source offset."""

from __future__ import annotations

import pytest

from shallowmirror.engine.offsets import MapRow, OffsetMap
from shallowmirror.engine.resume import ResumePoint, TargetResume, parse_metadata


def test_metadata_round_trips():
    point = ResumePoint(1200, "A.orders-v2_x", 3, 98_765)
    text = point.encode()
    assert text == "shallowmirror.resume/1 source=1200 target=A.orders-v2_x:3@98765"
    assert parse_metadata(text) == (point, None)


@pytest.mark.parametrize("text,reason", [
    ("", None),
    (None, None),
    ("checkpoint from app 7", "not shallowmirror's"),
    ("shallowmirror.resume/2 source=1 target=t:0@5", "format version '2'"),
    ("shallowmirror.resume/1 source=x target=t:0@5", "unreadable"),
    ("shallowmirror.resume/1 source=1 target=t:0@", "unreadable"),
])
def test_foreign_or_garbled_metadata_is_a_reason(text, reason):
    point, problem = parse_metadata(text)
    assert point is None
    if reason is None:
        assert problem is None
    else:
        assert reason in problem


def _resume() -> TargetResume:
    return TargetResume(None, None, group_id="g", read_committed=False)  # type: ignore[arg-type]


def test_commit_metadata_follows_the_offset_map():
    resume, omap = _resume(), OffsetMap()
    resume.keep(("s", 0), ("t", 0), 100, None)
    assert resume.commit_metadata(("s", 0), 100, omap) is None      # nothing known yet
    omap.add(MapRow(100, 10, 5000))
    omap.add(MapRow(112, 8, 5010))     # 110..111: a control batch (a gap)
    assert parse_metadata(resume.commit_metadata(("s", 0), 120, omap))[0] == \
        ResumePoint(120, "t", 0, 5018)
    # Only gaps since: the same target position goes with the later source offset.
    assert parse_metadata(resume.commit_metadata(("s", 0), 125, omap))[0] == \
        ResumePoint(125, "t", 0, 5018)


def test_rows_of_an_earlier_ownership_are_not_used():
    resume, omap = _resume(), OffsetMap()
    omap.add(MapRow(0, 50, 0))          # mirrored by this process before a rebalance
    resume.keep(("s", 0), ("t", 0), 80, None)   # owned again from 80: someone else wrote 50..79
    assert resume.commit_metadata(("s", 0), 80, omap) is None
    resume.keep(("s", 0), ("t", 0), 80, ResumePoint(80, "t", 0, 77))
    assert parse_metadata(resume.commit_metadata(("s", 0), 80, omap))[0] == \
        ResumePoint(80, "t", 0, 77)


def test_unknown_target_offset_keeps_the_last_pair():
    resume, omap = _resume(), OffsetMap()
    resume.keep(("s", 0), ("t", 0), 0, None)
    omap.add(MapRow(0, 10, 0))
    first = resume.commit_metadata(("s", 0), 10, omap)
    omap.add(MapRow(10, 10, None))      # DUPLICATE_SEQUENCE_NUMBER: target offset unknown
    assert resume.commit_metadata(("s", 0), 20, omap) == first   # source=10 target 10: still true


def test_a_pair_below_the_start_is_kept_not_moved():
    """A pair for a source offset below where this ownership starts (kept after a fallback or a
    refusal) is committed unchanged: moving it up would claim a wrong target position."""
    resume, omap = _resume(), OffsetMap()
    old = ResumePoint(40, "t", 0, 400)
    resume.keep(("s", 0), ("t", 0), 60, old)
    assert parse_metadata(resume.commit_metadata(("s", 0), 60, omap))[0] == old


def test_a_pair_above_the_committed_offset_is_dropped_when_offsets_start_anew():
    """The source topic was deleted and created again: the partition restarts at 0 and the
    offset map forgets every row. The old topic's pair (source 100) must not be committed beside
    offset 0: the next owner would walk from 100 and skip the new topic's first 100 records.
    Nothing is committed beside 0, and the new topic's own rows give the next pair."""
    resume, omap = _resume(), OffsetMap()
    resume.keep(("s", 0), ("t", 0), 0, None)
    omap.add(MapRow(0, 100, 0))
    assert parse_metadata(resume.commit_metadata(("s", 0), 100, omap))[0] == \
        ResumePoint(100, "t", 0, 100)
    omap.forget_from(0)                 # what SourceOffsets.restart does
    assert resume.commit_metadata(("s", 0), 0, omap) is None
    omap.add(MapRow(0, 30, 100))        # the new topic's first batch, after the old copies
    assert parse_metadata(resume.commit_metadata(("s", 0), 30, omap))[0] == \
        ResumePoint(30, "t", 0, 130)
