"""``benchmarks/engine/bench_mirror.py --process mirror`` still measures what users run: the
``shallowmirror mirror`` process, against the clusters given to it (its "external" mode), from
its first record on the target to caught up. Benchmarks that nothing runs break unnoticed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from engine_support import benchmark_script

from shallowmirror.testing.topics import read_topic

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


# Enough records that the window spans several of the kernel's 10 ms CPU ticks on a fast host:
# 20,000 were mirrored within one, and the process's CPU read 0.
RECORDS = 300_000
FLOOR_RECORDS = 30_000


def _bench_mirror(source_cluster, target_cluster, tmp_path, *args: str) -> tuple[dict, str]:
    """Run ``bench_mirror.py`` with ``args`` against the test clusters (its "external" mode);
    return its one run (JSON) and what it printed."""
    out = tmp_path / "runs.jsonl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine" / "bench_mirror.py"), "--codecs",
         "lz4", "--value-bytes", "300", "--batch-bytes", "16384", "--repeat", "1", *args,
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT),
             "SHALLOWMIRROR_SOURCE_BOOTSTRAP": source_cluster.bootstrap,
             "SHALLOWMIRROR_TARGET_BOOTSTRAP": target_cluster.bootstrap})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (run,) = [json.loads(line) for line in out.read_text().splitlines()]
    return run, done.stdout


def test_bench_mirror_times_the_mirror_process(source_cluster, target_cluster, tmp_path):
    run, printed = _bench_mirror(source_cluster, target_cluster, tmp_path, "--process", "mirror",
                                 "--records", str(RECORDS), "--phases", "mirror")
    assert run["process"] == "mirror" and run["records"] == RECORDS
    # The window ran from the first record to the last: it saw work, and the process's CPU.
    assert run["batches"] > 10
    assert run["mirror"]["cpu_s"] > 0 and run["mirror"]["wall_s"] > 0
    assert run["cpu_s_per_gb"] > 0
    assert "mirror process mirror" in printed


@pytest.mark.skipif(shutil.which("cc") is None, reason="mirror_floor.c needs cc")
def test_bench_mirror_floor_copies_every_record(source_cluster, target_cluster, tmp_path):
    """``--phases floor`` (``mirror_floor.c``, the mirror's cycle from C) copies the topic exactly:
    its CPU per GB is read against the mirror's in RESULTS.md, so it must do the same work."""
    run, printed = _bench_mirror(source_cluster, target_cluster, tmp_path, "--records",
                                 str(FLOOR_RECORDS), "--partitions", "3", "--phases", "floor")
    floor = run["floor"]
    assert floor["batches"] == run["batches"] > 3 and floor["bytes"] == run["compressed_bytes"]
    # One batch per partition per Produce request (stock Kafka's rule): at least a third as
    # many requests as batches with three partitions, and every answer was read.
    assert floor["requests"] >= run["batches"] // 3 and floor["target_reads"] > 0
    assert floor["cpu_s"] >= 0 and floor["wall_s"] > 0
    assert "(mirror_floor.c: no interpreter)" in printed
    source = read_topic(source_cluster, run["topic"])
    copied = read_topic(target_cluster, floor["target_topic"])
    assert sum(len(records) for records in source.values()) == FLOOR_RECORDS
    for partition, records in source.items():     # key, value, headers, timestamp, in order
        assert copied[partition] == records, f"partition {partition}"


@pytest.mark.skipif(shutil.which("cc") is None, reason="mirror_floor.c needs cc")
def test_mirror_floor_refuses_bad_arguments(tmp_path):
    binary = benchmark_script("request_floor").build_native_client(str(tmp_path), "mirror_floor")
    for args in (["t", "t2", "10,x"], ["t", "t2", "10", "0"], ["t", "t2", "10", "5", "0"],
                 ["t", "t2", "10", "5", "3", "10"]):
        done = subprocess.run([binary, "127.0.0.1", "9", "127.0.0.1", "9", *args],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode in (1, 2), (args, done.stderr)
        assert "mirror_floor:" in done.stderr and "connect" not in done.stderr, args


def test_bench_mirror_refuses_an_unknown_phase():
    """A misspelt phase would otherwise run nothing and exit 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine" / "bench_mirror.py"), "--phases",
         "mirror,flor"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2
    assert "--phases: flor is not one of fetch, produce, mirror, floor" in done.stderr


@pytest.mark.parametrize("args, says", [
    (["--perf", "/tmp/unused", "--process", "mirror"], "--perf records the engine process alone"),
    (["--perf", "/tmp/unused", "--py-spy", "/tmp/unused"], "--perf records the engine process"),
])
def test_bench_mirror_refuses_profilers_it_cannot_run(args, says):
    """--py-spy without py-spy installed ended the first mirror run with a traceback, after
    the whole load; --perf of the mirror process would record the wrong process."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine" / "bench_mirror.py"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
