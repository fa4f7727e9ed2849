"""`shallowmirror bench`: shallow versus deep mirroring on a workload matrix.

Loads each workload into a source cluster (embedded tansu by default, real Apache Kafka with
--kafka-home, or your own), runs every mode as its own process with the target emptied between runs, appends one ``bench_run`` JSON line per run to
``--out`` and prints a summary table (median and min..max over repeats) and the goal ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from typing import TYPE_CHECKING

from shallowmirror.bench.matrix import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_PARTITIONS,
    DEFAULT_RECORDS,
    DEFAULT_VALUE_BYTES,
)
from shallowmirror.cli.formatting import finite_float

if TYPE_CHECKING:
    from shallowmirror.bench.runner import BenchConfig

DEFAULT_MODES = "shallow,deep-confluent,fetch-only"


def add_parser(sub: argparse._SubParsersAction) -> None:
    from shallowmirror.cli.formatting import epilog

    p = sub.add_parser(
        "bench", help="benchmark shallow against deep mirroring (CPU, RSS, throughput, latency)",
        description=__doc__.split("\n\n")[1].replace("``", "'"),
        epilog=epilog([
            ("shallowmirror bench --codecs lz4 --records 200k --repeats 1 --report report/",
             "a quick run on embedded clusters, then the HTML report in report/"),
            ("shallowmirror bench --kafka-home $KAFKA_HOME --codecs lz4 --records 200k "
             "--repeats 1 --modes shallow,deep-confluent,mm2,fetch-only",
             "two real Apache Kafka clusters started (and stopped) by the harness, MirrorMaker 2 "
             "from the same distribution as a mode"),
            ("shallowmirror bench --source-bootstrap kafka-a:9092 --target-bootstrap "
             "kafka-b:9092 --codecs lz4,zstd --records 1m",
             "the default modes against your own clusters, three repeats each"),
        ]),
    )
    p.add_argument("--source-bootstrap", help="source cluster (default: started by the harness)")
    p.add_argument("--target-bootstrap", help="target cluster (default: started by the harness)")
    p.add_argument("--broker", choices=("tansu", "kafka"),
                   help="clusters the harness starts: embedded tansu (default) or Apache Kafka "
                        "from KAFKA_HOME")
    p.add_argument("--kafka-home", metavar="DIR",
                   help="Apache Kafka distribution: the harness starts two Kafka clusters from "
                        "it (implies --broker kafka) and mode mm2 runs its MirrorMaker 2 "
                        "(default: $KAFKA_HOME)")
    p.add_argument("--codecs", default="lz4,zstd,gzip", help="none,gzip,snappy,lz4,zstd")
    p.add_argument("--records", default=str(DEFAULT_RECORDS), help="record counts, e.g. 1m,100k")
    p.add_argument("--value-bytes", default=str(DEFAULT_VALUE_BYTES), help="value sizes")
    p.add_argument("--batch-bytes", default=",".join(str(b) for b in DEFAULT_BATCH_SIZES),
                   help="producer batch.size values (default: 16 KiB and 256 KiB), e.g. "
                        "16KiB,256KiB")
    p.add_argument("--partitions", default=str(DEFAULT_PARTITIONS), help="partition counts")
    p.add_argument("--modes", default=DEFAULT_MODES,
                   help="shallow,deep-confluent,deep-kafka-python,fetch-only,mm2,external "
                        "(mm2: MirrorMaker 2, Kafka clusters only)")
    p.add_argument("--repeats", type=int, default=3, help="runs per workload and mode")
    p.add_argument("--external-cmd",
                   help="command line of mode 'external'; placeholders {source} {target} {topic} "
                        "{target_topic} {latency_topic} {target_latency_topic} {topics_regex} "
                        "{group}")
    p.add_argument("--external-target-topic", default="{topic}",
                   help="topic the external tool writes to, e.g. 'source.{topic}' for MM2")
    p.add_argument("--fetch-impl", choices=("engine", "raw", "confluent"), default="engine",
                   help="fetch-only baseline: the engine's raw fetch reader or hand-made raw "
                        "Fetch requests (no decompression: the shallow ceiling), or a confluent-kafka consumer")
    p.add_argument("--shallow-setting", action="append", default=[], metavar="KEY=VALUE",
                   help="engine setting for the shallow mode, e.g. fetch.max.bytes=33554432 "
                        "(repeatable)")
    p.add_argument("--latency-probes", type=int, default=20,
                   help="probe records per run for end-to-end latency (0: none)")
    p.add_argument("--run-timeout", type=finite_float, default=900.0,
                   help="seconds per run before it is stopped and recorded as timed out")
    p.add_argument("--out", default="bench-results.jsonl", help="JSON lines file to append to")
    p.add_argument("--report", metavar="DIR", help="also render the report into DIR")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on stderr (default: when stderr is a terminal)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from shallowmirror.bench.matrix import expand, parse_list
    from shallowmirror.bench.runner import BenchConfig

    lists = {}
    for option, kind in (("codecs", str), ("value_bytes", int), ("batch_bytes", int),
                         ("partitions", int), ("records", int), ("modes", str)):
        try:
            lists[option] = parse_list(getattr(args, option), kind)
        except ValueError as err:
            print(f"shallowmirror bench: --{option.replace('_', '-')}: {err}", file=sys.stderr)
            return 2
    try:
        workloads = expand(lists["codecs"], lists["value_bytes"], lists["batch_bytes"],
                           lists["partitions"], lists["records"])
    except ValueError as err:
        print(f"shallowmirror bench: {err}", file=sys.stderr)
        return 2
    config = BenchConfig(
        workloads=workloads, modes=lists["modes"], repeats=args.repeats,
        source_bootstrap=args.source_bootstrap, target_bootstrap=args.target_bootstrap,
        external_cmd=args.external_cmd, external_target_topic=args.external_target_topic,
        fetch_impl=args.fetch_impl, latency_probes=args.latency_probes,
        run_timeout_s=args.run_timeout, progress=args.progress,
        shallow_settings=list(args.shallow_setting), broker=args.broker,
        kafka_home=args.kafka_home,
    )
    problems = config.problems()
    if problems:
        for problem in problems:
            print(f"shallowmirror bench: {problem}", file=sys.stderr)
        return 2

    java = _java_problem() if args.report else None     # not after a whole bench
    if java:
        print(f"shallowmirror bench: {java}", file=sys.stderr)
        return 1
    created = [path for path in (args.out, args.report) if path and not os.path.exists(path)]
    try:
        return _run_and_report(args, config)
    finally:
        # What the checks below created and nothing filled (a bench that ended before its first
        # run: an unreachable cluster, Ctrl-C) goes, not an empty file that looks like a result.
        for path in created:
            with contextlib.suppress(OSError):
                if os.path.isdir(path):
                    os.rmdir(path)            # only if empty
                elif os.path.getsize(path) == 0:
                    os.remove(path)


def _run_and_report(args: argparse.Namespace, config: BenchConfig) -> int:
    from shallowmirror.bench import summary
    from shallowmirror.bench.runner import BrokerGone, run_bench
    from shallowmirror.bench.topics import ClusterUnreachable
    from shallowmirror.testing.embedded import BrokerStartError

    early = _output_problem(args.out, args.report)      # not after a whole bench either
    if early:
        print(f"shallowmirror bench: {early}", file=sys.stderr)
        return 2
    with open(args.out, "a") as out:
        def emit(record: dict) -> None:
            out.write(json.dumps(record) + "\n")
            out.flush()
            status = "ok" if record["ok"] else f"FAILED: {record['error']}"
            metrics = summary.run_metrics(record)
            detail = (f"{metrics['mb_s']:.1f} MB/s, {metrics['cpu_s_per_gb']:.2f} CPU s/GB, "
                      f"peak RSS {metrics['peak_rss_mb']:.0f} MB" if metrics else "")
            if metrics and record.get("startup_s") is not None:
                detail += (f", start-up {record['startup_s']:.1f} s / "
                           f"{record.get('startup_cpu_s') or 0:.1f} CPU s")
            print(f"{record['mode']} {record['workload_id']} repeat {record['repeat']}: "
                  f"{detail} {status}", file=sys.stderr, flush=True)

        try:
            records = run_bench(config, emit)
        except BrokerStartError as err:
            print(f"shallowmirror bench: {err}", file=sys.stderr)
            return 2
        except (ClusterUnreachable, BrokerGone) as err:
            print(f"shallowmirror bench: {err}", file=sys.stderr)
            return 1
    table = summary.rows(records)
    print(summary.format_table(table))
    ratio_text = summary.format_ratios(summary.ratios(table))
    if ratio_text:
        print("\n" + ratio_text)
    for line in summary.short_runs(records):
        print(f"warning: {line}", file=sys.stderr)
    print(f"\n{len(records)} runs appended to {args.out}")
    ok = all(r["ok"] for r in records)
    if args.report and not _report(args.out, args.report):
        return 1
    return 0 if ok else 1


def _output_problem(out: str, report_dir: str | None) -> str | None:
    """Why --out or --report cannot be written, or None."""
    from shallowmirror.output_paths import dir_problem, file_problem

    return file_problem(out, "--out") or (dir_problem(report_dir, "--report") if report_dir
                                          else None)


def _java_problem() -> str | None:
    """Why the report could not be rendered for want of Java, or None; asked before the bench
    runs, not after it."""
    from shallowmirror.reports.spark import JavaMissingError, check_java

    try:
        check_java()
    except JavaMissingError as err:
        return str(err)
    return None


def _report(results: str, out_dir: str) -> bool:
    """Render the report of ``results`` into ``out_dir`` as ``shallowmirror report`` does (and
    as quietly); say where it is. False (said why) when it could not be made."""
    from shallowmirror.cli.report import drop_py4j_noise
    from shallowmirror.errors import ShallowMirrorError
    from shallowmirror.reports.report import run_report

    # py4j logs every gateway connection at INFO; it says nothing about the report.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger().addFilter(drop_py4j_noise)
    try:
        files = run_report([results], out_dir)
    except ShallowMirrorError as err:
        print(f"shallowmirror bench: the report: {err} (the results are in {results}: "
              f"`shallowmirror report {results} --out {out_dir}` renders it later)",
              file=sys.stderr)
        return False
    print(f"report: {files.html.resolve()}")
    return True
