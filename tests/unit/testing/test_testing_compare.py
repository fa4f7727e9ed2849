"""compare_topics / assert_same_records must fail on every kind of difference (and only then)."""

from __future__ import annotations

import pytest

from shallowmirror.testing.topics import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Record,
    assert_same_records,
    compare_topics,
)


def _topic(n: int = 20, partitions: int = 2) -> dict[int, list[Record]]:
    return {
        p: [Record(b"k%d" % i, b"value-%d-%d" % (p, i), (("h", b"%d" % i),), 1_700_000_000_000 + i,
                   TIMESTAMP_CREATE_TIME, i) for i in range(n)]
        for p in range(partitions)
    }


def _mutated(**change) -> tuple[dict, dict]:
    expected = _topic()
    actual = {p: list(rs) for p, rs in expected.items()}
    actual[1][7] = actual[1][7]._replace(**change)
    return expected, actual


def test_identical_topics_have_no_differences():
    assert compare_topics(_topic(), _topic()) == []
    assert_same_records(_topic(), _topic())


@pytest.mark.parametrize("field, value", [
    ("value", b"changed"),
    ("key", b"other-key"),
    ("headers", (("h", b"tampered"),)),
    ("timestamp_ms", 1),
    ("timestamp_type", TIMESTAMP_LOG_APPEND_TIME),
])
def test_a_changed_field_is_reported_with_both_values(field, value):
    expected, actual = _mutated(**{field: value})
    diffs = compare_topics(expected, actual, topic="orders")
    assert len(diffs) == 1
    d = diffs[0]
    assert (d.partition, d.index, d.field) == (1, 7, field)
    assert d.expected == getattr(expected[1][7], field) and d.actual == value
    assert str(d).startswith("orders-1 record #7 (offset 7 -> 7): " + field)
    with pytest.raises(AssertionError, match=f"orders-1 record #7.*{field} differs"):
        assert_same_records(expected, actual, topic="orders")


def test_a_missing_record_is_one_difference_not_a_flood():
    expected = _topic()
    actual = {p: list(rs) for p, rs in expected.items()}
    del actual[0][5]
    diffs = compare_topics(expected, actual)
    assert [(d.partition, d.index, d.field, d.count) for d in diffs] == [(0, 5, "missing", 1)]
    assert "missing record" in str(diffs[0])


def test_missing_tail_and_extra_block_are_counted():
    expected = _topic()
    actual = {p: list(rs) for p, rs in expected.items()}
    actual[0] = actual[0][:15]
    extra = [Record(b"x", b"aborted-%d" % i, (), 5) for i in range(30)]
    actual[1] = actual[1][:4] + extra + actual[1][4:]
    diffs = compare_topics(expected, actual)
    assert [(d.partition, d.index, d.field, d.count) for d in diffs] == [
        (0, 15, "missing", 5), (1, 4, "extra", 30)]
    assert "30 records" in str(diffs[1])


def test_a_reordered_record_is_reported():
    expected = _topic()
    actual = {p: list(rs) for p, rs in expected.items()}
    actual[1][3], actual[1][4] = actual[1][4], actual[1][3]
    diffs = compare_topics(expected, actual)
    assert [(d.partition, d.index, d.field) for d in diffs] == [(1, 3, "order")]


def test_a_missing_partition_counts_as_empty():
    expected = _topic()
    actual = {0: expected[0]}
    diffs = compare_topics(expected, actual)
    assert [(d.partition, d.field, d.count) for d in diffs] == [(1, "missing", 20)]


def test_offsets_are_compared_only_on_request():
    expected = _topic()
    actual = {p: [r._replace(offset=r.offset + 2) for r in rs] for p, rs in expected.items()}
    assert compare_topics(expected, actual) == []
    diffs = compare_topics(expected, actual, check_offsets=True)
    assert diffs and all(d.field == "offset" for d in diffs)


def test_max_differences_caps_the_report():
    expected = _topic(n=200)
    actual = {p: [r._replace(value=b"x%d" % i) for i, r in enumerate(rs)]
              for p, rs in expected.items()}
    assert len(compare_topics(expected, actual, max_differences=7)) == 7
    with pytest.raises(AssertionError, match="and .* more"):
        assert_same_records(expected, actual)
