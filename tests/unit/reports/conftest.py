"""One Spark session for every report test: starting the JVM costs ~10-20 s, so pay it once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A local[2] session; skips (with the reason) when pyspark or Java is missing."""
    pytest.importorskip("pyspark")
    from shallowmirror.reports.spark import JavaMissingError, check_java, spark_session

    try:
        check_java()
    except JavaMissingError as err:
        pytest.skip(str(err))
    session = spark_session(master="local[2]", app_name="shallowmirror-tests",
                            shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The committed JSON-lines fixtures whose numbers the tests check by hand."""
    return DATA
