"""Group offset sync's rule (MM2's ``syncGroupOffset``), the checkpoint stream it reads, which
topics reverse checkpointing takes, and what ``--check`` says about its settings."""

from __future__ import annotations

import pytest

from shallowmirror.errors import ConfigError
from shallowmirror.mirror.config import MM2_IGNORED_KEYS, resolve_mm2
from shallowmirror.replication.group_offset_sync import latest_checkpoints, offsets_to_sync
from shallowmirror.replication.mm2_records import Checkpoint
from shallowmirror.replication.reverse_checkpoints import came_from_target
from shallowmirror.replication.sync_settings import SYNC_KEYS

BASE = {"clusters": "A, B", "A.bootstrap.servers": "a:9092", "B.bootstrap.servers": "b:9092",
        "A->B.enabled": "true", "B->A.enabled": "true"}


def test_never_moves_a_group_backwards_and_fills_what_is_missing() -> None:
    checkpoints = {("A.t", 0): 100, ("A.t", 1): 50, ("A.t", 2): 70, ("A.u", 0): 5}
    committed = {("A.t", 0): 100, ("A.t", 1): 80, ("A.t", 2): 60}
    # p0 equal: nothing to do; p1 ahead on the target: kept; p2 behind: moved; u-0 new: written.
    assert offsets_to_sync(checkpoints, committed) == {("A.t", 2): 70, ("A.u", 0): 5}


def test_latest_checkpoint_per_group_and_partition_wins_and_junk_is_skipped() -> None:
    old = Checkpoint("g", "A.t", 0, 10, 10)
    new = Checkpoint("g", "A.t", 0, 20, 19, "meta")
    other = Checkpoint("h", "t", 1, 7, 7)
    records = [(old.key(), old.value()), (b"junk", b"\x00"), (new.key(), new.value()),
               (other.key(), other.value()), (new.key(), None)]
    assert latest_checkpoints(records) == {"g": {("A.t", 0): new}, "h": {("t", 1): other}}


def _flow(config, name: str):
    return next(f for f in config.flows if f.name == name)


def test_reverse_checkpointing_takes_the_copies_of_the_targets_topics() -> None:
    config = resolve_mm2({**BASE, "reverse.checkpointing.enabled": "true",
                          "B->A.reverse.checkpointing.topic.filter.topics.exclude": "A.secret"})
    back = _flow(config, "B->A")
    assert back.opposite is _flow(config, "A->B")
    assert came_from_target(back, "A.orders")
    assert not came_from_target(back, "A.secret")
    assert not came_from_target(back, "orders")            # B's own topic
    assert not came_from_target(back, "C.orders")          # from a third cluster


def test_a_topic_filter_decides_when_configured() -> None:
    config = resolve_mm2({**BASE, "reverse.checkpointing.enabled": "true",
                          "replication.policy.class": "IdentityReplicationPolicy",
                          "topics": "orders-.*",
                          "reverse.checkpointing.topic.filter.topics": "orders-.*"})
    assert came_from_target(_flow(config, "B->A"), "orders-eu")
    assert not came_from_target(_flow(config, "B->A"), "payments")


def test_check_reports_a_missing_opposite_flow_and_an_identity_policy_without_filter() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_mm2({**BASE, "B->A.enabled": "false", "reverse.checkpointing.enabled": "true"})
    assert any("A->B.reverse.checkpointing.enabled: needs the opposite flow B->A enabled" in p
               for p in err.value.problems)
    with pytest.raises(ConfigError) as err:
        resolve_mm2({**BASE, "B->A.reverse.checkpointing.enabled": "true",
                     "A->B.emit.offset-syncs.enabled": "false"})
    assert any("B->A.reverse.checkpointing.enabled: the opposite flow A->B writes no offset "
               "syncs" in p for p in err.value.problems)
    with pytest.raises(ConfigError) as err:
        resolve_mm2({**BASE, "reverse.checkpointing.enabled": "true", "topics": "orders",
                     "replication.policy.class": "IdentityReplicationPolicy"})
    assert any("IdentityReplicationPolicy cannot tell which topics came from" in p
               for p in err.value.problems)
    with pytest.raises(ConfigError) as err:
        resolve_mm2({**BASE, "reverse.checkpointing.topic.filter.class": "com.x.MyFilter",
                     "sync.group.offsets.interval.seconds": "0"})
    problems = "\n".join(err.value.problems)
    assert "unknown class 'com.x.MyFilter'" in problems
    assert "sync.group.offsets.interval.seconds (A->B): must be at least" in problems


def test_keys_are_settings_not_ignored_keys() -> None:
    assert {"sync.group.offsets.enabled", "sync.group.offsets.interval.seconds",
            "reverse.checkpointing.enabled"} <= SYNC_KEYS
    assert not SYNC_KEYS & MM2_IGNORED_KEYS


def test_group_features_without_checkpoints_are_warned_about_not_silently_idle() -> None:
    config = resolve_mm2({**BASE, "emit.checkpoints.enabled": "false",
                          "sync.group.offsets.enabled": "true"})
    assert "A->B.sync.group.offsets.enabled does nothing with emit.checkpoints.enabled = " \
           "false (it works on the flow's checkpoints)" in config.warnings
