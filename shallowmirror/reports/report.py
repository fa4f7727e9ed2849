"""`run_report`: find the JSON-lines inputs, run the Spark jobs, write the HTML/CSV/JSON report.

The jobs (``jobs.py``) build query plans; this module runs them, collects their (small) results
into plain rows and hands them to ``html.py``. Inputs are files or directories; a directory
contributes every ``*.jsonl`` file below it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shallowmirror import metrics_schema as ms
from shallowmirror.errors import ShallowMirrorError
from shallowmirror.output_paths import dir_problem
from shallowmirror.reports.html import ReportData, ReportFiles, Row, write_report

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


class ReportUsageError(ShallowMirrorError):
    """What was asked cannot be: an input, ``--out`` or an option value (the CLI's exit status
    2, as for its other usage errors; 1 is for a report that could not be made)."""


def find_inputs(paths: Iterable[str | Path]) -> list[Path]:
    """The JSON-lines files named by ``paths`` (files as given, directories searched for *.jsonl)."""
    found: list[Path] = []
    missing: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*.jsonl") if p.is_file()))
        elif path.is_file():
            found.append(path)
        else:
            missing.append(str(path))
    if missing:
        raise ReportUsageError("report inputs not found: " + ", ".join(missing))
    if not found:
        raise ReportUsageError(
            "no *.jsonl metrics files in " + ", ".join(str(p) for p in paths))
    return found


def _rows(df: DataFrame) -> list[Row]:
    return [r.asDict(recursive=True) for r in df.collect()]


def _first_ok_runs(runs: Sequence[Row]) -> set[str]:
    """The run id of the lowest ok repeat per (workload, mode): the one plotted over time."""
    first: dict[tuple[Any, Any], Row] = {}
    for r in runs:
        key = (r["workload_id"], r["mode"])
        if r["ok"] and (key not in first or (r["repeat"] or 0) < (first[key]["repeat"] or 0)):
            first[key] = r
    return {r["run_id"] for r in first.values()}


def _goals_without_data(goals: list[Row], summary: Sequence[Row]) -> list[Row]:
    """Rows saying which goals could not be checked, and what runs they need."""
    from shallowmirror.reports import jobs

    if not summary:
        return []
    extra: list[Row] = []
    checked = {(g["goal"], g["codec"]) for g in goals}
    # A codec that was not benchmarked at all is not a missing measurement: no row for it.
    benchmarked = {r.get("codec") for r in summary}
    for codec, threshold in jobs.CPU_RATIO_GOALS.items():
        if ("cpu_per_gb", codec) not in checked and codec in benchmarked:
            extra.append({"goal": "cpu_per_gb", "codec": codec, "threshold": threshold,
                          "status": "NO DATA", "comparison": ">=",
                          "note": f"needs ok shallow and deep-confluent runs of {codec}"})
    needs = {
        "shallow_rss_flat": (jobs.RSS_FLAT_MAX_RATIO, "<=",
                             "needs ok shallow runs of one workload shape in 2+ codecs"),
        "deep_rss_grows": (jobs.DEEP_RSS_MIN_CORRELATION, ">=",
                           "needs ok deep-confluent runs of one workload shape in 2+ codecs"),
        "fetch_only_throughput": (jobs.FETCH_ONLY_MIN_RATIO, ">=",
                                  "needs ok shallow and fetch-only runs of one workload"),
    }
    for goal, (threshold, comparison, note) in needs.items():
        if not any(g["goal"] == goal for g in goals):
            extra.append({"goal": goal, "codec": None, "threshold": threshold,
                          "status": "NO DATA", "comparison": comparison, "note": note})
    return extra


def _bench_tables(runs: DataFrame) -> dict[str, list[Row]]:
    """The benchmark tables: per run, per workload and mode, ratios, goals and series."""
    from shallowmirror.reports import jobs

    metrics = jobs.run_metrics(runs).cache()
    summary = jobs.repeat_summary(metrics, runs).cache()
    ratios = jobs.shallow_ratios(summary).cache()
    tables: dict[str, list[Row]] = {
        "bench_runs": _rows(metrics),
        "bench_summary": _rows(summary),
        "ratios": _rows(ratios),
    }
    goals = _rows(jobs.goals(summary, ratios)) if tables["bench_summary"] else []
    tables["goals"] = goals + _goals_without_data(goals, tables["bench_summary"])
    tables["run_latency"] = _rows(jobs.run_latency(runs))
    tables["failed_runs"] = _rows(jobs.failed_runs(metrics))
    plotted = _first_ok_runs(tables["bench_runs"])
    tables["bench_throughput_series"] = [
        r for r in _rows(jobs.bench_throughput_series(runs)) if r["run_id"] in plotted]
    tables["bench_rss_series"] = [
        r for r in _rows(jobs.bench_rss_series(runs)) if r["run_id"] in plotted]
    return tables


def compute(spark: SparkSession, inputs: Sequence[Path], window_s: float = 1.0) -> ReportData:
    """Run every job over ``inputs`` and collect the results as plain rows."""
    from pyspark.sql import functions as F

    from shallowmirror.reports import jobs

    log.info("reading the records and finding their kinds")
    records = jobs.read_records(spark, [str(p) for p in inputs]).cache()
    tables: dict[str, list[Row]] = {}
    try:
        bad = jobs.malformed_count(records).first()
        # Every Spark job costs a second or more even on tiny inputs: run only the jobs whose
        # kind of record is present.
        kinds = {r["kind"] for r in records.select("kind").where(F.col("kind").isNotNull())
                 .distinct().collect()}
        if ms.BENCH_RUN in kinds:
            log.info("computing the tables of the benchmark runs")
            tables.update(_bench_tables(jobs.bench_runs(records).cache()))
        flow = jobs.flow_records(records).cache()
        if ms.FLOW in kinds:
            log.info("computing the mirror flows' throughput")
            tables["flow_totals"] = _rows(jobs.flow_totals(flow))
            tables["flow_windows"] = _rows(
                jobs.flow_windows(flow, window_s, by=("run_id", "flow")))
        if ms.PROCESS in kinds:
            log.info("computing the processes' CPU and memory")
            process = jobs.process_records(records)
            processes = jobs.process_summary(process).cache()
            tables["process_summary"] = _rows(processes)
            tables["process_series"] = _rows(jobs.process_series(process))
            if ms.FLOW in kinds:
                tables["engine_cpu_per_gb"] = _rows(jobs.engine_cpu_per_gb(processes, flow))
    finally:
        spark.catalog.clearCache()
    return ReportData(
        inputs=[str(p) for p in inputs],
        generated_at=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        window_s=window_s,
        malformed_lines=int(bad.malformed_lines or 0) if bad else 0,
        unknown_records=int(bad.unknown_records or 0) if bad else 0,
        tables=tables,
    )


#: A line that may be a record the report shows (a benchmark run, a flow, a process).
_REPORTED_KIND = re.compile(
    rb'"kind"\s*:\s*"(' + b"|".join(re.escape(k.encode()) for k in (ms.FLOW, ms.PROCESS,
                                                                 ms.BENCH_RUN)) + rb')"')


def _may_hold_records(files: Sequence[Path]) -> bool:
    """Whether any line of ``files`` names a reported kind: read until the first one (at
    once for real inputs), to the end only for inputs that hold none."""
    for path in files:
        with open(path, "rb") as lines:
            if any(_REPORTED_KIND.search(line) for line in lines):
                return True
    return False


def _lines(files: Sequence[Path]) -> Iterator[tuple[Path, int, bool, bool]]:
    """(file, line number, a JSON object?, the file's last line cut short?) of every non-blank
    line of ``files``, as the Spark job tells JSON objects from the rest."""
    import json

    for path in files:
        with open(path, "rb") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    is_object = isinstance(json.loads(line), dict)
                except ValueError:
                    is_object = False
                yield path, number, is_object, not line.endswith(b"\n")


def _count_unreportable(files: Sequence[Path]) -> tuple[int, int]:
    """(lines that are not JSON objects, JSON objects of another kind) in ``files``, as the
    Spark job counts them, for inputs with nothing to report."""
    malformed = unknown = 0
    for _path, _number, is_object, _cut in _lines(files):
        if is_object:
            unknown += 1
        else:
            malformed += 1
    return malformed, unknown


def _unreadable_lines(files: Sequence[Path], most: int = 5) -> list[str]:
    """Where the lines that are not JSON objects are ("results.jsonl line 57 (cut short?)"),
    the first ``most`` of them."""
    found: list[str] = []
    for path, number, is_object, cut in _lines(files):
        if is_object:
            continue
        found.append(f"{path} line {number}" + (" (the last, cut short?)" if cut else ""))
        if len(found) == most:
            return found + ["..."]
    return found


def _nothing_to_report(files: Sequence[Path], malformed: int, unknown: int) -> str:
    return (f"nothing to report in {', '.join(str(f) for f in files)}: no benchmark run, flow "
            f"or process record ({malformed} line(s) not JSON, {unknown} record(s) of another "
            "kind); give the JSON lines written by `shallowmirror bench --out` or `shallowmirror "
            "mirror --metrics-file`")


def run_report(
    inputs: Iterable[str | Path],
    out_dir: str | Path,
    master: str = "local[*]",
    window_s: float = 1.0,
    spark: SparkSession | None = None,
) -> ReportFiles:
    """Compute the report over ``inputs`` and write it into ``out_dir``.

    Starts (and stops) a Spark session on ``master`` unless one is given. Raises
    :class:`ShallowMirrorError` for missing inputs or a missing Java.
    """
    if window_s <= 0:
        raise ReportUsageError(f"--window-s must be positive, got {window_s}")
    files = find_inputs(inputs)
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    problem = dir_problem(out_dir, "--out")     # before Spark: a bad --out costs no JVM start
    if problem:
        raise ReportUsageError(problem)
    try:
        return _report(files, out_dir, master, window_s, spark)
    except BaseException:
        if created:          # a folder this run made and filled with nothing goes with it
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise


def _report(files: Sequence[Path], out_dir: Path, master: str, window_s: float,
            spark: SparkSession | None) -> ReportFiles:
    """``run_report`` once its inputs and ``out_dir`` are known to be usable."""
    if not _may_hold_records(files):
        # Found by reading the files, before a JVM starts (that took 16-38 s to say this).
        malformed, unknown = _count_unreportable(files)
        raise ShallowMirrorError(_nothing_to_report(files, malformed, unknown))
    own_session = spark is None
    if spark is None:
        from shallowmirror.reports.spark import spark_session, stop_session

        log.info("starting Spark (%s); a local session takes about 10 s", master)
        spark = spark_session(master)
    try:
        log.info("report over %d file(s) on %s", len(files), spark.sparkContext.master)
        data = compute(spark, files, window_s)
    finally:
        if own_session:
            stop_session(spark)  # and its JVM, before the CLI returns
    if not any(data.tables.values()):
        raise ShallowMirrorError(_nothing_to_report(files, data.malformed_lines,
                                                    data.unknown_records))
    if data.malformed_lines:
        # On the terminal too (the page's banner alone went unseen), with where they are: a
        # half-written file (a bench still running, or killed) ends in a line cut short.
        log.warning("skipped %d line(s) that are not JSON: %s", data.malformed_lines,
                    "; ".join(_unreadable_lines(files)))
    try:
        return write_report(data, out_dir)
    except OSError as err:
        raise ShallowMirrorError(f"--out {out_dir}: cannot write the report "
                                 f"({err.strerror or err})") from err

