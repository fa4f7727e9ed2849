"""group.protocol: the setting, what it refuses, and the KIP-848 heartbeat on the wire (encoded
from Kafka's own schema, checked against the bytes its spec gives) and in the membership (a
join tells the whole state, later heartbeats only what changed)."""

from __future__ import annotations

import asyncio
import struct
import uuid

import pytest

from shallowmirror.engine.config import resolve_settings
from shallowmirror.engine.consumer_group import ConsumerGroupMembership
from shallowmirror.errors import ConfigError
from shallowmirror.mirror.config import resolve_mm2
from shallowmirror.net.group_api import (
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)

BASE = {"clusters": "A, B", "A.bootstrap.servers": "127.0.0.1:1",
        "B.bootstrap.servers": "127.0.0.1:2", "A->B.enabled": "true"}
TOPIC_ID = uuid.UUID("d65b9b3e-cb13-4f88-8a72-9ac82f8eb438")


def test_auto_is_the_default_and_a_protocol_is_chosen_per_flow_or_for_all():
    assert resolve_settings({})["group.protocol"] == "auto"
    for value in ("consumer", "classic"):
        for keys in ({"group.protocol": value}, {"A->B.group.protocol": value}):
            flow = resolve_mm2({**BASE, **keys}).flows[0]
            assert resolve_settings(flow.engine_settings)["group.protocol"] == value


def test_a_bad_value_is_refused_with_the_choices():
    with pytest.raises(ConfigError,
                       match="group.protocol.*auto, classic, consumer.*'cooperative'"):
        resolve_settings({"group.protocol": "cooperative"})


def test_the_deep_path_takes_the_default_auto_as_classic():
    flow = resolve_mm2(dict(BASE), deep=True).flows[0]
    assert resolve_settings(flow.engine_settings)["group.protocol"] == "auto"


def test_the_deep_path_refuses_the_consumer_protocol_instead_of_ignoring_it():
    with pytest.raises(ConfigError, match="A->B: group.protocol=consumer runs on the shallow"):
        resolve_mm2({**BASE, "group.protocol": "consumer"}, deep=True)


def _uvarint(n: int) -> bytes:
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([low])
        out += bytes([low | 0x80])


def _compact(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    data = text.encode()
    return _uvarint(len(data) + 1) + data


def test_a_join_heartbeat_is_encoded_as_kafkas_schema_says():
    """Field by field as ConsumerGroupHeartbeatRequest.json v0 (flexible: compact strings and
    arrays, a tagged-field count after each struct)."""
    request = ConsumerGroupHeartbeatRequest(
        version=0, group_id="g", member_id="", member_epoch=0, instance_id=None,
        rack_id=None, rebalance_timeout_ms=60000, subscribed_topic_names=["orders", "x"],
        server_assignor=None,
        topic_partitions=[ConsumerGroupHeartbeatRequest.TopicPartitions(
            topic_id=TOPIC_ID, partitions=[0, 3])])
    expected = (_compact("g") + _compact("") + struct.pack(">i", 0) + b"\x00" + b"\x00"
                + struct.pack(">i", 60000) + _uvarint(3) + _compact("orders") + _compact("x")
                + b"\x00" + _uvarint(2) + TOPIC_ID.bytes + _uvarint(3)
                + struct.pack(">ii", 0, 3) + b"\x00" + b"\x00")
    assert bytes(request.encode()) == expected


def test_an_answer_with_an_assignment_is_decoded():
    body = (struct.pack(">ih", 0, 0) + b"\x00" + _compact("member-1") + struct.pack(">ii", 3, 5000)
            + struct.pack(">b", 1) + _uvarint(2) + TOPIC_ID.bytes + _uvarint(3)
            + struct.pack(">ii", 1, 2) + b"\x00" + b"\x00" + b"\x00")
    answer = ConsumerGroupHeartbeatResponse.decode(body, version=0)
    assert (answer.error_code, answer.member_id, answer.member_epoch) == (0, "member-1", 3)
    assert answer.heartbeat_interval_ms == 5000
    [tps] = answer.assignment.topic_partitions
    assert (tps.topic_id, list(tps.partitions)) == (TOPIC_ID, [1, 2])


async def _no_call(*args):
    raise AssertionError("not called")


def _membership() -> ConsumerGroupMembership:
    return ConsumerGroupMembership(
        {"bootstrap.servers": "127.0.0.1:1"}, group_id="g", mode="group",
        session_timeout_ms=10000, heartbeat_interval_ms=1000, loop=asyncio.new_event_loop(),
        on_assigned=_no_call, on_revoked=_no_call, group_instance_id="mirror-1")


def test_a_join_tells_the_whole_state_and_later_heartbeats_only_what_changed():
    member = _membership()
    member.set_topics(["b", "a"])
    join, sent = member._request(0)
    assert (join.member_epoch, join.instance_id, join.rebalance_timeout_ms) == (0, "mirror-1",
                                                                                60000)
    assert join.subscribed_topic_names == ["a", "b"] and join.topic_partitions == []
    answer = ConsumerGroupHeartbeatResponse(
        version=0, throttle_time_ms=0, error_code=0, error_message=None, member_id="m",
        member_epoch=1, heartbeat_interval_ms=2000, assignment=None)
    assert member._answer(answer, sent) == 2.0
    assert (member.member_id, member.epoch) == ("m", 1)

    beat, sent = member._request(0)
    assert (beat.member_id, beat.member_epoch, beat.instance_id) == ("m", 1, None)
    assert beat.subscribed_topic_names is None and beat.topic_partitions is None
    assert beat.rebalance_timeout_ms == -1

    member._ids["a"] = TOPIC_ID
    member.assigned = {("a", 2), ("a", 0)}
    member._send_owned = True
    member.set_topics(["a"])
    beat, sent = member._request(0)
    assert beat.subscribed_topic_names == ["a"]
    [owned] = beat.topic_partitions
    assert (owned.topic_id, owned.partitions) == (TOPIC_ID, [0, 2])
    member.assigned.add(("a", 1))        # changed while the heartbeat was on its way: sent again
    member._answer(answer, sent)
    assert member._send_owned and not member._send_topics


def test_a_fenced_member_joins_again_at_once():
    member = _membership()
    member.member_id, member.epoch = "m", 4
    fenced = ConsumerGroupHeartbeatResponse(
        version=0, throttle_time_ms=0, error_code=110, error_message="fenced", member_id=None,
        member_epoch=0, heartbeat_interval_ms=0, assignment=None)

    async def answer() -> float:
        return member._answer(fenced, ([], None))

    pause = member._loop.run_until_complete(answer())
    assert pause == 0 and (member.member_id, member.epoch) == ("m", 0)
    rejoin = member._request(0)[0]           # the same member id at epoch 0 (KIP-848's rejoin)
    assert (rejoin.member_id, rejoin.member_epoch, rejoin.topic_partitions) == ("m", 0, [])
