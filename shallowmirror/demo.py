"""What `make demo` runs: two embedded clusters, sample data in every codec, a shallow mirror, checks.

Steps, each a function so later work can extend one without touching the others:
``start_clusters`` -> ``load_samples`` -> ``mirror_samples`` -> ``verify`` -> ``report``.
Brokers are stopped on exit, on error and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from shallowmirror.cli.stop_signals import StopSignals, outcome
from shallowmirror.testing.embedded import EmbeddedCluster, embedded_clusters
from shallowmirror.testing.topics import compare_topics, read_topic
from shallowmirror.testing.workload import CODECS, LoadResult, Workload, load


@dataclass
class DemoRun:
    """What the demo did, step by step, for ``report``."""

    loads: list[LoadResult] = field(default_factory=list)
    mirrored: bool = False
    mirror_note: str = ""
    mirror_s: float | None = None
    #: topic -> number of differences between source load and target read-back (0 = identical).
    verified: dict[str, int] = field(default_factory=dict)
    #: source topic -> its remote topic on the target (``source.<topic>``).
    remote: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def start_clusters() -> Iterator[tuple[EmbeddedCluster, EmbeddedCluster]]:
    """A source and a target cluster (embedded tansu), stopped when the block ends."""
    with embedded_clusters("source", "target") as (source, target):
        print(f"source cluster {source.bootstrap} (tansu pid {source.pid})")
        print(f"target cluster {target.bootstrap} (tansu pid {target.pid})")
        yield source, target


def load_samples(source: Any, records: int, codecs: Sequence[str] = CODECS,
                 between: Callable[[], None] = lambda: None) -> list[LoadResult]:
    """One topic per codec, filled with JSON-like events through confluent-kafka; ``between``
    runs before each topic (the demo's check for a Ctrl-C)."""
    results = []
    for codec in codecs:
        between()
        workload = Workload(topic=f"demo-{codec}", records=records, codec=codec, partitions=3)
        result = load(source, workload)
        print(f"loaded {result.record_count:,} records into {result.topic} ({codec})")
        results.append(result)
    return results


def mirror_samples(source: Any, target: Any, loads: Sequence[LoadResult], run: DemoRun) -> None:
    """Mirror every sample topic shallowly by running ``shallowmirror mirror`` (the CLI, as an
    operator would) on an mm2.properties until it has caught up. The config and summary live in a
    temporary directory that goes with the brokers."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="shallowmirror-demo-") as workdir:
        _mirror_in(Path(workdir), source, target, loads, run)


def _mirror_in(workdir: Any, source: Any, target: Any, loads: Sequence[LoadResult],
               run: DemoRun) -> None:
    import json
    import os
    import resource
    import subprocess

    topics = [r.topic for r in loads]
    config = workdir / "mm2.properties"
    config.write_text("\n".join([
        "clusters = source, target",
        f"source.bootstrap.servers = {source.bootstrap}",
        f"target.bootstrap.servers = {target.bootstrap}",
        "source->target.enabled = true",
        f"source->target.topics = {', '.join(topics)}",
        # One mirror process: it takes every partition at once instead of waiting for the
        # consumer group's first join (seconds, and most of a small demo's run).
        "source->target.partition.assignment = all",
    ]) + "\n")
    summary_path = workdir / "summary.json"
    cmd = [sys.executable, "-m", "shallowmirror", "--log-level", "WARNING", "mirror",
           str(config), "--exit-when-caught-up", "--caught-up-timeout", "180",
           "--summary-json", str(summary_path)]
    print(f"running: shallowmirror mirror {config} --exit-when-caught-up")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    run.mirror_s = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        run.mirror_note = (f"shallowmirror mirror failed (exit status {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
        print(run.mirror_note)
        return
    summary = json.loads(summary_path.read_text())
    total_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    run.remote = {t: f"source.{t}" for t in topics}
    run.mirrored = True
    run.mirror_note = (
        f"shallow mirror (shallowmirror mirror via the CLI): {summary['records']:,} records, "
        f"{summary['bytes'] / 1e6:.1f} MB as stored (compressed) in {summary['wall_s']:.1f} s "
        f"= {summary['mb_per_s']:.1f} MB/s after {summary.get('startup_s') or 0:.1f} s of "
        f"start-up; CPU {summary['cpu_s']:.2f} s mirroring "
        f"({total_cpu:.2f} s with interpreter start-up); remote topics source.<topic>")
    print(f"mirrored {len(topics)} topics to {target.bootstrap} in {run.mirror_s:.2f}s")


def verify(target: Any, loads: Sequence[LoadResult], run: DemoRun) -> bool:
    """Read every mirrored topic back from the target and compare it with what was loaded."""
    if not run.mirrored:
        return True
    ok = True
    for result in loads:
        back = read_topic(target, run.remote.get(result.topic, result.topic), timeout_s=60)
        diffs = compare_topics(result.committed, back, topic=result.topic)
        run.verified[result.topic] = len(diffs)
        for diff in diffs[:3]:
            print(f"  {diff}")
        ok = ok and not diffs
    return ok


def report(run: DemoRun) -> str:
    """The per-topic table: records, partitions, bytes on the wire vs uncompressed, ratio."""
    header = (f"{'topic':<14} {'codec':<7} {'records':>9} {'parts':>5} {'batches':>7} "
              f"{'uncompressed':>14} {'on the wire':>13} {'ratio':>6} {'target':>10}")
    lines = [header, "-" * len(header)]
    for r in run.loads:
        wire = f"{r.compressed_bytes:,}" if r.compressed_bytes is not None else "?"
        ratio = f"{r.compression_ratio:.2f}x" if r.compression_ratio else "?"
        if r.topic in run.verified:
            target = "identical" if run.verified[r.topic] == 0 else "DIFFERS"
        else:
            target = "-"
        lines.append(f"{r.topic:<14} {r.workload.codec:<7} {r.record_count:>9,} "
                     f"{len(r.committed):>5} {r.batches or 0:>7} {r.uncompressed_bytes:>14,} "
                     f"{wire:>13} {ratio:>6} {target:>10}")
    lines.append("on the wire = RecordBatch bytes as produced (what a shallow mirror forwards "
                 "untouched); uncompressed = key + value + header bytes")
    if run.mirror_note:
        lines.append(run.mirror_note)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shallowmirror.demo", description=__doc__)
    parser.add_argument("--records", type=int, default=20_000, help="records per codec topic")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run = DemoRun()
    # SIGTERM unwinds like Ctrl-C, so the brokers are stopped by the context manager. A signal
    # lost on its way (see StopSignals) is raised again at the next step.
    stops = StopSignals.install()
    try:
        with start_clusters() as (source, target):
            run.loads = load_samples(source, args.records, between=stops.check)
            stops.check()
            mirror_samples(source, target, run.loads, run)
            stops.check()
            ok = verify(target, run.loads, run)
            stops.check()
            print()
            print(report(run))
    except KeyboardInterrupt as interrupt:
        return _interrupted(interrupt)
    except Exception:
        # After a Ctrl-C, what a client library raises on the way out is that Ctrl-C.
        interrupt = stops.received_interrupt()
        if interrupt is None:
            raise
        return _interrupted(interrupt)
    if not ok:
        print("demo FAILED: the target differs from the source", file=sys.stderr)
        return 1
    return 0


def _interrupted(interrupt: KeyboardInterrupt) -> int:
    status, word = outcome(interrupt)
    print(f"\n{word}; brokers stopped", file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
