"""`shallowmirror report RESULTS... --out DIR`: Spark over metrics JSON lines -> HTML report."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from shallowmirror.cli.formatting import finite_float


def add_parser(sub: argparse._SubParsersAction) -> None:
    from shallowmirror.cli.formatting import epilog

    p = sub.add_parser(
        "report",
        help="compute throughput/CPU/memory reports with Spark and render them as HTML",
        description="Read benchmark results and engine metrics (JSON lines; directories are "
        "searched for *.jsonl), compute throughput, CPU per GB, peak RSS, latency percentiles "
        "and shallow/deep ratios with Spark, and write report.html, summary.json and CSVs.",
        epilog=epilog([
            ("shallowmirror report bench-results.jsonl --out report/",
             "the benchmark report: open report/report.html in a browser"),
            ("shallowmirror report run.jsonl --out mirror-report/",
             "a report of a mirror run written with --metrics-file run.jsonl"),
        ]),
    )
    p.add_argument("inputs", nargs="+", metavar="RESULTS", help="*.jsonl files or directories")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write the report to")
    p.add_argument("--master", default="local[*]",
                   help="Spark master URL (default: local[*]; e.g. spark://host:7077, yarn)")
    p.add_argument("--window-s", type=finite_float, default=1.0, metavar="N",
                   help="width of the throughput-over-time windows in seconds (default: 1)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from shallowmirror.errors import ShallowMirrorError

    # py4j logs every gateway connection at INFO; it says nothing about the report.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger().addFilter(drop_py4j_noise)
    from shallowmirror.reports.report import ReportUsageError, run_report
    from shallowmirror.reports.spark import master_form_problem

    problem = master_form_problem(args.master)
    if problem:
        print(f"shallowmirror report: {problem}", file=sys.stderr)
        return 2
    try:
        files = run_report(args.inputs, args.out, master=args.master, window_s=args.window_s)
    except ReportUsageError as err:      # what was asked cannot be: as argparse's errors
        print(f"shallowmirror report: {err}", file=sys.stderr)
        return 2
    except ShallowMirrorError as err:
        print(f"shallowmirror report: {err}", file=sys.stderr)
        return 1
    print(f"report: {files.html.resolve()}")
    print(f"summary: {files.summary_json.resolve()} and {len(files.csv)} CSV file(s) beside it")
    if files.measured_nothing:
        failed = len(files.data.table("failed_runs"))
        print(f"shallowmirror report: all {failed} benchmark run(s) in the inputs failed: the "
              "report lists them, and has no figure", file=sys.stderr)
        return 1
    return 0


def drop_py4j_noise(record: logging.LogRecord) -> bool:
    """py4j logs two things on the root logger, with a traceback, that are not the user's
    concern: a Ctrl-C during a Spark call, as an ERROR ("KeyboardInterrupt while sending
    command."; the command says "interrupted" itself), and a command it sent again on a fresh
    connection because the pooled one was closed, at INFO ("Exception while sending command.":
    the report went on and succeeded; one of the CI runs showed it)."""
    if f"py4j{os.sep}" not in record.pathname:
        return True
    message = record.getMessage()
    return not (message.startswith("KeyboardInterrupt while sending command")
                or (record.levelno <= logging.INFO
                    and message.startswith("Exception while sending command")))
