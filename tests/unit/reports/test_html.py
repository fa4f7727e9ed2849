"""The report renders from the committed fixtures: page, tables, decodable PNG plots, CSV, JSON."""

from __future__ import annotations

import base64
import csv
import json
import re
from dataclasses import replace

import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

#: bench: CPU/GB, throughput, peak RSS, throughput over time, RSS over time, latency;
#: engine: throughput over time, CPU and RSS over time.
EXPECTED_PLOTS = 8


@pytest.fixture(scope="module")
def report(report_files):
    """run_report over the fixture directory (conftest runs it once for all report tests)."""
    return report_files


def test_window_is_stated(report_data, tmp_path):
    from shallowmirror.reports.html import write_report

    files = write_report(replace(report_data, window_s=2.5), tmp_path)
    assert "throughput window 2.5 s" in files.html.read_text()
    assert json.loads(files.summary_json.read_text())["window_s"] == 2.5


@pytest.mark.spark
def test_html_has_plots_that_decode_as_png(report):
    page = report.html.read_text(encoding="utf-8")
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert report.plots == len(images) == EXPECTED_PLOTS
    for encoded in images:
        png = base64.b64decode(encoded, validate=True)
        assert png.startswith(PNG_MAGIC)
        width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        assert width > 300 and height > 200


@pytest.mark.spark
def test_html_has_goals_and_tables(report):
    page = report.html.read_text(encoding="utf-8")
    for heading in ("Goals", "Benchmarks: shallow against deep mirroring",
                    "Per workload and mode", "Shallow against each baseline", "Failed runs",
                    "Engine metrics", "Per flow and topic", "Per process"):
        assert heading in page
    assert page.count("<table") == 6
    # zstd: 24x against >= 30x is a miss and says by how much; gzip was not run: no row
    assert "24.0x (goal &gt;= 30.0x): 6.00 (20%) short" in page
    assert "runs of gzip" not in page
    # Deep RSS against the compression ratio of two codecs: not judged, and says why.
    assert page.count("NO DATA") == 1 and "needs 3 codecs or more of this shape" in page
    assert page.count("badge pass") == 2 and page.count("badge miss") == 2
    assert "Skipped 1 line(s) that were not JSON and 1 record(s) of an unknown kind" in page
    assert "target unreachable" in page


@pytest.mark.spark
def test_csv_and_json_summaries_parse(report):
    assert {"goals", "bench_summary", "ratios", "flow_totals", "flow_windows",
            "process_summary"} <= set(report.csv)
    with report.csv["bench_summary"].open() as f:
        rows = list(csv.DictReader(f))
    lz4 = next(r for r in rows if r["workload_id"] == "lz4-200B-4p" and r["mode"] == "shallow")
    assert float(lz4["mb_s_compressed"]) == pytest.approx(80.0)
    assert lz4["mb_s_uncompressed_min"] == "125.0"
    assert report.csv["goals"].read_text().count("\n") == 1 + 5  # header + goal rows
    summary = json.loads(report.summary_json.read_text())
    assert summary["units"]["GB"] == 1e9
    assert summary["malformed_lines"] == 1
    statuses = {(g["goal"], g["codec"]): g["status"] for g in summary["goals"]}
    assert ("cpu_per_gb", "gzip") not in statuses  # gzip was not benchmarked: no row
    assert statuses[("fetch_only_throughput", "lz4")] == "MISS"
    assert len(summary["flow_totals"]) == 2


def test_goal_margin_text():
    from shallowmirror.reports.html import goal_margin_text

    miss = {"goal": "cpu_per_gb", "status": "MISS", "measured": 24.0, "threshold": 30.0,
            "comparison": ">=", "margin": -6.0, "margin_fraction": -0.2}
    assert goal_margin_text(miss) == "24.0x (goal >= 30.0x): 6.00 (20%) short"
    flat = {"goal": "shallow_rss_flat", "status": "MISS", "measured": 1.5, "threshold": 1.25,
            "comparison": "<=", "margin": -0.25, "margin_fraction": -0.2}
    assert goal_margin_text(flat).endswith("0.250 (20%) over")
    ok = {**miss, "status": "PASS", "measured": 33.0, "margin": 3.0, "margin_fraction": 0.1}
    assert goal_margin_text(ok) == "33.0x (goal >= 30.0x): 3.00 (10%) to spare"


def test_render_without_spark_and_without_data(tmp_path):
    from shallowmirror.reports.html import ReportData, write_report

    files = write_report(ReportData(inputs=["x.jsonl"], generated_at="now", window_s=1.0),
                         tmp_path)
    page = files.html.read_text()
    assert files.plots == 0 and "no benchmark runs and no engine metrics" in page
    assert json.loads(files.summary_json.read_text())["goals"] == []


def test_missing_inputs_are_named(tmp_path):
    from shallowmirror.errors import ShallowMirrorError
    from shallowmirror.reports.report import find_inputs

    with pytest.raises(ShallowMirrorError, match="not found: .*nope"):
        find_inputs([tmp_path / "nope"])
    with pytest.raises(ShallowMirrorError, match="no \\*.jsonl"):
        find_inputs([tmp_path])
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.jsonl").write_text("{}\n")
    assert find_inputs([tmp_path]) == [tmp_path / "sub" / "a.jsonl"]


def test_a_file_without_any_record_to_report_is_an_error(spark, tmp_path):
    """Not an empty report and exit 0: nothing was measured, and the message says what the
    input held and what report reads."""
    from shallowmirror.errors import ShallowMirrorError
    from shallowmirror.reports.report import run_report

    text = tmp_path / "notes.jsonl"
    text.write_text('garbage\n{"kind": "something else"}\n')
    with pytest.raises(ShallowMirrorError) as info:
        run_report([text], tmp_path / "out", spark=spark)
    assert str(info.value) == (
        f"nothing to report in {text}: no benchmark run, flow or process record (1 line(s) not "
        "JSON, 1 record(s) of another kind); give the JSON lines written by `shallowmirror bench "
        "--out` or `shallowmirror mirror --metrics-file`")


def test_nothing_to_report_is_found_before_spark_and_leaves_no_folder(tmp_path, monkeypatch):
    """Empty, binary or foreign inputs started Spark (16-38 s) before saying so, and left the
    empty --out folder behind."""
    from shallowmirror.errors import ShallowMirrorError
    from shallowmirror.reports import spark as spark_module
    from shallowmirror.reports.report import run_report

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark was started for inputs with nothing to report")

    monkeypatch.setattr(spark_module, "spark_session", no_spark)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\x00\xff\x81garbage\n\n{\"kind\": \"heartbeat\"}\n[1, 2]\n")
    out = tmp_path / "made" / "out"
    with pytest.raises(ShallowMirrorError) as info:
        run_report([binary], out)
    assert "(2 line(s) not JSON, 1 record(s) of another kind)" in str(info.value)
    assert not out.exists()
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ShallowMirrorError, match=f"--out {afile}: is a file, not a directory"):
        run_report([binary], afile)


def test_an_output_directory_that_cannot_be_made_is_named_before_spark_starts(data_dir,
                                                                              tmp_path):
    from shallowmirror.errors import ShallowMirrorError
    from shallowmirror.reports.report import run_report

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ShallowMirrorError, match=f"--out {blocker}/report: cannot create the "
                                                 "directory"):
        run_report([data_dir], blocker / "report")     # no Spark session: fails before it


def test_no_data_rows_only_for_codecs_that_were_run():
    from shallowmirror.reports.report import _goals_without_data

    rows = _goals_without_data([], [{"codec": "lz4", "mode": "shallow"}])
    cpu = [r for r in rows if r["goal"] == "cpu_per_gb"]
    # lz4 ran without deep-confluent: its CPU goal cannot be checked; gzip never ran: no row.
    assert [(r["codec"], r["status"]) for r in cpu] == [("lz4", "NO DATA")]


def test_a_failed_runs_error_shows_its_exception_and_folds_the_traceback():
    """The whole stderr tail of a failed mode sat flattened in one cell that never wrapped: the
    line that says why (the exception, last) was off the page."""
    from shallowmirror.reports.html import _error_cell

    error = ("not all records arrived (0/20000); mode process exited with status 1; stderr "
             "tail: Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
             "    main()\nRuntimeError: Libraries for snappy compression codec not found\n")
    cell = _error_cell({"error": error})
    assert cell.startswith("<div>not all records arrived (0/20000); mode process exited with "
                           "status 1</div><details><summary>RuntimeError: Libraries for snappy "
                           "compression codec not found</summary><pre>Traceback")
    assert _error_cell({"error": "target <unreachable>"}) == "<div>target &lt;unreachable&gt;</div>"


def test_a_flow_reported_at_one_time_has_no_seconds_and_says_why():
    """A run shorter than one metrics interval showed '0' seconds and no records/s in the table
    beside a panel drawing its records/s: the page contradicted itself without a word."""
    from shallowmirror.reports.html import _span_cell, instant_flows_note

    one = {"run_id": "r1", "flow": "A->B", "topic": "t", "records": 500, "span_s": 0.0}
    long = {**one, "topic": "u", "span_s": 12.5}
    assert _span_cell(one) == "–" and _span_cell(long) == "12.5"
    note = instant_flows_note([one, long])
    assert note.startswith("run r1 flow A->B topic t: every record was reported at one time")
    assert "topic u" not in note
    assert instant_flows_note([long]) is None
    assert instant_flows_note([{**one, "records": 0}]) is None
