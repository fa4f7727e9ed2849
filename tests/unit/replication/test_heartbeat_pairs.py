"""Which heartbeat emitters run (MM2 3.7's ``clusterPairs``), their settings, and what
``--check`` reports about them."""

from __future__ import annotations

import pytest

from shallowmirror.errors import ConfigError
from shallowmirror.mirror.config import MM2_IGNORED_KEYS, resolve_mm2
from shallowmirror.replication.heartbeats import HEARTBEAT_KEYS, Heartbeat, HeartbeatLatency

BASE = {"clusters": "A, B, C", "A.bootstrap.servers": "a:9092", "B.bootstrap.servers": "b:9092",
        "C.bootstrap.servers": "c:9092", "A->B.enabled": "true"}


def _pairs(**keys: str) -> dict[str, tuple[float, int, str]]:
    config = resolve_mm2({**BASE, **keys})
    return {p.name: (p.interval_s, p.replication_factor, p.target_config["bootstrap.servers"])
            for p in config.heartbeat_pairs}


def test_off_by_default_so_no_topic_appears_uninvited() -> None:
    assert _pairs() == {}


def test_both_directions_of_an_enabled_flow_emit_on_their_target() -> None:
    # B->A is not enabled, yet it emits into A (MM2: "B->A for the MirrorHeartbeatConnector");
    # C takes part in no enabled flow and gets nothing.
    assert _pairs(**{"emit.heartbeats.enabled": "true"}) == {
        "A->B": (1.0, -1, "b:9092"), "B->A": (1.0, -1, "a:9092")}


def test_pair_keys_override_top_level_keys() -> None:
    assert _pairs(**{"emit.heartbeats.enabled": "true", "B->A.emit.heartbeats.enabled": "false",
                     "emit.heartbeats.interval.seconds": "5",
                     "heartbeats.topic.replication.factor": "3"}) == {"A->B": (5.0, 3, "b:9092")}
    assert _pairs(**{"B->A.emit.heartbeats.enabled": "true"}) == {"B->A": (1.0, -1, "a:9092")}


def test_bad_values_are_reported_with_the_pair() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_mm2({**BASE, "emit.heartbeats.enabled": "true",
                     "B->A.emit.heartbeats.interval.seconds": "0"})
    assert any("emit.heartbeats.interval.seconds (B->A): must be at least" in p
               for p in err.value.problems)


def test_only_targets_keeps_the_emitters_into_those_clusters() -> None:
    config = resolve_mm2({**BASE, "emit.heartbeats.enabled": "true"}).only_targets(["A"])
    assert [p.name for p in config.heartbeat_pairs] == ["B->A"]


def test_heartbeat_keys_are_settings_not_ignored_keys() -> None:
    expected = {"emit.heartbeats.enabled", "emit.heartbeats.interval.seconds",
                "heartbeats.topic.replication.factor"}
    assert expected == HEARTBEAT_KEYS
    assert not HEARTBEAT_KEYS & MM2_IGNORED_KEYS


def test_latency_is_read_time_minus_heartbeat_time_never_negative() -> None:
    latency = HeartbeatLatency("A->B", "A.heartbeats")
    assert latency.observe(Heartbeat("B", "A", 1_000), now_ms=1_250) == 250.0
    assert latency.observe(Heartbeat("B", "A", 2_000), now_ms=1_990) == 0.0   # clock skew
    assert (latency.last_pair, latency.seen) == ("B->A", 2)


def test_an_unreachable_target_is_warned_about_once_and_retried(caplog) -> None:
    import asyncio
    import logging

    from shallowmirror.replication.heartbeats import HeartbeatEmitter, HeartbeatPair

    # Nothing listens on port 1: the topic cannot be listed or created.
    pair = HeartbeatPair("A", "B", 0.1, -1, {"bootstrap.servers": "127.0.0.1:1"})
    emitter = HeartbeatEmitter(pair, timeout_s=0.5)
    with caplog.at_level(logging.WARNING, logger="shallowmirror.replication.heartbeats"):
        asyncio.run(emitter.prepare())
        asyncio.run(emitter.prepare())
    assert emitter.failing and "cluster B" in emitter.failing
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("heartbeats A->B: cluster B: cannot list topics")
    assert emitter.emitted == 0
