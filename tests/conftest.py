"""Session fixtures shared by every integration test.

Clusters: two embedded tansu brokers for the whole session (``source_cluster``, ``target_cluster``),
or, when ``SHALLOWMIRROR_SOURCE_BOOTSTRAP`` and ``SHALLOWMIRROR_TARGET_BOOTSTRAP`` are set, those
existing clusters (e.g. real Apache Kafka) — the tests run unchanged. Each cluster object has
``.bootstrap``, ``.alias``, ``.embedded`` and ``.client_config()``. Tests share the clusters and
isolate themselves with ``unique_topic()`` names, so they also run against a shared real cluster.

Markers:
- ``needs_real_kafka("why")``: tansu cannot serve the test (e.g. it reports no aborted
  transactions); skipped, with the reason, when the clusters are embedded tansu.
- ``tansu_workaround("why")``: the test adapts to a documented tansu quirk; it runs everywhere and
  the ``on_tansu`` fixture says which branch applies.

At session end every tansu process started by this test process must be gone (checked by pid);
if one is left, it is killed and the session fails loudly.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Callable, Iterator

import psutil
import pytest

from shallowmirror.testing import embedded

#: pids of every embedded broker the fixtures started, checked at session end.
_STARTED_PIDS: list[int] = []


def _using_external() -> bool:
    return bool(os.environ.get(embedded.SOURCE_ENV) or os.environ.get(embedded.TARGET_ENV))


def pytest_report_header(config: pytest.Config) -> str:
    if _using_external():
        return (f"clusters: external ({embedded.SOURCE_ENV}={os.environ.get(embedded.SOURCE_ENV)}, "
                f"{embedded.TARGET_ENV}={os.environ.get(embedded.TARGET_ENV)})")
    return "clusters: embedded tansu (needs_real_kafka tests are skipped)"


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("needs_real_kafka")
    if marker is not None and not _using_external():
        why = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
        pytest.skip(f"needs real Apache Kafka, not embedded tansu{': ' + why if why else ''} "
                    f"(set {embedded.SOURCE_ENV} and {embedded.TARGET_ENV})")


@pytest.fixture(scope="session")
def broker_log_dir(tmp_path_factory: pytest.TempPathFactory):
    """Where embedded brokers write their logs (pytest keeps the last few sessions' tmp dirs)."""
    return tmp_path_factory.mktemp("brokers")


@pytest.fixture(scope="session")
def clusters(broker_log_dir) -> Iterator[tuple]:
    """(source, target): external clusters from the environment, or two embedded tansu brokers
    started once for the session."""
    external = embedded.external_from_env()
    if external is not None:
        yield external
        return
    started = []
    try:
        for alias in ("source", "target"):
            cluster = embedded.start_cluster(alias, log_dir=broker_log_dir)
            _STARTED_PIDS.append(cluster.pid)
            started.append(cluster)
        yield tuple(started)
    finally:
        for cluster in started:
            cluster.stop()


@pytest.fixture(scope="session")
def source_cluster(clusters):
    return clusters[0]


@pytest.fixture(scope="session")
def target_cluster(clusters):
    return clusters[1]


@pytest.fixture(scope="session")
def on_tansu(clusters) -> bool:
    """True when the session's clusters are embedded tansu (for ``tansu_workaround`` branches)."""
    return bool(clusters[0].embedded)


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> Callable[..., str]:
    """Factory of topic names unique to this test and run: ``unique_topic("orders")``."""
    test = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:60]

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{test}-{uuid.uuid4().hex[:10]}"

    return make


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every broker this session started must be gone: fail loudly (and clean up) if not."""
    embedded.stop_all()  # anything a test started and forgot; the pid check below still applies
    leftovers = [pid for pid in _STARTED_PIDS if _alive(pid)]
    me = psutil.Process()
    leftovers += [child.pid for child in me.children(recursive=True)
                  if _is_tansu(child) and child.pid not in leftovers]
    if not leftovers:
        return
    for pid in leftovers:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"BROKER PROCESSES LEFT RUNNING AFTER THE SESSION (now killed): pids {leftovers}"
    if reporter is not None:
        reporter.write_line(message, red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _is_tansu(process: psutil.Process) -> bool:
    try:
        return process.name() == "tansu" and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
