"""Partition ownership and committed source offsets, through a confluent-kafka Consumer that never
fetches.

The consumer joins ``group.id`` (``partition.assignment=group``) or assigns itself every partition
(``all``); either way all its partitions are paused at once, so it only does membership,
``committed()`` on assignment and ``commit()``. The engine fetches with its own raw Fetch loop.

Threads: librdkafka's calls block, so the consumer lives in one thread running ``poll`` and a small
command queue. Rebalance callbacks run in that thread and call into the engine's event loop:
- on assign: the committed offsets are read, then ``on_assigned(partitions, offsets)`` runs on
  the loop (offset ``None``: nothing committed, apply auto.offset.reset; each commit's metadata
  string in ``offsets.metadata``, see ``Positions``: the engine's resume from the target keeps
  its target position there);
- on revoke: ``on_revoked(partitions)`` runs on the loop and *blocks the rebalance* until the
  engine stopped fetching those partitions, finished or abandoned what was in flight and returned
  the final positions, which are committed before the partitions are released (no loss; at most
  the abandoned in-flight batches are mirrored twice);
- on lost (session expired): the same, without the commit (another member may own them already).

Out of scope: fetching records with this consumer, cooperative rebalancing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition

from shallowmirror.engine.runtime import UNREACHABLE_LOG_INTERVAL_S
from shallowmirror.errors import OperatorActionRequired
from shallowmirror.net.config import librdkafka_connection
from shallowmirror.rdkafka_logs import ClientErrors, with_log_config

log = logging.getLogger(__name__)

TP = tuple[str, int]


class Positions(dict):
    """Source positions per partition (``TP -> offset``) and the commit metadata that goes with
    them (``metadata``: ``TP -> str``, for the partitions that have one): what the engine hands
    to ``commit``/``close``/returns from ``on_revoked``, and what ``on_assigned`` receives (the
    committed offsets, None when there is none, with the metadata read back)."""

    def __init__(self, offsets: Mapping[TP, Any] = (), metadata: Mapping[TP, str] | None = None):
        super().__init__(offsets)
        self.metadata: dict[TP, str] = dict(metadata or {})


OnAssigned = Callable[[list[TP], Positions], Awaitable[None]]
OnRevoked = Callable[[list[TP], bool], Awaitable[Mapping[TP, int]]]

_REVOKE_TIMEOUT_S = 60.0

#: Group errors no retry can fix: the mirror stops with the reason instead of retrying forever.
_FATAL_GROUP_ERRORS = frozenset({
    KafkaError.INVALID_SESSION_TIMEOUT, KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.INVALID_GROUP_ID, KafkaError.INCONSISTENT_GROUP_PROTOCOL,
    KafkaError.GROUP_MAX_SIZE_REACHED, KafkaError.FENCED_INSTANCE_ID,
    # A JoinGroup for a group id held by a KIP-848 (group.protocol=consumer) group, on Kafka
    # 3.7; librdkafka would retry it every 2 s for ever.
    KafkaError.GROUP_ID_NOT_FOUND,
})


#: Answers of a coordinator that moved, is loading or is briefly unreachable: wait and ask again.
_RETRIABLE_COORDINATOR_ERRORS = frozenset({
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._WAIT_COORD,
})


class GroupMembershipError(OperatorActionRequired):
    """The source cluster refused the mirror's consumer group for a reason retrying cannot fix."""


def _explain_group_error(err: KafkaError, group_id: str, alias: str,
                         conf: Mapping[str, Any]) -> str:
    where = f"consumer group {group_id!r} on source cluster {alias}"
    if err.code() == KafkaError.INVALID_SESSION_TIMEOUT:
        return (f"{where} refused session.timeout.ms={conf.get('session.timeout.ms')}: the broker "
                "only accepts values between its group.min.session.timeout.ms and "
                "group.max.session.timeout.ms (Kafka's defaults: 6000 and 1800000); set "
                "session.timeout.ms inside that range")
    if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return (f"{where}: not authorized to use the group (the source cluster's ACLs must allow "
                f"READ on group {group_id!r}); broker said: {err.str()}")
    if err.code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL:
        return (f"{where}: another member of the group uses an incompatible assignor; give this "
                f"mirror its own group.id; broker said: {err.str()}")
    if err.code() == KafkaError.GROUP_ID_NOT_FOUND:
        return (f"{where} exists with the consumer protocol (KIP-848: made by a shallow run "
                "with group.protocol=auto or consumer on a broker serving it), which this "
                "broker does not let a classic member join: mirror it shallowly with "
                "group.protocol=auto or group.protocol=consumer (the deep path, --deep, joins "
                f"with the classic protocol only), or give the mirror a new group.id; broker "
                f"said: {err.str()}")
    return f"{where}: {err.name()}: {err.str()}"


def fatal_group_error(err: KafkaError, group_id: str, alias: str,
                      conf: Mapping[str, Any]) -> GroupMembershipError | None:
    """The refusal to raise for a group error librdkafka reports but no retry can fix (None:
    one it rightly retries). Shared by the membership thread and the deep path's consumer."""
    if err.code() not in _FATAL_GROUP_ERRORS:
        return None
    return GroupMembershipError(_explain_group_error(err, group_id, alias, conf))


def committed_with_retries(consumer: Consumer, partitions: list[TP], *,
                           deadline_s: float = 120.0, where: str = "") -> list[TopicPartition]:
    """``consumer.committed()``, retried while the broker answers with a retriable error: a group
    coordinator that moved or is still loading (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS on
    real Kafka right after __consumer_offsets is created). ``where`` names the group in the log."""
    wanted = [TopicPartition(t, p) for t, p in partitions]
    deadline = time.monotonic() + deadline_s
    delay = 0.1
    while True:
        try:
            return consumer.committed(wanted, timeout=30)
        except KafkaException as err:
            error = err.args[0] if err.args else None
            retriable = isinstance(error, KafkaError) and (
                error.retriable() or error.code() in _RETRIABLE_COORDINATOR_ERRORS)
            if not retriable or time.monotonic() + delay > deadline:
                raise
            log.info("%s: committed offsets not readable yet (%s); retrying in %.1fs",
                     where or "consumer group", error.name(), delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


class OtherCommitterError(OperatorActionRequired):
    """Another process commits under this engine's group while it owns every partition
    (``partition.assignment=all``): both mirror everything. A flow stops with it (a restart
    would only find the other process again)."""


class Membership:
    """Group membership and offset commits for one engine (see the module docstring)."""

    def __init__(self, source_config: Mapping[str, Any], *, group_id: str, mode: str,
                 session_timeout_ms: int, heartbeat_interval_ms: int,
                 loop: asyncio.AbstractEventLoop, on_assigned: OnAssigned,
                 on_revoked: OnRevoked, source_alias: str = "source",
                 on_failed: Callable[[BaseException], None] | None = None,
                 group_instance_id: str | None = None,
                 metadata_refresh_ms: int | None = None) -> None:
        assert mode in ("group", "all")
        self.group_id = group_id
        self.mode = mode
        self.source_alias = source_alias
        self._loop = loop
        #: Told (from the membership thread) about an error that ended the thread.
        self._on_failed = on_failed
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        conf: dict[str, Any] = librdkafka_connection(source_config, source_alias)
        #: librdkafka's client-level errors (a lost source broker is reported on every
        #: reconnect attempt): warned as the engine's own connections are, once a while.
        self._errors = ClientErrors(
            log, f"membership consumer (group {group_id}, cluster {source_alias})",
            UNREACHABLE_LOG_INTERVAL_S)
        conf.update({
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": min(heartbeat_interval_ms, session_timeout_ms // 3),
            "partition.assignment.strategy": "roundrobin",
            # Paused partitions fetch nothing; keep any pre-pause fetch tiny anyway.
            "queued.max.messages.kbytes": 1024,
            "fetch.message.max.bytes": 65536,
            "client.id": f"{conf.get('client.id', 'shallowmirror')}-membership",
            "error_cb": self._errors,
        })
        if metadata_refresh_ms is not None:
            # How soon partitions added to a subscribed topic are seen and assigned (librdkafka's
            # default is 5 minutes); the engine's metadata.max.age.ms, as topic discovery uses.
            conf["topic.metadata.refresh.interval.ms"] = metadata_refresh_ms
        if group_instance_id:
            # Static membership (KIP-345): librdkafka then never sends LeaveGroup, so a restart
            # within session.timeout.ms finds the group Stable and gets its assignment back
            # without a rebalance (and without group.initial.rebalance.delay.ms).
            conf["group.instance.id"] = group_instance_id
        self._conf = conf
        self._commands: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._ended = False
        self.assigned: set[TP] = set()
        #: Mode ``all``: per partition, the offset the group held at the start or this process
        #: committed last (None: none); another value there is another process's commit.
        self._last_known: dict[TP, int | None] = {}
        #: Off under exactly-once: there an instance taking a partition over is expected, and
        #: the transactions fence the other (its commits go to the target, atomically).
        self.refuse_other_committers = True
        #: ``time.monotonic()`` of the first subscription, the latest assignment and its
        #: committed offsets (the engine's start-up timeline reads them).
        self.subscribed_at: float | None = None
        self.assigned_at: float | None = None
        self.committed_at: float | None = None

    # ---- engine side (event loop thread) ----
    def start(self, topics: Sequence[str]) -> None:
        self._thread = threading.Thread(target=self._run, name=f"membership-{self.group_id}",
                                        daemon=True)
        self._thread.start()
        self.set_topics(topics)

    def set_topics(self, topics: Sequence[str]) -> None:
        """Subscribe to these topics (group mode)."""
        if self.mode == "group":
            if topics and self.subscribed_at is None:
                self.subscribed_at = time.monotonic()
            self._commands.put(("subscribe", list(topics)))

    def set_partitions(self, partitions: Sequence[TP]) -> None:
        """Own exactly these partitions (mode ``all``)."""
        assert self.mode == "all"
        if partitions and self.subscribed_at is None:
            self.subscribed_at = time.monotonic()
        self._commands.put(("assign", list(partitions)))

    def commit(self, offsets: Mapping[TP, int]) -> concurrent.futures.Future:
        """Commit positions (next offset to mirror; with metadata when ``offsets`` is
        ``Positions``) to the source cluster; done in the thread."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("commit", copy_positions(offsets), future))
        return future

    async def close(self, final_offsets: Mapping[TP, int]) -> None:
        """Commit the final positions, leave the group, stop the thread."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("close", copy_positions(final_offsets), future))
        if self._ended or self._thread is None:
            self._fail_queued()          # the thread is gone (or never ran): nothing to wait for
        await asyncio.wrap_future(future)
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 30)

    @property
    def ended(self) -> bool:
        """The membership thread has ended (closed, or failed and reported through on_failed)."""
        return self._ended

    # ---- consumer thread ----
    @property
    def last_error(self) -> str | None:
        """librdkafka's latest client-level error (None: none yet)."""
        return self._errors.last_error

    def _run(self) -> None:
        """The thread. An error that ends it (the consumer cannot be created, a rebalance
        callback failed) goes to ``on_failed``; commands still queued then fail instead of
        waiting for a thread that is gone."""
        try:
            self._serve()
        except Exception as err:       # keep the engine informed rather than dying silently
            if self._on_failed is None:
                log.exception("membership thread of group %s failed", self.group_id)
                raise
            self._on_failed(err)
        finally:
            self._ended = True
            self._fail_queued()

    def _fail_queued(self) -> None:
        """Settle the futures of commands the (ended) thread will never run."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] in ("commit", "close"):
                settle(command[2], RuntimeError(
                    f"the membership thread of group {self.group_id} has ended"))

    def _serve(self) -> None:
        consumer = Consumer(with_log_config(self._conf))  # librdkafka lines via logging
        try:
            while True:
                try:
                    command = self._commands.get(timeout=0.05 if self.mode == "group" else 0.2)
                except queue.Empty:
                    command = None
                if command is not None:
                    if command[0] == "close":
                        self._do_close(consumer, command[1], command[2])
                        return
                    self._do(consumer, command)
                msg = consumer.poll(0.05 if self.mode == "group" else 0)
                if msg is not None and msg.error() is not None:
                    self._check_consumer_error(msg.error())
        except BaseException:
            with contextlib.suppress(Exception):     # leave the group; the error goes on
                consumer.close()
            raise

    def _check_consumer_error(self, err: KafkaError) -> None:
        """Errors the group protocol reports through ``poll``: librdkafka retries them all, so one
        no retry can fix (a session timeout outside the broker's range, no access to the group)
        would spin silently forever. Those end the thread (-> ``on_failed``); others are logged."""
        refusal = fatal_group_error(err, self.group_id, self.source_alias, self._conf)
        if refusal is not None:
            raise refusal
        log.debug("membership consumer (group %s): %s", self.group_id, err)

    def _do(self, consumer: Consumer, command: tuple) -> None:
        kind = command[0]
        if kind == "subscribe":
            if command[1]:
                consumer.subscribe(command[1], on_assign=self._assign_cb,
                                   on_revoke=self._revoke_cb, on_lost=self._lost_cb)
            else:
                consumer.unsubscribe()
        elif kind == "assign":
            wanted = set(command[1])
            gone = sorted(self.assigned - wanted)
            if gone:
                offsets = self._call_engine(self._on_revoked(gone, True))
                self._commit_now(consumer, offsets)
            new = sorted(wanted - self.assigned)
            consumer.assign([TopicPartition(t, p) for t, p in sorted(wanted)])
            consumer.pause([TopicPartition(t, p) for t, p in sorted(wanted)])
            self.assigned = wanted
            if new:
                self._announce(consumer, new)
        elif kind == "commit":
            error: BaseException | None = None
            try:
                self._commit_now(consumer, command[1])
            except Exception as err:  # noqa: BLE001 - reported through the future
                error = err
            settle(command[2], error)

    def _commit_now(self, consumer: Consumer, offsets: Mapping[TP, int]) -> None:
        owned = {tp: off for tp, off in offsets.items() if tp in self.assigned and off >= 0}
        if not owned:
            return
        if self.mode == "all":
            self._refuse_other_committers(consumer, owned)
        metadata = getattr(offsets, "metadata", {})
        try:
            consumer.commit(offsets=[_topic_partition(tp, off, metadata.get(tp))
                                     for tp, off in owned.items()], asynchronous=False)
        except KafkaException as err:
            error = err.args[0] if err.args and isinstance(err.args[0], KafkaError) else None
            said = f"{error.name()}: {error.str()}" if error is not None else str(err)
            raise RuntimeError(f"commit of {len(owned)} source offsets under group "
                               f"{self.group_id} on cluster {self.source_alias} failed: {said}"
                               ) from err
        self._last_known.update(owned)

    def _refuse_other_committers(self, consumer: Consumer, owned: Mapping[TP, int]) -> None:
        """Mode ``all`` joins no group, so nothing stops a second process on the same group.id
        from mirroring every partition too: each record then lands twice on the target, and
        both commit. Before committing, read what the group holds: an offset this process did
        not commit (nor find at its start) is another's, and the run stops with
        ``OtherCommitterError`` instead of doubling the target silently."""
        tps = [tp for tp in owned if tp in self._last_known]
        if not tps or not self.refuse_other_committers:
            return
        try:
            found = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=10)
        except KafkaException:
            return                       # the commit that follows says what is wrong
        for tp in found:
            key = (tp.topic, tp.partition)
            now = None if tp.offset == OFFSET_INVALID or tp.offset < 0 else tp.offset
            # None: the group holds nothing there any more (the topic was deleted and created
            # again, and Kafka dropped its offsets), which no other process did.
            if now is not None and now != self._last_known[key]:
                raise OtherCommitterError(
                    f"another process commits offsets under group {self.group_id} on cluster "
                    f"{self.source_alias}: {tp.topic}-{tp.partition} is committed at {now}, "
                    f"this process last committed {self._last_known[key]}. With "
                    "partition.assignment=all every process mirrors every partition of its "
                    "topics, so two of them copy every record twice: give each its own "
                    "group.id (and topics), or run them with partition.assignment=group")

    def _announce(self, consumer: Consumer, partitions: list[TP]) -> None:
        self.assigned_at = time.monotonic()
        committed = self._committed_with_retries(consumer, partitions)
        self.committed_at = time.monotonic()
        offsets = Positions()
        for tp in committed:
            key = (tp.topic, tp.partition)
            offsets[key] = (None if tp.offset in (OFFSET_INVALID,) or tp.offset < 0
                            else tp.offset)
            if tp.metadata and offsets[key] is not None:
                offsets.metadata[key] = tp.metadata
            self._last_known[key] = offsets[key]
        self._call_engine(self._on_assigned(partitions, offsets))

    def _committed_with_retries(self, consumer: Consumer, partitions: list[TP],
                                deadline_s: float = 120.0) -> list[TopicPartition]:
        return committed_with_retries(consumer, partitions, deadline_s=deadline_s,
                                      where=f"group {self.group_id} on cluster "
                                            f"{self.source_alias}")

    def _call_engine(self, coro: Awaitable) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        return future.result(_REVOKE_TIMEOUT_S)

    def _assign_cb(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = sorted((tp.topic, tp.partition) for tp in partitions)
        consumer.assign(partitions)
        consumer.pause(partitions)
        self.assigned = set(tps)
        log.info("group %s assigned %d partitions: %s", self.group_id, len(tps), tps)
        if tps and not self._closing:
            self._announce(consumer, tps)

    def _revoke_cb(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = sorted((tp.topic, tp.partition) for tp in partitions)
        if tps and not self._closing:
            offsets = self._call_engine(self._on_revoked(tps, True))
            try:
                self._commit_now(consumer, offsets)
            except RuntimeError as err:
                log.warning("%s", err)
        log.info("group %s revoked %d partitions", self.group_id, len(tps))
        self.assigned -= set(tps)

    def _lost_cb(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = sorted((tp.topic, tp.partition) for tp in partitions)
        if tps and not self._closing:
            self._call_engine(self._on_revoked(tps, False))
        log.warning("group %s lost %d partitions (session expired)", self.group_id, len(tps))
        self.assigned -= set(tps)

    def _do_close(self, consumer: Consumer, offsets: Mapping[TP, int],
                  future: concurrent.futures.Future) -> None:
        self._closing = True
        error: BaseException | None = None
        try:
            self._commit_now(consumer, offsets)
        except Exception as err:  # noqa: BLE001 - reported through the future
            error = err
        try:
            consumer.close()
        except Exception as err:  # noqa: BLE001
            log.warning("closing the membership consumer: %s", err)
        settle(future, error)


def _topic_partition(tp: TP, offset: int, metadata: str | None) -> TopicPartition:
    """confluent-kafka's TopicPartition takes metadata only as a string (None is refused)."""
    if metadata is None:
        return TopicPartition(tp[0], tp[1], offset)
    return TopicPartition(tp[0], tp[1], offset, metadata=metadata)


def copy_positions(offsets: Mapping[TP, int]) -> Positions:
    """A snapshot for the membership thread, keeping the commit metadata."""
    return Positions(offsets, getattr(offsets, "metadata", None))


def settle(future: concurrent.futures.Future, error: BaseException | None) -> None:
    """Complete a caller's future unless the caller already gave up on it.

    A future cancelled by the engine during shutdown (its awaiting task was cancelled) is done:
    setting it would raise InvalidStateError here and kill the membership thread, and then
    close() would never return."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(None)
