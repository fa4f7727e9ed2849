"""`shallowmirror bench` refuses what cannot work before anything starts, and says why.

Every case here ends before a broker is started or contacted (an unreachable address is one
nothing listens on): bad options in one line each with exit status 2, a missing Java or an
unreachable cluster with 1, never a traceback, and no empty results file left behind.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys

import pytest

from shallowmirror.bench import topics
from shallowmirror.bench.matrix import expand
from shallowmirror.bench.runner import BenchConfig
from shallowmirror.cli import bench as bench_cli
from shallowmirror.cli.main import build_parser
from shallowmirror.cli.report import drop_py4j_noise


def run_bench_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shallowmirror", "bench", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def _refused(result: subprocess.CompletedProcess, status: int, *messages: str) -> None:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "unexpected" not in result.stderr, result.stderr
    assert "embedded cluster" not in result.stderr, "a broker was started"
    for message in messages:
        assert message in result.stderr, result.stderr


@pytest.mark.parametrize("args,messages", [
    # A typo benchmarked the defaults without a word.
    (["--shallow-setting", "foo.bar=1"],
     ["shallowmirror bench: --shallow-setting 'foo.bar=1': unknown engine setting 'foo.bar'"]),
    (["--shallow-setting", "fetch.max.byte=1048576"],
     ["unknown engine setting 'fetch.max.byte'; did you mean 'fetch.max.bytes'?"]),
    # Failed inside the mode with its argparse usage, then with a raw traceback.
    (["--shallow-setting", "foo"], ["--shallow-setting: expected KEY=VALUE, got 'foo'"]),
    (["--shallow-setting", "fetch.max.bytes=abc"],
     ["--shallow-setting fetch.max.bytes: expected a whole number, got 'abc'"]),
    (["--shallow-setting", "fetch.max.bytes=999999999999"],
     ["fetch.max.bytes (999999999999) must not exceed buffer.memory"]),
    (["--modes", "fetch-only", "--shallow-setting", "fetch.max.bytes=1048576"],
     ["--shallow-setting applies to mode shallow, which --modes does not run"]),
    # Ran, then blamed the mode for the harness's own SIGTERM.
    (["--run-timeout", "0"], ["--run-timeout must be more than 0 seconds, got 0"]),
    (["--run-timeout", "-1"], ["--run-timeout must be more than 0 seconds, got -1"]),
    (["--latency-probes", "-1"], ["--latency-probes must be 0 (none) or more, got -1"]),
    (["--modes", "shallow,shallow"], ["mode shallow is listed 2 times in --modes"]),
    (["--source-bootstrap", "nohost", "--target-bootstrap", "x:y"],
     ["--source-bootstrap: 'nohost' is not host:port",
      "--target-bootstrap: 'x:y' is not host:port"]),
])
def test_bad_options_are_refused_before_anything_starts(tmp_path, args, messages):
    out = tmp_path / "results.jsonl"
    result = run_bench_cli("--codecs", "lz4", "--records", "1k", "--repeats", "1",
                           "--out", str(out), *args)
    _refused(result, 2, *messages)
    assert not out.exists()


def test_valid_shallow_settings_pass_and_reach_the_mode():
    config = BenchConfig(workloads=expand(["lz4"], [10], [1024], [1], [10]), modes=["shallow"],
                         shallow_settings=["fetch.max.bytes=1048576", "acks = all"])
    assert config.problems() == []


def test_report_without_java_is_refused_before_the_bench(tmp_path):
    """It ran the whole benchmark, then failed "Spark reports need Java"."""
    no_java = tmp_path / "jdk"
    no_java.mkdir()
    out, report = tmp_path / "results.jsonl", tmp_path / "report"
    result = run_bench_cli("--codecs", "lz4", "--records", "1k", "--repeats", "1",
                           "--out", str(out), "--report", str(report),
                           env={"JAVA_HOME": str(no_java)})
    _refused(result, 1, f"shallowmirror bench: Spark reports need Java: JAVA_HOME={no_java} "
                        "has no bin/java")
    assert not out.exists() and not report.exists()


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


def test_an_unreachable_cluster_is_named_and_no_results_file_is_left(tmp_path, monkeypatch,
                                                                      capsys):
    """It waited 30 s, then said "unexpected TimeoutError: " and left an empty results file."""
    monkeypatch.setattr(topics, "ANSWER_TIMEOUT_S", 1.0)
    out = tmp_path / "e.jsonl"
    status = bench_cli.run(_args("--source-bootstrap", "127.0.0.1:1", "--target-bootstrap",
                                 "127.0.0.1:2", "--codecs", "lz4", "--records", "1k",
                                 "--repeats", "1", "--modes", "shallow", "--out", str(out)))
    err = capsys.readouterr().err
    assert status == 1, err
    assert err.startswith("shallowmirror bench: the source cluster at 127.0.0.1:1 did not "
                          "answer within 1s ("), err
    assert "the target cluster at 127.0.0.1:2 did not answer within 1s (" in err
    assert err.rstrip().endswith("are they running, and are those their addresses?")
    assert not out.exists()


def test_an_existing_results_file_is_kept_when_nothing_ran(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(topics, "ANSWER_TIMEOUT_S", 0.5)
    out = tmp_path / "e.jsonl"
    out.write_text("")
    status = bench_cli.run(_args("--source-bootstrap", "127.0.0.1:1", "--target-bootstrap",
                                 "127.0.0.1:1", "--modes", "shallow", "--out", str(out)))
    assert status == 1 and out.exists(), capsys.readouterr().err


def test_the_report_is_quiet_and_says_where_it_is(tmp_path, monkeypatch, capsys, caplog):
    """bench --report printed py4j's "Closing down clientserver connection" four times and
    never where the report was; `shallowmirror report` does neither."""
    from shallowmirror.reports import report

    html = tmp_path / "report" / "report.html"

    def fake_run_report(inputs, out_dir, **_kwargs):
        logging.getLogger("py4j.clientserver").info("Closing down clientserver connection")
        return argparse.Namespace(html=html)

    monkeypatch.setattr(report, "run_report", fake_run_report)
    caplog.set_level(logging.INFO)
    py4j = logging.getLogger("py4j")
    level = py4j.level
    try:
        assert bench_cli._report(str(tmp_path / "r.jsonl"), str(tmp_path / "report"))
    finally:
        py4j.setLevel(level)
        logging.getLogger().removeFilter(drop_py4j_noise)
    assert [r for r in caplog.records if r.name.startswith("py4j")] == []
    assert f"report: {html.resolve()}" in capsys.readouterr().out


def test_a_report_that_fails_says_how_to_render_it_later(tmp_path, monkeypatch, capsys):
    from shallowmirror.errors import ShallowMirrorError
    from shallowmirror.reports import report

    def failing(*_args, **_kwargs):
        raise ShallowMirrorError("no runs in the input")

    monkeypatch.setattr(report, "run_report", failing)
    assert not bench_cli._report("r.jsonl", str(tmp_path / "rep"))
    err = capsys.readouterr().err
    assert "shallowmirror bench: the report: no runs in the input" in err
    assert f"shallowmirror report r.jsonl --out {tmp_path / 'rep'}" in err


def test_check_answers_names_only_the_cluster_that_does_not_answer():
    with pytest.raises(topics.ClusterUnreachable) as refused:
        topics.check_answers({"source": "127.0.0.1:1"}, timeout_s=0.5)
    assert str(refused.value).startswith("the source cluster at 127.0.0.1:1 did not answer "
                                         "within 0.5s (")
    assert str(refused.value).endswith("; is it running, and is that its address?")

