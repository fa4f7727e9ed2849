"""Medians, spreads and ratios over ``bench_run`` records, and the table the CLI prints.

Per (workload, mode), over the ok repeats: median and min..max of MB/s (compressed source bytes
per wall second), CPU seconds per compressed GB (1e9 bytes) (user + sys of the mode's process tree), peak RSS,
and latency p50/p99 over all samples. Ratios per workload: deep CPU/GB over shallow CPU/GB, and
shallow MB/s over fetch-only MB/s (the issue's goals).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class Row:
    workload_id: str
    codec: str
    mode: str
    runs: int
    failed: int
    mb_s: float | None
    mb_s_min: float | None
    mb_s_max: float | None
    cpu_s_per_gb: float | None
    cpu_min: float | None
    cpu_max: float | None
    peak_rss_mb: float | None
    wall_s: float | None
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    compression_ratio: float | None


def run_metrics(record: dict) -> dict | None:
    """MB/s, CPU s per GB and peak RSS MB of one ok record; None if it failed."""
    if not record.get("ok") or not record.get("wall_s") or not record.get("compressed_bytes"):
        return None
    gb = record["compressed_bytes"] / 1e9
    cpu = (record.get("cpu_user_s") or 0.0) + (record.get("cpu_sys_s") or 0.0)
    return {
        "mb_s": record["compressed_bytes"] / 1e6 / record["wall_s"],
        "cpu_s_per_gb": cpu / gb,
        "peak_rss_mb": (record.get("peak_rss_bytes") or 0) / 1e6,
        "wall_s": record["wall_s"],
    }


#: Below this much CPU (user + sys, seconds) a run's CPU per GB is mostly the clock's 10 ms
#: ticks: 0.1 s of CPU is 10 ticks, +-10%, enough to put shallow above deep.
MIN_RELIABLE_CPU_S = 0.5
#: Below this wall time a run's MB/s is mostly start and end effects (the first fetch, the last
#: acknowledgement, the 20 ms end probe).
MIN_RELIABLE_WALL_S = 1.0


def short_runs(records: Iterable[dict]) -> list[str]:
    """One line per (workload, mode) whose ok runs were too short to measure: CPU under
    ``MIN_RELIABLE_CPU_S`` or wall time under ``MIN_RELIABLE_WALL_S`` (median of the runs)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r.get("kind", "bench_run") == "bench_run" and run_metrics(r):
            groups.setdefault((r["workload_id"], r["mode"]), []).append(r)
    lines = []
    for (workload_id, mode), runs in groups.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        cpu = statistics.median((r.get("cpu_user_s") or 0.0) + (r.get("cpu_sys_s") or 0.0)
                                for r in runs)
        if cpu < MIN_RELIABLE_CPU_S or wall < MIN_RELIABLE_WALL_S:
            lines.append(f"{mode} on {workload_id}: {wall:.2f} s and {cpu:.2f} CPU s per run "
                         f"(median), too short for its MB/s and CPU per GB to mean much (at "
                         f"least {MIN_RELIABLE_WALL_S:.0f} s and {MIN_RELIABLE_CPU_S} CPU s); "
                         "give it more records")
    return lines


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) — exact on the samples, no interpolation."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def rows(records: Iterable[dict]) -> list[Row]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r.get("kind", "bench_run") == "bench_run":
            groups.setdefault((r["workload_id"], r["mode"]), []).append(r)
    out = []
    for (workload_id, mode), runs in groups.items():
        metrics = [m for m in map(run_metrics, runs) if m]
        latencies = [x for r in runs if r.get("ok") for x in r.get("latency_ms_samples") or ()]

        def med(key: str, metrics=metrics):
            return statistics.median(m[key] for m in metrics) if metrics else None

        def lo(key: str, metrics=metrics):
            return min(m[key] for m in metrics) if metrics else None

        def hi(key: str, metrics=metrics):
            return max(m[key] for m in metrics) if metrics else None

        first = runs[0]
        ratio = (first["uncompressed_bytes"] / first["compressed_bytes"]
                 if first.get("uncompressed_bytes") and first.get("compressed_bytes") else None)
        out.append(Row(workload_id, first["workload"]["codec"], mode, len(runs),
                       len(runs) - len(metrics), med("mb_s"), lo("mb_s"), hi("mb_s"),
                       med("cpu_s_per_gb"), lo("cpu_s_per_gb"), hi("cpu_s_per_gb"),
                       med("peak_rss_mb"), med("wall_s"), percentile(latencies, 50),
                       percentile(latencies, 99), ratio))
    return out


def ratios(table: list[Row]) -> list[dict]:
    """Per workload: deep/shallow CPU per GB, shallow/fetch-only MB/s, deep/shallow peak RSS."""
    by = {(r.workload_id, r.mode): r for r in table}
    out = []
    for workload_id in dict.fromkeys(r.workload_id for r in table):
        shallow = by.get((workload_id, "shallow"))
        item: dict = {"workload_id": workload_id}
        for mode in ("deep-confluent", "deep-kafka-python", "mm2", "external"):
            other = by.get((workload_id, mode))
            if shallow and other and shallow.cpu_s_per_gb and other.cpu_s_per_gb:
                item[f"cpu_{mode}_over_shallow"] = other.cpu_s_per_gb / shallow.cpu_s_per_gb
            if shallow and other and shallow.peak_rss_mb and other.peak_rss_mb:
                item[f"rss_{mode}_over_shallow"] = other.peak_rss_mb / shallow.peak_rss_mb
        fetch = by.get((workload_id, "fetch-only"))
        if shallow and fetch and shallow.mb_s and fetch.mb_s:
            item["shallow_over_fetch_only_mb_s"] = shallow.mb_s / fetch.mb_s
        if len(item) > 1:
            out.append(item)
    return out


def _f(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def format_table(table: list[Row]) -> str:
    """A plain-text (Markdown-compatible) table, one line per workload and mode."""
    head = ("| workload | ratio | mode | runs | MB/s compressed (min..max) | CPU s/GB (min..max) "
            "| peak RSS MB | lat p50/p99 ms |")
    lines = [head, "|" + "---|" * 8]
    for r in table:
        failed = f" ({r.failed} failed)" if r.failed else ""
        lines.append(
            f"| {r.workload_id} | {_f(r.compression_ratio, '{:.2f}x')} | {r.mode} "
            f"| {r.runs}{failed} "
            f"| {_f(r.mb_s)} ({_f(r.mb_s_min)}..{_f(r.mb_s_max)}) "
            f"| {_f(r.cpu_s_per_gb)} ({_f(r.cpu_min)}..{_f(r.cpu_max)}) "
            f"| {_f(r.peak_rss_mb, '{:.0f}')} "
            f"| {_f(r.latency_p50_ms)}/{_f(r.latency_p99_ms)} |")
    return "\n".join(lines)


def format_ratios(items: list[dict]) -> str:
    lines = []
    for item in items:
        parts = [f"{k}={v:.2f}x" for k, v in item.items() if k != "workload_id"]
        lines.append(f"{item['workload_id']}: " + ", ".join(parts))
    return "\n".join(lines)
