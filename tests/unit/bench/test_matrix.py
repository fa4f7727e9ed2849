"""Workload matrix: ids, validation, expansion and list parsing."""

from __future__ import annotations

import pytest

from shallowmirror.bench.matrix import Workload, default_workload, expand, parse_list


def test_default_workload_is_the_issue_goal_workload():
    w = default_workload("zstd")
    assert (w.codec, w.records, w.value_bytes, w.partitions, w.batch_bytes) == (
        "zstd", 1_000_000, 300, 8, 262_144)
    assert w.workload_id == "zstd-v300-b262144-p8-n1000000"
    assert w.as_record() == {"codec": "zstd", "value_bytes": 300, "batch_bytes": 262_144,
                             "partitions": 8, "records": 1_000_000}


def test_expand_is_the_cartesian_product_codec_slowest_without_duplicates():
    ws = expand(["lz4", "gzip", "lz4"], [100, 300], [16384], [1, 2], [10])
    assert len(ws) == 2 * 2 * 1 * 2 * 1
    assert [w.codec for w in ws] == ["lz4"] * 4 + ["gzip"] * 4
    assert len({w.workload_id for w in ws}) == len(ws)
    assert ws[0] == Workload("lz4", 100, 16384, 1, 10)


def test_workload_rejects_every_problem_at_once():
    with pytest.raises(ValueError) as err:
        Workload("brotli", 0, 1, -1, 5)
    text = str(err.value)
    assert "brotli" in text and "--value-bytes" in text and "partitions" in text


@pytest.mark.parametrize(("text", "expected"), [
    ("256KiB", [262_144]), ("1m", [1_000_000]), ("2k,300", [2000, 300]), ("1_000", [1000]),
    ("1MiB", [1_048_576]), ("1.5k", [1500]),
])
def test_parse_int_lists_with_suffixes(text, expected):
    assert parse_list(text, int) == expected


def test_parse_str_list_and_empty_list():
    assert parse_list(" lz4, zstd ,") == ["lz4", "zstd"]
    with pytest.raises(ValueError):
        parse_list(" , ")


def test_default_bench_matrix_runs_16_kib_and_256_kib_batches():
    """`shallowmirror bench` without --batch-bytes measures both the Java producer's default
    batch.size (16 KiB, where the cost per batch decides) and the 256 KiB goal workload."""
    from shallowmirror.cli.main import build_parser

    args = build_parser().parse_args(["bench"])
    sizes = parse_list(args.batch_bytes, int)
    assert sizes == [16_384, 262_144]
    ws = expand(["lz4"])
    assert [w.batch_bytes for w in ws] == [16_384, 262_144]


def test_kb_is_refused_with_both_meanings():
    """'16kb' was refused with no hint of what to write instead."""
    import pytest

    from shallowmirror.bench.matrix import parse_list

    with pytest.raises(ValueError, match=r"got '16kb' \(kb could mean either: 16KiB for 16,384 "
                                         r"or 16k for 16,000\)"):
        parse_list("16kb", int)
    assert parse_list("16KiB,16k", int) == [16384, 16000]
