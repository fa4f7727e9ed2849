"""Render the report: one self-contained HTML file (PNG plots inlined as base64) plus CSV/JSON.

Input is :class:`ReportData`: plain Python rows already computed by the Spark jobs, so rendering
needs neither Spark nor a display (matplotlib's Agg canvas through ``Figure``, never pyplot's
global state). Plots come first and tables after them, because a person compares bars faster than
numbers; every plot has its numbers in a table below it.

Out of scope: computing anything beyond formatting (see ``jobs.py``).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shallowmirror import metrics_schema as ms

Row = dict[str, Any]

#: One colour per mode, the same in every plot; shallow is the one to find first.
MODE_COLOURS = {
    "shallow": "#1b9e77",
    "fetch-only": "#7570b3",
    "deep-confluent": "#d95f02",
    "deep-kafka-python": "#e7298a",
    "external": "#666666",
    "mm2": "#e6ab02",
}
MODE_ORDER = ("fetch-only", "shallow", "deep-confluent", "deep-kafka-python", "mm2", "external")

#: Tables written as CSV next to the report (series included: they are what the plots show).
CSV_TABLES = (
    "goals", "ratios", "bench_summary", "bench_runs", "run_latency", "failed_runs",
    "bench_throughput_series", "bench_rss_series", "flow_totals", "flow_windows",
    "process_summary", "process_series", "engine_cpu_per_gb",
)
#: Tables in summary.json (the series stay in CSV: they can be long).
JSON_TABLES = (
    "goals", "ratios", "bench_summary", "failed_runs", "flow_totals", "process_summary",
    "engine_cpu_per_gb",
)

GOAL_TEXT = {
    "cpu_per_gb": "shallow needs at least {threshold:g}x less CPU per GB than deep-confluent",
    "shallow_rss_flat": "shallow peak RSS flat across codecs (max/min at most {threshold:g})",
    "deep_rss_grows": "deep-confluent peak RSS grows with the compression ratio "
                      "(correlation at least {threshold:g})",
    "fetch_only_throughput": "shallow throughput at least {threshold:g}x a fetch-only consumer",
}


@dataclass
class ReportData:
    """Everything the report shows, as rows of plain values (see ``report.py``)."""

    inputs: list[str]
    generated_at: str
    window_s: float
    malformed_lines: int = 0
    unknown_records: int = 0
    tables: dict[str, list[Row]] = field(default_factory=dict)

    def table(self, name: str) -> list[Row]:
        return self.tables.get(name, [])


# --- formatting ------------------------------------------------------------------------------

def _num(value: Any, digits: int = 3) -> str:
    """A number with ``digits`` significant digits, thousands separated; '–' when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1000:
        return f"{int(value):,}"
    magnitude = math.floor(math.log10(abs(value))) + 1 if value else 1
    decimals = max(0, digits - magnitude)
    return f"{value:,.{decimals}f}"


def _mb(value: Any) -> str:
    return "–" if value is None else _num(value / 1e6)


def _spread(row: Row, name: str, scale: float = 1.0) -> str:
    """Median with the [min – max] of the repeats when there is more than one."""
    med = row.get(name)
    if med is None:
        return "–"
    text = _num(med / scale)
    if row.get("runs", 1) > 1 and row.get(f"{name}_min") is not None:
        text += (f"<br><span class=spread>{_num(row[f'{name}_min'] / scale)} – "
                 f"{_num(row[f'{name}_max'] / scale)}</span>")
    return text


def goal_margin_text(goal: Row) -> str:
    """The measured value against the goal, and the headroom or by how much it was missed."""
    if goal.get("status") == "NO DATA":
        return goal.get("note") or "no runs to compare"
    measured, threshold = goal["measured"], goal["threshold"]
    margin, fraction = goal["margin"], goal.get("margin_fraction")
    correlation = goal["goal"] in ("deep_rss_grows",)
    unit = "" if correlation else "x"
    # The margin is a difference (24.0x against 30.0x: 6.00 short), not a ratio; a share of a
    # correlation's threshold means nothing.
    pct = f" ({abs(fraction):.0%})" if fraction is not None and not correlation else ""
    head = f"{_num(measured)}{unit} (goal {goal['comparison']} {_num(threshold)}{unit})"
    if goal["status"] == "PASS":
        return f"{head}: {_num(abs(margin))}{pct} to spare"
    word = "short" if goal["comparison"] == ">=" else "over"
    return f"{head}: {_num(abs(margin))}{pct} {word}"


GOAL_ORDER = ("cpu_per_gb", "shallow_rss_flat", "deep_rss_grows", "fetch_only_throughput")


def sort_goals(goals: Iterable[Row]) -> list[Row]:
    """Goals in the issue's order, then by codec."""
    return sorted(goals, key=lambda g: (
        GOAL_ORDER.index(g["goal"]) if g["goal"] in GOAL_ORDER else len(GOAL_ORDER),
        _codec_key(g.get("codec") or ""), g.get("scope") or ""))


def _codec_key(codec: str) -> tuple[int, str]:
    return (ms.CODECS.index(codec) if codec in ms.CODECS else len(ms.CODECS), codec)


def _mode_key(mode: str) -> tuple[int, str]:
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


# --- plots -----------------------------------------------------------------------------------

def _figure(width: float = 9.0, height: float = 4.0, ncols: int = 1, nrows: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat:
        ax.grid(True, axis="y", alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, axes


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _grouped_bars(summary: Sequence[Row], metric: str, ylabel: str, title: str,
                  scale: float = 1.0, log: bool | None = None,
                  markers: Sequence[tuple[str, str, str]] = ()) -> str | None:
    """Bars of ``metric`` (median, whiskers min..max) per workload (x) and mode (colour).

    ``markers`` are (column, matplotlib marker, label) drawn over each bar, e.g. p95 and p99
    over a p50 bar; with markers the whiskers are left out.
    """
    rows = [r for r in summary if r.get(metric) is not None]
    if not rows:
        return None
    workloads = sorted({(r["codec"], r["workload_id"]) for r in rows},
                       key=lambda cw: (_codec_key(cw[0]), cw[1]))
    modes = sorted({r["mode"] for r in rows}, key=_mode_key)
    index = {(r["workload_id"], r["mode"]): r for r in rows}
    values = [r[c] / scale for r in rows for c in (metric, *(m[0] for m in markers))
              if r.get(c) is not None]
    if log is None:  # deep mirroring can cost 100x shallow: one linear axis would hide shallow
        positive = [v for v in values if v > 0]
        log = bool(positive) and max(positive) / min(positive) > 30
    fig_width = max(6.0, 1.2 + 0.5 * len(workloads) * len(modes))
    fig, axes = _figure(width=fig_width, height=4.2)
    # Flat labels when each fits its workload's width (about 0.062 in a character at 8 pt),
    # slanted otherwise: 4 workloads of ~30 characters ran into each other flat.
    longest = max(len(wid) for _c, wid in workloads)
    rotate = longest * 0.062 > 0.9 * (fig_width - 1.2) / len(workloads)
    ax = axes[0][0]
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        xs, ys, lo, hi = [], [], [], []
        for x, (_codec, wid) in enumerate(workloads):
            r = index.get((wid, mode))
            if r is None:
                continue
            y = r[metric] / scale
            xs.append(x - 0.4 + width * (i + 0.5))
            ys.append(y)
            lo.append(y - (r.get(f"{metric}_min") if r.get(f"{metric}_min") is not None
                           else r[metric]) / scale)
            hi.append((r.get(f"{metric}_max") if r.get(f"{metric}_max") is not None
                       else r[metric]) / scale - y)
        bars = ax.bar(xs, ys, width * 0.95, label=mode, color=MODE_COLOURS.get(mode, "#999999"),
                      yerr=None if markers else [lo, hi], capsize=2,
                      error_kw={"elinewidth": 0.8, "alpha": 0.6})
        ax.bar_label(bars, labels=[_num(y, 2) for y in ys], fontsize=7, padding=2)
        for column, marker, label in markers:
            points = [(x, index[(wid, mode)].get(column))
                      for x, (_c, wid) in zip(xs, [w for w in workloads
                                                   if (w[1], mode) in index], strict=True)]
            points = [(x, v / scale) for x, v in points if v is not None]
            ax.scatter([x for x, _ in points], [v for _, v in points], marker=marker, s=30,
                       color="black", zorder=3, label=label if i == 0 else None)
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels([wid for _c, wid in workloads], rotation=25 if rotate else 0,
                       ha="right" if rotate else "center", rotation_mode="anchor", fontsize=8)
    if log:
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        # 0.1, 1, 10, 100 read faster than 10^-1, 10^0...
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.grid(True, axis="y", which="both", alpha=0.2)
    ax.margins(y=0.15)
    ax.set_ylabel(ylabel + (" (log scale)" if log else ""))
    ax.set_title(title, fontsize=11, loc="left")
    ax.legend(fontsize=8, frameon=False, ncols=min(len(modes), 5), loc="upper left",
              bbox_to_anchor=(0, -0.3) if rotate else (0, -0.12))
    return _png(fig)


def _run_t(row: Row) -> float:
    """Seconds since the mode was ready (``run_t_s``; older series only have ``t_s``)."""
    value = row.get("run_t_s")
    return float(row["t_s"] if value is None else value)


def _series_panels(series: Sequence[Row], y: str, ylabel: str, title: str,
                   panel_key: Callable[[Row], str], line_key: Callable[[Row], str],
                   colour: Callable[[str], str | None], scale: float = 1.0,
                   max_panels: int = 6, share_of_run: bool = False,
                   step_s: float | None = None) -> str | None:
    """Line plots of ``y`` over ``t_s``, one panel per ``panel_key``, one line per ``line_key``.

    With ``share_of_run`` the x axis is the percentage of each run's ``wall_s`` and the legend
    gives the run's length: a deep mirror may run 20x longer than a shallow one, and on one
    time axis the shallow line would shrink to a few pixels.

    With ``step_s`` each point is a window of that width starting at ``t_s``, drawn as a step
    over the whole window: a run that fits in one window is a level line, not a lone dot.
    """
    rows = [r for r in series if r.get(y) is not None and r.get("t_s") is not None]
    if share_of_run:
        # run_t_s counts from the mode's "ready", as wall_s does: 0-100 % is the mirroring;
        # start-up and the harness's wind-down after the last record are left out.
        # (Sample times are rounded to 1 ms: the last one may pass wall_s by that much.)
        rows = [{**r, "t_s": min(100.0, 100.0 * _run_t(r) / r["wall_s"])} for r in rows
                if r.get("wall_s") and 0.0 <= _run_t(r) <= r["wall_s"] * 1.01 + 0.002]
    if not rows:
        return None
    panels: dict[str, dict[str, list[Row]]] = {}
    for r in rows:
        panels.setdefault(panel_key(r), {}).setdefault(line_key(r), []).append(r)
    names = sorted(panels)[:max_panels]
    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig, axes = _figure(width=4.0 * ncols + 1, height=2.9 * nrows + 0.4, ncols=ncols,
                        nrows=nrows)
    for ax, name in zip(axes.flat, names, strict=False):
        for line, points in sorted(panels[name].items(), key=lambda kv: _mode_key(kv[0])):
            points.sort(key=lambda r: r["t_s"])
            label = f"{line} ({_num(points[0]['wall_s'], 2)} s)" if share_of_run else line
            xs, ys = [p["t_s"] for p in points], [p[y] / scale for p in points]
            if step_s:
                ax.plot(xs + [xs[-1] + step_s], ys + [ys[-1]], label=label, color=colour(line),
                        linewidth=1.4, drawstyle="steps-post")
                continue
            ax.plot(xs, ys, label=label,
                    color=colour(line), linewidth=1.4, marker="." if len(points) < 30 else None)
        ax.set_title(name, fontsize=9, loc="left")
        ax.set_xlabel("% of the run" if share_of_run else "seconds since start", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=7, frameon=False)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    # Wrapped to the figure's width: one panel is 5 inches, where a long title was cut off.
    fig.suptitle(textwrap.fill(title, max(40, int((4.0 * ncols + 1) * 11))), fontsize=11,
                 x=0.01, ha="left")
    return _png(fig)


def _process_plot(series: Sequence[Row]) -> str | None:
    """CPU cores in use and RSS over time, one line per (run, pid)."""
    rows = [r for r in series if r.get("t_s") is not None]
    if not rows:
        return None
    fig, axes = _figure(width=10.0, height=3.4, ncols=2)
    lines: dict[str, list[Row]] = {}
    for r in rows:
        lines.setdefault(f"{r['run_id']} pid {r['pid']}", []).append(r)
    for name, points in sorted(lines.items()):
        points.sort(key=lambda r: r["t_s"])
        cores = [p for p in points if p.get("cpu_cores") is not None]
        # A short run has a sample or two: markers keep them visible.
        marker = "." if len(points) < 30 else None
        axes[0][0].plot([p["t_s"] for p in cores], [p["cpu_cores"] for p in cores], label=name,
                        marker=marker)
        axes[0][1].plot([p["t_s"] for p in points],
                        [(p["rss_bytes"] or 0) / 1e6 for p in points], label=name,
                        marker=marker)
    axes[0][0].set_ylabel("CPU cores in use")
    axes[0][1].set_ylabel("RSS (MB)")
    for ax, title in zip(axes[0], ("Engine CPU", "Engine memory"), strict=True):
        ax.set_title(title, fontsize=11, loc="left")
        ax.set_xlabel("seconds since first sample", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, frameon=False)
    return _png(fig)


# --- tables ----------------------------------------------------------------------------------

Column = tuple[str, Callable[[Row], str]]


def _table(rows: Iterable[Row], columns: Sequence[Column], css: str = "") -> str:
    head = "".join(f"<th>{html.escape(title)}</th>" for title, _ in columns)
    body = []
    for row in rows:
        cells = "".join(f"<td>{cell(row)}</td>" for _, cell in columns)
        body.append(f"<tr>{cells}</tr>")
    return (f"<table class='{css}'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def _f(name: str, fmt: Callable[[Any], str] = _num) -> Callable[[Row], str]:
    return lambda r: fmt(r.get(name))


def _esc(name: str) -> Callable[[Row], str]:
    return lambda r: html.escape("–" if r.get(name) is None else str(r.get(name)))


def _span_cell(row: Row) -> str:
    """A flow's seconds from its first to its last metrics record; '–' when they are one
    record time (0 s beside a records/s line contradicted the over-time panel)."""
    span = row.get("span_s")
    return "–" if not span else _num(span)


def instant_flows_note(rows: list[Row]) -> str | None:
    """What to say of flows whose records all came at one time: a run shorter than one metrics
    interval has no measurable duration, so the table leaves its seconds and rates out."""
    instant = [r for r in rows if not r.get("span_s") and r.get("records")]
    if not instant:
        return None
    names = ", ".join(f"run {r.get('run_id')} flow {r.get('flow')} topic {r.get('topic')}"
                      for r in instant[:5]) + (f" and {len(instant) - 5} more"
                                               if len(instant) > 5 else "")
    return (f"{names}: every record was reported at one time (the run was shorter than one "
            "metrics.interval.ms), so its duration and throughput are unknown here; the panel "
            "over time shows its records in a single window.")


def _error_cell(row: Row) -> str:
    """A failed run's error: what the harness saw, then the mode's stderr tail folded away
    under its last line (a traceback's exception), which is what says why; the whole tail in
    one unwrapped cell ran off the page."""
    error = str(row.get("error") or "–")
    head, _, tail = error.partition(ms.STDERR_TAIL)
    text = f"<div>{html.escape(head)}</div>"
    lines = [line for line in tail.strip().splitlines() if line.strip()]
    if lines:
        text += (f"<details><summary>{html.escape(lines[-1].strip())}</summary>"
                 f"<pre>{html.escape(tail.strip())}</pre></details>")
    return text


def _goal_table(goals: Sequence[Row]) -> str:
    def status(r: Row) -> str:
        s = r["status"]
        return f"<span class='badge {s.replace(' ', '-').lower()}'>{s}</span>"

    def text(r: Row) -> str:
        template = GOAL_TEXT.get(r["goal"], r["goal"])
        return html.escape(template.format(threshold=r.get("threshold") or 0))

    return _table(goals, [
        ("", status), ("goal", text), ("workload / shape", _esc("scope")),
        ("codec(s)", _esc("codec")), ("result", lambda r: html.escape(goal_margin_text(r))),
    ], css="goals")


def _sorted_summary(rows: Sequence[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (_codec_key(r["codec"] or ""), r["workload_id"] or "",
                                       _mode_key(r["mode"] or "")))


# --- the page --------------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1150px; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.1em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.meta { color: #666; font-size: 12px; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 12.5px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: right;
         vertical-align: top; }
td { white-space: nowrap; }
th { background: #f6f6f6; font-weight: 600; }
td:first-child, th:first-child { text-align: left; }
table.goals td, table.goals th { text-align: left; white-space: normal; }
table.failed td, table.failed th { text-align: left; white-space: normal; max-width: 760px; }
table.failed pre { white-space: pre-wrap; word-break: break-word; font-size: 11px; }
table.failed summary { cursor: pointer; color: #a33; }
.badge { white-space: nowrap; }
.spread { color: #888; font-size: 11px; }
.badge { font-weight: 700; padding: 1px 7px; border-radius: 3px; color: white; }
.badge.pass { background: #1b9e77; } .badge.miss { background: #c0392b; }
.badge.no-data { background: #999; }
img.plot { display: block; max-width: 100%; margin: 0.8em 0; }
.warn { background: #fff4e0; border-left: 4px solid #e67e22; padding: 0.4em 0.8em; }
.note { color: #555; font-size: 12.5px; }
"""


def render_html(data: ReportData) -> tuple[str, int]:
    """The report page, and how many plots it embeds."""
    plots = 0
    parts: list[str] = []

    def plot(png: str | None, alt: str) -> None:
        nonlocal plots
        if png:
            plots += 1
            parts.append(f"<img class=plot alt='{html.escape(alt)}' "
                         f"src='data:image/png;base64,{png}'>")

    summary = _sorted_summary(data.table("bench_summary"))
    inputs = ", ".join(html.escape(p) for p in data.inputs)
    parts.append(f"""<h1>shallowmirror report</h1>
<p class=meta>generated {html.escape(data.generated_at)} · inputs: {inputs} ·
throughput window {data.window_s:g} s · MB = 10<sup>6</sup> bytes, GB = 10<sup>9</sup> bytes,
CPU = user + system seconds</p>""")
    if data.malformed_lines or data.unknown_records:
        parts.append(f"<p class=warn>Skipped {data.malformed_lines} line(s) that were not JSON "
                     f"and {data.unknown_records} record(s) of an unknown kind.</p>")

    if data.table("goals"):
        parts.append("<h2>Goals</h2>")
        parts.append(_goal_table(sort_goals(data.table("goals"))))

    if summary:
        parts.append("<h2>Benchmarks: shallow against deep mirroring</h2>")
        parts.append("<p class=note>Bars are the median of the repeats; whiskers span min to "
                     "max.</p>")
        plot(_grouped_bars(summary, "cpu_s_per_gb_compressed", "CPU seconds per GB compressed",
                           "CPU per GB moved, by codec and mode (lower is better)"),
             "CPU per GB by codec and mode")
        plot(_grouped_bars(summary, "mb_s_compressed", "MB/s compressed",
                           "Throughput, by codec and mode (higher is better)", log=False),
             "throughput by codec and mode")
        plot(_grouped_bars(summary, "peak_rss_bytes", "peak RSS (MB)",
                           "Peak memory, by codec and mode", scale=1e6, log=False),
             "peak RSS by codec and mode")
        plot(_series_panels(
            data.table("bench_throughput_series"), "mb_s_compressed", "MB/s compressed",
            "Throughput over each run (first repeat of each mode; run length in the legend)",
            panel_key=lambda r: r["workload_id"], line_key=lambda r: r["mode"], share_of_run=True,
            colour=lambda m: MODE_COLOURS.get(m)), "throughput over time")
        plot(_series_panels(
            data.table("bench_rss_series"), "rss_bytes", "RSS (MB)",
            "Memory over each run (first repeat of each mode)", scale=1e6,
            panel_key=lambda r: r["workload_id"], line_key=lambda r: r["mode"], share_of_run=True,
            colour=lambda m: MODE_COLOURS.get(m)), "memory over time")
        plot(_grouped_bars(summary, "latency_p50", "end-to-end latency (ms)",
                           "Latency: bar = p50, dash = p95, triangle = p99 (lower is better)",
                           markers=(("latency_p95", "_", "p95"), ("latency_p99", "v", "p99"))),
             "latency percentiles by codec and mode")

        parts.append("<h3>Per workload and mode</h3><p class=note>Median of the ok repeats; "
                     "below it, in grey, min – max when there were several.</p>")
        parts.append(_table(summary, [
            ("workload", _esc("workload_id")), ("codec", _esc("codec")), ("mode", _esc("mode")),
            ("runs", _f("runs")),
            ("MB/s compr.", lambda r: _spread(r, "mb_s_compressed")),
            ("MB/s uncompr.", lambda r: _spread(r, "mb_s_uncompressed")),
            ("records/s", lambda r: _spread(r, "records_s")),
            ("CPU s/GB compr.", lambda r: _spread(r, "cpu_s_per_gb_compressed")),
            ("CPU s/GB uncompr.", lambda r: _spread(r, "cpu_s_per_gb_uncompressed")),
            ("peak RSS MB", lambda r: _spread(r, "peak_rss_bytes", 1e6)),
            ("compr. ratio", _f("compression_ratio")),
            ("p50 ms", _f("latency_p50")), ("p95 ms", _f("latency_p95")),
            ("p99 ms", _f("latency_p99")),
        ], css="summary"))
        ratios = sorted(data.table("ratios"), key=lambda r: (
            _codec_key(r["codec"]), r["workload_id"], _mode_key(r["baseline_mode"])))
        if ratios:
            parts.append("<h3>Shallow against each baseline</h3><p class=note>CPU/GB and RSS: "
                         "baseline ÷ shallow (how many times less shallow needs); throughput: "
                         "shallow ÷ baseline.</p>")
            parts.append(_table(ratios, [
                ("workload", _esc("workload_id")), ("codec", _esc("codec")),
                ("baseline", _esc("baseline_mode")),
                ("CPU/GB ×", _f("cpu_per_gb_ratio")), ("peak RSS ×", _f("peak_rss_ratio")),
                ("throughput ×", _f("throughput_ratio")),
                ("shallow CPU s/GB", _f("shallow_cpu_s_per_gb_compressed")),
                ("baseline CPU s/GB", _f("baseline_cpu_s_per_gb_compressed")),
            ], css="ratios"))
    if data.table("failed_runs"):
        parts.append("<h3>Failed runs (left out of every number above)</h3>")
        parts.append(_table(data.table("failed_runs"), [
            ("run", _esc("run_id")), ("workload", _esc("workload_id")), ("mode", _esc("mode")),
            ("repeat", _f("repeat")), ("error", _error_cell),
        ], css="failed"))

    if data.table("flow_totals") or data.table("process_summary"):
        parts.append("<h2>Engine metrics</h2>")
        plot(_series_panels(
            data.table("flow_windows"), "records_s", "records/s",
            f"Engine throughput over time (records/s, {data.window_s:g} s windows)",
            panel_key=lambda r: f"run {r['run_id']}", line_key=lambda r: r["flow"],
            colour=lambda _f: None, step_s=data.window_s), "engine throughput over time")
        plot(_process_plot(data.table("process_series")), "engine CPU and memory over time")
        if data.table("flow_totals"):
            parts.append("<h3>Per flow and topic</h3>")
            parts.append(_table(sorted(data.table("flow_totals"), key=lambda r: (
                r["run_id"] or "", r["flow"] or "", r["topic"] or "")), [
                ("run", _esc("run_id")), ("flow", _esc("flow")), ("topic", _esc("topic")),
                ("mode", _esc("modes")), ("codec", _esc("codecs")), ("records", _f("records")),
                ("MB compr.", _f("compressed_bytes", _mb)), ("seconds", _span_cell),
                ("MB/s compr.", _f("mb_s_compressed")), ("records/s", _f("records_s")),
                ("p50 ms", _f("latency_p50")), ("p95 ms", _f("latency_p95")),
                ("p99 ms", _f("latency_p99")), ("max ms", _f("latency_max")),
                ("final lag", _f("final_offset_lag")),
            ]))
            note = instant_flows_note(data.table("flow_totals"))
            if note:
                parts.append(f"<p class=note>{html.escape(note)}</p>")
        if data.table("engine_cpu_per_gb") or data.table("process_summary"):
            per_gb = {(r["run_id"], r["pid"]): r for r in data.table("engine_cpu_per_gb")}
            rows = [{**r, **per_gb.get((r["run_id"], r["pid"]), {})}
                    for r in data.table("process_summary")]
            parts.append("<h3>Per process</h3>")
            parts.append(_table(rows, [
                ("run", _esc("run_id")), ("pid", _esc("pid")), ("samples", _f("samples")),
                ("CPU s", _f("cpu_s")), ("mean cores", _f("mean_cpu_cores")),
                ("peak RSS MB", _f("peak_rss_bytes", _mb)),
                ("CPU s/GB compr.", _f("cpu_s_per_gb_compressed")),
                ("CPU s/GB uncompr.", _f("cpu_s_per_gb_uncompressed")),
            ]))

    if not summary and not data.table("flow_totals") and not data.table("process_summary"):
        if data.table("failed_runs"):
            parts.append("<p class=warn>Every benchmark run in the inputs failed (listed "
                         "above): nothing was measured.</p>")
        else:
            parts.append("<p class=warn>The inputs hold no benchmark runs and no engine "
                         "metrics.</p>")
    page = (f"<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>shallowmirror report</title><style>{_CSS}</style></head><body>"
            f"{''.join(parts)}</body></html>")
    return page, plots


# --- files -----------------------------------------------------------------------------------

def _csv_value(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def write_csv(path: Path, rows: Sequence[Row]) -> None:
    """Rows as CSV with a header of every key seen (first-seen order); nulls as empty cells."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(keys))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(v) for k, v in row.items()})


def _json_safe(value: Any) -> Any:
    """NaN and infinity are not JSON: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


@dataclass(frozen=True)
class ReportFiles:
    """Where the report went, and what it was made of."""

    html: Path
    summary_json: Path
    csv: dict[str, Path]
    plots: int
    data: ReportData

    @property
    def measured_nothing(self) -> bool:
        """Only failed benchmark runs: a report, but no figure in it."""
        d = self.data
        return bool(d.table("failed_runs")) and not (
            d.table("bench_summary") or d.table("flow_totals") or d.table("process_summary"))


def write_report(data: ReportData, out_dir: Path) -> ReportFiles:
    """Write ``report.html``, ``summary.json`` and one CSV per non-empty table into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    page, plots = render_html(data)
    html_path = out_dir / "report.html"
    html_path.write_text(page, encoding="utf-8")
    csvs: dict[str, Path] = {}
    for name in CSV_TABLES:
        rows = data.table(name)
        if rows:
            csvs[name] = out_dir / f"{name}.csv"
            write_csv(csvs[name], rows)
    summary = {
        "generated_at": data.generated_at,
        "inputs": data.inputs,
        "window_s": data.window_s,
        "units": {"MB": 1e6, "GB": 1e9, "cpu": "user + system seconds", "latency": "ms"},
        "malformed_lines": data.malformed_lines,
        "unknown_records": data.unknown_records,
        **{name: data.table(name) for name in JSON_TABLES},
    }
    json_path = out_dir / "summary.json"
    json_path.write_text(json.dumps(_json_safe(summary), indent=2, default=str),
                         encoding="utf-8")
    return ReportFiles(html=html_path, summary_json=json_path, csv=csvs, plots=plots, data=data)
