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
    # The data's one line that is not JSON (on purpose) is told, with where it is.
    told = [line for line in lines if " WARNING shallowmirror.reports.report: skipped " in line]
    assert len(told) == 1 and told[0].endswith(f"{DATA / 'engine.jsonl'} line 9"), told
    assert lines and all(" INFO shallowmirror." in line for line in lines
                         if line not in told), result.stderr
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


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shallowmirror", "report", *args],
                          capture_output=True, text=True, timeout=120)


def test_what_cannot_be_asked_is_a_usage_error_and_what_failed_is_not(tmp_path):
    """Status 2, as argparse's own errors and `bench`'s and `load`'s: an input that is not
    there, a folder without metrics files, an --out that is a file, a --window-s of 0, a
    --master that is no Spark URL. Status 1: inputs with nothing to report, a Spark master that
    does not answer. All of them before any JVM starts, in one line each."""
    metrics = tmp_path / "run.jsonl"
    metrics.write_text('{"kind": "flow"}\n')
    empty = tmp_path / "empty"
    empty.mkdir()
    out = str(tmp_path / "out")
    cases = [
        (2, [str(tmp_path / "missing.jsonl"), "--out", out], "report inputs not found: "),
        (2, [str(empty), "--out", out], "no *.jsonl metrics files in "),
        (2, [str(metrics), "--out", str(metrics)], "is a file, not a directory"),
        (2, [str(metrics), "--out", out, "--window-s", "0"], "--window-s must be positive"),
        (2, [str(metrics), "--out", out, "--master", "sparky://x"],
         "is not a Spark master URL"),
        (1, [str(tmp_path / "empty"), str(metrics), "--out", out, "--master",
             "spark://127.0.0.1:1"], "did not answer"),
    ]
    not_json = tmp_path / "notes.jsonl"
    not_json.write_text("hello\n")
    cases.append((1, [str(not_json), "--out", out], "nothing to report in "))
    for status, args, said in cases:
        result = _report(*args)
        assert (result.returncode, said in result.stderr) == (status, True), (args, result.stderr)
        assert "Traceback" not in result.stderr
        assert not (tmp_path / "out").exists(), args


def test_py4j_retrying_a_command_or_a_ctrl_c_in_it_is_not_shown():
    """py4j's own root-logger records with tracebacks: a command sent again on a fresh
    connection (INFO; the report then succeeded) and a Ctrl-C inside a call. Its final failure
    (ERROR) and every record of other code still show."""
    import logging

    from shallowmirror.cli.report import drop_py4j_noise

    gateway = os.path.join("site-packages", "py4j", "java_gateway.py")

    def record(level: int, message: str, path: str = gateway) -> logging.LogRecord:
        return logging.LogRecord("root", level, path, 1, message, None, None)

    assert not drop_py4j_noise(record(logging.INFO, "Exception while sending command."))
    assert not drop_py4j_noise(record(logging.ERROR, "KeyboardInterrupt while sending command."))
    assert drop_py4j_noise(record(logging.ERROR, "Exception while sending command."))
    assert drop_py4j_noise(record(logging.INFO, "Exception while sending command.",
                                  path=os.path.join("shallowmirror", "x.py")))


def test_lines_that_are_not_json_are_located(tmp_path):
    """A half-written results file was reported with exit 0 and a banner in the page only,
    naming no file and no line."""
    from shallowmirror.reports.report import _unreadable_lines

    whole = tmp_path / "whole.jsonl"
    whole.write_text('{"kind": "bench_run"}\n[1, 2]\n\n{"kind": "bench_run"}\n')
    half = tmp_path / "half.jsonl"
    half.write_text('{"kind": "bench_run"}\n{"kind": "bench_ru')
    assert _unreadable_lines([whole, half]) == [
        f"{whole} line 2", f"{half} line 2 (the last, cut short?)"]
    many = tmp_path / "many.jsonl"
    many.write_text("x\n" * 9)
    assert _unreadable_lines([many]) == [f"{many} line {n}" for n in range(1, 6)] + ["..."]
