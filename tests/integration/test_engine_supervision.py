"""No engine task dies silently: an exception injected into each kind of task the engine starts
(fetch loop, produce loop, an in-flight Produce request - its task or its response callback -
topic discovery, offset commits, metrics, a one-shot helper task, the membership thread) either
is retried with backoff (transient) or ends ``run`` with an ``EngineTaskError`` naming the task,
cluster and topic-partition. Real source and target brokers; only the injected exception is
scripted."""

from __future__ import annotations

import asyncio

import pytest
from engine_support import create_target, group, load_topic, run_until_caught_up

from shallowmirror import codec
from shallowmirror.engine import MirrorEngine, hotpath
from shallowmirror.engine.core import EngineCore
from shallowmirror.engine.discovery import TopicDiscovery
from shallowmirror.engine.membership import Membership
from shallowmirror.engine.metrics import FlowRecorder
from shallowmirror.engine.sink import Sinks
from shallowmirror.engine.source import Source
from shallowmirror.engine.supervisor import EngineTaskError
from shallowmirror.errors import BrokerError, Where
from shallowmirror.testing.topics import read_topic

pytestmark = pytest.mark.integration

UNSUPPORTED_VERSION = 35
REQUEST_TIMED_OUT = 7
RECORDS = 2000
FAST = {"retry.backoff.ms": 10, "retry.backoff.max.ms": 50}


def _once(error: BaseException, original=None, *, is_async: bool = True):
    """A replacement that raises ``error`` on its first call, then behaves like ``original``."""
    calls = []

    if is_async:
        async def replacement(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise error
            return await original(*args, **kwargs)
    else:
        def replacement(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise error
            return original(*args, **kwargs)
    replacement.calls = calls
    return replacement


@pytest.fixture
def topic(source_cluster, target_cluster, unique_topic) -> str:
    name = unique_topic("sup")
    load_topic(source_cluster, name, RECORDS, partitions=1)
    create_target(target_cluster, name, 1)
    return name


def _fails(source_cluster, target_cluster, topic: str, settings=None, *,
           engine_out: list | None = None, **kwargs) -> str:
    """Run an engine with no stop signal: it must end, within 60 s, with an EngineTaskError."""
    engine = MirrorEngine(source_cluster.client_config(), target_cluster.client_config(),
                          topics=[topic], settings={"partition.assignment": "all",
                                                    "group.id": group(), **FAST,
                                                    **(settings or {})}, **kwargs)
    if engine_out is not None:
        engine_out.append(engine)
    with pytest.raises(EngineTaskError) as caught:
        asyncio.run(asyncio.wait_for(engine.run(asyncio.Event()), 60))
    return str(caught.value)


def _mirrors_everything(source_cluster, target_cluster, topic: str) -> list:
    engines: list = []
    stats = asyncio.run(run_until_caught_up(source_cluster, target_cluster, [topic],
                                            settings=FAST, engine_out=engines))
    assert stats.records == RECORDS and not stats.stopped
    values = [r.value for r in read_topic(target_cluster.client_config(), topic)[0]]
    assert len(values) == RECORDS == len(set(values))       # each record once
    return engines


def test_fetch_loop_error_no_retry_fixes_fails_the_engine(source_cluster, target_cluster, topic,
                                                         monkeypatch):
    # The bug this replaces: BrokerError(UNSUPPORTED_VERSION) ended the fetch task silently.
    monkeypatch.setattr(Source, "_fetch_once", _once(
        BrokerError(UNSUPPORTED_VERSION, Where(cluster="source"), "in a Fetch response"),
        Source._fetch_once))
    text = _fails(source_cluster, target_cluster, topic)
    assert "fetch loop of source broker" in text and "UNSUPPORTED_VERSION" in text
    assert f"topic-partition {topic}-0" in text and "cluster source" in text


def test_fetch_loop_transient_error_is_retried(source_cluster, target_cluster, topic,
                                               monkeypatch):
    fetch = _once(BrokerError(REQUEST_TIMED_OUT, Where(cluster="source")), Source._fetch_once)
    monkeypatch.setattr(Source, "_fetch_once", fetch)
    (engine,) = _mirrors_everything(source_cluster, target_cluster, topic)
    assert len(fetch.calls) > 1 and engine.supervisor.restarts == 1


def test_a_partition_revoked_while_the_fetch_loop_waits_is_not_asked_for(
        source_cluster, target_cluster, topic, monkeypatch):
    """The fetch loop picks its partitions, then waits for budget room and the connection; one
    revoked meanwhile is no longer the source's. It once failed the loop (KeyError, the engine
    stopped: seen in the two-process kill test). Here every fetch's list carries a partition
    the source does not hold."""
    original = Source._fetch_once
    calls = []

    async def with_a_revoked_partition(self, ready, max_bytes=None):
        calls.append(1)
        return await original(self, [*ready, ("revoked-meanwhile", 0)], max_bytes)

    monkeypatch.setattr(Source, "_fetch_once", with_a_revoked_partition)
    (engine,) = _mirrors_everything(source_cluster, target_cluster, topic)
    assert calls and engine.supervisor.restarts == 0


def test_produce_loop_error_fails_the_engine(source_cluster, target_cluster, topic,
                                             monkeypatch):
    monkeypatch.setattr(hotpath, "plan_picks", _once(
        RuntimeError("injected"), hotpath.plan_picks, is_async=False))
    text = _fails(source_cluster, target_cluster, topic)
    assert "produce loop of target broker" in text and "RuntimeError: injected" in text
    assert "cluster target" in text


def test_produce_request_error_fails_the_engine_and_leaves_nothing_in_flight(
        source_cluster, target_cluster, topic, monkeypatch):
    engines: list = []
    monkeypatch.setattr(codec, "decode_produce_answer", _once(
        BrokerError(UNSUPPORTED_VERSION), codec.decode_produce_answer, is_async=False))
    text = _fails(source_cluster, target_cluster, topic, engine_out=engines)
    assert "produce request to target broker" in text and "UNSUPPORTED_VERSION" in text
    assert f"topic-partition {topic}-0" in text and "cluster target" in text
    (engine,) = engines
    assert all(tq.in_flight == 0 and not tq.failed
               for sink in engine.sinks.values() for tq in sink.partitions.values())
    assert "UNSUPPORTED_VERSION" in engine.stats().stopped[(topic, 0)]


def test_produce_request_transient_error_resends_without_duplicates(
        source_cluster, target_cluster, topic, monkeypatch):
    # The request reached the target before the (injected) error: the resend must not duplicate.
    decode = _once(BrokerError(REQUEST_TIMED_OUT), codec.decode_produce_answer,
                   is_async=False)
    monkeypatch.setattr(codec, "decode_produce_answer", decode)
    _mirrors_everything(source_cluster, target_cluster, topic)
    assert len(decode.calls) > 1


def test_error_applying_a_response_in_a_callback_fails_the_engine(
        source_cluster, target_cluster, topic, monkeypatch):
    # A request on an open connection is answered in its future's done callback, in no task:
    # what raises there (asyncio would only log it) must end run() with the same EngineTaskError
    # a failing request task gives, naming the request and where.
    in_task: list[bool] = []
    settle = hotpath.settle_picks

    def failing_in_callback(*args):
        in_task.append(asyncio.current_task() is not None)
        if not in_task[-1]:
            raise RuntimeError("injected")
        return settle(*args)

    monkeypatch.setattr(hotpath, "settle_picks", failing_in_callback)
    text = _fails(source_cluster, target_cluster, topic)
    assert in_task[-1] is False, "the failing response was applied outside any task"
    assert "produce request to target broker" in text and "RuntimeError: injected" in text
    assert f"topic-partition {topic}-0" in text and "cluster target" in text


@pytest.mark.parametrize(("cls", "method", "settings", "named"), [
    (TopicDiscovery, "discover", {}, "topic discovery"),
    (EngineCore, "commit_now", {"offset.commit.interval.ms": 10}, "offset commits"),
    (FlowRecorder, "maybe_flush", {"metrics.interval.ms": 10}, "metrics"),
])
def test_engine_loop_error_fails_the_engine(source_cluster, target_cluster, topic, monkeypatch,
                                            cls, method, settings, named):
    original = getattr(cls, method)
    monkeypatch.setattr(cls, method, _once(RuntimeError("injected"), original,
                                           is_async=asyncio.iscoroutinefunction(original)))
    text = _fails(source_cluster, target_cluster, topic, settings)
    assert f"{named} failed: RuntimeError: injected" in text and "cluster source" in text


def test_one_shot_task_error_fails_the_engine(source_cluster, target_cluster, topic,
                                              monkeypatch):
    # A target partition without a leader (here: a topic that does not exist) is looked up in a
    # one-shot task; an error escaping it fails the engine.
    monkeypatch.setattr(Sinks, "_forward_later", _once(RuntimeError("injected"),
                                                       Sinks._forward_later))
    text = _fails(source_cluster, target_cluster, topic,
                  topic_mapper=lambda t: f"{t}-missing")
    assert "target leader lookup failed: RuntimeError: injected" in text
    assert f"topic-partition {topic}-missing-0" in text and "cluster target" in text


def test_membership_thread_error_fails_the_engine(source_cluster, target_cluster, topic,
                                                  monkeypatch):
    monkeypatch.setattr(Membership, "_do", _once(RuntimeError("injected"), Membership._do,
                                                 is_async=False))
    text = _fails(source_cluster, target_cluster, topic)
    assert "membership thread of group" in text and "RuntimeError: injected" in text
    assert "cluster source" in text
