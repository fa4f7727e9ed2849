"""The engine core: the lifecycle of one flow, the partitions it owns, and what an
acknowledgement means (offsets -> commits -> hooks; failures -> stopped partitions).

Who does what::

    membership (thread) --assigned/revoked--> core --attach/detach--> source.Sources
    discovery --topics/partitions--> membership        Source per broker --batch--> router
    router (passed in) --route()--> sink.Sinks --> Sink per broker --ack/fail--> core
    core --> offsets, offset maps, metrics, hooks (batch acknowledged, offsets committed,
             partitions assigned/revoked), commits through membership

``MirrorEngine`` (routing by a topic mapper) and ``BatchForwarder`` (a program decides per batch)
differ only in the router they pass in. Clusters and membership come from injected factories.
Every task runs under ``runtime.supervisor``: nothing dies silently.

Lifecycle: ``run`` starts both clusters, gets the producer identity, joins the group; partitions
arrive through ``Membership`` with their committed offsets (or auto.offset.reset); on revocation
they are finished or abandoned and their positions committed; on stop, fetching stops, what is in
flight is given ``request.timeout.ms`` to be acknowledged, the final positions are committed and
everything is closed.

Error policy: retriable -> retry with backoff and log; a partition-level fault (corrupt or legacy
source batch, a batch too large for the target, an unknown target partition, a non-retriable
produce error) stops that one partition with an error naming cluster, topic, partition and
offset, forwards nothing more from it and never advances its offset; anything else (an
authentication failure, an engine task's unexpected error, a hook that raises) ends ``run`` with
the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from shallowmirror.engine import hotpath
from shallowmirror.engine.arguments import check_engine_arguments, check_seconds
from shallowmirror.engine.batch import (
    TP,
    BatchAbandonedError,
    EngineStats,
    FetchedBatch,
    SourcePartition,
)
from shallowmirror.engine.config import exactly_once, resolve_settings
from shallowmirror.engine.consumer_group import ConsumerGroupMembership
from shallowmirror.engine.discovery import TopicDiscovery, TopicsSpec, topic_predicate
from shallowmirror.engine.hooks import AckRun, BatchAck, EngineHooks, HookError
from shallowmirror.engine.membership import Membership, OtherCommitterError, Positions
from shallowmirror.engine.metrics import EngineMetrics, MetricsSink
from shallowmirror.engine.offsets import OffsetMap
from shallowmirror.engine.protocol_choice import AutoMembership
from shallowmirror.engine.replaced_topics import replaced_partitions
from shallowmirror.engine.resume import ResumeStart, TargetResume
from shallowmirror.engine.runtime import Runtime
from shallowmirror.engine.sink import Sinks
from shallowmirror.engine.source import Router, Sources
from shallowmirror.engine.startup import StartupTimeline
from shallowmirror.engine.supervisor import partitions_text
from shallowmirror.engine.topic_names import TopicMapperError
from shallowmirror.engine.transactions import FencedError, TransactionalSinks
from shallowmirror.errors import (
    ConfigError,
    LocatedError,
    ShallowMirrorError,
    Where,
)
from shallowmirror.net import Cluster
from shallowmirror.net.config import unknown_client_keys

log = logging.getLogger(__name__)

#: At shutdown, how often the wait for the target's acknowledgements says what it waits for
#: (a stop while the target does not answer waits up to request.timeout.ms, 30 s by default).
DRAIN_TELL_S = 5.0

ClusterFactory = Callable[[Mapping[str, Any], str], Cluster]
"""``factory(client_config, alias)``: an unstarted cluster (``net.Cluster`` or a scripted one)."""
MembershipFactory = Callable[..., Membership]
"""Called with ``Membership``'s arguments; returns a started-on-demand membership."""

#: The membership of ``partition.assignment=group`` for each ``group.protocol``.
_GROUP_PROTOCOLS: dict[str, MembershipFactory] = {
    "auto": AutoMembership, "classic": Membership, "consumer": ConsumerGroupMembership}


class EngineCore:
    """Everything but the routing decision (see the module docstring)."""

    #: Every batch of a source partition goes to ``target_partition_of`` it (MirrorEngine): what
    #: resume from the target needs; a program routing each batch itself does not promise it.
    routes_by_partition = False

    def __init__(self, source_config: Mapping[str, Any], target_config: Mapping[str, Any], *,
                 topics: TopicsSpec, flow: str | None = None, source_alias: str = "source",
                 target_alias: str = "target", settings: Mapping[str, Any] | None = None,
                 metrics_sink: MetricsSink | None = None, router: Router,
                 cluster_factory: ClusterFactory | None = None,
                 membership_factory: MembershipFactory | None = None) -> None:
        check_engine_arguments(type(self).__name__, source_config, target_config, topics,
                               settings)
        self.settings = resolve_settings(settings)
        #: How the engine reaches a cluster and joins its group; tests inject scripted ones.
        self.cluster_factory: ClusterFactory = cluster_factory or Cluster
        self.membership_factory: MembershipFactory = membership_factory or Membership
        self.source_config = dict(source_config)
        self.target_config = dict(target_config)
        self.source_alias, self.target_alias = source_alias, target_alias
        # A program's configs; a mirror flow's (given with its name) were checked against
        # MirrorMaker 2's key rules when its file was read, and carry its engine keys too.
        for config, alias in (() if flow is not None else
                              ((self.source_config, source_alias),
                               (self.target_config, target_alias))):
            for key, hint in unknown_client_keys(config):
                log.warning("cluster %s: unknown client key %r, ignored (not a Kafka client "
                            "setting)%s", alias, key, f"; did you mean {hint!r}?" if hint else "")
        if flow is None:
            self._one_request_timeout(settings or {})
        self.flow = flow or f"{source_alias}->{target_alias}"
        self.group_id = self.settings["group.id"] or f"shallowmirror-{source_alias}-{target_alias}"
        self.runtime = Runtime(self.settings, fail=self.fail)
        self.discovery = TopicDiscovery(self.runtime, topics, alias=source_alias)
        self.supervisor = self.runtime.supervisor
        self.budget = self.runtime.budget
        #: Transactional exactly-once (engine.transactions) replaces the at-least-once sinks.
        self.exactly_once = exactly_once(self.settings)
        if self.exactly_once and not self.routes_by_partition:
            raise ConfigError("exactly-once needs every batch of a source partition to go to one "
                              "known target partition (MirrorEngine): its offsets are committed "
                              "under that target partition")
        self.sinks: Sinks | TransactionalSinks = (
            TransactionalSinks(self.runtime, self, alias=target_alias, source_alias=source_alias,
                               group_id=self.group_id, flow=self.flow,
                               target_of=self.target_partition_of,
                               source_topic_id=self._source_topic_id) if self.exactly_once
            else Sinks(self.runtime, self, alias=target_alias, source_alias=source_alias))
        self.identity = self.sinks.identity
        self.partitions: dict[TP, SourcePartition] = {}
        self.offset_maps: dict[TP, OffsetMap] = {}
        #: (records, batches, bytes) mirrored by this engine of partitions it owned and gave
        #: up: its totals count them, and a partition owned again goes on counting from there.
        self.released: dict[TP, tuple[int, int, int]] = {}
        #: Where later features attach: batch acknowledged, offsets committed, assigned/revoked.
        self.hooks = EngineHooks()
        if isinstance(self.sinks, TransactionalSinks):
            self.hooks.partitions_revoked.add(self.sinks.partitions_revoked)
        self.sources = Sources(self.runtime, self.partitions, router, alias=source_alias)
        self.duplicates_unknown_offset = 0
        self._fatal: BaseException | None = None
        #: Set with ``_fatal``: what ``run`` waits on (not the progress signal, which is notified
        #: a few times per Produce request: a waiter there was a task woken for each).
        self._failed = asyncio.Event()
        self.metrics = EngineMetrics(self.settings, metrics_sink, flow=self.flow,
                                     source_alias=source_alias, target_alias=target_alias,
                                     budget=self.budget)
        self.source: Cluster | None = None
        self.target: Cluster | None = None
        self.membership: Membership | None = None
        #: Exact resume from the target (engine.resume); None when off or not applicable.
        self.resume: TargetResume | None = None
        self.resume_start: ResumeStart | None = None
        self.ready = False

    # ------------------------------------------------------------------ configuration
    def set_topics(self, topics: TopicsSpec) -> None:
        """Change the topic set (list, regex or predicate); picked up by the next discovery."""
        self.discovery.set_topics(topics)

    # ------------------------------------------------------------------ lifecycle
    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Mirror until ``stop`` is set (or a fatal error); commit on the way out. A stop during
        start-up (a cluster not answering yet, a group join held by the broker) ends it at once,
        not after ``reconnect.deadline.ms``."""
        stop = stop or asyncio.Event()
        self.runtime.loop = asyncio.get_running_loop()
        self.runtime.startup = StartupTimeline()
        self.source = self.cluster_factory(self.source_config, self.source_alias)
        self.target = self.cluster_factory(self.target_config, self.target_alias)
        try:
            if not await self._start_unless_stopped(stop):
                return
            stopped = asyncio.ensure_future(stop.wait())
            failed = asyncio.ensure_future(self._failed.wait())
            await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            failed.cancel()
        finally:
            await self._shutdown()
        if self._fatal is not None:
            raise self._fatal

    async def _start_unless_stopped(self, stop: asyncio.Event) -> bool:
        """``_start`` raced against ``stop``: False if the stop came first (start-up cancelled,
        nothing mirrored); start-up's own errors are raised."""
        starting = asyncio.ensure_future(self._start())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:                         # also when run() itself is cancelled
            stopped.cancel()
            if not starting.done():
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
        if not starting.cancelled():
            starting.result()            # start-up's error, if it ended with one
            return True
        reached = self.runtime.startup.text()
        log.info("cluster %s -> %s: stopped during start-up (%s); nothing was mirrored",
                 self.source_alias, self.target_alias,
                 f"phases done: {reached}" if reached else "clusters not reached yet")
        return False

    def check_clusters(self) -> None:
        """Called once both clusters answered (their cluster ids known), before anything is
        fetched: a subclass raises ``ConfigError`` for a flow they make impossible."""

    async def _start(self) -> None:
        """Connect to both clusters, set the producer identity up, join the group and start the
        background loops; ``ready`` once done."""
        assert self.source is not None and self.target is not None
        startup = self.runtime.startup
        await self.source.start()
        startup.mark("source metadata")
        await self.target.start()
        startup.mark("target metadata")
        self.check_clusters()
        self.sources.start(self.source)
        await self.sinks.start(self.target)
        if self.settings["resume.from.target"] and self.routes_by_partition \
                and not self.exactly_once:     # exactly-once resumes from its target group
            self.resume = TargetResume(
                self.source, self.target, group_id=self.group_id,
                read_committed=self.settings["isolation.level"] == "read_committed")
            self.resume_start = ResumeStart(
                self.resume, self.runtime, self.sources, self.partitions, where=self._where,
                source_alias=self.source_alias, group_id=self.group_id)
        startup.mark("producer id")
        factory = self.membership_factory
        if factory is Membership and self.settings["partition.assignment"] == "group":
            factory = _GROUP_PROTOCOLS[self.settings["group.protocol"]]
        self.membership = factory(
            self.source_config, group_id=self.group_id,
            mode=self.settings["partition.assignment"],
            session_timeout_ms=self.settings["session.timeout.ms"],
            heartbeat_interval_ms=self.settings["heartbeat.interval.ms"],
            loop=self.runtime.loop, on_assigned=self._on_assigned, on_revoked=self._on_revoked,
            source_alias=self.source_alias, on_failed=self._membership_failed,
            group_instance_id=self.settings["group.instance.id"],
            metadata_refresh_ms=self.settings["metadata.max.age.ms"])
        if self.exactly_once and isinstance(self.membership, Membership):
            self.membership.refuse_other_committers = False
        self.membership.start([])
        source = Where(cluster=self.source_alias)
        self.supervisor.spawn_loop(
            lambda: self.discovery.run(self.source, self.membership),
            what="topic discovery", where=source)
        self.supervisor.spawn_loop(self._commit_loop, what="offset commits", where=source)
        self.supervisor.spawn_loop(lambda: self.metrics.run(lambda: self.runtime.stopping),
                                   what="metrics", where=source)
        self.ready = True
        self.runtime.progress.notify()

    def _one_request_timeout(self, given: Mapping[str, Any]) -> None:
        """A program's ``request.timeout.ms`` given once sets both the engine's (a Produce
        request's timeout, the wait for in-flight batches at a stop) and the target
        connection's (how long an answer may take): in ``mm2.properties`` one producer key sets
        both, and in the API one of the two was silently left at 30 s. Given in both places,
        each keeps its own."""
        key = "request.timeout.ms"
        in_engine = key in given
        if in_engine and key not in self.target_config:
            self.target_config[key] = self.settings[key]
        elif not in_engine and key in self.target_config:
            with contextlib.suppress(TypeError, ValueError):   # the client's check names it
                self.settings[key] = max(1000, int(self.target_config[key]))

    def _membership_failed(self, err: BaseException) -> None:
        """The membership thread ended with ``err`` (called from that thread)."""
        self.supervisor.thread_failed(
            err, what=f"membership thread of group {self.group_id}",
            where=Where(cluster=self.source_alias))

    def fail(self, err: BaseException) -> None:
        """End ``run`` with ``err`` (the first fatal error wins; callable from any thread)."""
        if self._fatal is None:
            self._fatal = err
            self.runtime.wake_soon(self._failed)
            self.runtime.wake_soon(self.runtime.progress)

    async def _shutdown(self) -> None:
        self.runtime.stopping = True
        self.sources.wake_all()
        left_because = await self._drain()
        if left_because is not None:
            log.warning("cluster %s -> %s: %s batches still unacknowledged %s at shutdown; "
                        "abandoned, not committed (the next start mirrors them again)",
                        self.source_alias, self.target_alias,
                        f"{self.sinks.pending_batches():,}", left_because)
        self.sinks.stop()
        await self.supervisor.cancel_all()
        owned = list(self.partitions.values())
        skipped = self.membership is not None and self._skip_final_commit(owned)
        # Skipped: close() only leaves the group.
        final = Positions() if skipped else await self._positions_to_commit(
            owned, check_replaced=bool(self.membership), timeout_s=2.0)
        if self.membership is not None:
            try:
                await self.membership.close(final)
            except OtherCommitterError as err:
                self.fail(err)           # run() raises it once shutdown is done
            except Exception as err:  # noqa: BLE001 - logged; shutdown goes on
                if final or not self.membership.ended:  # an ended thread with nothing to commit
                    log.error("final commit to %s failed: %s", self.source_alias, err)
            else:
                try:
                    if not skipped:
                        self.hooks.offsets_committed({tp: off for tp, off in final.items()
                                                      if off >= 0})
                except HookError as err:
                    self.fail(err)           # run() raises it once shutdown is done
        stopped = self._abandoned("the engine stopped before the target acknowledged it; the "
                                  "next start mirrors it again from the last commit")
        for sp in self.partitions.values():
            sp.abandon_pending(release=True, error=stopped)
        if self.partitions:
            # Stopping gives every partition up, as Kafka's consumers call onPartitionsRevoked
            # when they close: an embedder that tracks ownership from these hooks saw partitions
            # assigned and never released. (They stay in stats().)
            try:
                self.hooks.partitions_revoked(list(self.partitions))
            except HookError as err:
                self.fail(err)
        self.metrics.close()
        for cluster in (self.source, self.target):
            if cluster is not None:
                with contextlib.suppress(Exception):
                    await cluster.close()

    async def _drain(self) -> str | None:
        """Wait up to request.timeout.ms for the target to acknowledge what is queued and in
        flight; None when it did (or the engine failed), else why the rest is left. Every
        ``DRAIN_TELL_S`` still waiting, say for what and how much longer (a stop while the
        target did not answer was silent for the whole timeout). A target out of reach (no
        connection open, every attempt failing) is not waited for: nothing can be acknowledged
        until it is back, and the next start mirrors what was not."""
        timeout_ms = self.settings["request.timeout.ms"]
        deadline = time.monotonic() + timeout_ms / 1000

        def drained() -> bool:
            return not self.sinks.pending_batches() or self._fatal is not None

        told = time.monotonic()
        while not drained():
            down_s = self.target.unreachable_for_s() if self.target is not None else None
            if down_s is not None:
                return (f"(cluster {self.target_alias} has been unreachable for {down_s:.0f} s: "
                        "not waited for)")
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                return f"after request.timeout.ms={timeout_ms}"
            if now - told >= DRAIN_TELL_S and left > 0.5:
                told = now
                pending = self.sinks.pending_batches()
                log.info("cluster %s -> %s: stopping; %s batch%s not yet acknowledged by "
                         "cluster %s, waiting up to %.0f s more for %s (request.timeout.ms=%d), "
                         "then %s abandoned and mirrored again by the next start",
                         self.source_alias, self.target_alias, f"{pending:,}",
                         "es" if pending != 1 else "", self.target_alias, left,
                         "them" if pending != 1 else "it", timeout_ms,
                         "they are" if pending != 1 else "it is")
            # Woken by every acknowledgement; looks at the target's reach once a second.
            await self.runtime.progress.wait_until(drained, min(left, 1.0))
        return None

    def _skip_final_commit(self, owned: list[SourcePartition]) -> bool:
        """True (logged) when the source cluster is out of reach at shutdown: a commit would
        wait for it until the group's session ends (librdkafka's answer, 10 s by default), and
        the process with it. What the next start does instead is said."""
        down_s = self.source.unreachable_for_s() if self.source is not None else None
        if down_s is None or not any(sp.offsets.committed >= 0 for sp in owned):
            return False
        if self.exactly_once:
            then = "the next start resumes from the offsets committed with the target's writes"
        elif self.resume is not None:
            then = "the next start resumes from what the target holds"
        else:
            then = "the next start mirrors again from the last commit"
        log.warning("final commit to %s skipped: the cluster has been unreachable for %.0f s; %s",
                    self.source_alias, down_s, then)
        return True

    # ------------------------------------------------------------------ ownership
    async def _on_assigned(self, tps: list[TP], committed: dict[TP, int | None]) -> None:
        assert self.source is not None
        self._mark_membership_phases()
        await self.source.refresh_metadata(sorted({t for t, _ in tps}))
        metadata = getattr(committed, "metadata", {})
        if isinstance(self.sinks, TransactionalSinks):   # resume from the target's group
            committed = await self.sinks.take_over(tps, committed)
        assigned = []
        # One ListOffsets per leader for every partition without a committed offset.
        starts = await self.sources.start_positions(tps, committed, self.group_id)
        self.runtime.startup.mark("positions known")
        for tp in tps:
            position, skip = starts[tp]
            omap = self._offset_map_from(tp, position)
            sp = SourcePartition(tp[0], tp[1], position, omap)
            if tp in self.released:
                sp.records, sp.batches, sp.bytes = self.released.pop(tp)
            sp.skip_to_high_watermark = skip
            sp.last_committed_sent = position
            assigned.append(sp)
        # Attached together once every start is known: the first fetches then share the
        # budget among all of them, instead of filling it with the first partitions' backlog.
        resuming: list[tuple[SourcePartition, TP]] = []
        for sp in assigned:
            self.partitions[sp.tp] = sp
            if self.resume_start is None:
                self.sources.attach(sp)
                continue
            try:
                target = self.target_partition_of(sp.tp)
            except TopicMapperError as err:
                # The embedder's mapper: the run stops with its error, and this call returns
                # (raised into the membership thread, it ended the thread and with it the
                # run's final commit: on tansu, the next run mirrored everything again).
                self.fail(err)
                continue
            self.resume_start.hold(sp, target, metadata.get(sp.tp))
            resuming.append((sp, target))
        if resuming:
            assert self.resume_start is not None
            first = {tp for tp in tps if committed.get(tp) is None}
            self.supervisor.spawn(
                self.resume_start.run(resuming, metadata, first, self.membership, self._positions),
                what="resume from the target", where=Where(cluster=self.target_alias))
        if tps:
            self.hooks.partitions_assigned(list(tps))

    async def _replaced(self, owned: list[SourcePartition], *, timeout_s: float) -> set[TP]:
        """Owned partitions whose position must not be committed: their topic was deleted (or
        deleted and created again) since they were fetched (``replaced_topics``)."""
        if not owned or self.source is None:
            return set()
        replaced = await replaced_partitions(self.source, owned, timeout_s=timeout_s)
        if replaced:
            log.warning("cluster %s: %s: the source topic was deleted (or deleted and created "
                        "again) since it was fetched; its position is not committed, so a "
                        "topic of that name starts at auto.offset.reset", self.source_alias,
                        partitions_text(sorted(replaced)))
        return replaced

    async def _positions_to_commit(self, owned: list[SourcePartition], *,
                                   check_replaced: bool, timeout_s: float) -> Positions:
        """The committed positions of ``owned`` with exact resume's metadata, less those whose
        topic was replaced (looked up when ``check_replaced``): what revocation and shutdown
        commit."""
        replaced = (await self._replaced(owned, timeout_s=timeout_s) if check_replaced
                    else set())
        # Read after the lookup: a re-created topic's restart may run while it waits, moving the
        # position to the new topic's start and the partition's topic id to the new one. A
        # position read before it (the old topic's) would then be checked against the new id,
        # pass as not replaced and be committed into the new topic, whose records below it the
        # next owner would skip (the likely cause of a CI failure on Kafka 3.7: the new topic's
        # first 100 of 300 records missing).
        return self._positions({sp.tp: sp.offsets.committed for sp in owned
                                if sp.tp not in replaced})

    def _mark_membership_phases(self) -> None:
        """Start-up phases the membership thread timed (a scripted membership may not)."""
        startup = self.runtime.startup
        for phase, attr in (("subscribed", "subscribed_at"), ("assigned", "assigned_at"),
                            ("offsets fetched", "committed_at")):
            at = getattr(self.membership, attr, None)
            if at is not None:
                startup.mark(phase, at)

    async def _on_revoked(self, tps: list[TP], commit: bool) -> Positions:
        """Stop fetching ``tps``, give in-flight batches a chance to finish, abandon the rest."""
        owned = [self.partitions[tp] for tp in tps if tp in self.partitions]
        for sp in owned:
            sp.paused = True
            sp.revoked = True           # no task attaches it again (batch.still_owned)
            self.sources.detach(sp)
        await self.runtime.progress.wait_until(
            lambda: not any(sp.offsets.pending for sp in owned) or self.sinks.stopped,
            self.settings["request.timeout.ms"] / 1000 if commit else 0)
        lost = self._abandoned(
            "its partition was revoked before the target acknowledged it; the partition's next "
            "owner mirrors it again from the last commit")
        for sp in owned:
            abandoned = sp.abandon_pending(error=lost)
            if abandoned:
                log.warning("%s: %d batches abandoned on revocation; they may be mirrored "
                            "again by the next owner", self._where(sp.tp), abandoned)
        result = await self._positions_to_commit(owned, check_replaced=commit, timeout_s=5.0)
        for sp in owned:
            if self.partitions.get(sp.tp) is not sp:
                continue        # owned anew meanwhile: that ownership is not this revocation's
            del self.partitions[sp.tp]
            self.released[sp.tp] = (sp.records, sp.batches, sp.bytes)
            if self.resume is not None:
                self.resume.release(sp.tp)
        if owned:
            self.hooks.partitions_revoked([sp.tp for sp in owned])
        return result

    def _abandoned(self, why: str) -> Callable[[FetchedBatch], BaseException]:
        """What a program awaiting an abandoned batch is told (``abandon_pending``'s error)."""
        return lambda batch: BatchAbandonedError(f"batch not forwarded: {why}", Where(
            cluster=self.source_alias, topic=batch.topic, partition=batch.partition,
            offset=batch.source_base))

    def _source_topic_id(self, tp: TP) -> str | None:
        """The id of the source topic ``tp``'s batches come from: the one the partition fetches
        (it changes only once the old topic's batches are done), else the source cluster's."""
        sp = self.partitions.get(tp)
        if sp is not None and sp.topic_id is not None:
            return sp.topic_id
        return self.source.topic_id(tp[0]) if self.source is not None else None

    def target_partition_of(self, tp: TP) -> TP:
        """Where the router sends ``tp``'s batches, when known up front (exactly-once keeps the
        source offsets under it in the target group); a router-less guess: the same name."""
        return tp

    def route(self, batch: FetchedBatch, target_topic: str, target_partition: int) -> None:
        """Queue ``batch`` for ``target_topic``/``target_partition`` on the target."""
        self.sinks.forward(batch, target_topic, target_partition)

    def batch_acked(self, batch: FetchedBatch, target_base: int | None) -> None:
        self.batches_acked([(batch, target_base)])

    def batches_acked(self, acked: list[tuple[FetchedBatch, int | None]]) -> None:
        """Acknowledgements (one Produce response's), applied in order, with one progress
        notification. Whether a hook listens or metrics record is read once per response."""
        try:
            hook = self.hooks.batch_acknowledged
            hooked = bool(hook)
            # The only callback's run maps, which the native loop extends itself (hooks.AckRun).
            runs = hook.runs if hooked else None
            recording = self.metrics.recording
            if ((hooked and runs is None) or (recording and not self.metrics.tallied)
                    or not self.runtime.startup.done):
                for batch, target_base in acked:
                    self._ack_one(batch, target_base, hooked, recording)
                return
            # The usual batches (what _ack_one does for them, without its calls: this runs
            # once per forwarded batch) in one call (hotpath); from the first other one on,
            # one at a time, each then the usual ones after it again.
            follow = runs is not None
            # Recording: the partitions' tallies (metrics.AckTally) take the batches, all
            # acknowledged at this moment (latency: since each was fetched).
            now = time.monotonic() if recording else -1.0
            done = hotpath.ack_batches(self.partitions, acked, follow, now)
            while done < len(acked):
                batch, target_base = acked[done]
                self._ack_one(batch, target_base, hooked, recording, runs)
                done += 1
                if done < len(acked):
                    done += hotpath.ack_batches(self.partitions, acked[done:], follow, now)
        finally:
            self.runtime.progress.notify()

    def _ack_one(self, batch: FetchedBatch, target_base: int | None, hooked: bool,
                 recording: bool, runs: Callable[[str, int], AckRun] | None = None) -> None:
        sp = self.partitions.get((batch.topic, batch.partition))
        if runs is not None and sp is not None and sp.ack_run is None:
            # Looked up once per ownership; the native loop extends it from the next batch on.
            sp.ack_run = runs(batch.topic, batch.partition)
        if recording and sp is not None and sp.ack_tally is None and self.metrics.tallied:
            sp.ack_tally = self.metrics.tally_of(batch)     # the same: the native loop adds to it
        if target_base is None:
            self.duplicates_unknown_offset += 1
            log.info("%s: target answered DUPLICATE_SEQUENCE_NUMBER: batch already written, "
                     "its target offset is unknown (recorded as unknown in the offset map)",
                     self._where((batch.topic, batch.partition), batch.source_base))
        # The batch is its own offsets entry (start < 0: never registered).
        if batch.abandoned or sp is None or batch.start < 0 or batch.acked:
            batch._finish(target_base, None)
            return
        sp.offsets.ack(batch, target_base)
        if not self.runtime.startup.done:
            self.runtime.startup.mark("first record")
        # Counted with its acknowledgement, before a hook that may raise (which ends the run):
        # counted after it, stats() said fewer records than the committed position held.
        sp.records += batch.record_count
        sp.batches += 1
        sp.bytes += batch.size
        if recording:
            self.metrics.batch_acked(batch, sp)
        try:
            if hooked:
                assert batch.target_topic is not None and batch.target_partition is not None
                self.hooks.batch_acknowledged(BatchAck(
                    batch.topic, batch.partition, batch.source_base, batch.next_offset,
                    batch.record_count, batch.target_topic, batch.target_partition,
                    target_base, batch.record_offsets))
        finally:
            batch._finish(target_base, None)

    def batch_dropped(self, batch: FetchedBatch) -> None:
        """A program chose not to forward ``batch``: its offsets count as done, no map row."""
        sp = self.partitions.get((batch.topic, batch.partition))
        if sp is not None and batch.start >= 0 and not batch.acked and not batch.abandoned:
            batch.is_gap = True
            sp.offsets.ack(batch, None)
        batch._finish(None, None)
        self.runtime.progress.notify()

    def rewind_partition(self, tp: TP) -> None:
        """Fetch ``tp`` again from its committed offset (its transaction was aborted)."""
        sp = self.partitions.get(tp)
        if sp is not None:
            sp.abandon_pending(release=True)
            self.sources.wake_all()
            self.runtime.progress.notify()

    def partition_failed(self, tp: TP, err: BaseException) -> None:
        """Stop ``tp`` (fenced, or a batch the target never takes): nothing more from it."""
        sp = self.partitions.get(tp)
        if sp is not None:
            self.sources.stop_partition(sp, err, taken_over=isinstance(err, FencedError))
        self.runtime.progress.notify()

    def target_partition_unknown(self, ttp: TP) -> None:
        if self.hooks.target_partition_unknown:
            self.hooks.target_partition_unknown(ttp)

    def target_repaired(self) -> bool:
        return bool(self.hooks.target_partition_unknown)

    def batch_failed(self, batch: FetchedBatch, err: BaseException) -> None:
        sp = self.partitions.get((batch.topic, batch.partition))
        if sp is not None and not batch.abandoned:
            if isinstance(err, LocatedError):
                err = err.at(offset=batch.source_base)
            self.sources.stop_partition(sp, err)
        batch._finish(None, err)
        self.runtime.progress.notify()

    # ------------------------------------------------------------------ commits & metrics
    async def _commit_loop(self) -> None:
        interval = self.settings["offset.commit.interval.ms"] / 1000
        while not self.runtime.stopping:
            await asyncio.sleep(interval)
            await self.commit_now()

    async def commit_now(self) -> None:
        """Commit every owned partition whose position moved since the last commit."""
        if self.membership is None:
            return
        offsets = self._positions({tp: sp.offsets.committed for tp, sp in self.partitions.items()
                                   if sp.offsets.committed != sp.last_committed_sent})
        if not offsets:
            return
        try:
            await asyncio.wrap_future(self.membership.commit(offsets))
        except OtherCommitterError as err:
            self.fail(err)               # two processes mirror everything: stop this one
            return
        except Exception as err:  # noqa: BLE001 - retried next interval
            log.warning("offset commit to %s failed (retried next interval): %s",
                        self.source_alias, err)
            return
        for tp, offset in offsets.items():
            sp = self.partitions.get(tp)
            if sp is not None:
                sp.last_committed_sent = offset
        self.hooks.offsets_committed(offsets)

    def _positions(self, offsets: Mapping[TP, int]) -> Positions:
        """``offsets`` with the commit metadata of exact resume (the target position)."""
        positions = Positions(offsets)
        if self.resume is not None:
            for tp, offset in offsets.items():
                text = self.resume.commit_metadata(tp, offset, self.offset_map(*tp))
                if text is not None:
                    positions.metadata[tp] = text
        return positions

    # ------------------------------------------------------------------ queries
    def unreachable(self) -> tuple[str, float] | None:
        """For the status line: the alias of the cluster out of reach and for how many seconds
        (None: neither cluster is known to be)."""
        for alias, cluster in ((self.source_alias, self.source),
                               (self.target_alias, self.target)):
            down_s = cluster.unreachable_for_s() if cluster is not None else None
            if down_s is not None:
                return alias, down_s
        return None

    def stats(self) -> EngineStats:
        partitions = {tp: sp.stats() for tp, sp in sorted(self.partitions.items())}
        if self.source is not None and self.source.unreachable_for_s() is not None:
            # The high watermarks are the last ones fetched before the source went away: the
            # lag is not known (with partition.assignment=all it said 0 meanwhile).
            for part in partitions.values():
                part.high_watermark, part.lag = -1, None
        return EngineStats(
            partitions=partitions,
            budget_bytes_in_use=self.budget.in_use_bytes,
            budget_peak_bytes=self.budget.peak_bytes, producer_id=self.identity.producer_id,
            producer_epoch=self.identity.producer_epoch,
            duplicates_acked_unknown_offset=self.duplicates_unknown_offset,
            startup=self.runtime.startup.seconds(),
            released=tuple(map(sum, zip(*self.released.values(), strict=True)))
            if self.released else (0, 0, 0))

    def _offset_map_from(self, tp: TP, position: int) -> OffsetMap:
        """``tp``'s offset map for an ownership starting at ``position``. Rows this process made
        at or past it are forgotten: that part of the source is mirrored again (its copies
        land further on the target), or it is not what was mirrored (a topic deleted and
        re-created: the group's offsets went with it, so ``position`` is its new start)."""
        omap = self.offset_map(*tp)
        end = omap.source_end
        if end is not None and position < end:
            forgotten = omap.forget_from(position)
            if self.resume_start is not None:
                # The walk reads what the target holds from here on and logs where fetching
                # starts: after a session loss (no final commit) nothing is mirrored again.
                log.info("%s: starts at its committed offset %d, below offset %d, up to which "
                         "this process had mirrored it (its partitions were lost before their "
                         "positions were committed, or the source topic was re-created); resume "
                         "from the target skips what the target already holds",
                         self._where(tp), position, end)
            else:
                log.warning("%s: starts at %d, below offset %d, up to which this process had "
                            "mirrored it (partitions lost before a commit, the source topic "
                            "re-created, or an offset commit lost): offsets from %d are mirrored "
                            "again, and the translation of the %d mirrored before is forgotten",
                            self._where(tp), position, end, position, forgotten)
        return omap

    def offset_map(self, topic: str, partition: int) -> OffsetMap:
        """The partition's offset map, kept across ownerships (made on first use)."""
        omap = self.offset_maps.get((topic, partition))
        if omap is None:
            omap = self.offset_maps[(topic, partition)] = OffsetMap(
                max_rows=self.settings["offset.map.max.rows"])
        return omap

    async def wait_caught_up(self, timeout_s: float, *, since: float | None = None) -> bool:
        """True once every owned partition's committed position reached a high watermark that a
        Fetch sent at or after ``since`` (``time.monotonic()``; default: this call) reported, so
        every record already on the source then is mirrored (stopped partitions excluded; at
        least one partition owned). A high watermark fetched before a producer's last records
        landed said "caught up" while they were not mirrored: an engine stopped on it left a
        partition's newest batch behind (a CI run on Kafka 3.7 counted its 104 records lost)."""
        check_seconds(f"{type(self).__name__}.wait_caught_up", "timeout_s", timeout_s)
        since = time.monotonic() if since is None else since

        def caught_up() -> bool:
            live = [sp for sp in self.partitions.values() if sp.error is None]
            return bool(self.partitions) and all(
                sp.high_watermark >= 0 and sp.high_watermark_at >= since
                and sp.offsets.committed >= sp.high_watermark for sp in live)

        done = await self.runtime.progress.wait_until(
            lambda: self._fatal is not None or caught_up(), timeout_s)
        if self._fatal is not None:
            raise self._fatal
        return done

    def _where_obj(self, tp: TP, offset: int | None = None) -> Where:
        return Where(cluster=self.source_alias, topic=tp[0], partition=tp[1], offset=offset)

    def _where(self, tp: TP, offset: int | None = None) -> str:
        return str(self._where_obj(tp, offset))


__all__ = ["EngineCore", "ShallowMirrorError", "TopicsSpec", "topic_predicate"]
