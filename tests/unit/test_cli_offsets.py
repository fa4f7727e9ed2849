"""`shallowmirror offsets`: usage errors are one line and a non-zero exit, before any cluster is
contacted; an unreachable cluster is named, not a traceback."""

from __future__ import annotations

from pathlib import Path

from test_cli_messages import GOOD, mm2, run_cli


def test_without_an_action_it_prints_its_help_and_exits_2() -> None:
    result = run_cli("offsets")
    assert result.returncode == 2 and "translate" in result.stderr


def test_an_unknown_flow_is_named_with_the_enabled_ones(tmp_path: Path) -> None:
    config = mm2(tmp_path, *GOOD)
    result = run_cli("offsets", "translate", config, "--group", "g", "--flow", "B->A")
    assert result.returncode == 2
    assert "no enabled flow B->A (enabled flows: A->B)" in result.stderr
    assert "Traceback" not in result.stderr
    failover = run_cli("offsets", "failover", config, "--group", "g", "--to", "C")
    assert failover.returncode == 2 and "no enabled flow *->C" in failover.stderr


def test_an_unreachable_cluster_is_a_message(tmp_path: Path) -> None:
    config = mm2(tmp_path, "A.bootstrap.servers = 127.0.0.1:9", "B.bootstrap.servers = "
                 "127.0.0.1:9")
    result = run_cli("offsets", "failover", config, "--group", "g", "--to", "B", "--timeout",
                     "2")
    assert result.returncode == 2, result.stderr
    assert "cluster B" in result.stderr and "Traceback" not in result.stderr
