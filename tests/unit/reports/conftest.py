"""One Spark session for every report test: starting the JVM costs ~10-20 s, so pay it once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def java() -> None:
    """PySpark and a usable Java: skips (with the reason) when either is missing, fails under
    CI=true."""
    pytest.importorskip("pyspark")
    from shallowmirror.reports.spark import JavaMissingError, check_java

    try:
        check_java()
    except JavaMissingError as err:
        # CI has Java 17 by contract: there a missing Java is a missing install step, not a skip.
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but Spark cannot run: {err}")
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def spark(java) -> Iterator[object]:
    """A local[2] session (see ``java`` for when there is none)."""
    from shallowmirror.reports.spark import spark_session, stop_session

    # Fixture data is a few rows: one shuffle partition spares tasks that would sit empty.
    session = spark_session(master="local[2]", app_name="shallowmirror-tests",
                            shuffle_partitions=1)
    yield session
    stop_session(session)  # and its JVM: nothing of Spark may outlive `make test`


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The committed JSON-lines fixtures whose numbers the tests check by hand."""
    return DATA


@pytest.fixture(scope="session")
def report_files(spark, data_dir, tmp_path_factory):
    """The whole report over the fixtures, run once: every job costs Spark seconds, so share it."""
    from shallowmirror.reports.report import run_report

    return run_report([data_dir], tmp_path_factory.mktemp("report"), window_s=1.0, spark=spark)


@pytest.fixture(scope="session")
def report_data(report_files):
    """What the jobs computed for the report (ReportData)."""
    return report_files.data


@pytest.fixture(scope="session")
def tables(report_data):
    """The collected job results by name: lists of dict rows."""
    return report_data.tables
