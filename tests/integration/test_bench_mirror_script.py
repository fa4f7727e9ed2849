"""``benchmarks/engine/bench_mirror.py --process mirror`` still measures what users run: the
``shallowmirror mirror`` process, against the clusters given to it (its "external" mode), from
its first record on the target to caught up. Benchmarks that nothing runs break unnoticed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


# Enough records that the window spans several of the kernel's 10 ms CPU ticks on a fast host:
# 20,000 were mirrored within one, and the process's CPU read 0.
RECORDS = 300_000


def test_bench_mirror_times_the_mirror_process(source_cluster, target_cluster, tmp_path):
    out = tmp_path / "runs.jsonl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine" / "bench_mirror.py"),
         "--process", "mirror", "--codecs", "lz4", "--records", str(RECORDS), "--value-bytes", "300",
         "--batch-bytes", "16384", "--repeat", "1", "--phases", "mirror", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT),
             "SHALLOWMIRROR_SOURCE_BOOTSTRAP": source_cluster.bootstrap,
             "SHALLOWMIRROR_TARGET_BOOTSTRAP": target_cluster.bootstrap})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (run,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert run["process"] == "mirror" and run["records"] == RECORDS
    # The window ran from the first record to the last: it saw work, and the process's CPU.
    assert run["batches"] > 10
    assert run["mirror"]["cpu_s"] > 0 and run["mirror"]["wall_s"] > 0
    assert run["cpu_s_per_gb"] > 0
    assert "mirror process mirror" in done.stdout
