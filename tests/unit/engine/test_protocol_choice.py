"""group.protocol=auto's switch from the consumer protocol to the classic one, on scripted members
(the refusals themselves come from real brokers in tests/integration/test_consumer_group_protocol
.py): what is handed over, what is not switched for, and a close that meets a switch."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from shallowmirror.engine.consumer_group import ConsumerProtocolRefused
from shallowmirror.engine.membership import GroupMembershipError
from shallowmirror.engine.protocol_choice import AutoMembership


class ScriptedMember:
    """Membership's interface, recording what the AutoMembership asks of it."""

    made: list[ScriptedMember]

    def __init__(self, source_config, *, on_failed=None, **arguments) -> None:
        self.config, self.on_failed, self.arguments = source_config, on_failed, arguments
        self.started_with: list[str] | None = None
        self.topics: list[list[str]] = []
        self.closed: list[dict] = []
        self.ended = False
        self.subscribed_at: float | None = None
        self.assigned = set()
        self.close_gate: asyncio.Event | None = None
        self.made.append(self)

    def start(self, topics):
        self.started_with = list(topics)

    def set_topics(self, topics):
        self.topics.append(list(topics))
        if topics and self.subscribed_at is None:
            self.subscribed_at = 12.5

    def commit(self, offsets):
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(None)
        return future

    async def close(self, final):
        if self.close_gate is not None:
            await self.close_gate.wait()
        self.closed.append(dict(final))
        self.ended = True


def _auto(loop, failures: list) -> tuple[AutoMembership, list[ScriptedMember]]:
    made: list[ScriptedMember] = []
    member_type = type("Member", (ScriptedMember,), {"made": made})
    auto = AutoMembership({"bootstrap.servers": "x"}, loop=loop, on_failed=failures.append,
                          consumer_factory=member_type, classic_factory=member_type,
                          group_id="g", mode="group", session_timeout_ms=10000,
                          heartbeat_interval_ms=3000, on_assigned=None, on_revoked=None,
                          source_alias="A")
    return auto, made


def _refused(*, before_join: bool = True, classic_group: bool = False):
    return ConsumerProtocolRefused("refused", before_join=before_join,
                                   classic_group=classic_group)


def test_a_refusal_before_joining_goes_on_with_the_classic_protocol(caplog):
    async def scenario():
        failures: list = []
        auto, made = _auto(asyncio.get_running_loop(), failures)
        auto.start([])
        auto.set_topics(["t1", "t2"])
        made[0].on_failed(_refused(classic_group=True))
        assert not auto.ended                       # switching, not ended
        await auto._switch
        return auto, made, failures

    caplog.set_level("INFO")
    auto, made, failures = asyncio.run(scenario())
    consumer, classic = made
    assert failures == [] and auto.protocol == "classic" and auto.current is classic
    assert consumer.closed == [{}]                  # it owned nothing: nothing committed
    assert classic.started_with == ["t1", "t2"]     # the latest subscription
    assert classic.subscribed_at == 12.5            # the start-up timeline keeps its first mark
    assert classic.arguments == consumer.arguments and classic.config == consumer.config
    assert auto.assigned is classic.assigned and not auto.ended
    assert "a classic group holds the group id" in caplog.text
    assert "sharing partitions through the classic protocol" in caplog.text


@pytest.mark.parametrize("error", [
    _refused(before_join=False),                   # it had joined: it may have owned partitions
    GroupMembershipError("not authorized"),        # any other group error
])
def test_other_failures_stop_the_engine_as_with_an_explicit_protocol(error):
    async def scenario():
        failures: list = []
        auto, made = _auto(asyncio.get_running_loop(), failures)
        auto.start(["t"])
        made[0].on_failed(error)
        return auto, made, failures

    auto, made, failures = asyncio.run(scenario())
    assert failures == [error] and len(made) == 1 and auto.protocol == "consumer"


def test_a_close_during_the_switch_starts_no_classic_member():
    async def scenario():
        failures: list = []
        auto, made = _auto(asyncio.get_running_loop(), failures)
        auto.start(["t"])
        made[0].close_gate = gate = asyncio.Event()
        made[0].on_failed(_refused())
        await asyncio.sleep(0)
        closing = asyncio.create_task(auto.close({("t", 0): 5}))
        await asyncio.sleep(0)
        gate.set()
        await closing
        return auto, made, failures

    auto, made, failures = asyncio.run(scenario())
    assert len(made) == 1 and made[0].closed == [{}] and failures == []
    assert auto.protocol == "consumer" and auto.ended


def test_a_close_after_the_switch_closes_the_classic_member_with_the_final_positions():
    async def scenario():
        auto, made = _auto(asyncio.get_running_loop(), [])
        auto.start(["t"])
        made[0].on_failed(_refused())
        await auto._switch
        await auto.close({("t", 0): 7})
        return made

    consumer, classic = asyncio.run(scenario())
    assert consumer.closed == [{}] and classic.closed == [{("t", 0): 7}]
