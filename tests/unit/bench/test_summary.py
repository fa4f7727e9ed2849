"""Summary table and goal ratios from hand-made bench_run records (numbers checked by hand)."""

from __future__ import annotations

from shallowmirror.bench.summary import (
    format_table,
    percentile,
    ratios,
    rows,
    run_metrics,
    short_runs,
)


def _run(mode, wall_s, cpu_s, rss, *, ok=True, latency=(), workload_id="lz4-w", codec="lz4"):
    return {"kind": "bench_run", "workload_id": workload_id, "mode": mode, "ok": ok,
            "workload": {"codec": codec}, "wall_s": wall_s, "cpu_user_s": cpu_s * 0.75,
            "cpu_sys_s": cpu_s * 0.25, "peak_rss_bytes": rss, "compressed_bytes": 500_000_000,
            "uncompressed_bytes": 1_500_000_000, "latency_ms_samples": list(latency)}


def test_run_metrics_per_compressed_gb():
    m = run_metrics(_run("shallow", 5.0, 1.0, 80_000_000))
    assert m == {"mb_s": 100.0, "cpu_s_per_gb": 2.0, "peak_rss_mb": 80.0, "wall_s": 5.0}
    assert run_metrics(_run("shallow", 5.0, 1.0, 1, ok=False)) is None


def test_medians_spread_failures_and_ratios():
    records = [
        _run("shallow", 5.0, 1.0, 80e6, latency=[10, 20]),
        _run("shallow", 4.0, 1.5, 90e6, latency=[30]),
        _run("shallow", 10.0, 0.5, 70e6),
        _run("shallow", 1.0, 0.1, 1, ok=False),
        _run("deep-confluent", 10.0, 30.0, 400e6),
        _run("fetch-only", 4.0, 0.5, 50e6),
    ]
    table = {r.mode: r for r in rows(records)}
    s = table["shallow"]
    assert (s.runs, s.failed) == (4, 1)
    assert s.mb_s == 100.0 and (s.mb_s_min, s.mb_s_max) == (50.0, 125.0)
    assert s.cpu_s_per_gb == 2.0 and (s.cpu_min, s.cpu_max) == (1.0, 3.0)
    assert s.peak_rss_mb == 80.0
    assert (s.latency_p50_ms, s.latency_p99_ms) == (20, 30)
    assert s.compression_ratio == 3.0
    (r,) = ratios(list(table.values()))
    assert r["cpu_deep-confluent_over_shallow"] == 30.0  # 60 s/GB over 2 s/GB
    assert r["rss_deep-confluent_over_shallow"] == 5.0
    assert r["shallow_over_fetch_only_mb_s"] == 0.8      # 100 MB/s over 125 MB/s
    text = format_table(list(table.values()))
    assert "| lz4-w | 3.00x | shallow | 4 (1 failed) | 100.0 (50.0..125.0) | 2.0 (1.0..3.0) | 80 |" in text


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([7], 99) == 7


def test_runs_too_short_to_measure_are_named():
    """A bench of a few thousand records printed CPU per GB from a few 10 ms ticks, and could
    put shallow above deep, with no word that the figures were noise."""
    records = [
        _run("shallow", 0.3, 0.08, 1), _run("shallow", 0.4, 0.1, 1),
        _run("deep-confluent", 2.0, 1.2, 1),              # long enough
        _run("fetch-only", 5.0, 0.2, 1),                  # long, but 20 ticks of CPU
        _run("mm2", 0.1, 0.05, 1, ok=False),              # failed: nothing to judge
    ]
    lines = short_runs(records)
    assert len(lines) == 2, lines
    assert lines[0].startswith("shallow on lz4-w: 0.35 s and 0.09 CPU s per run (median)")
    assert lines[1].startswith("fetch-only on lz4-w: 5.00 s and 0.20 CPU s")
    assert "give it more records" in lines[0]
