"""One replication flow at run time: topic sync on a timer, and the runners that move the data.

``FlowRunner.run(stop)`` for flow A->B:

    connect admin clients (retry with a clear message while a cluster is unreachable)
    refresh topics: list A's topics -> filter/policy/cycles -> create/grow remote topics on B
    start tasks.max runners (shallow MirrorEngine, or DeepFlowRunner) with the ready topics
    every refresh.topics.interval.seconds: refresh again, hand the new ready list to runners
    every sync.topic.configs.interval.seconds: copy config changes to remote topics
    a runner that fails is restarted with backoff (or, with abort.on.send.failure, the flow
    fails and the process stops)

Runners resume from the offsets committed in the source cluster under the flow's group.id, so
a restart (of a runner or of the process) loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from shallowmirror.codec.layout import CODEC_NAMES
from shallowmirror.errors import ShallowMirrorError, needs_operator
from shallowmirror.mirror.clients import admin_client
from shallowmirror.mirror.config import FlowConfig
from shallowmirror.mirror.stats import FlowStats, PartitionStats
from shallowmirror.mirror.status import counted
from shallowmirror.mirror.topic_sync import ClusterUnreachableError, TopicSync

log = logging.getLogger(__name__)



class FlowFailedError(ShallowMirrorError):
    """A flow stopped for good (abort.on.send.failure, or an error retrying cannot fix)."""


class Runner(Protocol):
    """What moves the data of one flow: the shallow engine or the deep path."""

    def set_topics(self, topics: list[str]) -> None: ...

    async def run(self, stop: asyncio.Event | None = None) -> None: ...

    async def wait_caught_up(self, timeout_s: float, *, since: float | None = None) -> bool: ...


async def _unless_stopped(fn: Callable[[], Any], stop: asyncio.Event) -> tuple[bool, Any]:
    """``(True, fn())`` run in a daemon thread, or ``(False, None)`` as soon as ``stop`` is set.

    An admin call to an unreachable cluster blocks for its whole timeout; a daemon thread lets
    SIGINT end the process at once instead of waiting for it (an executor thread is joined at
    exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def call() -> None:
        result, error = None, None
        try:
            result = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting coroutine
            error = err
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=call, name="admin-call", daemon=True).start()
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({future, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if future.done():
        return True, future.result()
    future.cancel()
    return False, None


async def _first_of(first: asyncio.Event, second: asyncio.Event, timeout_s: float) -> None:
    """Return when either event is set or after ``timeout_s``, whichever comes first."""
    waits = {asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())}
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _engine_classes():
    try:
        from shallowmirror.engine import MirrorEngine
    except ImportError:
        from shallowmirror.engine.engine import MirrorEngine
    return MirrorEngine


class FlowRunner:
    """Runs one ``FlowConfig`` until stopped."""

    def __init__(self, flow: FlowConfig, *, metrics_sink: Any = None,
                 admin_timeout_s: float | None = None):
        self.flow = flow
        self.metrics_sink = metrics_sink
        self.admin_timeout_s = float(flow.engine_settings.get("request.timeout.ms", 15000)) / 1000 \
            if admin_timeout_s is None else admin_timeout_s
        self.sync: TopicSync | None = None
        self.runners: list[Any] = []
        self.ready_topics: list[str] = []
        self.source_topic_count: int | None = None
        self.state = "starting"
        self.restarts = 0
        #: (records, bytes) mirrored by runners replaced after a failure: still this flow's.
        self.retired = (0, 0)
        #: Partitions of the first assignment(s) the shallow engines announced (hook).
        self._assigned_total = 0
        self._assigned_event = asyncio.Event()
        #: Set when the target no longer knows a remote topic (hook): refresh topics now.
        self._refresh_soon = asyncio.Event()
        self._unknown_remote: set[tuple[str, int]] = set()
        #: True when the flow had to be abandoned at shutdown (no final commit).
        self.unclean = False
        self._source_codecs: dict[str, str] = {}
        #: monotonic time the runners got their first partitions (None: still starting/joining).
        self.mirroring_since: float | None = None
        self._started_at = time.monotonic()
        #: Reads the heartbeats this flow mirrors (emit.heartbeats.enabled), for the latency.
        self.heartbeat_monitor: Any = None
        #: Offset syncs and checkpoints (replication/): None when disabled or not started.
        self.offset_syncs: Any = None
        self.checkpoints: Any = None
        #: Set when the flow was stopped before its clusters first answered (nothing could be
        #: mirrored): what it was waiting for, and the last error. The process then fails.
        self.never_started: str | None = None
        self._last_unreachable: str | None = None

    @property
    def name(self) -> str:
        return self.flow.name

    @property
    def mode(self) -> str:
        return "shallow" if self.flow.shallow else "deep"

    # -- setup -----------------------------------------------------------------------------------

    def _client_configs(self) -> tuple[dict[str, str], dict[str, str]]:
        source = {k: v for k, v in self.flow.source_consumer.items()}
        target = {k: v for k, v in self.flow.target_producer.items()}
        source.setdefault("client.id", f"shallowmirror-{self.flow.source}-{self.flow.target}")
        target.setdefault("client.id", f"shallowmirror-{self.flow.source}-{self.flow.target}")
        return source, target

    def _make_runner(self, index: int) -> Any:
        source, target = self._client_configs()
        if self.flow.shallow:
            engine_cls = _engine_classes()
            settings = dict(self.flow.engine_settings)
            if settings.get("group.instance.id") and self.flow.settings["tasks.max"] > 1:
                # One static member per task: a shared instance id fences the others.
                settings["group.instance.id"] = f"{settings['group.instance.id']}-{index}"
            engine = engine_cls(source, target, topics=list(self.ready_topics),
                                topic_mapper=self.flow.remote_topic, flow=self.flow.name,
                                source_alias=self.flow.source, target_alias=self.flow.target,
                                settings=settings, metrics_sink=self.metrics_sink)
            self._maybe_sample_process(getattr(getattr(engine, "metrics", None), "run_id", None))
            hooks = getattr(engine, "hooks", None)  # scripted test runners have none
            if hooks is not None:
                hooks.partitions_assigned.add(self._note_assigned)
                hooks.target_partition_unknown.add(self._remote_partition_unknown)
                if self.offset_syncs is not None:
                    # The writer's run maps: the engine extends them itself for a usual batch.
                    hooks.batch_acknowledged.add(self.offset_syncs.on_batch_ack,
                                                 runs=self.offset_syncs.table.partition)
            return engine
        from shallowmirror.mirror.deep import DeepFlowRunner

        runner = DeepFlowRunner(flow=self.flow.name, source_config=source, target_config=target,
                                settings=self.flow.engine_settings,
                                topic_mapper=self.flow.remote_topic,
                                codec_for_topic=self._source_codecs.get,
                                metrics_sink=self.metrics_sink, source_alias=self.flow.source,
                                target_alias=self.flow.target)
        runner.set_topics(list(self.ready_topics))
        return runner

    def _maybe_sample_process(self, run_id: str | None) -> None:
        """A process record (CPU, RSS) as a runner starts: the engine writes them every
        metrics interval and at its end, so a run shorter than one interval would otherwise
        have a single sample and no CPU figure in the report."""
        if self.metrics_sink is None or run_id is None:
            return
        from shallowmirror.engine.metrics import process_record

        self.metrics_sink.emit(process_record(run_id, None))

    async def _connect(self, stop: asyncio.Event) -> None:
        def build() -> TopicSync:
            return TopicSync(
                self.flow,
                admin_client(self.flow.source_admin, what=f"cluster {self.flow.source} admin"),
                admin_client(self.flow.target_admin, what=f"cluster {self.flow.target} admin"),
                timeout_s=self.admin_timeout_s)

        self.sync = await asyncio.to_thread(build)

    async def _start_group_features(self, stop: asyncio.Event) -> list[asyncio.Task]:
        """Reverse checkpoints and group offset sync (replication/), as the flow asks."""
        from shallowmirror.replication.group_features import start_group_features

        return await start_group_features(self.flow, stop, timeout_s=self.admin_timeout_s)

    def _maybe_watch_heartbeats(self) -> None:
        """Measure end-to-end latency on the heartbeats this flow mirrors, when it emits them."""
        s = self.flow.settings
        if not (s.get("emit.heartbeats.enabled") and s["heartbeats.replication.enabled"]):
            return
        from shallowmirror.replication.heartbeats import HEARTBEATS_TOPIC, HeartbeatLatencyMonitor

        self.heartbeat_monitor = HeartbeatLatencyMonitor(
            self.name, self.flow.remote_topic(HEARTBEATS_TOPIC), self.flow.target_admin,
            alias=self.flow.target, metrics_sink=self.metrics_sink)
        self.heartbeat_monitor.start()

    def _address(self, alias: str) -> str:
        admin = self.flow.source_admin if alias == self.flow.source else self.flow.target_admin
        return str(admin.get("bootstrap.servers", "?"))

    def _deadline_ms(self) -> int:
        """reconnect.deadline.ms of the flow's clients (the smallest): how long a cluster may
        stay unreachable before the flow gives up. Each client's config counts, so a role key
        (``A.consumer.reconnect.deadline.ms``, or a key of ``legacy``'s --consumer.config /
        --producer.config) is obeyed as well as a cluster key."""
        f = self.flow
        return min(int(c.get("reconnect.deadline.ms", 120000))
                   for c in (f.source_consumer, f.source_admin, f.target_producer, f.target_admin))

    async def _refresh(self, stop: asyncio.Event, *, first: bool = False) -> bool:
        """Refresh topics, retrying while a cluster is unreachable; False if stopped first.

        The first failed attempt is one warning naming the cluster, its address and the backoff;
        further attempts log at DEBUG (the status line shows what the flow waits for). After
        reconnect.deadline.ms without an answer the flow fails (``FlowFailedError``)."""
        assert self.sync is not None
        delay, waiting_since = 1.0, None
        while not stop.is_set():
            # The wait counts from the start of the first attempt that failed, not from its
            # end: an attempt itself may wait for an answer for seconds.
            attempt_started = time.monotonic()
            try:
                answered, ready = await _unless_stopped(self.sync.refresh, stop)
                if not answered:
                    return False
            except ClusterUnreachableError as err:
                alias = self._unreachable_alias(err)
                where = f"cluster {alias} at {self._address(alias)}"
                self.state = f"waiting for {where}"
                self._last_unreachable = f"{where} ({err})"
                deadline_ms = self._deadline_ms()
                now = time.monotonic()
                if waiting_since is None:
                    waiting_since = attempt_started
                    log.warning("flow %s: cannot reach %s (%s); retrying in %.0fs, backoff "
                                "doubling up to 30s, for at most reconnect.deadline.ms=%d",
                                self.name, where, err, delay, deadline_ms)
                else:
                    log.debug("flow %s: %s still unreachable; retrying in %.0fs", self.name,
                              where, delay)
                if (now - waiting_since) * 1000 >= deadline_ms:
                    raise FlowFailedError(
                        f"flow {self.name}: {where} did not answer for "
                        f"{now - waiting_since:.0f}s (reconnect.deadline.ms={deadline_ms}); "
                        f"giving up: {err}") from err
                # The last attempt comes at the deadline, not a whole backoff after it.
                remaining_s = deadline_ms / 1000 - (now - waiting_since)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, min(delay, remaining_s)))
                delay = min(delay * 2, 30.0)
                continue
            if waiting_since is not None:
                log.info("flow %s: clusters answer again", self.name)
            self.source_topic_count = len(self.sync.topics)
            await self._note_codecs()
            if ready != self.ready_topics or first:
                added = sorted(set(ready) - set(self.ready_topics))
                if added and not first:
                    log.info("flow %s: new topics to mirror: %s", self.name, ", ".join(added))
                self.ready_topics = ready
                for runner in self.runners:
                    runner.set_topics(list(ready))
            return True
        return False

    def _unreachable_alias(self, err: Exception) -> str:
        """The alias a ``ClusterUnreachableError`` names (its message starts "cluster X")."""
        words = str(err).split()
        if len(words) > 1 and words[0] == "cluster" and words[1] == self.flow.target:
            return self.flow.target
        return self.flow.source

    async def _note_codecs(self) -> None:
        """The codec each source topic's data came in (the deep path recompresses with it):
        the topic's compression.type when it names a codec, else one stored batch's header."""
        if self.flow.shallow or self.sync is None:
            return
        from shallowmirror.mirror.codec_probe import probe_codec

        for topic in list(self.sync.topics):
            if self._source_codecs.get(topic):
                continue
            try:
                described = await asyncio.to_thread(self.sync.describe, self.sync.source_admin,
                                                    topic)
                value = getattr(described.get("compression.type"), "value", None)
            except Exception:  # noqa: BLE001 - the probe below decides
                value = None
            if value not in CODEC_NAMES:
                value = await probe_codec(self.flow.source_consumer, topic,
                                          alias=self.flow.source)
            if value:
                log.info("flow %s: deep path recompresses %s with %s", self.name, topic, value)
            self._source_codecs[topic] = value

    # -- running ---------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; raise ``FlowFailedError`` if the flow cannot go on."""
        log.info("flow %s: starting (%s, policy %s, topics %s, exclude %s)", self.name,
                 self.mode, self.flow.policy.class_name.rsplit(".", 1)[-1],
                 ",".join(self.flow.settings["topics"]),
                 ",".join(self.flow.topic_filter.exclude))
        await self._connect(stop)
        if not await self._refresh(stop, first=True):
            self.never_started = (f"waiting for {self._last_unreachable}"
                                  if self._last_unreachable else
                                  f"cluster {self.flow.source} at "
                                  f"{self._address(self.flow.source)} and cluster "
                                  f"{self.flow.target} at {self._address(self.flow.target)} had "
                                  "not both answered yet")
            return
        # Even with sync.topic.configs.enabled=false this enforces compression.type=producer.
        await asyncio.to_thread(self.sync.sync_configs)
        self._maybe_watch_heartbeats()
        # A flow-local stop: a failing flow stops its own tasks without stopping the others.
        local = asyncio.Event()
        relay = asyncio.create_task(self._relay(stop, local))
        offset_tasks = await self._start_offset_features(local)
        self.runners = [self._make_runner(i) for i in range(self.flow.settings["tasks.max"])]
        tasks = [asyncio.create_task(self._supervise(r, local)) for r in self.runners]
        tasks.append(asyncio.create_task(self._housekeeping(local)))
        tasks.extend(offset_tasks)
        tasks.extend(await self._start_group_features(local))
        self.state = "running"
        watcher = asyncio.create_task(self._watch_start(local))
        # Until the stop (or a task failing, or every task done): the graceful timeout below
        # runs from the stop. Waiting for the tasks alone waited for the runners' own shutdown
        # (an engine gives in-flight batches request.timeout.ms), so the timeout never applied.
        ended = asyncio.ensure_future(asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION))
        stopping = asyncio.ensure_future(local.wait())
        try:
            await asyncio.wait({ended, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            stopping.cancel()
            local.set()
            # Runners finish in-flight batches and commit, within the graceful timeout.
            grace_s = self.flow.settings["task.shutdown.graceful.timeout.ms"] / 1000
            _done, pending = await asyncio.wait(tasks, timeout=grace_s)
            relay.cancel()
            watcher.cancel()
            if self.heartbeat_monitor is not None:
                await asyncio.to_thread(self.heartbeat_monitor.stop)
            if pending:
                self.unclean = True
                log.error("flow %s: did not stop within task.shutdown.graceful.timeout.ms="
                          "%d; giving up on it (records after its last commit will be "
                          "mirrored again)", self.name,
                          self.flow.settings["task.shutdown.graceful.timeout.ms"])
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending, timeout=5)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                self.state = "failed"
                raise task.exception()
        self.state = "stopped"

    async def _start_offset_features(self, stop: asyncio.Event) -> list[asyncio.Task]:
        """Offset syncs (fed by the engines' acknowledged batches) and checkpoints."""
        from shallowmirror.replication.features import start_offset_features

        self.offset_syncs, self.checkpoints, tasks = await start_offset_features(
            self.flow, stop, timeout_s=self.admin_timeout_s)
        return tasks

    def _owned_partitions(self) -> int:
        owned = 0
        for runner in self.runners:
            with contextlib.suppress(Exception):  # a runner still starting has no stats yet
                owned += len(runner.stats().partitions)
        return owned

    def waiting_for(self) -> str | None:
        """What a running flow waits for before it can mirror, or for a cluster to come back
        (for the status line), or None."""
        if self.state != "running":
            return None
        for runner in self.runners:
            # The engine's clusters and the deep path's librdkafka clients say it.
            unreachable = getattr(runner, "unreachable", None)   # scripted test runners lack it
            down = unreachable() if unreachable is not None else None
            if down is not None:
                return f"cluster {down[0]} unreachable for {down[1]:.0f} s"
        if not self.ready_topics or self.mirroring_since is not None:
            return None
        return self._getting_partitions()

    def stopped_before_mirroring(self) -> str | None:
        """What a flow whose clusters answered was still doing when it stopped without having
        mirrored anything (joining its group, most often), or None."""
        if self.never_started or self.mirroring_since is not None or not self.ready_topics:
            return None
        return f"still {self._getting_partitions()}"

    def _getting_partitions(self) -> str:
        """How the flow is getting its partitions before it mirrors: its group's join, or
        taking every partition (``partition.assignment = all``)."""
        assignment = self.flow.engine_settings.get("partition.assignment", "group")
        if self.flow.shallow and assignment == "all":
            return f"assigning every partition of {counted(len(self.ready_topics), 'topic')}"
        return (f"joining consumer group {self.flow.engine_settings.get('group.id')} on "
                f"cluster {self.flow.source}")

    def _note_assigned(self, partitions: list) -> None:
        """Engine hook: a whole assignment is attached (its partitions start one by one)."""
        self._assigned_total += len(partitions)
        self._assigned_event.set()

    async def _watch_start(self, stop: asyncio.Event) -> None:
        """Log when the flow starts mirroring, how long the start took and, when the group join
        was most of it, how a single process skips it (partition.assignment=all)."""
        while not stop.is_set() and not self._owned_partitions():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
        if stop.is_set():
            return
        self.mirroring_since = time.monotonic()
        owned = 0
        if self.flow.shallow:
            # Count the whole first assignment (the engine's hook), not the partitions attached
            # so far: each waits for its start offset, so early counts are a fraction of it.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._assigned_event.wait(), 30)
            owned = max(self._assigned_total, self._owned_partitions())
        while not stop.is_set() and self._owned_partitions() != owned:  # deep: one by one
            owned = self._owned_partitions()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
        took = self.mirroring_since - self._started_at
        grouped = not self.flow.shallow or \
            self.flow.engine_settings.get("partition.assignment", "group") == "group"
        hint = ""
        if grouped and took > 2.0 and self.flow.settings["tasks.max"] == 1 and self.flow.shallow:
            hint = (f"; most of it is the consumer group's first join: a flow run by a single "
                    f"process can skip it with {self.name}.partition.assignment = all "
                    f"(shallowmirror legacy: partition.assignment = all in --consumer.config)")
        log.info("flow %s: mirroring %d partitions, %.1fs after start%s", self.name, owned,
                 took, hint)

    @staticmethod
    async def _relay(stop: asyncio.Event, local: asyncio.Event) -> None:
        await stop.wait()
        local.set()

    async def _supervise(self, runner: Any, stop: asyncio.Event) -> None:
        """Run one runner; restart it after a failure unless abort.on.send.failure."""
        delay = 1.0
        while not stop.is_set():
            started = time.monotonic()
            try:
                await runner.run(stop)
                return
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - reported, then restart or fail the flow
                refused = needs_operator(err)
                if refused is not None:      # a restart would meet the same refusal
                    raise FlowFailedError(f"flow {self.name} stopped: {refused}") from err
                if self.flow.settings["abort.on.send.failure"]:
                    raise FlowFailedError(f"flow {self.name} failed: {err} "
                                          "(abort.on.send.failure=true)") from err
                missing = getattr(err, "target_partition", None)
                if missing is not None:     # the deep path: repair the remote topic first
                    self._remote_partition_unknown(missing)
                if time.monotonic() - started > 60:
                    delay = 1.0
                self.restarts += 1
                log.error("flow %s: %s failed: %s; restarting in %.0fs from the last committed "
                          "offsets", self.name, self.mode, err, delay)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, 60.0)
                index = self.runners.index(runner)
                done = runner.stats()
                self.retired = (self.retired[0] + done.records, self.retired[1] + done.bytes)
                runner = self._make_runner(index)
                self.runners[index] = runner

    def _remote_partition_unknown(self, ttp: tuple[str, int]) -> None:
        """The target lacks a remote topic-partition the engine has batches for: the topic was
        deleted there, or the source topic grew. The next topic refresh re-creates or widens
        it, so run that refresh now rather than up to refresh.topics.interval.seconds later, by
        which time the partition's retries would have run out and stopped it."""
        self._unknown_remote.add(ttp)
        self._refresh_soon.set()

    async def _housekeeping(self, stop: asyncio.Event) -> None:
        s = self.flow.settings
        refresh_s = s["refresh.topics.interval.seconds"] if s["refresh.topics.enabled"] else None
        sync_s = s["sync.topic.configs.interval.seconds"] \
            if s["sync.topic.configs.enabled"] else None
        if refresh_s is None and sync_s is None:
            return
        next_refresh = time.monotonic() + (refresh_s or 0)
        next_sync = time.monotonic() + (sync_s or 0)
        while not stop.is_set():
            wake = min(t for t in (next_refresh if refresh_s else None,
                                   next_sync if sync_s else None) if t is not None)
            await _first_of(stop, self._refresh_soon, max(0.0, wake - time.monotonic()))
            if stop.is_set():
                return
            now = time.monotonic()
            if refresh_s and self._refresh_soon.is_set():
                log.info("flow %s: target %s has no %s; refreshing topics now", self.name,
                         self.flow.target,
                         ", ".join(f"{t}-{p}" for t, p in sorted(self._unknown_remote)))
                next_refresh = now
            self._refresh_soon.clear()
            self._unknown_remote.clear()
            if refresh_s and now >= next_refresh:
                await self._refresh(stop)
                next_refresh = time.monotonic() + refresh_s
            if sync_s and now >= next_sync and self.sync is not None:
                try:
                    await asyncio.to_thread(self.sync.sync_configs)
                except Exception as err:  # noqa: BLE001 - next interval tries again
                    log.warning("flow %s: topic config sync failed: %s", self.name, err)
                next_sync = time.monotonic() + sync_s

    # -- observing -------------------------------------------------------------------------------

    def stats(self) -> FlowStats:
        """Merged counters of this flow's runners."""
        merged = FlowStats(self.name, self.mode)
        merged.released_records, merged.released_bytes = self.retired
        for runner in self.runners:
            snap = runner.stats()
            released = getattr(snap, "released", None)     # the engine's partitions given up
            if released is not None:
                merged.released_records += released[0]
                merged.released_bytes += released[2]
            for key, p in snap.partitions.items():
                taken_over = getattr(p, "taken_over", False)
                if not isinstance(p, PartitionStats):  # the engine's own stats type
                    p = PartitionStats(p.topic, p.partition, p.position, p.high_watermark,
                                       p.records, p.batches, p.bytes, p.errors,
                                       error=getattr(p, "error", None))
                if p.error:
                    (merged.taken_over if taken_over else merged.errors).append(
                        f"{key[0]}-{key[1]}: {p.error}")
                merged.partitions[key] = p
        if self.sync is not None:
            merged.errors.extend(f"{t}: {e}" for t, e in sorted(self.sync.errors().items()))
        if self.heartbeat_monitor is not None:
            merged.heartbeat_latency_ms = self.heartbeat_monitor.latency.latency_ms
        return merged

    def nothing_to_mirror(self) -> str | None:
        """Why this flow can never catch up, once it has listed its source: no topic matches."""
        if self.state != "running" or self.sync is None or self.source_topic_count:
            return None
        return (f"flow {self.name}: no topic on cluster {self.flow.source} "
                f"({self._address(self.flow.source)}) matches topics="
                f"{','.join(self.flow.settings['topics'])} (topics.exclude="
                f"{','.join(self.flow.topic_filter.exclude)}): nothing to mirror")

    async def caught_up(self, since: float) -> bool:
        """Every ready topic mirrored to its source's high watermark as fetched at or after
        ``since`` (``time.monotonic()``), and no topic waiting."""
        if self.state != "running" or self.sync is None:
            return False
        errors = set(self.sync.errors())
        if not self.ready_topics:
            # Nothing mirrored is never "caught up" (see nothing_to_mirror), unless every topic
            # it matched stopped on an error: then nothing is left to wait for, and the summary
            # says "caught up, except N stopped" with exit status 1 (it waited for ever).
            return bool(self.sync.topics) and set(self.sync.topics) <= errors
        pending = set(self.sync.topics) - set(self.ready_topics) - errors
        if pending:
            return False
        # Every partition of every ready topic must be owned by a caught-up runner (a runner
        # owning nothing, e.g. tasks.max above the partition count, is not asked).
        expected = {(t, p) for t in self.ready_topics
                    for p in range(self.sync.topics[t].source_partitions)}
        owned: set[tuple[str, int]] = set()
        for runner in self.runners:
            parts = set(runner.stats().partitions)
            if not parts:
                continue
            owned |= parts
            try:
                if not await runner.wait_caught_up(0.05, since=since):
                    return False
            except Exception:  # noqa: BLE001 - a failing runner is not caught up
                return False
        return expected <= owned
