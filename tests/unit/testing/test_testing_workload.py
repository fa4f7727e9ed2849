"""The workload generator: deterministic, sized as asked, compressible like real events."""

from __future__ import annotations

import gzip
import json

import lz4.frame
import pytest
import zstandard

from shallowmirror.errors import ConfigError
from shallowmirror.testing.workload import Workload, generate


def test_same_seed_same_records_other_seed_other_records():
    w = Workload(topic="t", records=500, timestamp_ms=1_000)
    assert generate(w) == generate(w)
    other = generate(Workload(topic="t", records=500, timestamp_ms=1_000, seed=1))
    assert [r.value for _, r in other] != [r.value for _, r in generate(w)]


def test_values_are_json_events_of_the_asked_size():
    rows = generate(Workload(topic="t", records=1000, value_bytes=400))
    assert {len(r.value) for _, r in rows} == {400}
    event = json.loads(rows[0][1].value)
    assert {"event_id", "type", "user", "session", "note"} <= set(event)
    # Tiny values are cut to size rather than overflowing.
    assert {len(r.value) for _, r in generate(Workload(topic="t", records=50, value_bytes=40))} == {40}


def test_keys_headers_partitions_and_timestamps():
    w = Workload(topic="t", records=3000, keys=10, headers=4, partitions=5, timestamp_ms=7_000)
    rows = generate(w)
    keys = {r.key for _, r in rows}
    assert len(keys) == 10
    # The same key always lands in the same partition; every partition is used.
    by_key = {}
    for p, r in rows:
        assert by_key.setdefault(r.key, p) == p
    assert {p for p, _ in rows} <= set(range(5))
    assert all(len(r.headers) == 4 for _, r in rows)
    assert rows[5][1].headers[1] == ("seq", b"5")
    assert [r.timestamp_ms for _, r in rows[:3]] == [7_000, 7_001, 7_002]


def test_null_keys_go_round_robin():
    rows = generate(Workload(topic="t", records=9, keys=0, headers=0, partitions=3))
    assert [p for p, _ in rows] == [0, 1, 2] * 3
    assert all(r.key is None and r.headers == () for _, r in rows)


def test_values_compress_like_real_events():
    """A 1 MB batch of values compresses ~3x with lz4 and 4-9x with zstd/gzip (librdkafka's
    own ratios are checked against a broker in the integration tests)."""
    blob = b"".join(r.value for _, r in generate(Workload(topic="t", records=3500)))
    lz4_ratio = len(blob) / len(lz4.frame.compress(blob))
    zstd_ratio = len(blob) / len(zstandard.ZstdCompressor(level=3).compress(blob))
    gzip_ratio = len(blob) / len(gzip.compress(blob))
    assert 2.8 <= lz4_ratio <= 5.5, lz4_ratio
    assert 4.0 <= zstd_ratio <= 10.0, zstd_ratio
    assert 4.0 <= gzip_ratio <= 11.0, gzip_ratio


def test_transaction_plans():
    assert Workload(topic="t", records=10).transaction_outcomes() == []
    w = Workload(topic="t", records=1000, transactional=True, transaction_records=100,
                 abort_every=3)
    assert w.transaction_outcomes() == [True, True, False] * 3 + [True]
    plan = Workload(topic="t", records=250, transactional=True, transaction_records=100,
                    transaction_plan=(False, True))
    assert plan.transaction_outcomes() == [False, True, True]


def test_invalid_workloads_list_every_problem():
    with pytest.raises(ConfigError) as info:
        Workload(topic="t", codec="brotli", partitions=0, abort_every=2)
    text = str(info.value)
    assert "brotli" in text and "partitions" in text and "transactional" in text
