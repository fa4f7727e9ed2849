"""Exactly-once settings: what switches it on, what it forces, and what it refuses (all at once,
before anything runs)."""

import pytest

from shallowmirror.engine.config import exactly_once, resolve_settings
from shallowmirror.engine.transactions import commit_metadata, committed_topic_id, transactional_id
from shallowmirror.errors import ConfigError
from shallowmirror.mirror.config import resolve_mm2

BASE = {"clusters": "A, B", "A.bootstrap.servers": "127.0.0.1:1",
        "B.bootstrap.servers": "127.0.0.1:2", "A->B.enabled": "true"}


def test_mm2_switch_and_per_flow_key_both_turn_it_on():
    assert not exactly_once(resolve_settings({}))
    assert exactly_once(resolve_settings({"exactly.once": "true"}))
    assert exactly_once(resolve_settings({"exactly.once.source.support": "enabled"}))
    assert not exactly_once(resolve_settings({"exactly.once.source.support": "preparing"}))


def test_exactly_once_forces_read_committed_fetches():
    values = resolve_settings({"exactly.once": "true", "isolation.level": "read_uncommitted"})
    assert values["isolation.level"] == "read_committed"


def test_every_conflicting_setting_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        resolve_settings({"exactly.once": "true", "enable.idempotence": "false", "acks": "1",
                          "transaction.interval.ms": "40000", "transaction.timeout.ms": "60000",
                          "transaction.max.bytes": str(128 << 20)})
    text = "\n".join(err.value.problems)
    assert "exactly-once needs enable.idempotence=true" in text
    assert "exactly-once needs acks=all" in text
    assert "transaction.interval.ms (40000) must be at most half of transaction.timeout.ms" in text
    assert "transaction.max.bytes (134217728) must not exceed buffer.memory" in text


def test_mm2_properties_top_level_and_per_flow():
    top = resolve_mm2({**BASE, "exactly.once.source.support": "enabled"})
    assert exactly_once(resolve_settings(top.flows[0].engine_settings))
    flow = resolve_mm2({**BASE, "A->B.exactly.once": "true"})
    assert exactly_once(resolve_settings(flow.flows[0].engine_settings))
    with pytest.raises(ConfigError, match="exactly.once.source.support"):
        resolve_mm2({**BASE, "exactly.once.source.support": "yes"})


def test_transactional_id_is_unique_per_group_flow_and_partition():
    ids = {transactional_id(g, f, t, p) for g, f, t, p in [
        ("g", "A->B", "t", 1), ("g", "A->B", "t", 12), ("g", "A->B", "t-1", 2),
        ("g-a", "A->B", "b", 0), ("g", "A->B", "a-b", 0), ("g", "C->B", "t", 1)]}
    assert len(ids) == 6
    assert transactional_id("g", "A->B", "orders", 3) == "g:A->B:orders:3"


def test_a_flow_can_turn_it_off_again():
    config = resolve_mm2({**BASE, "exactly.once": "true", "A->B.exactly.once": "false"})
    assert not exactly_once(resolve_settings(config.flows[0].engine_settings))


def test_the_deep_path_refuses_exactly_once_instead_of_ignoring_it():
    with pytest.raises(ConfigError, match="A->B: exactly-once runs on the shallow path only"):
        resolve_mm2({**BASE, "A->B.exactly.once": "true"}, deep=True)


def test_the_offset_commit_names_the_source_topic_id_and_older_commits_name_none():
    tid = "4mZwBOKeTbKI8mHzmU8Ifw"
    text = commit_metadata("A", ("orders", 3), tid)
    assert text == f"source A orders-3 topic-id {tid}"
    assert committed_topic_id(text) == tid
    assert commit_metadata("A", ("orders", 3), None) == "source A orders-3"
    # A commit by a version before ids were recorded, another tool's, or none at all.
    for older in ("source A orders-3", "", None, "topic-id x", "source A orders-3 topic x"):
        assert committed_topic_id(older) is None
