"""The one-call API checks its arguments at the call: a wrong kind of stop event, topics, config,
mapper or timeout raises ``TypeError``/``ValueError`` naming what is expected before anything
connects (the clusters here are addresses nothing listens on), and a run that would copy a topic
into itself (one cluster as source and target, a target topic named as its source) is refused.

Each call runs on a thread joined with a bound: before these checks, some of these calls blocked
their event loop for good (``mirror_async`` with a ``threading.Event``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from shallowmirror.engine import mirror, mirror_async, prefix_mapper
from shallowmirror.errors import ConfigError
from shallowmirror.testing.embedded import free_port

NOWHERE = {"bootstrap.servers": f"127.0.0.1:{free_port()}"}
ELSEWHERE = {"bootstrap.servers": f"127.0.0.1:{free_port()}"}
#: Far less than what start-up waits for an unreachable cluster: an error raised within it was
#: raised by the argument checks, not by a connection attempt giving up.
BOUND_S = 10.0


def _raised(call: Callable[[], Any]) -> BaseException:
    """What ``call`` raised (on a thread joined within ``BOUND_S``)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as err:  # noqa: BLE001 - what the test looks at
            outcome.append(err)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert outcome, f"the call neither returned nor raised within {BOUND_S} s"
    assert outcome[0] is not None, "the call returned instead of raising"
    return outcome[0]


def _both(source: Any, target: Any, topics: Any, **kwargs: Any) -> list[Callable[[], Any]]:
    """The same call through ``mirror`` and ``mirror_async``."""
    return [lambda: mirror(source, target, topics, **kwargs),
            lambda: asyncio.run(mirror_async(source, target, topics, **kwargs))]


@pytest.mark.parametrize("kwargs, kind, says", [
    ({"topics": 123}, TypeError, "topics must be a list of topic names"),
    ({"topics": None}, TypeError, "topics must be a list of topic names"),
    ({"topics": [1, "orders"]}, TypeError, "non-empty topic names"),
    ({"topics": []}, ValueError, "topics is empty"),
    ({"topics": "orders("}, ValueError, "not a valid regular expression"),
    ({"source": "127.0.0.1:9092"}, TypeError, "source_config must be a mapping"),
    ({"target": None}, TypeError, "target_config must be a mapping"),
    ({"topic_mapper": "x"}, TypeError, "topic_mapper must be a function"),
    ({"timeout_s": "5"}, TypeError, "timeout_s must be a number of seconds"),
    ({"timeout_s": True}, TypeError, "timeout_s must be a number of seconds"),
    ({"timeout_s": -1}, ValueError, "timeout_s must be >= 0"),
    ({"timeout_s": float("nan")}, ValueError, "timeout_s must be >= 0"),
    ({"stop": True}, TypeError, "stop must be a"),   # "a threading" / "an asyncio"
    ({"source": {}}, ConfigError, "bootstrap.servers"),
    ({"fetch.max.bytes": "abc"}, ConfigError, "fetch.max.bytes"),
], ids=lambda v: repr(v) if isinstance(v, dict) else None)
@pytest.mark.parametrize("which", ["mirror", "mirror_async"])
def test_a_wrong_argument_raises_at_the_call(which, kwargs, kind, says):
    kwargs = dict(kwargs)
    source = kwargs.pop("source", NOWHERE)
    target = kwargs.pop("target", ELSEWHERE)
    topics = kwargs.pop("topics", ["orders"])
    kwargs.setdefault("topic_mapper", prefix_mapper("src"))
    call = _both(source, target, topics, until_caught_up=True, **kwargs)[which == "mirror_async"]
    err = _raised(call)
    assert isinstance(err, kind), repr(err)
    assert says in str(err)
    assert which in str(err) or kind is ConfigError


def test_mirror_refuses_an_asyncio_event_and_mirror_async_a_threading_event():
    err = _raised(lambda: mirror(NOWHERE, ELSEWHERE, ["orders"], stop=asyncio.Event()))
    assert isinstance(err, TypeError)
    assert "mirror(): stop must be a threading.Event" in str(err)
    assert "asyncio.Event is for mirror_async()" in str(err)

    err = _raised(lambda: asyncio.run(mirror_async(NOWHERE, ELSEWHERE, ["orders"],
                                                   stop=threading.Event())))
    assert isinstance(err, TypeError)
    assert "mirror_async(): stop must be an asyncio.Event" in str(err)
    assert "threading.Event is for mirror()" in str(err)


@pytest.mark.parametrize("mapper, topics, names", [
    (None, ["orders"], "keeps the topic name"),                 # the default: identity
    (None, ".*", "keeps the topic name"),                       # whatever the topics are
    (lambda t: t if t == "orders" else f"copy.{t}", ["clicks", "orders"], "orders"),
])
@pytest.mark.parametrize("which", ["mirror", "mirror_async"])
def test_a_topic_mirrored_into_itself_is_refused_up_front(which, mapper, topics, names):
    same = dict(NOWHERE)
    also_same = {"bootstrap.servers": f"127.0.0.1:{free_port()},{NOWHERE['bootstrap.servers']}"}
    kwargs = {} if mapper is None else {"topic_mapper": mapper}
    err = _raised(_both(same, also_same, topics, until_caught_up=True,
                        **kwargs)[which == "mirror_async"])
    assert isinstance(err, ValueError), repr(err)
    assert "same cluster" in str(err) and NOWHERE["bootstrap.servers"] in str(err)
    assert names in str(err)


def _sync_forwarder(**kwargs: Any) -> None:
    from shallowmirror.engine import SyncBatchForwarder

    SyncBatchForwarder(kwargs.pop("source", NOWHERE), ELSEWHERE, **kwargs).close()


def _async_forwarder(**kwargs: Any) -> None:
    from shallowmirror.engine import BatchForwarder

    BatchForwarder(kwargs.pop("source", NOWHERE), ELSEWHERE, **kwargs)


def _ensure(**kwargs: Any) -> None:
    from shallowmirror.engine import ensure_target_topics

    ensure_target_topics(kwargs.pop("source", NOWHERE), ELSEWHERE, kwargs.pop("topics", ["t"]),
                         kwargs.pop("topic_mapper", prefix_mapper("x")), **kwargs)


@pytest.mark.parametrize(("make", "name"), [(_sync_forwarder, "SyncBatchForwarder"),
                                            (_async_forwarder, "BatchForwarder")])
@pytest.mark.parametrize(("kwargs", "kind", "says"), [
    ({"source": "127.0.0.1:1", "topics": ["t"]}, TypeError,
     "source_config must be a mapping of client settings"),
    ({"topics": 5}, TypeError, "topics must be a list of topic names, a regex (str) or a "
                               "predicate, not int 5"),
    ({"topics": None}, TypeError, "topics must be a list of topic names, a regex (str) or a "
                                  "predicate, not NoneType None"),
    ({"topics": "(["}, ValueError, "topics '([' is not a valid regular expression"),
    ({"topics": ["t"], "settings": "a=b"}, TypeError,
     "settings must be a mapping of engine settings"),
])
def test_the_forwarders_check_their_arguments_at_the_call(make, name, kwargs, kind, says):
    """These were "dictionary update sequence element #0 has length 1", "'int' object is not
    iterable", a bare ``re.error``."""
    err = _raised(lambda: make(**kwargs))
    assert isinstance(err, kind) and f"{name}(): {says}" in str(err), err


@pytest.mark.parametrize(("kwargs", "kind", "says"), [
    ({"source": "a:1"}, TypeError, "source_config must be a mapping of client settings"),
    ({"topics": 5}, TypeError, "topics must be a list of topic names"),
    ({"topic_mapper": "e."}, TypeError, "topic_mapper must be a function"),
    ({"timeout_s": "2"}, TypeError, "timeout_s must be a number of seconds or None"),
])
def test_ensure_target_topics_checks_its_arguments_at_the_call(kwargs, kind, says):
    err = _raised(lambda: _ensure(**kwargs))
    assert isinstance(err, kind) and f"ensure_target_topics(): {says}" in str(err), err


@pytest.mark.parametrize("flag", ["until_caught_up", "create_topics"])
def test_a_flag_that_is_not_a_bool_is_refused(flag):
    """``until_caught_up="no"`` was taken as true."""
    err = _raised(lambda: mirror(NOWHERE, ELSEWHERE, ["t"], topic_mapper=prefix_mapper("x"),
                                 **{flag: "no"}))
    assert isinstance(err, TypeError), err
    assert f"mirror(): {flag} must be True or False, not str 'no'" in str(err)


def _sync_wait(method: str, timeout_s: Any) -> None:
    from shallowmirror.engine import SyncBatchForwarder

    forwarder = SyncBatchForwarder(NOWHERE, ELSEWHERE, topics=["t"])
    try:
        getattr(forwarder, method)(timeout_s)
    finally:
        forwarder.close()


def _async_wait(method: str, timeout_s: Any) -> None:
    from shallowmirror.engine import BatchForwarder

    forwarder = BatchForwarder(NOWHERE, ELSEWHERE, topics=["t"])
    asyncio.run(getattr(forwarder, method)(timeout_s))


@pytest.mark.parametrize(("wait", "name"), [(_sync_wait, "SyncBatchForwarder"),
                                            (_async_wait, "BatchForwarder")])
@pytest.mark.parametrize("method", ["next_batch", "wait_caught_up"])
@pytest.mark.parametrize(("timeout_s", "kind", "says"), [
    ("2", TypeError, "timeout_s must be a number of seconds or None, not str '2'"),
    (True, TypeError, "timeout_s must be a number of seconds or None, not bool True"),
    (-1, ValueError, "timeout_s must be >= 0 seconds, not -1"),
    (float("nan"), ValueError, "timeout_s must be >= 0 seconds, not nan"),
])
def test_a_wait_refuses_a_timeout_that_is_not_seconds(wait, name, method, timeout_s, kind,
                                                      says):
    """``next_batch(-1)`` returned None at once, as if the wait had timed out, and
    ``next_batch("2")`` failed inside asyncio; the forwarder is never started (nothing is
    reachable), so the error is the check's."""
    err = _raised(lambda: wait(method, timeout_s))
    assert isinstance(err, kind) and f"{name}.{method}(): {says}" in str(err), err
