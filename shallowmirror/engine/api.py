"""The one-call embedded API: ``mirror`` (blocking) and ``mirror_async``.

Both check their arguments first (a wrong type or value raises ``TypeError``/``ValueError`` at
the call, a bad setting ``ConfigError``), refuse a run that would copy a topic into itself (the
same cluster as source and target, a target topic named as its source topic), then create
missing target topics — with the source topic's partition count and ``compression.type=producer``
(so the target broker keeps the forwarded batches as they are), through confluent-kafka's
AdminClient — then run a ``MirrorEngine`` until stopped, caught up, or timed out, commit the
source positions and return the final ``EngineStats``.

The stop event, ``timeout_s`` and cancellation hold from the first moment: while the target
topics are checked or created as much as while the engine runs. A stop before the engine is
running ends the run at once with nothing mirrored and nothing raised. A cluster that does not
answer the topic check within its ``reconnect.deadline.ms`` raises ``ConnectionFailedError``
naming it (alias and bootstrap address), as the engine's own start-up does.

Out of scope: recognising one cluster behind two different addresses (``localhost`` and
``127.0.0.1``); only a bootstrap address given for both counts as the same cluster.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shallowmirror.engine.arguments import (
    check_configs,
    check_mapper,
    check_seconds,
    check_topics,
)
from shallowmirror.engine.batch import EngineStats
from shallowmirror.engine.discovery import TopicsSpec, topic_predicate
from shallowmirror.engine.engine import MirrorEngine, identity_mapper
from shallowmirror.engine.metrics import MetricsSink
from shallowmirror.engine.topic_names import mapped_topic
from shallowmirror.errors import (
    BrokerError,
    ConfigError,
    ConnectionFailedError,
    LocatedError,
    PartitionsStoppedError,
    Where,
)
from shallowmirror.net.config import ClientSettings, client_settings, librdkafka_connection
from shallowmirror.net.connection import AuthenticationFailedError
from shallowmirror.rdkafka_logs import ClientErrors, with_log_config

log = logging.getLogger(__name__)

#: The longest one AdminClient call blocks before the stop event and the deadline are looked at
#: again: how late a stop can be while target topics are checked or created.
_POLL_S = 0.25
#: How often ``mirror`` looks at its ``threading.Event`` (the engine's loop cannot wait on it).
_STOP_POLL_S = 0.1
#: librdkafka's client-level errors are a warning at most this often (the rest go to debug).
_ERROR_LOG_INTERVAL_S = 10.0
#: Metadata topic errors that mean "no such topic" (UNKNOWN_TOPIC_OR_PARTITION,
#: INVALID_TOPIC_EXCEPTION); another (LEADER_NOT_AVAILABLE of a topic just created) does not.
_NO_SUCH_TOPIC = frozenset({3, 17})


# ---------------------------------------------------------------- target topics
class _Admin:
    """An AdminClient on one cluster whose calls end at ``stop`` and give up once the cluster has
    not answered for ``timeout_s`` (``ConnectionFailedError`` naming alias and address)."""

    def __init__(self, config: Mapping[str, Any], alias: str, timeout_s: float | None,
                 stop: threading.Event) -> None:
        from confluent_kafka.admin import AdminClient

        settings = client_settings(config, alias)
        self.alias = alias
        self.address = _addresses(settings)
        self.timeout_s = settings.reconnect_deadline_ms / 1000 if timeout_s is None else timeout_s
        self.stop = stop
        self.errors = ClientErrors(log, f"cluster {alias} ({self.address})",
                                   _ERROR_LOG_INTERVAL_S)
        self.client = AdminClient(with_log_config({**librdkafka_connection(config, alias),
                                                   "error_cb": self.errors}))
        #: ``time.monotonic()`` of the first failed call since the last answer (None: none).
        self._failing_since: float | None = None

    def list_topics(self) -> dict[str, Any] | None:
        """The cluster's topic metadata; None once ``stop`` is set."""
        from confluent_kafka import KafkaException

        while not self.stop.is_set():
            began = time.monotonic()
            try:
                topics = self.client.list_topics(timeout=self._slice_s(began)).topics
            except KafkaException as err:
                self.client.poll(0)      # serves error_cb: what librdkafka said went wrong
                self._failed(err, began)
                # An answer that failed fast is not asked again at once.
                self.stop.wait(max(0.0, _POLL_S - (time.monotonic() - began)))
                continue
            self._failing_since = None
            return topics
        return None

    def wait(self, future: concurrent.futures.Future, what: str) -> bool:
        """Wait for an AdminClient future (its error raised); False once ``stop`` is set."""
        began = time.monotonic()
        while not self.stop.is_set():
            done, _ = concurrent.futures.wait([future], timeout=_POLL_S)
            if done:
                future.result()
                return True
            if time.monotonic() - began >= self.timeout_s:
                raise ConnectionFailedError(
                    f"{self.address} did not answer {what} within {self.timeout_s:.0f} s"
                    f"{self._last_error()}", Where(cluster=self.alias))
        return False

    def _slice_s(self, now: float) -> float:
        since = self._failing_since if self._failing_since is not None else now
        return max(0.01, min(_POLL_S, since + self.timeout_s - now))

    def _failed(self, err: Any, began: float) -> None:
        """Raise what a failed call means once retrying cannot help (or the time is up)."""
        from confluent_kafka import KafkaError

        kerr = err.args[0] if err.args else None
        code = kerr.code() if isinstance(kerr, KafkaError) else None
        text = kerr.str() if isinstance(kerr, KafkaError) else str(err)
        where = Where(cluster=self.alias)
        if code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
                    KafkaError._SSL):
            raise AuthenticationFailedError(f"{self.address}: {text}", where) from err
        if self._failing_since is None:
            self._failing_since = began
        waited_s = time.monotonic() - self._failing_since
        if waited_s >= self.timeout_s:
            raise ConnectionFailedError(
                f"cannot reach {self.address}: gave up after {waited_s:.0f} s "
                f"(reconnect.deadline.ms={self.timeout_s * 1000:.0f}){self._last_error(text)}",
                where) from err

    def _last_error(self, fallback: str | None = None) -> str:
        text = self.errors.last_error or fallback
        return f"; last error: {text}" if text else ""


def _addresses(settings: ClientSettings) -> str:
    return ",".join(f"{h}:{p}" for h, p in settings.bootstrap_servers)


def ensure_target_topics(source_config: Mapping[str, Any], target_config: Mapping[str, Any],
                         topics: TopicsSpec, topic_mapper: Callable[[str], str],
                         timeout_s: float | None = 30.0, *, source_alias: str = "source",
                         target_alias: str = "target",
                         stop: threading.Event | None = None) -> list[str]:
    """Create every mapped target topic that does not exist yet (source partition count,
    ``compression.type=producer``); return the names created.

    A cluster that does not answer for ``timeout_s`` (None: its ``reconnect.deadline.ms``)
    raises ``ConnectionFailedError`` naming its alias and bootstrap address; a topic the target
    refuses raises ``BrokerError`` naming it. ``stop`` set ends the call within a fraction of a
    second, returning what was created until then. librdkafka's own log lines go through Python
    logging (the ``librdkafka`` logger), its client errors are warnings naming the cluster."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    check_configs("ensure_target_topics", source_config, target_config)
    check_topics("ensure_target_topics", topics)
    check_mapper("ensure_target_topics", topic_mapper)
    check_seconds("ensure_target_topics", "timeout_s", timeout_s)
    stop = stop or threading.Event()
    wanted, _names = topic_predicate(topics)
    src = _Admin(source_config, source_alias, timeout_s, stop)
    src_topics = src.list_topics()
    if src_topics is None:
        return []
    dst = _Admin(target_config, target_alias, timeout_s, stop)
    existing = dst.list_topics()
    if existing is None:
        return []
    # Per target topic, the most partitions of the source topics mapped to it: several source
    # topics merged into one asked for it once each, and the request was refused (Kafka:
    # "Duplicate topic name"; tansu: a parse failure).
    wanted_partitions: dict[str, int] = {}
    for name, meta in sorted(src_topics.items()):
        if name.startswith("__") or meta.error is not None or not wanted(name):
            continue
        target = mapped_topic(topic_mapper, name)
        if target not in existing:
            wanted_partitions[target] = max(wanted_partitions.get(target, 0),
                                            len(meta.partitions))
    new = [NewTopic(target, partitions, -1, config={"compression.type": "producer"})
           for target, partitions in wanted_partitions.items()]
    created: list[str] = []
    if not new:
        return created
    request_s = max(1.0, dst.timeout_s)
    futures = dst.client.create_topics(new, operation_timeout=request_s,
                                       request_timeout=request_s)
    for name, future in futures.items():
        try:
            if not dst.wait(future, f"the creation of topic {name}"):
                return created
        except KafkaException as err:
            if "exist" in str(err).lower():        # a concurrent creator is fine
                continue
            kerr = err.args[0] if err.args else None
            code = kerr.code() if hasattr(kerr, "code") else -1
            where = Where(cluster=target_alias, topic=name)
            if code > 0:
                raise BrokerError(code, where, f"cannot create the target topic: {kerr.str()}") \
                    from err
            raise LocatedError(f"cannot create the target topic: {err}", where) from err
        created.append(name)
        log.info("created target topic %s on cluster %s", name, target_alias)
    # Created is not yet served everywhere: wait (bounded) until the metadata shows them.
    deadline = time.monotonic() + dst.timeout_s
    names = set(created)
    while names and time.monotonic() < deadline:
        md = dst.list_topics()
        if md is None or all(n in md and md[n].error is None and md[n].partitions
                             for n in names):
            break
        stop.wait(0.1)
    return created


async def _create_target_topics(source_config: Mapping[str, Any],
                                target_config: Mapping[str, Any], topics: TopicsSpec,
                                topic_mapper: Callable[[str], str], stop: asyncio.Event,
                                deadline: float | None, *, source_alias: str,
                                target_alias: str) -> bool:
    """``ensure_target_topics`` on a worker thread, for as long as neither ``stop`` nor the
    run's ``deadline`` (loop time) comes: True once done, False when one of them came first.
    Cancelled, it ends the thread before it returns: nothing of the run outlives it."""
    loop = asyncio.get_running_loop()
    halt = threading.Event()
    creating = loop.run_in_executor(None, functools.partial(
        ensure_target_topics, source_config, target_config, topics, topic_mapper, None,
        source_alias=source_alias, target_alias=target_alias, stop=halt))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        timeout_s = None if deadline is None else max(0.0, deadline - loop.time())
        await asyncio.wait({creating, stopped}, timeout=timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not creating.done():
            halt.set()                   # the thread looks at it every _POLL_S at least
            await asyncio.wait({creating})
    if halt.is_set():
        if not creating.cancelled():
            creating.exception()         # what it raised once told to stop does not matter
        log.info("cluster %s -> %s: %s while checking the target topics; nothing was "
                 "mirrored", source_alias, target_alias,
                 "stopped" if stop.is_set() else "timeout_s passed")
        return False
    creating.result()
    return True


# ---------------------------------------------------------------- arguments
def _check_arguments(call: str, source_config: Any, target_config: Any, topics: Any,
                     topic_mapper: Any, stop: Any, stop_type: type, timeout_s: Any) -> None:
    """``TypeError``/``ValueError`` for an argument of the wrong kind, at the call: the same
    mistake found deep inside the engine (or never) said much less."""
    check_configs(call, source_config, target_config)
    check_topics(call, topics)
    check_mapper(call, topic_mapper)
    if stop is not None and not isinstance(stop, stop_type):
        wanted, other, other_call = (("a threading.Event", "asyncio.Event", "mirror_async")
                                     if stop_type is threading.Event else
                                     ("an asyncio.Event", "threading.Event", "mirror"))
        hint = f" ({other} is for {other_call}())" if type(stop).__name__ == "Event" else ""
        raise TypeError(f"{call}(): stop must be {wanted} or None, not "
                        f"{type(stop).__module__}.{type(stop).__qualname__} {stop!r}{hint}")
    check_seconds(call, "timeout_s", timeout_s)


def _refuse_self_loop(source: ClientSettings, target: ClientSettings, topics: TopicsSpec,
                      topic_mapper: Callable[[str], str], call: str) -> TopicsSpec:
    """Refuse a run that would copy a topic into itself: source and target are one cluster and
    a target topic is named as its source topic. Names known up front (a list, or the identity
    mapper) are refused at once; a regex or predicate on one cluster is returned narrowed to
    the topics whose target is another topic (each one left out is warned about once)."""
    address = ", ".join(source.shared_addresses(target))
    if not address:
        return topics
    if topic_mapper is identity_mapper:
        raise ValueError(f"{call}(): source and target are the same cluster ({address}) and "
                         "topic_mapper keeps the topic name: every topic would be copied into "
                         "itself; give a topic_mapper such as prefix_mapper('source')")
    if not callable(topics) and not isinstance(topics, str):
        looping = sorted(t for t in topics if topic_mapper(t) == t)
        if looping:
            raise ValueError(f"{call}(): source and target are the same cluster ({address}) "
                             f"and topic_mapper maps {', '.join(looping)} to itself: it would "
                             "be copied into itself")
        return topics
    wanted, _names = topic_predicate(topics)
    warned: set[str] = set()

    def not_into_itself(name: str) -> bool:
        if not wanted(name):
            return False
        if topic_mapper(name) != name:
            return True
        if name not in warned:
            warned.add(name)
            log.warning("topic %s is not mirrored: source and target are the same cluster (%s) "
                        "and topic_mapper maps it to itself", name, address)
        return False

    return not_into_itself


# ---------------------------------------------------------------- the run
async def mirror_async(source_config: Mapping[str, Any], target_config: Mapping[str, Any],
                       topics: Sequence[str] | str | Callable[[str], bool], *,
                       topic_mapper: Callable[[str], str] = identity_mapper,
                       stop: asyncio.Event | None = None, until_caught_up: bool = False,
                       timeout_s: float | None = None, create_topics: bool = True,
                       metrics_sink: MetricsSink | None = None,
                       source_alias: str = "source", target_alias: str = "target",
                       **settings: Any) -> EngineStats:
    """Mirror ``topics`` until ``stop`` is set, or (``until_caught_up``) every partition's
    committed position reaches the source high watermark, or ``timeout_s`` passes; the stats'
    ``ended_by`` says which (``"stop"``, ``"caught_up"``, ``"timeout"``).

    ``settings`` are engine keys with dots written as underscores or as given
    (``fetch_max_bytes=...`` or ``**{"fetch.max.bytes": ...}``). With ``until_caught_up``, no
    source topic matching ``topics`` raises ``ConfigError`` (the run could never be caught
    up); without it the run waits for one to appear. With ``until_caught_up``, partitions
    stopped by errors (a batch the target refuses, a corrupt one, a missing target topic with
    ``create_topics=False``) raise ``PartitionsStoppedError`` once the others are caught up,
    its ``stats`` the run's."""
    _check_arguments("mirror_async", source_config, target_config, topics, topic_mapper, stop,
                     asyncio.Event, timeout_s)
    return await _mirror("mirror_async", source_config, target_config, topics,
                         topic_mapper=topic_mapper, stop=stop, until_caught_up=until_caught_up,
                         timeout_s=timeout_s, create_topics=create_topics,
                         metrics_sink=metrics_sink, source_alias=source_alias,
                         target_alias=target_alias, settings=settings)


async def _mirror(call: str, source_config: Mapping[str, Any], target_config: Mapping[str, Any],
                  topics: TopicsSpec, *, topic_mapper: Callable[[str], str],
                  stop: asyncio.Event | None, until_caught_up: bool, timeout_s: float | None,
                  create_topics: bool, metrics_sink: MetricsSink | None, source_alias: str,
                  target_alias: str, settings: Mapping[str, Any]) -> EngineStats:
    """``mirror_async`` once its arguments are checked (``call``: the public function)."""
    for name, flag in (("until_caught_up", until_caught_up), ("create_topics", create_topics)):
        if not isinstance(flag, bool):     # "no" was taken as true
            raise TypeError(f"{call}(): {name} must be True or False, not "
                            f"{type(flag).__name__} {flag!r}")
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    engine_settings = {k.replace("_", "."): v for k, v in settings.items()}
    asked = topics
    topics = _refuse_self_loop(client_settings(source_config, source_alias),
                               client_settings(target_config, target_alias), topics,
                               topic_mapper, call)
    # Made first: it checks every setting before anything connects.
    engine = MirrorEngine(source_config, target_config, topics=topics, topic_mapper=topic_mapper,
                          source_alias=source_alias, target_alias=target_alias,
                          settings=engine_settings, metrics_sink=metrics_sink)
    own_stop = stop or asyncio.Event()
    if create_topics:
        try:
            created = await _create_target_topics(
                source_config, target_config, topics, topic_mapper, own_stop, deadline,
                source_alias=source_alias, target_alias=target_alias)
        except BaseException:
            engine.metrics.close()       # run() never will: its metrics file is closed here
            raise
        if not created:
            engine.metrics.close()
            stats = engine.stats()
            stats.ended_by = "stop" if own_stop.is_set() else "timeout"
            return stats
    task = asyncio.create_task(engine.run(own_stop))
    # Whichever comes first ends the run: the engine ends (its error), stop, caught up (or
    # nothing to mirror), timeout.
    watchers = {asyncio.ensure_future(own_stop.wait())}
    caught_up = asyncio.ensure_future(_caught_up(engine, topics, asked)) if until_caught_up \
        else None
    if caught_up is not None:
        watchers.add(caught_up)
    ended_by = "stop"
    try:
        done, _pending = await asyncio.wait(
            {task, *watchers}, timeout=None if deadline is None else max(
                0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED)
        if not done:
            ended_by = "timeout"
        elif caught_up in done and caught_up.exception() is None:
            ended_by = "caught_up"
    finally:
        own_stop.set()
        for watcher in watchers:
            watcher.cancel()
        # The engine stops as it was told: what is in flight is acknowledged and its offsets
        # committed. A cancellation now (Ctrl-C under asyncio.run) cancelled that shutdown
        # with the awaited task, and the run's commit was lost: it is raised once it is done.
        interrupted = await _all_done({task, *watchers})
        if interrupted is not None:
            raise interrupted
        task.result()                    # run's error (the watchers': below)
    for watcher in watchers:             # nothing to mirror (the engine's own errors: above)
        if not watcher.cancelled() and watcher.exception() is not None:
            raise watcher.exception()
    stats = engine.stats()
    stats.ended_by = ended_by
    if until_caught_up and stats.stopped:
        raise _stopped_error(call, stats, engine.source_alias)
    return stats


async def _all_done(tasks: set[asyncio.Future]) -> asyncio.CancelledError | None:
    """Wait until every one of ``tasks`` is done, whatever cancels the caller meanwhile; the
    cancellation it got (raised by the caller when it may), else None."""
    interrupted = None
    while not all(t.done() for t in tasks):
        try:
            await asyncio.wait(tasks)
        except asyncio.CancelledError as err:
            interrupted = err
    return interrupted


def _stopped_error(call: str, stats: EngineStats, alias: str) -> PartitionsStoppedError:
    """What ``until_caught_up`` raises when partitions stopped: caught up without them is not
    caught up (a run whose every partition stopped returned as if it had mirrored them)."""
    stopped = sorted(stats.stopped.items())
    shown = "; ".join(f"{topic}-{partition}: {error}" for (topic, partition), error in stopped[:5])
    more = f"; and {len(stopped) - 5} more" if len(stopped) > 5 else ""
    return PartitionsStoppedError(
        f"{call}(until_caught_up=True): {len(stopped)} of {len(stats.partitions)} partitions of "
        f"cluster {alias} stopped on errors, so they are not caught up (nothing more of them "
        f"was forwarded; their committed offsets stay where they stopped): {shown}{more}",
        stats)


async def _caught_up(engine: MirrorEngine, topics: TopicsSpec, asked: TopicsSpec) -> None:
    """Return once the engine is ready and every owned partition is caught up; raise
    ``ConfigError`` when no source topic matches ``topics`` (it never would be)."""
    since = time.monotonic()         # what is on the source now is mirrored before stopping
    await engine.runtime.progress.wait_until(lambda: engine.ready)
    await _something_to_mirror(engine, topics, asked)
    while not await engine.wait_caught_up(3600, since=since):
        pass


async def _something_to_mirror(engine: MirrorEngine, topics: TopicsSpec,
                               asked: TopicsSpec) -> None:
    """Raise ``ConfigError`` when no topic of the source cluster matches ``topics`` (what the
    caller ``asked`` for, less the topics a same-cluster run leaves out)."""
    assert engine.source is not None
    wanted, names = topic_predicate(topics)
    while True:
        try:
            meta = await engine.source.refresh_metadata(names)
            break
        except ConnectionFailedError:
            await asyncio.sleep(1.0)     # the source went away meanwhile: the engine says so
    if any(tm.error_code not in _NO_SUCH_TOPIC and not tm.is_internal
           and not name.startswith("__") and wanted(name) for name, tm in meta.topics.items()):
        return
    shown = asked if isinstance(asked, str) else "(a predicate)" if callable(asked) else \
        list(asked)
    raise ConfigError(f"no topic on cluster {engine.source_alias} "
                      f"({_addresses(engine.source.settings)}) matches topics={shown!r}: "
                      "nothing to mirror, so the run could never be caught up")


def mirror(source_config: Mapping[str, Any], target_config: Mapping[str, Any],
           topics: Sequence[str] | str | Callable[[str], bool], *,
           topic_mapper: Callable[[str], str] = identity_mapper,
           stop: threading.Event | None = None, until_caught_up: bool = False,
           timeout_s: float | None = None, **settings: Any) -> EngineStats:
    """Blocking ``mirror_async``: runs its own event loop; ``stop`` is a ``threading.Event``.
    ``mirror_async``'s other keywords (``create_topics``, ``metrics_sink``, the aliases) are
    taken too."""
    _check_arguments("mirror", source_config, target_config, topics, topic_mapper, stop,
                     threading.Event, timeout_s)
    options = {"create_topics": True, "metrics_sink": None, "source_alias": "source",
               "target_alias": "target"}
    options.update((key, settings.pop(key)) for key in list(options) if key in settings)

    async def main() -> EngineStats:
        astop = asyncio.Event()
        watch = asyncio.ensure_future(_watch(stop, astop)) if stop is not None else None
        try:
            return await _mirror("mirror", source_config, target_config, topics,
                                 topic_mapper=topic_mapper, stop=astop,
                                 until_caught_up=until_caught_up, timeout_s=timeout_s,
                                 settings=settings, **options)
        finally:
            if watch is not None:
                watch.cancel()

    return asyncio.run(main())


async def _watch(stop: threading.Event, astop: asyncio.Event) -> None:
    """Set ``astop`` once ``stop`` is set (looked at every ``_STOP_POLL_S``)."""
    while not stop.is_set():
        await asyncio.sleep(_STOP_POLL_S)
    astop.set()
