"""`shallowmirror offsets`: usage errors are one line and a non-zero exit, before any cluster is
contacted; an unreachable cluster is named with its address, not a traceback; a dry run says
what it did not write and what the group already has."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
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


def _closed_port() -> int:
    """A local port nothing listens on (connections are refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("action, unreachable", [
    (("translate", "--flow", "A->B"), "A"),          # reads the group's offsets on A
    (("failover", "--to", "B"), "B"),                # reads B's checkpoints
    (("failover", "--to", "B", "--live"), "A"),
    (("failback", "--to", "A"), "B"),                # reads the group's offsets on B
])
def test_an_unreachable_cluster_is_named_with_its_address(tmp_path: Path, action,
                                                          unreachable) -> None:
    ports = {"A": _closed_port(), "B": _closed_port()}
    config = mm2(tmp_path, *(f"{alias}.bootstrap.servers = 127.0.0.1:{port}"
                             for alias, port in ports.items()))
    result = run_cli("offsets", action[0], config, "--group", "g", *action[1:], "--timeout", "1")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "KafkaError{" not in result.stderr, result.stderr
    assert (f"shallowmirror offsets {action[0]}: cannot reach cluster {unreachable} at "
            f"127.0.0.1:{ports[unreachable]}: no answer within 1s") in result.stderr, result.stderr
    assert f"nothing listens at 127.0.0.1:{ports[unreachable]})" in result.stderr
    assert f"{unreachable}.bootstrap.servers" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_dry_run_says_what_the_group_already_has() -> None:
    from shallowmirror.cli.offsets import dry_run_summary
    from shallowmirror.replication.groups import CommittedOffset

    wanted = [CommittedOffset("A.orders", 0, 10, ""), CommittedOffset("A.orders", 1, 20, ""),
              CommittedOffset("A.orders", 2, 30, "")]
    synced = dry_run_summary("billing", "B", wanted, list(wanted))
    assert synced == ("dry run, nothing written: group billing on cluster B already has these "
                      "3 offsets (written by group offset sync or an earlier --execute); "
                      "--execute would change nothing")
    partly = dry_run_summary("billing", "B", wanted, [CommittedOffset("A.orders", 0, 10, ""),
                                                      CommittedOffset("A.orders", 1, 5, "")])
    assert partly == ("dry run, nothing written: group billing on cluster B: --execute would "
                      "commit these 3 offsets (1 already committed, 1 committed at another "
                      "offset, 1 with none)")
    assert "3 with none" in dry_run_summary("billing", "B", wanted, [])


def test_one_offset_is_said_in_the_singular() -> None:
    from shallowmirror.cli.offsets import dry_run_summary
    from shallowmirror.replication.groups import CommittedOffset

    one = [CommittedOffset("A.orders", 0, 10, "")]
    assert "already has this 1 offset (" in dry_run_summary("billing", "B", one, one)
    assert "--execute would commit this 1 offset (" in dry_run_summary("billing", "B", one, [])
