"""FlowRunner's runner supervision, with a scripted fake runner (a real broker cannot be made to
fail a runner on cue)."""

import asyncio

import pytest

from shallowmirror.mirror.config import resolve_mm2
from shallowmirror.mirror.flows import FlowFailedError, FlowRunner


class ScriptedRunner:
    """Fails ``failures`` times, then runs until stopped."""

    def __init__(self, script: list):
        self.script = script
        self.runs = 0
        self.records = 0                # what this runner has mirrored (10 bytes a record)

    def set_topics(self, topics):
        pass

    def stats(self):
        from shallowmirror.mirror.stats import FlowStats, PartitionStats
        return FlowStats("A->B", "fake", {("t", 0): PartitionStats(
            "t", 0, records=self.records, bytes=10 * self.records)})

    async def run(self, stop=None):
        self.runs += 1
        step = self.script.pop(0) if self.script else None
        if isinstance(step, Exception):
            raise step
        await stop.wait()


def _flow_runner(**keys):
    flow = resolve_mm2({"clusters": "A, B", "A.bootstrap.servers": "a:1",
                        "B.bootstrap.servers": "b:1", "A->B.enabled": "true", **keys}).flows[0]
    return FlowRunner(flow)


def test_failed_runner_is_restarted_from_the_last_commit(monkeypatch):
    runner = _flow_runner()
    script = [RuntimeError("target unreachable")]
    made = []

    def make(index):
        made.append(ScriptedRunner(script))
        return made[-1]

    monkeypatch.setattr(runner, "_make_runner", make)
    monkeypatch.setattr("shallowmirror.mirror.flows.asyncio.wait_for",
                        _instant_wait_for)

    async def scenario():
        stop = asyncio.Event()
        first = make(0)
        first.records = 500             # mirrored before it failed
        runner.runners = [first]
        task = asyncio.create_task(runner._supervise(first, stop))
        for _ in range(100):
            await asyncio.sleep(0)
            if len(made) == 2 and made[1].runs == 1:
                break
        stop.set()
        await task

    asyncio.run(scenario())
    assert runner.restarts == 1 and len(made) == 2 and made[1].runs == 1
    assert runner.runners == [made[1]]
    made[1].records = 30
    stats = runner.stats()              # the failed runner's records still count
    assert (stats.records, stats.bytes) == (530, 5300)
    assert stats.partitions[("t", 0)].records == 30


def test_abort_on_send_failure_fails_the_flow():
    runner = _flow_runner(**{"abort.on.send.failure": "true"})
    fake = ScriptedRunner([RuntimeError("MESSAGE_TOO_LARGE")])
    runner.runners = [fake]

    async def scenario():
        await runner._supervise(fake, asyncio.Event())

    with pytest.raises(FlowFailedError, match="flow A->B failed: MESSAGE_TOO_LARGE"):
        asyncio.run(scenario())


async def _instant_wait_for(awaitable, timeout):
    """No real backoff sleeps in unit tests."""
    if asyncio.iscoroutine(awaitable):
        awaitable.close()
    raise asyncio.TimeoutError


@pytest.mark.parametrize("key", ["A.reconnect.deadline.ms", "B.reconnect.deadline.ms",
                                 "A.consumer.reconnect.deadline.ms",
                                 "B.producer.reconnect.deadline.ms",
                                 "A->B.consumer.reconnect.deadline.ms"])
def test_the_flow_gives_up_after_the_smallest_deadline_any_client_has(key):
    """``legacy``'s --consumer.config / --producer.config keys arrive as role keys: the flow
    waited out the 120 s default whatever they said."""
    assert _flow_runner()._deadline_ms() == 120000
    assert _flow_runner(**{key: "6000"})._deadline_ms() == 6000


class _SlowToStop(ScriptedRunner):
    """Stops only long after the stop: an engine whose in-flight batches wait out
    request.timeout.ms for a target that died."""

    async def run(self, stop=None):
        self.runs += 1
        await stop.wait()
        await asyncio.sleep(30)


def test_a_runner_slow_to_stop_is_given_up_after_the_graceful_timeout(monkeypatch):
    """The graceful timeout runs from the stop: the flow waited for its runners' own shutdown
    first (30 s, request.timeout.ms) and then, all of them done, never reported giving up."""
    runner = _flow_runner(**{"task.shutdown.graceful.timeout.ms": "200",
                             "refresh.topics.enabled": "false",
                             "sync.topic.configs.enabled": "false"})
    slow = _SlowToStop([])

    async def nothing(*args, **kwargs):
        return []

    async def refreshed(stop, first=False):
        return True

    class Sync:
        def sync_configs(self):
            pass

    monkeypatch.setattr(runner, "_connect", lambda stop: nothing())
    monkeypatch.setattr(runner, "_refresh", refreshed)
    monkeypatch.setattr(runner, "_start_offset_features", nothing)
    monkeypatch.setattr(runner, "_start_group_features", nothing)
    monkeypatch.setattr(runner, "_make_runner", lambda index: slow)
    runner.sync = Sync()

    async def scenario():
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        while slow.runs == 0:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 10)      # not the runner's 30 s: given up on

    asyncio.run(scenario())
    assert runner.unclean
