"""`shallowmirror report` as a person runs it: what reaches the terminal, and what is left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

DATA = Path(__file__).parent / "data"


def test_report_prints_its_own_lines_only_and_leaves_no_temporary_file(spark, tmp_path):
    """The JVM's incubator-module warning and Spark's log-level banner are not the user's
    concern; the log4j2 profile written for the JVM is removed once the JVM has read it.
    (``spark``: skip or fail as the other report tests do when Java is missing.)"""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "shallowmirror", "report", str(DATA), "--out",
         str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
        env={**os.environ, "TMPDIR": str(scratch)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"report: {tmp_path / 'out' / 'report.html'}\n")
    lines = result.stderr.splitlines()
    assert lines and all(" INFO shallowmirror." in line for line in lines), result.stderr
    assert list(scratch.iterdir()) == []


def test_a_report_of_failed_runs_only_is_no_success(spark, tmp_path):
    """Only failed runs: the HTML said 'no benchmark runs' beside their table, and the command
    exited 0. The report lists them, says nothing was measured, and the exit status is 1."""
    import json

    runs = []
    for line in (DATA / "bench.jsonl").read_text().splitlines()[:3]:
        record = json.loads(line)
        if record.get("kind") == "bench_run":
            record.update(ok=False, error="not all records arrived (0/1000)")
            runs.append(json.dumps(record))
    assert runs
    inputs = tmp_path / "failed.jsonl"
    inputs.write_text("\n".join(runs) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "shallowmirror", "report", str(inputs), "--out",
         str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert (f"shallowmirror report: all {len(runs)} benchmark run(s) in the inputs failed: the "
            "report lists them, and has no figure") in result.stderr
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Every benchmark run in the inputs failed" in html
    assert "hold no benchmark runs" not in html
