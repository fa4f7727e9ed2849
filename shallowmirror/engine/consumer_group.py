"""Partition ownership through the consumer group protocol of KIP-848 (``group.protocol=consumer``).

The broker runs the assignor: the member's first ConsumerGroupHeartbeat (epoch 0, with its
subscribed topic names) is answered with partitions at once. There is no JoinGroup/SyncGroup
round and no ``group.initial.rebalance.delay.ms``, which holds a classic group's first join for
3 s on a stock broker: a lone process starts mirroring in well under a second.

Same interface and guarantees as ``membership.Membership`` (the classic protocol through
librdkafka), on the engine's event loop instead of a thread:
- every heartbeat may carry the member's new assignment (topic ids and partitions); a
  reconciliation task first revokes what left it (``on_revoked(partitions, True)``: the engine
  stops fetching, settles what is in flight, and its final positions are committed *before* the
  partitions are acknowledged as released), then announces what joined it with the committed
  offsets (``on_assigned``), and the next heartbeat tells the coordinator what is now owned;
- a member the coordinator fenced (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID), or that heard
  nothing from it for ``session.timeout.ms``, has lost its partitions: ``on_revoked(partitions,
  False)``, no commit (another member may own them already), and it joins again;
- commits are OffsetCommit v9 with the member epoch, so a fenced member cannot commit.

Its own connections to the source cluster: heartbeats never queue behind large Fetch answers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kafka import errors as Errors
from kafka.protocol.consumer.group import OffsetCommitRequest, OffsetFetchRequest

from shallowmirror.engine.membership import (
    GroupMembershipError,
    OnAssigned,
    OnRevoked,
    Positions,
    copy_positions,
    settle,
)
from shallowmirror.engine.runtime import UNREACHABLE_LOG_INTERVAL_S
from shallowmirror.errors import BrokerError, ConnectionFailedError, Where
from shallowmirror.net import Cluster
from shallowmirror.net.connection import UnsupportedVersionError
from shallowmirror.net.coordinators import GROUP_KEY, Coordinators
from shallowmirror.net.group_api import (
    CONSUMER_GROUP_HEARTBEAT_KEY,
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroupHeartbeatRequest,
)

log = logging.getLogger(__name__)

TP = tuple[str, int]

#: OffsetCommit v9 carries the member epoch (KIP-848); OffsetFetch v7 as the exactly-once sinks.
_VERSIONS = {OffsetCommitRequest: (9, 9), OffsetFetchRequest: (7, 7)}
#: How long the coordinator waits for this member to release revoked partitions (the engine's
#: revocation settles in-flight batches within request.timeout.ms).
_REBALANCE_TIMEOUT_MS = 60_000
_RETRY_S = (0.1, 2.0)                # first and longest pause after a retriable failure
_LEAVE_TIMEOUT_S = 10.0

_COORDINATOR_MOVED = frozenset({Errors.NotCoordinatorError.errno,
                                Errors.CoordinatorNotAvailableError.errno})
_RETRY = frozenset({Errors.CoordinatorLoadInProgressError.errno,
                    Errors.RequestTimedOutError.errno})
_FENCED = frozenset({Errors.FencedMemberEpochError.errno, Errors.UnknownMemberIdError.errno})
#: Heartbeat answers that mean "not with this protocol": not served, or a classic group's id.
_PROTOCOL_REFUSED = frozenset({Errors.UnsupportedVersionError.errno,
                               Errors.GroupIdNotFoundError.errno})


class ConsumerProtocolRefused(GroupMembershipError):
    """The coordinator refused the consumer group protocol for this group: the cluster does not
    serve it (no ConsumerGroupHeartbeat API, or UNSUPPORTED_VERSION), or a classic group holds
    the group id (GROUP_ID_NOT_FOUND; ``classic_group``). ``before_join``: no heartbeat of this
    member was ever accepted, so it owns nothing and ``group.protocol=auto`` may go on with the
    classic protocol instead (``engine.protocol_choice``)."""

    def __init__(self, text: str, *, before_join: bool, classic_group: bool = False) -> None:
        super().__init__(text)
        self.before_join = before_join
        self.classic_group = classic_group


def explain_unsupported(group_id: str, alias: str, detail: str) -> str:
    """Why a broker refused the consumer group protocol, and the two ways out."""
    return (f"consumer group {group_id!r} on source cluster {alias}: group.protocol=consumer "
            f"needs the KIP-848 consumer group protocol, which this cluster does not serve "
            f"({detail}). It is on by default from Apache Kafka 4.0; Kafka 3.7 serves it with "
            "group.coordinator.rebalance.protocols=classic,consumer in the brokers' config. "
            "Otherwise use group.protocol=auto (the default: classic where consumer is not "
            "served) or classic")


def _explain_heartbeat_error(code: int, message: str | None, group_id: str, alias: str) -> str:
    where = f"consumer group {group_id!r} on source cluster {alias}"
    said = f"; broker said: {message}" if message else ""
    if code == Errors.GroupIdNotFoundError.errno:
        return (f"{where} exists with the classic protocol (a JoinGroup group, e.g. committed "
                "by an earlier run with group.protocol=classic or by MirrorMaker); this broker "
                "cannot move it to the consumer protocol: give the mirror a new group.id, or "
                f"use group.protocol=auto (the default) or classic{said}")
    if code == Errors.GroupAuthorizationFailedError.errno:
        return (f"{where}: not authorized to use the group (the source cluster's ACLs must "
                f"allow READ on group {group_id!r}){said}")
    if code == Errors.UnreleasedInstanceIdError.errno:
        return (f"{where}: group.instance.id is still held by a member that has not left; "
                f"give each process its own group.instance.id{said}")
    if code == Errors.UnsupportedVersionError.errno:
        return explain_unsupported(group_id, alias, message or "UNSUPPORTED_VERSION")
    return f"{where}: {BrokerError(code).reason}{said}"


class ConsumerGroupMembership:
    """Group membership and offset commits through KIP-848 heartbeats (module docstring)."""

    def __init__(self, source_config: Mapping[str, Any], *, group_id: str, mode: str,
                 session_timeout_ms: int, heartbeat_interval_ms: int,
                 loop: asyncio.AbstractEventLoop, on_assigned: OnAssigned,
                 on_revoked: OnRevoked, source_alias: str = "source",
                 on_failed: Callable[[BaseException], None] | None = None,
                 group_instance_id: str | None = None,
                 metadata_refresh_ms: int | None = None) -> None:
        assert mode == "group", "group.protocol=consumer shares partitions through a group"
        self.group_id = group_id
        self.mode = mode
        self.source_alias = source_alias
        self._loop = loop
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._on_failed = on_failed
        self._instance_id = group_instance_id
        self._session_timeout_s = session_timeout_ms / 1000
        self._cluster = Cluster({**source_config, "client.id": (
            f"{source_config.get('client.id', 'shallowmirror')}-membership")}, source_alias)
        self._coordinators = Coordinators(self._cluster, source_alias)
        self.member_id = ""
        self.epoch = JOIN_EPOCH
        #: A heartbeat of this member was accepted once (it may have owned partitions since).
        self.joined = False
        #: A static member that lost its partitions frees its instance id before rejoining.
        self._release_instance = False
        self._interval_s = heartbeat_interval_ms / 1000
        self._topics: list[str] = []
        self._send_topics = True
        self._send_owned = True
        #: The partitions the engine owns (announced, not yet revoked).
        self.assigned: set[TP] = set()
        #: The coordinator's latest assignment for this member (its TopicPartitions), and
        #: whether the partitions were lost since: what the reconciler works towards.
        self._target: list | None = None
        self._lost = False
        self._names: dict[uuid.UUID, str] = {}
        self._ids: dict[str, uuid.UUID] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._reconciler: asyncio.Task | None = None
        self._closing = False
        self._ended = False
        self._last_answer = time.monotonic()
        self._retry_s = _RETRY_S[0]
        self._warned_at = -UNREACHABLE_LOG_INTERVAL_S
        self.last_error: str | None = None
        self.subscribed_at: float | None = None
        self.assigned_at: float | None = None
        self.committed_at: float | None = None

    # ---- the engine's side (Membership's interface) ----
    def start(self, topics: Sequence[str]) -> None:
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name=f"membership-{self.group_id}")
        self.set_topics(topics)

    def set_topics(self, topics: Sequence[str]) -> None:
        """Subscribe to these topics (sent with the next heartbeat, at once)."""
        wanted = sorted(topics)
        if wanted == self._topics:
            return
        if wanted and self.subscribed_at is None:
            self.subscribed_at = time.monotonic()
        self._topics = wanted
        self._send_topics = True
        self._poke()

    def set_partitions(self, partitions: Sequence[TP]) -> None:
        raise AssertionError("partition.assignment=all does not use a group protocol")

    def commit(self, offsets: Mapping[TP, int]) -> concurrent.futures.Future:
        """Commit positions (with their metadata) of owned partitions; the future settles when
        the coordinator answered."""
        result: concurrent.futures.Future = concurrent.futures.Future()
        task = self._loop.create_task(self._commit(copy_positions(offsets)))
        task.add_done_callback(lambda t: _settle_from(result, t))
        return result

    async def close(self, final_offsets: Mapping[TP, int]) -> None:
        """Commit the final positions and leave the group (a static member leaves with epoch -2:
        the coordinator keeps its partitions for it until the session times out)."""
        self._closing = True
        error: BaseException | None = None
        try:
            await self._commit(copy_positions(final_offsets))
        except Exception as err:  # noqa: BLE001 - reported after leaving
            error = err
        for task in (self._reconciler, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self.epoch > 0:       # bounded: an unreachable coordinator expires the member
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._leave(), _LEAVE_TIMEOUT_S)
        self._ended = True
        await self._cluster.close()
        if error is not None:
            raise error

    @property
    def ended(self) -> bool:
        return self._ended

    # ---- heartbeats ----
    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        """Heartbeat until closed; an error no retry can fix ends it through ``on_failed``."""
        try:
            await self._connect()
            while not self._closing:
                pause = self._interval_s
                if self._topics or self.epoch > 0:
                    pause = await self._beat()
                self._check_session()
                assert self._wake is not None
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)
                self._wake.clear()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self._ended = True
            if self._on_failed is None:
                raise
            self._on_failed(err)

    async def _connect(self) -> None:
        while True:
            try:
                await self._cluster.start()
                return
            except ConnectionFailedError as err:
                await asyncio.sleep(self._unreachable(err))

    async def _beat(self) -> float:
        """One heartbeat; returns how long to wait before the next."""
        try:
            node = await self._coordinators.node(GROUP_KEY, self.group_id)
            conn = await self._cluster.connection(node)
            version = conn.api_version(CONSUMER_GROUP_HEARTBEAT_KEY, (0, 0))
            if self._release_instance:
                await self._release_static_member(conn, version)
            request, sent = self._request(version)
            resp = await conn.request(request)
        except UnsupportedVersionError as err:
            raise ConsumerProtocolRefused(explain_unsupported(
                self.group_id, self.source_alias,
                "its group coordinator does not offer the ConsumerGroupHeartbeat API"),
                before_join=not self.joined) from err
        except BrokerError as err:          # FindCoordinator's answer
            if not err.retriable:
                raise GroupMembershipError(_explain_heartbeat_error(
                    err.code, None, self.group_id, self.source_alias)) from err
            return self._unreachable(err)
        except ConnectionFailedError as err:
            self._coordinators.forget(GROUP_KEY, self.group_id)
            return self._unreachable(err)
        return self._answer(resp, sent)

    def _request(self, version: int) -> tuple[Any, tuple]:
        """A heartbeat, and the (topics, owned partitions) it tells (None: left out). Joining
        sends the whole state, later heartbeats only what changed."""
        joining = self.epoch == JOIN_EPOCH
        owned = None
        if joining:
            owned = []
        elif self._send_owned:
            owned = [ConsumerGroupHeartbeatRequest.TopicPartitions(
                topic_id=self._ids[topic], partitions=sorted(p for t, p in self.assigned
                                                             if t == topic))
                for topic in sorted({t for t, _ in self.assigned}) if topic in self._ids]
        topics = list(self._topics) if joining or self._send_topics else None
        request = ConsumerGroupHeartbeatRequest(
            version=version, group_id=self.group_id, member_id=self.member_id,
            member_epoch=self.epoch,
            instance_id=self._instance_id if joining else None,
            rebalance_timeout_ms=_REBALANCE_TIMEOUT_MS if joining else -1,
            subscribed_topic_names=topics, server_assignor=None, topic_partitions=owned)
        return request, (topics, None if owned is None else frozenset(self.assigned))

    def _answer(self, resp: Any, sent: tuple) -> float:
        code = resp.error_code
        if code == 0:
            self._heard()
            topics, owned = sent
            if topics == self._topics:          # unless they changed while it was on its way
                self._send_topics = False
            if owned is not None and owned == self.assigned:
                self._send_owned = False
            if resp.member_id:
                self.member_id = resp.member_id
            self.epoch = resp.member_epoch
            if not self.joined:
                self.joined = True
                log.info("group %s on source cluster %s: joined with the consumer group "
                         "protocol (KIP-848) as member %s", self.group_id, self.source_alias,
                         self.member_id)
            if resp.heartbeat_interval_ms > 0:
                self._interval_s = resp.heartbeat_interval_ms / 1000
            if resp.assignment is not None:
                self._assignment(resp.assignment)
            return self._interval_s
        if code in _FENCED:
            self._heard()
            log.warning("group %s on cluster %s: %s; its partitions are lost, joining again",
                        self.group_id, self.source_alias, BrokerError(code).reason)
            self._lose()
            return 0
        if code in _COORDINATOR_MOVED or code in _RETRY:
            if code in _COORDINATOR_MOVED:
                self._coordinators.forget(GROUP_KEY, self.group_id)
            return self._unreachable(BrokerError(code, Where(cluster=self.source_alias),
                                                 resp.error_message))
        text = _explain_heartbeat_error(code, resp.error_message, self.group_id,
                                        self.source_alias)
        if code in _PROTOCOL_REFUSED:
            raise ConsumerProtocolRefused(
                text, before_join=not self.joined,
                classic_group=code == Errors.GroupIdNotFoundError.errno)
        raise GroupMembershipError(text)

    def _heard(self) -> None:
        self._last_answer = time.monotonic()
        self._retry_s = _RETRY_S[0]

    def _unreachable(self, err: BaseException) -> float:
        """A retriable failure: say so (at most once per interval; a warning when the cluster
        cannot be reached, information when the coordinator is still loading, as right after
        __consumer_offsets is created), wait a growing pause."""
        self.last_error = str(err)
        now = time.monotonic()
        level = logging.DEBUG
        if now - self._warned_at >= UNREACHABLE_LOG_INTERVAL_S:
            self._warned_at = now
            level = logging.INFO if isinstance(err, BrokerError) else logging.WARNING
        log.log(level, "group %s on cluster %s: coordinator not ready (%s); retrying",
                self.group_id, self.source_alias, err)
        pause, self._retry_s = self._retry_s, min(self._retry_s * 2, _RETRY_S[1])
        return pause

    def _check_session(self) -> None:
        """No answer for session.timeout.ms: the coordinator has given the partitions away by
        now (or will); stop mirroring them rather than write beside their next owner."""
        if self.epoch > 0 and time.monotonic() - self._last_answer > self._session_timeout_s:
            log.warning("group %s on cluster %s: no heartbeat answered for %.0fs "
                        "(session.timeout.ms); its partitions are lost, joining again",
                        self.group_id, self.source_alias, self._session_timeout_s)
            self._lose()

    def _lose(self) -> None:
        """Forget the partitions without committing; the next heartbeat joins again (epoch 0)
        under the same member id, as KIP-848 asks of a fenced member. The coordinator then
        answers with this member's assignment at once (Kafka 3.7: all of it again, where a new
        member id got nothing until the old one's group.consumer.session.timeout.ms, 45 s by
        default, had expired it). A static member first leaves with epoch -2: Kafka 3.7 refuses
        any join for a group.instance.id its old member still holds (UNRELEASED_INSTANCE_ID),
        and a join under the same member id after that leave (UNKNOWN_SERVER_ERROR), so it joins
        under a new one and the coordinator hands the instance's partitions to it."""
        self.epoch = JOIN_EPOCH
        self._release_instance = bool(self._instance_id and self.member_id)
        self._send_topics = self._send_owned = True
        self._target = []
        self._lost = True
        self._reconcile_soon()
        self._poke()                # join again now, not a heartbeat interval later

    async def _release_static_member(self, conn: Any, version: int) -> None:
        """Free this static member's group.instance.id for its rejoin (see ``_lose``): its old
        member leaves with epoch -2, and the next join has no member id."""
        resp = await conn.request(self._leave_request(version))
        if resp.error_code not in (0, *_FENCED):      # fenced/unknown: nothing left to free
            raise BrokerError(resp.error_code, Where(cluster=self.source_alias),
                              f"releasing group.instance.id {self._instance_id!r}")
        self._release_instance = False
        self.member_id = ""

    def _leave_request(self, version: int) -> Any:
        """This member's leave: epoch -2 for a static member (the coordinator keeps its
        partitions for its instance id until the session times out), -1 otherwise."""
        epoch = STATIC_LEAVE_EPOCH if self._instance_id else LEAVE_EPOCH
        return ConsumerGroupHeartbeatRequest(
            version=version, group_id=self.group_id, member_id=self.member_id,
            member_epoch=epoch, instance_id=self._instance_id)

    async def _leave(self) -> None:
        node = await self._coordinators.node(GROUP_KEY, self.group_id)
        conn = await self._cluster.connection(node)
        await conn.request(self._leave_request(
            conn.api_version(CONSUMER_GROUP_HEARTBEAT_KEY, (0, 0))))
        log.info("group %s on cluster %s: left the group", self.group_id, self.source_alias)

    # ---- reconciliation ----
    def _assignment(self, assignment: Any) -> None:
        """The coordinator's new assignment for this member (topic ids and partitions)."""
        self._target = list(assignment.topic_partitions)
        self._reconcile_soon()

    def _reconcile_soon(self) -> None:
        """Start the reconciler unless it runs: a running one reads the newest target (and a
        loss) when it loops. Never cancelled midway, which could stop the engine's
        on_assigned/on_revoked between two of its steps."""
        running = self._reconciler
        if running is None or running.done():
            self._reconciler = self._loop.create_task(self._reconcile())

    async def _reconcile(self) -> None:
        """Bring the owned partitions to the newest target: a loss first (nothing committed),
        then revocations (final positions committed), then new partitions; after each round
        the next heartbeat tells the coordinator what is owned."""
        try:
            while True:
                if self._lost:
                    self._lost = False
                    if self.assigned:
                        await self._release(sorted(self.assigned), commit=False)
                    continue
                raw = self._target
                if raw is None:
                    return
                target = await self._named(raw)
                if self._lost or raw is not self._target:
                    continue                    # changed while names were looked up
                if target == self.assigned:
                    return
                gone = sorted(self.assigned - target)
                if gone:
                    await self._release(gone, commit=True)
                new = sorted(target - self.assigned)
                if new and not self._lost:
                    await self._announce(new)
                self._send_owned = True
                self._poke()
        except Exception as err:  # noqa: BLE001 - the engine stops with it
            if self._on_failed is None:
                raise
            self._on_failed(err)

    async def _named(self, raw: list) -> set[TP]:
        """An assignment's topic ids as names (from the source's metadata when one is new)."""
        if any(tps.topic_id not in self._names for tps in raw):
            await self._cluster.refresh_metadata(list(self._topics))
            for topic in self._topics:
                tid = self._cluster.topic_id(topic)
                if tid is not None:
                    self._names[uuid.UUID(tid)] = topic
                    self._ids[topic] = uuid.UUID(tid)
        target: set[TP] = set()
        for tps in raw:
            name = self._names.get(tps.topic_id)
            if name is None:
                log.warning("group %s on cluster %s: assigned partitions %s of topic id %s, "
                            "which is not among the subscribed topics' ids; not mirrored",
                            self.group_id, self.source_alias, list(tps.partitions), tps.topic_id)
                continue
            target.update((name, p) for p in tps.partitions)
        return target

    async def _release(self, tps: list[TP], *, commit: bool) -> None:
        offsets = await self._on_revoked(tps, commit)
        if commit:
            try:
                await self._commit(copy_positions(offsets))
            except Exception as err:  # noqa: BLE001 - the next owner mirrors from the last commit
                log.warning("%s", err)
        self.assigned.difference_update(tps)
        log.info("group %s %s %d partitions", self.group_id,
                 "revoked" if commit else "lost", len(tps))

    async def _announce(self, tps: list[TP]) -> None:
        self.assigned_at = time.monotonic()
        committed = await self._committed(tps)
        self.committed_at = time.monotonic()
        self.assigned.update(tps)
        log.info("group %s assigned %d partitions: %s", self.group_id, len(tps), tps)
        await self._on_assigned(tps, committed)

    # ---- offsets ----
    async def _committed(self, tps: list[TP]) -> Positions:
        """The group's committed offsets of ``tps`` (None where there is none), with metadata."""
        topics: dict[str, list[int]] = {}
        for topic, partition in tps:
            topics.setdefault(topic, []).append(partition)
        resp = await self._group_call(OffsetFetchRequest, lambda v: OffsetFetchRequest(
            version=v, group_id=self.group_id, require_stable=False,
            topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name=t, partition_indexes=ps)
                    for t, ps in topics.items()]), "OffsetFetch")
        result = Positions({tp: None for tp in tps})
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code:
                    raise BrokerError(p.error_code, Where(self.source_alias, t.name,
                                                          p.partition_index), "in OffsetFetch")
                key = (t.name, p.partition_index)
                if key in result and p.committed_offset >= 0:
                    result[key] = p.committed_offset
                    if p.metadata:
                        result.metadata[key] = p.metadata
        return result

    async def _commit(self, offsets: Positions) -> None:
        owned = {tp: off for tp, off in offsets.items() if tp in self.assigned and off >= 0}
        if not owned or self.epoch <= 0:
            return
        topics: dict[str, list[Any]] = {}
        for (topic, partition), offset in sorted(owned.items()):
            topics.setdefault(topic, []).append(
                OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                    partition_index=partition, committed_offset=offset,
                    committed_leader_epoch=-1,
                    committed_metadata=offsets.metadata.get((topic, partition))))
        epoch, member = self.epoch, self.member_id
        resp = await self._group_call(OffsetCommitRequest, lambda v: OffsetCommitRequest(
            version=v, group_id=self.group_id, generation_id_or_member_epoch=epoch,
            member_id=member, group_instance_id=self._instance_id,
            topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=t, partitions=ps)
                    for t, ps in topics.items()]), "OffsetCommit")
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code:
                    raise RuntimeError(
                        f"commit of {len(owned)} source offsets under group {self.group_id} on "
                        f"cluster {self.source_alias} failed: {t.name}-{p.partition_index}: "
                        f"{BrokerError(p.error_code).reason}")

    async def _group_call(self, api: Any, make: Callable[[int], Any], what: str) -> Any:
        """A request to the group coordinator, retried while it moves, loads or cannot be
        reached (a dropped connection, a coordinator broker restarting), for up to 120 s."""
        pause = _RETRY_S[0]
        deadline = time.monotonic() + 120
        while True:
            try:
                node = await self._coordinators.node(GROUP_KEY, self.group_id)
                conn = await self._cluster.connection(node)
                resp = await conn.request(make(conn.api_version(api.API_KEY, _VERSIONS[api])))
            except (ConnectionFailedError, BrokerError) as err:
                retriable = isinstance(err, ConnectionFailedError) or err.retriable
                if not retriable or time.monotonic() >= deadline:
                    raise
                self._coordinators.forget(GROUP_KEY, self.group_id)
                log.info("group %s on cluster %s: %s not answered (%s); retrying in %.1fs",
                         self.group_id, self.source_alias, what, err, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETRY_S[1])
                continue
            code = getattr(resp, "error_code", 0)
            if code in _COORDINATOR_MOVED:
                self._coordinators.forget(GROUP_KEY, self.group_id)
            if (code in _COORDINATOR_MOVED or code in _RETRY) and time.monotonic() < deadline:
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETRY_S[1])
                continue
            if code:
                raise BrokerError(code, Where(cluster=self.source_alias),
                                  f"in {what} for group {self.group_id!r}")
            return resp


def _settle_from(result: concurrent.futures.Future, task: asyncio.Task) -> None:
    """Hand a task's outcome to a caller's future (unless the caller gave up on it)."""
    if task.cancelled():
        result.cancel()
    else:
        settle(result, task.exception())
