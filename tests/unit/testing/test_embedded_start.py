"""An embedded broker's start cut short: nothing of it is left behind, unless an error names it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from shallowmirror.testing import embedded


def _folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("shallowmirror-brokers-*"))


def test_ctrl_c_while_a_broker_starts_leaves_no_process_and_no_folder(monkeypatch):
    """The log folder was kept on any exception, Ctrl-C included: `bench` interrupted in its
    first second left a /tmp/shallowmirror-brokers-* folder each time."""
    started: list[int] = []
    before = _folders()

    def interrupted(cluster):
        started.append(cluster.pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "_wait_ready", interrupted)
    with pytest.raises(KeyboardInterrupt):
        embedded.start_cluster("cut-short")
    assert started and embedded.pid_gone(started[0])
    assert _folders() - before == set()


def test_a_broker_that_fails_to_start_keeps_the_log_its_error_names(monkeypatch):
    kept: list[Path] = []

    def failed(cluster):
        kept.append(cluster.log_path.parent)
        raise embedded.BrokerStartError(f"see {cluster.log_path}")

    monkeypatch.setattr(embedded, "_wait_ready", failed)
    with pytest.raises(embedded.BrokerStartError):
        embedded.start_cluster("failing")
    try:
        assert kept and kept[0].is_dir()
    finally:
        shutil.rmtree(kept[0], ignore_errors=True)
