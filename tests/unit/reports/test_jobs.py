"""Report jobs on the committed fixtures, against numbers worked out by hand (in the comments).

Fixture ``data/bench.jsonl`` (MB = 1e6 B, GB = 1e9 B; every run moves 1,000,000 records):

    run             mode            wall  user+sys   compressed  uncompressed  peak RSS      ok
    lz4-shallow-0   shallow         2.0   0.3+0.1    200 MB      500 MB        50 MB         yes
    lz4-shallow-1   shallow         4.0   0.5+0.1    200 MB      500 MB        null: 52 MB   yes
                                                                               from samples
    lz4-shallow-2   shallow         2.5   0.7+0.3    200 MB      500 MB        48 MB         yes
    lz4-shallow-3   shallow         100   0.1+0.1    200 MB      500 MB        9 GB          NO
    lz4-deep-0      deep-confluent  5.0   8+2        200 MB      500 MB        150 MB        yes
    lz4-fetch-0     fetch-only      1.6   0.2+0.1    200 MB      null          30 MB         yes
    zstd-shallow-0  shallow         2.0   0.4+0.1    100 MB      500 MB        55 MB         yes
    zstd-deep-0     deep-confluent  6.0   10+2       100 MB      500 MB        400 MB        yes

Fixture ``data/engine.jsonl``: five flow records of run engine-1 (topics t1, t2), three process
samples of pid 42, one line that is not JSON and one record of an unknown kind. Progress
samples: see the series test.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark

approx = pytest.approx


@pytest.fixture(scope="module")
def records(spark, data_dir):
    from shallowmirror.reports import jobs

    df = jobs.read_records(spark, [str(data_dir / "bench.jsonl"), str(data_dir / "engine.jsonl")])
    df.cache()
    yield df
    df.unpersist()


def by(rows, *keys):
    """Rows (Spark Rows or dicts) indexed by the given key columns."""
    out = {}
    for row in rows:
        d = row if isinstance(row, dict) else row.asDict()
        out[tuple(d[k] for k in keys) if len(keys) > 1 else d[keys[0]]] = d
    return out


def test_kinds_are_split_and_bad_lines_counted(tables, report_data):
    assert len(tables["bench_runs"]) == 8
    assert sum(r["batches"] for r in tables["flow_totals"]) == 6  # five flow records
    assert tables["process_summary"][0]["samples"] == 3
    assert (report_data.malformed_lines, report_data.unknown_records) == (1, 1)


def test_per_run_throughput_cpu_per_gb_and_peak_rss(tables):
    m = by(tables["bench_runs"], "run_id")
    r0 = m["lz4-shallow-0"]
    assert r0["mb_s_compressed"] == approx(100.0)  # 200 MB / 2 s
    assert r0["mb_s_uncompressed"] == approx(250.0)  # 500 MB / 2 s
    assert r0["records_s"] == approx(500_000.0)  # 1e6 / 2 s
    # cpu = user + sys = 0.4 s; a user-only formula would give 1.5 and 0.6
    assert r0["cpu_s_per_gb_compressed"] == approx(2.0)  # 0.4 s / 0.2 GB
    assert r0["cpu_s_per_gb_uncompressed"] == approx(0.8)  # 0.4 s / 0.5 GB
    assert r0["compression_ratio"] == approx(2.5)  # 500 / 200
    # peak_rss_bytes is null in the record: the largest rss sample (52 MB) stands in
    assert m["lz4-shallow-1"]["peak_rss_bytes"] == 52_000_000
    assert m["lz4-shallow-1"]["cpu_s_per_gb_compressed"] == approx(3.0)  # 0.6 / 0.2
    assert m["lz4-shallow-2"]["cpu_s_per_gb_compressed"] == approx(5.0)  # 1.0 / 0.2
    # fetch-only never decompresses: uncompressed figures are unknown, not zero
    fetch = m["lz4-fetch-0"]
    assert fetch["mb_s_uncompressed"] is None and fetch["cpu_s_per_gb_uncompressed"] is None
    assert fetch["mb_s_compressed"] == approx(125.0)  # 200 MB / 1.6 s
    assert m["zstd-deep-0"]["cpu_s_per_gb_compressed"] == approx(120.0)  # 12 s / 0.1 GB
    assert m["zstd-deep-0"]["cpu_s_per_gb_uncompressed"] == approx(24.0)  # 12 s / 0.5 GB


def test_repeats_median_min_max_skip_failed_runs(tables):
    s = by(tables["bench_summary"], "workload_id", "mode")
    lz4 = s[("lz4-200B-4p", "shallow")]
    # ok repeats only; the failed run (2 MB/s, 9 GB RSS) would move every median
    assert lz4["runs"] == 3
    # MB/s {100, 50, 80}: median 80 (mean would be 76.7; with the failed run, median 65)
    assert (lz4["mb_s_compressed"], lz4["mb_s_compressed_min"], lz4["mb_s_compressed_max"]) == (
        approx(80.0), approx(50.0), approx(100.0))
    # CPU s/GB {2, 3, 5}: median 3 (mean 3.33)
    assert lz4["cpu_s_per_gb_compressed"] == approx(3.0)
    assert lz4["cpu_s_per_gb_compressed_max"] == approx(5.0)
    # peak RSS {50, 52, 48} MB: median 50 MB
    assert lz4["peak_rss_bytes"] == approx(50_000_000)
    assert lz4["peak_rss_bytes_max"] == 52_000_000
    assert lz4["records_s"] == approx(400_000.0)  # {500k, 250k, 400k}


def test_latency_percentiles_are_nearest_rank_as_in_the_bench_table(tables):
    from shallowmirror.bench.summary import percentile

    per_run = by(tables["run_latency"], "run_id")
    r0 = per_run["lz4-shallow-0"]  # samples 10, 20, 30, 40, 50 (n=5, ranks 1..5)
    assert r0["latency_samples"] == 5
    assert r0["latency_p50"] == approx(30.0)  # rank ceil(2.5) = 3
    assert r0["latency_p95"] == approx(50.0)  # rank ceil(4.75) = 5 (interpolation: 48)
    assert r0["latency_p99"] == approx(50.0)  # rank ceil(4.95) = 5
    assert r0["latency_max"] == approx(50.0)
    # Pooled over the ok lz4 shallow repeats: 5 10 15 20 30 40 50 100 (n=8, ranks 1..8);
    # the failed run's 100000 ms sample is left out (it would make p99 100000).
    pooled = by(tables["bench_summary"], "workload_id", "mode")[("lz4-200B-4p", "shallow")]
    assert pooled["latency_p50"] == approx(20.0)  # rank ceil(4) = 4 (interpolation: 25)
    assert pooled["latency_p95"] == approx(100.0)  # rank ceil(7.6) = 8
    assert pooled["latency_p99"] == approx(100.0)  # rank ceil(7.92) = 8
    # The same method as `shallowmirror bench`'s own table: the two never disagree.
    samples = [5, 10, 15, 20, 30, 40, 50, 100]
    assert (percentile(samples, 50), percentile(samples, 95)) == (20, 100)


def test_shallow_ratios_against_each_baseline(tables):
    r = by(tables["ratios"], "workload_id", "baseline_mode")
    assert set(r) == {("lz4-200B-4p", "deep-confluent"), ("lz4-200B-4p", "fetch-only"),
                      ("zstd-200B-4p", "deep-confluent")}
    deep = r[("lz4-200B-4p", "deep-confluent")]
    assert deep["cpu_per_gb_ratio"] == approx(50.0 / 3.0)  # 50 s/GB over the median 3 s/GB
    assert deep["peak_rss_ratio"] == approx(3.0)  # 150 MB / 50 MB
    assert deep["throughput_ratio"] == approx(2.0)  # shallow 80 MB/s over deep 40 MB/s
    assert r[("zstd-200B-4p", "deep-confluent")]["cpu_per_gb_ratio"] == approx(24.0)  # 120 / 5
    assert r[("zstd-200B-4p", "deep-confluent")]["peak_rss_ratio"] == approx(400 / 55)
    assert r[("lz4-200B-4p", "fetch-only")]["throughput_ratio"] == approx(0.64)  # 80 / 125


def test_goals_pass_or_miss_with_margin(tables):
    g = by(tables["goals"], "goal", "codec")
    # five checked goals; gzip was not benchmarked at all, so its CPU goal has no row
    assert len(g) == 5
    assert ("cpu_per_gb", "gzip") not in g
    lz4 = g[("cpu_per_gb", "lz4")]  # 16.67x against >= 10x
    assert (lz4["status"], lz4["margin"], lz4["margin_fraction"]) == (
        "PASS", approx(20 / 3), approx(2 / 3))
    zstd = g[("cpu_per_gb", "zstd")]  # 24x against >= 30x: missed by 6x, 20 % short
    assert (zstd["status"], zstd["threshold"], zstd["margin"], zstd["margin_fraction"]) == (
        "MISS", 30.0, approx(-6.0), approx(-0.2))
    flat = g[("shallow_rss_flat", "lz4,zstd")]  # medians 50 MB and 55 MB: max/min 1.1 <= 1.25
    assert (flat["status"], flat["measured"], flat["margin"]) == ("PASS", approx(1.1),
                                                                  approx(0.15))
    assert flat["scope"].startswith("value=200B batch=") and flat["scope"].endswith(
        "B partitions=4 records=1000000")
    # Two codecs: their correlation (1: ratio 2.5 -> 150 MB, 5.0 -> 400 MB) is no evidence.
    grows = g[("deep_rss_grows", "lz4,zstd")]
    assert (grows["status"], grows["measured"]) == ("NO DATA", None)
    assert grows["note"].startswith("needs 3 codecs or more")
    fetch = g[("fetch_only_throughput", "lz4")]  # 0.64 against >= 0.8: 20 % short
    assert (fetch["status"], fetch["margin"], fetch["margin_fraction"]) == (
        "MISS", approx(-0.16), approx(-0.2))


def test_failed_runs_are_listed(tables):
    failed = tables["failed_runs"]
    assert [(f["run_id"], f["error"]) for f in failed] == [("lz4-shallow-3", "target unreachable")]


def test_bench_progress_becomes_throughput_over_time(tables):
    rows = sorted((r for r in tables["bench_throughput_series"]
                   if r["run_id"] == "lz4-shallow-0"), key=lambda r: r["t_s"])
    # samples (t, records, bytes): (0,0,0) (0.5,200k,40MB) (1.5,700k,140MB) (2.0,1M,200MB)
    assert [r["t_s"] for r in rows] == [0.5, 1.5, 2.0]
    assert [r["mb_s_compressed"] for r in rows] == approx([80.0, 100.0, 120.0])  # 40/.5 100 60/.5
    assert [r["records_s"] for r in rows] == approx([400_000.0, 500_000.0, 600_000.0])
    rss = sorted((r for r in tables["bench_rss_series"] if r["run_id"] == "lz4-deep-0"),
                 key=lambda r: r["t_s"])
    assert [(r["t_s"], r["rss_bytes"]) for r in rss] == [
        (0.0, 100_000_000), (2.5, 150_000_000), (5.0, 140_000_000)]
    assert [r["run_t_s"] for r in rows] == [0.5, 1.5, 2.0]  # no start-up recorded
    # zstd-shallow-0 was ready 0.5 s after its start (startup_s) and has no [0, 0, 0] sample:
    # the target is empty until then, so the anchor is [0.5, 0, 0]; run_t_s counts from the
    # ready, as wall_s does, so the plot's "% of the run" ends at 100 %, not 125 %.
    zstd = sorted((r for r in tables["bench_throughput_series"]
                   if r["run_id"] == "zstd-shallow-0"), key=lambda r: r["t_s"])
    assert [(r["t_s"], r["run_t_s"], r["mb_s_compressed"]) for r in zstd] == [
        (1.0, 0.5, approx(100.0)), (2.0, 1.5, approx(50.0))]  # 50 MB / 0.5 s, 50 MB / 1 s
    # only the first ok repeat of each mode is plotted over time
    assert {r["run_id"] for r in tables["bench_rss_series"]} == {"lz4-shallow-0", "lz4-deep-0"}


def test_flow_windows(records):
    from shallowmirror.reports import jobs

    flow = jobs.flow_records(records)
    w1 = by(jobs.flow_windows(flow, 1.0).collect(), "topic", "window_start")
    # t1 records at 1000.25 (100 rec, 1000 B) and 1000.75 (300 rec, 3000 B) share [1000, 1001)
    first = w1[("t1", 1000.0)]
    assert (first["records"], first["compressed_bytes"], first["batches"]) == (400, 4000, 3)
    assert first["mb_s_compressed"] == approx(0.004)  # 4000 B / 1e6 / 1 s
    assert first["mb_s_uncompressed"] == approx(0.016)  # 16000 B
    assert first["records_s"] == approx(400.0)
    assert first["t_s"] == 0.0
    # [1001, 1002) holds one record whose uncompressed size is unknown: null, not 0
    assert w1[("t1", 1001.0)]["uncompressed_bytes"] is None
    assert w1[("t1", 1002.0)]["t_s"] == 2.0
    assert w1[("t2", 1000.0)]["records"] == 50
    w2 = by(jobs.flow_windows(flow, 2.0).collect(), "topic", "window_start")
    # 2 s windows: [1000, 1002) holds 600 records, 6000 B -> 300 rec/s, 0.003 MB/s
    assert w2[("t1", 1000.0)]["records_s"] == approx(300.0)
    assert w2[("t1", 1000.0)]["mb_s_compressed"] == approx(0.003)
    assert set(w2) == {("t1", 1000.0), ("t1", 1002.0), ("t2", 1000.0)}
    with pytest.raises(ValueError):
        jobs.flow_windows(flow, 0)


def test_flow_totals_and_latency(tables):
    t = by(tables["flow_totals"], "topic")
    t1 = t["t1"]
    # 1000 records, 10000 B between 1000.25 and 1002.25: span 2 s
    assert (t1["records"], t1["compressed_bytes"], t1["batches"], t1["span_s"]) == (
        1000, 10000, 5, 2.0)
    assert t1["mb_s_compressed"] == approx(0.005)
    assert t1["records_s"] == approx(500.0)
    assert t1["uncompressed_bytes"] is None  # one record did not know it
    # latency_ms 5 7 11 20 (ranks 1..4): p50 rank ceil(2) = 2: 7; p95, p99 rank 4: 20
    assert (t1["latency_p50"], t1["latency_p95"], t1["latency_p99"]) == (
        approx(7.0), approx(20.0), approx(20.0))
    assert t1["latency_max"] == approx(25.0)  # from latency_ms_max
    assert t1["final_offset_lag"] == 0  # lag of the latest record (1002.25)
    assert t["t2"]["mb_s_compressed"] is None  # one record: no span to divide by


def test_process_cpu_and_rss(tables):
    series = sorted(tables["process_series"], key=lambda r: r["time"])
    # cumulative cpu 1.5, 2.25, 3.0 at t = 0, 1, 3: cores 0.75 / 1 s, then 0.75 / 2 s
    assert [r["cpu_s"] for r in series] == approx([1.5, 2.25, 3.0])
    assert [r["cpu_cores"] for r in series] == [None, approx(0.75), approx(0.375)]
    assert [r["t_s"] for r in series] == [0.0, 1.0, 3.0]
    s = tables["process_summary"][0]
    assert (s["cpu_s"], s["peak_rss_bytes"], s["mean_cpu_cores"]) == (
        approx(1.5), 40_000_000, approx(0.5))
    per_gb = tables["engine_cpu_per_gb"][0]
    # 1.5 CPU s over 10500 B (10000 B of t1 + 500 B of t2)
    assert per_gb["cpu_s_per_gb_compressed"] == approx(1.5 / 10500e-9)
