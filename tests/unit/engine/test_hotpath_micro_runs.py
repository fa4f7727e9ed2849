"""The engine's in-process benchmark (benchmarks/engine/hotpath_micro.py) still runs against the
engine as it is: its fake clusters must offer what the engine asks of a cluster (session 16's
topic ids broke it with no test noticing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_engine_micro_benchmark_mirrors_every_batch():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine" / "hotpath_micro.py"), "--child",
         "--batch-bytes", "5800", "--batches", "800", "--partitions", "4"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # 1 MiB of 5.6 KB batches per fetch and partition: 186 batches, one round per 744.
    assert result["batches"] == 4 * 186
    assert result["requests"] == 186          # one batch per partition per request
    assert result["bytes"] == result["batches"] * result["batch_bytes"]
    assert result["cpu_s"] > 0


def test_the_micro_benchmark_runs_with_what_the_mirror_process_adds():
    """``--offset-syncs --metrics``: the flow's offset-sync writer and the metrics the process
    records, on the same engine."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine" / "hotpath_micro.py"), "--child",
         "--batch-bytes", "5800", "--batches", "800", "--partitions", "4", "--offset-syncs",
         "--metrics"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["batches"] == 4 * 186
