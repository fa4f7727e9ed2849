"""A sink: the produce loop for the partitions one target broker leads (franz-go's ``sink``).

Batches wait in one queue per target partition, in source order. Each round the planner
(``packing.plan_request``) takes the head batch of as many partitions as fit ``max.request.size``
(exactly one batch per partition: stock brokers reject more), gives each batch the producer
identity and sequences the first time it is sent (``codec.stamp_batches``, one call per request),
writes the request from those stamps (``codec.encode_produce_batches``: each 61-byte header
rewritten into the request's framing, the payload never copied or decompressed), and
sends it while up to ``max.in.flight.requests.per.connection`` others are outstanding. With
``target.connections.per.broker`` > 1 a broker has one sink per connection (*lane*) and each
target partition is pinned to one lane for life, so everything below holds per lane. A stock broker
works on one request per connection at a time, so lanes let it validate several requests at once;
but a partition's lane only carries that partition's batches, so spreading partitions also makes
each request smaller. Partitions are therefore pinned by the size of their first batch: large
batches (``SPREAD_MIN_BATCH_BYTES`` and up: a request of a few of them already carries hundreds of
KB) are spread round robin over the lanes; smaller ones all share lane 0, where they keep filling
one request per round (measured on Kafka 3.7: two lanes made a 256 KiB-batch mirror 1.2-1.5x
faster and a 16 KiB-batch one 10-30% slower). The acknowledgements of one response go to the
engine in one call.

With several requests in flight the connection wakes the loop once three answers are there,
not for each (``target.answers.per.wakeup``: the socket's SO_RCVLOWAT is set from a lower bound of
the answers' sizes, ``codec.produce_response_min_bytes``): a wake-up costs more than a
small request's own work, and the requests still in flight keep the broker busy meanwhile.

Sending costs no task: when the lane's connection is open, the loop encodes and writes the
request itself and the response is applied in its future's done callback (a task per request
cost about 5x that). Only when the connection must be opened first does a task wait for it and
send; nothing more is planned until that task has written, so requests leave in plan order. Both
ways apply an outcome (response or error) through one function, ``_settle``, and what no retry
fixes reaches the supervisor either way. At shutdown the requests in flight are dropped without
a word (``abandon_requests`` for the first way, ``cancel_all`` for the second).

Per-partition order: at most ``per_partition_in_flight`` (<= 5 when idempotent) batches of one
partition are outstanding. When one fails with a retriable error the partition is *blocked*:
nothing new of it is sent until all its outstanding batches have answered; then the failed ones go
back to the front of its queue, in sequence order, and are resent with the same bytes (same
sequence), after a backoff. A sequence or fencing error makes the engine reset the producer
identity; every unacknowledged batch is then re-stamped on its next send.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kafka import errors as Errors
from kafka.protocol.admin import DescribeConfigsRequest
from kafka.protocol.producer import InitProducerIdRequest

from shallowmirror import codec
from shallowmirror.codec.messages import PRODUCE_API_KEY
from shallowmirror.engine import hotpath
from shallowmirror.engine.batch import FetchedBatch
from shallowmirror.engine.config import acks_value
from shallowmirror.engine.loops import answer_by_partition
from shallowmirror.engine.producer_identity import ProducerIdentity
from shallowmirror.engine.runtime import Runtime
from shallowmirror.engine.supervisor import is_transient, partitions_text, where_of
from shallowmirror.errors import (
    BrokerError,
    ConnectionFailedError,
    LocatedError,
    Where,
    broker_error_info,
)
from shallowmirror.net import BrokerConnection, Cluster
from shallowmirror.net.protocol import versions

log = logging.getLogger(__name__)

# Kafka error codes the sink treats specially (kafka-python's table of Kafka's Errors.java).
UNKNOWN_TOPIC_OR_PARTITION = Errors.UnknownTopicOrPartitionError.errno
MESSAGE_TOO_LARGE = Errors.MessageSizeTooLargeError.errno
RECORD_LIST_TOO_LARGE = Errors.RecordListTooLargeError.errno
INVALID_TIMESTAMP = Errors.InvalidTimestampError.errno
OUT_OF_ORDER_SEQUENCE_NUMBER = Errors.OutOfOrderSequenceNumberError.errno
DUPLICATE_SEQUENCE_NUMBER = Errors.DuplicateSequenceNumberError.errno
INVALID_PRODUCER_EPOCH = Errors.InvalidProducerEpochError.errno
UNKNOWN_PRODUCER_ID = Errors.UnknownProducerIdError.errno
PRODUCER_FENCED = Errors.ProducerFencedError.errno
INVALID_PRODUCER_ID_MAPPING = Errors.InvalidProducerIdMappingError.errno
_IDENTITY_ERRORS = {OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER_ID,
                    PRODUCER_FENCED, INVALID_PRODUCER_ID_MAPPING}
#: UNKNOWN_TOPIC_OR_PARTITION is retriable in Kafka (metadata may lag); give up after this many.
UNKNOWN_TARGET_RETRIES = 20
#: Lookups of a target topic never forwarded to before its absence is worth a warning: by then
#: (a second or so) a topic that was being created would be in the metadata.
_QUIET_LOOKUPS = 3
#: A target partition whose first batch is at least this big is spread over the lanes of its
#: broker (``target.connections.per.broker``); smaller-batch partitions share lane 0. 32 KiB: a
#: request of 8 such batches is 256 KB, where the broker's per-request cost no longer dominates.
SPREAD_MIN_BATCH_BYTES = 32 * 1024

TTP = tuple[str, int]


class TargetPartitionQueue:
    """Batches waiting for one target partition, and what is in flight for it."""

    __slots__ = ("queue", "in_flight", "failed", "blocked_until", "unknown_attempts",
                 "acked_producer_id", "acked_producer_epoch", "conn")

    def __init__(self) -> None:
        self.queue: deque[FetchedBatch] = deque()
        self.in_flight = 0
        self.failed: list[FetchedBatch] = []   # waiting for in_flight == 0 to be requeued
        self.blocked_until = 0.0
        self.unknown_attempts = 0
        #: Producer id and epoch the broker acknowledged a batch of this partition from (-1:
        #: none yet): from then on it holds the producer's sequence state here and refuses any
        #: gap. Two ints, not a tuple: set on every acknowledgement.
        self.acked_producer_id = -1
        self.acked_producer_epoch = -1
        #: The connection this partition's batches in flight were written to (None: not known
        #: yet, a request waiting for its connection). Its next batch goes only on the same one:
        #: a broker answers one connection's requests in order and a lost connection fails them
        #: all, so the partition's batches are acknowledged, or resent, in order.
        self.conn: BrokerConnection | None = None

    @property
    def acked_identity(self) -> tuple[int, int] | None:
        """(producer id, epoch) of the last acknowledged batch, None if none yet."""
        if self.acked_producer_id < 0:
            return None
        return (self.acked_producer_id, self.acked_producer_epoch)


class Sink:
    """Produces, over one connection (``lane``), to the partitions of one target broker pinned to
    that lane."""

    def __init__(self, owner: Sinks, node_id: int, lane: int = 0) -> None:
        self.owner = owner
        self.node_id = node_id
        self.lane = lane
        self.partitions: dict[TTP, TargetPartitionQueue] = {}
        #: The same partitions' queues, as the planner reads them (kept in step with the above).
        self.queues: dict[TTP, deque[FetchedBatch]] = {}
        #: The partitions whose queue may hold a batch (every one whose queue does, perhaps
        #: some whose queue emptied since), least recently sent first: the planner walks these,
        #: not every partition, so a request costs what is queued, not what is owned (10,000
        #: idle partitions). Whatever adds to a queue adds it here (``enqueue``, ``enqueue_all``,
        #: ``_maybe_requeue``); the planner drops the empty ones it meets and moves the ones it
        #: picks to the back (``loops.plan_picks``).
        self.ready: dict[TTP, None] = {}
        self.wake = asyncio.Event()
        self.requests_in_flight = 0
        s = owner.settings
        self.max_request_bytes = s["max.request.size"]
        self.max_requests = s["max.in.flight.requests.per.connection"]
        self.per_partition = min(5, self.max_requests) if s["enable.idempotence"] else \
            self.max_requests
        self.timeout_ms = s["request.timeout.ms"]
        #: Answers awaited per wake-up; one request always left for the broker to work on.
        self.answers_per_wakeup = max(1, min(s["target.answers.per.wakeup"],
                                             self.max_requests - 1))
        self.requests_sent = 0
        #: A request's task waits for the connection (nothing more is planned meanwhile).
        self.connecting = False
        #: Fast-path requests in flight: token -> (picks, Produce version).
        self.waiting: dict[int, tuple[list[tuple[TTP, FetchedBatch]], int]] = {}
        self._tokens = 0
        #: The last error said to make batches resend (``_tell_resend``: once per error).
        self._told_error: BaseException | None = None
        #: The Produce version negotiated with the connection ``_versioned``.
        self._versioned: BrokerConnection | None = None
        self._version = 0

    # ---- queueing ----
    def enqueue(self, batch: FetchedBatch, ttp: TTP | None = None) -> None:
        """Queue ``batch`` behind the others of its target partition (``ttp``, if known)."""
        if ttp is None:
            ttp = (batch.target_topic, batch.target_partition)
        tq = self.partitions.get(ttp)
        if tq is None:
            tq = self.partitions[ttp] = TargetPartitionQueue()
            self.queues[ttp] = tq.queue
            self.owner.holder[ttp] = self
            self.owner.forwarded.add(ttp)
        if batch.enqueue_no < 0:
            batch.enqueue_no = self.owner.next_enqueue_no()
        tq.queue.append(batch)
        self.ready[ttp] = None
        self.wake.set()

    def enqueue_all(self, batches: list[FetchedBatch], ttp: TTP) -> None:
        """``enqueue`` each of ``batches`` (all for ``ttp``, in order), addressed to ``ttp``."""
        tq = self.partitions.get(ttp)
        if tq is None:
            for batch in batches:
                batch.target_topic, batch.target_partition = ttp
                self.enqueue(batch, ttp)
            return
        hotpath.enqueue_run(batches, ttp[0], ttp[1],
                            self.owner.take_enqueue_nos(len(batches)))
        tq.queue.extend(batches)
        self.ready[ttp] = None
        self.wake.set()

    def take_partition(self, ttp: TTP) -> list[FetchedBatch]:
        """Remove a partition (leader moved): its queued and failed batches, in order. Only
        once nothing of it is in flight."""
        tq = self.partitions.get(ttp)
        if tq is None:
            return []
        assert tq.in_flight == 0, "moving a partition with batches in flight"
        self.partitions.pop(ttp)
        self.queues.pop(ttp)
        self.ready.pop(ttp, None)
        if self.owner.holder.get(ttp) is self:
            del self.owner.holder[ttp]
        return sorted(tq.failed, key=_order) + list(tq.queue)

    def pending_batches(self) -> int:
        return sum(len(tq.queue) + tq.in_flight + len(tq.failed)
                   for tq in self.partitions.values())

    # ---- the loop ----
    async def run(self) -> None:
        """The produce loop (supervised by the engine: an error escaping it is not swallowed):
        write what may go now (``_pump``), then sleep until woken or a backoff ends."""
        while not self.owner.stopped:
            timeout = self._pump()
            self.wake.clear()
            if timeout is None:
                await self.wake.wait()
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)

    def _pump(self) -> float | None:
        """Plan and write requests until none may go now. Returns the seconds until a blocked
        partition's backoff ends, or None when only a wake-up can bring more work (a batch
        queued, the connection opened, the producer identity reset). Synchronous: a response's
        callback runs it too (``_on_answer``), so the next request leaves on the loop turn that
        read the answer, without a turn to wake this loop's task."""
        while not self.owner.stopped:
            if self.requests_in_flight >= self.max_requests or self.connecting:
                return None
            conn = self.owner.live_connection(self.node_id, self.lane)
            # The picks leave their queues, in flight on ``conn`` (hotpath: one call a request).
            picks, too_large = hotpath.plan_picks(self, conn)
            for ttp, batch in too_large:
                self.partitions[ttp].queue.popleft()
                self.owner.batch_too_large(batch, self.max_request_bytes)
            if not picks:
                partitions = self.partitions
                blocked = [tq.blocked_until for tq in map(partitions.__getitem__, self.ready)
                           if tq.blocked_until and tq.queue]
                if not blocked:
                    return None
                return max(0.0, min(blocked) - asyncio.get_running_loop().time())
            self.owner.stamp_all(picks)
            self.requests_in_flight += 1
            if conn is not None:
                self._send_now(conn, picks)
                continue
            # Not connected (yet): a task waits for the connection, and nothing more is planned
            # until it has written its request, so requests leave in plan order.
            self.connecting = True
            # Described lazily: the text is only needed if the request fails.
            self.owner.runtime.supervisor.spawn(
                self._send(picks), what=lambda picks=picks: self._describe(picks),
                where=lambda picks=picks: self._where(picks))
        return None

    def _describe(self, picks: list[tuple[TTP, FetchedBatch]]) -> str:
        return (f"produce request to target broker {self.node_id} "
                f"(partitions {partitions_text(ttp for ttp, _ in picks)})")

    def _where(self, picks: list[tuple[TTP, FetchedBatch]]) -> Where:
        return where_of(self.owner.alias, (ttp for ttp, _ in picks))

    def _encode(self, conn: BrokerConnection,
                picks: list[tuple[TTP, FetchedBatch]]) -> tuple[int, int, list, int]:
        """(Produce version, correlation id, request buffers, the least bytes its answer can
        have, 0 when unused) for ``picks`` on ``conn``."""
        if conn is not self._versioned:      # asked once per connection, not per request
            self._version = conn.api_version(PRODUCE_API_KEY, versions(PRODUCE_API_KEY))
            self._versioned = conn
            conn.coalesce_answers(self.answers_per_wakeup)
        version = self._version
        cid = conn.next_correlation_id()
        # The headers are written from the stamps straight into the request (one batch per
        # partition: the planner's picks).
        buffers, answer_bytes = codec.encode_produce_batches(
            picks, version=version, correlation_id=cid, client_id=conn.client_id,
            transactional_id=self.owner.identity.transactional_id, acks=self.owner.acks,
            timeout_ms=self.timeout_ms, clear_log_append_time=self.owner.clear_log_append_time)
        self.requests_sent += 1
        if self.answers_per_wakeup <= 1:
            answer_bytes = 0
        return version, cid, buffers, answer_bytes

    # ---- fast path: an open connection, the response applied by the connection's callback ----
    def _send_now(self, conn: BrokerConnection, picks: list[tuple[TTP, FetchedBatch]]) -> None:
        """Write the request now and leave the response to ``_on_answer``: no task, no future."""
        self._tokens += 1
        token = self._tokens
        try:
            version, cid, buffers, answer_bytes = self._encode(conn, picks)
            conn.send_with_callback(buffers, cid, functools.partial(self._on_answer, token),
                                    min_response_bytes=answer_bytes)
        except Exception as err:         # the connection broke under the write, or a bug
            self._settle_outside_task(picks, 0, None, err)
            return
        self.waiting[token] = (picks, version)

    def _on_answer(self, token: int, frame: memoryview | None,
                   error: BaseException | None) -> None:
        """A fast-path request was answered (``frame``) or failed (``error``), called by the
        connection; whatever it raises goes to the supervisor (nothing would carry it). Then
        writes what may go now, on this same loop turn; the loop's task is woken only for what
        ``_pump`` leaves to it (a backoff to wait out, the engine stopping)."""
        sent = self.waiting.pop(token, None)
        if sent is None:                 # abandoned at shutdown (``abandon_requests``)
            return
        picks, version = sent
        try:                             # _settle_outside_task, without its call
            self._settle(picks, version, frame, error, wake=False)
        except Exception as err:
            self.owner.runtime.supervisor.work_failed(
                err, what=self._describe(picks), where=self._where(picks))
        try:
            if self.owner.stopped or self._pump() is not None:
                self.wake.set()
        except Exception as err:
            self.owner.runtime.supervisor.work_failed(
                err, what=f"produce loop to target broker {self.node_id}",
                where=Where(cluster=self.owner.alias))

    def _settle_outside_task(self, picks: list[tuple[TTP, FetchedBatch]], version: int,
                             frame: memoryview | None, error: BaseException | None, *,
                             wake: bool = True) -> None:
        """``_settle`` where no task would carry what it raises to the supervisor."""
        try:
            self._settle(picks, version, frame, error, wake=wake)
        except Exception as err:
            self.owner.runtime.supervisor.work_failed(
                err, what=self._describe(picks), where=self._where(picks))

    def abandon_requests(self) -> None:
        """The engine stops: fast-path requests still in flight are no longer outstanding, as
        the supervisor's ``cancel_all`` makes the slow path's tasks (their answers, if any come,
        are dropped: no acknowledgement after the final commit was taken, no resend warning)."""
        waiting, self.waiting = self.waiting, {}
        for picks, _version in waiting.values():
            self._abandon(picks)

    # ---- slow path: a task that first waits for the connection ----
    async def _send(self, picks: list[tuple[TTP, FetchedBatch]]) -> None:
        """Wait for the connection, then write as the fast path does: the answer, too, is
        applied by ``_on_answer`` on the turn that reads it. A future here would apply it a
        turn later than a fast-path answer read behind it on the same connection, and the
        partition's batches would be acknowledged out of order."""
        try:
            try:
                conn = await self.owner.connection(self.node_id, self.lane)
            finally:
                self.connecting = False
                self.wake.set()
        except asyncio.CancelledError:
            self._abandon(picks)         # engine stopping: these are no longer outstanding
            raise
        except Exception as err:
            self._settle(picks, 0, None, err)
            return
        for ttp, _batch in picks:
            self.partitions[ttp].conn = conn
        self._send_now(conn, picks)

    # ---- both paths ----
    def _abandon(self, picks: list[tuple[TTP, FetchedBatch]]) -> None:
        for ttp, _batch in picks:
            self.partitions[ttp].in_flight -= 1
        self._request_ended()

    def _request_ended(self, wake: bool = True) -> None:
        self.requests_in_flight -= 1
        if wake:
            self.wake.set()
        self.owner.runtime.progress.notify()

    def _settle(self, picks: list[tuple[TTP, FetchedBatch]], version: int,
                frame: memoryview | None, error: BaseException | None, *,
                wake: bool = True) -> None:
        """Apply the outcome of one Produce request - its response ``frame`` or the ``error``
        that ended it - to its ``picks``. A lost connection or a transient error resends them;
        any other error fails them and is raised (for the supervisor: it fails the engine).
        ``wake=False``: the caller runs ``_pump`` itself (the slot freed needs no task)."""
        try:
            if error is not None:
                raise error
            # Its partitions stay C rows for the settle loop (native build).
            response = codec.decode_produce_answer(frame, version)
        except ConnectionFailedError as err:
            self._tell_resend(err, picks)
            self.owner.note_unreachable(err)
            for ttp, batch in picks:
                self._retry(ttp, batch, refresh=True)
            return
        except Exception as err:
            if is_transient(err):
                self._tell_resend(err, picks)
                for ttp, batch in picks:
                    self._retry(ttp, batch, refresh=True)
                return
            # Nothing retry can fix: these batches fail (their partitions stop, nothing is left
            # counted in flight) and the error escapes to the supervisor, which fails the engine.
            for ttp, batch in picks:
                self.partitions[ttp].in_flight -= 1
                self.owner.batch_failed(batch, err)
            raise
        finally:
            self._request_ended(wake)
        acked: list[tuple[FetchedBatch, int | None]] = []
        try:
            # The usual outcome in one call (hotpath), the rest here.
            rest = hotpath.settle_picks(self, picks, response, acked)
            if rest:
                self._answered(rest, answer_by_partition(response), acked)
        finally:
            # One call per response (at most one batch per partition, so per partition still in
            # source order), after the queues were updated.
            if acked:
                self.owner.batches_acked(acked)

    def _tell_resend(self, err: BaseException,
                     picks: list[tuple[TTP, FetchedBatch]]) -> None:
        """Say that a request's batches will be resent: once per error, for every request it
        ended. A lost connection ends each request in flight on it with the same error, and
        each used to print the same warning (5 in flight: 5 identical lines)."""
        if err is self._told_error:
            log.debug("%s; %d more batches to target broker %d will be resent", err,
                      len(picks), self.node_id)
            return
        self._told_error = err
        # The requests this error ends after this one are still waiting (the connection fails
        # its requests in send order, each through its callback).
        others = [sent for sent, _version in self.waiting.values()] if isinstance(
            err, ConnectionFailedError) else []
        batches = len(picks) + sum(map(len, others))
        requests = 1 + len(others)
        log.warning("%s; %d batch%s to target broker %d will be resent%s", err, batches,
                    "es" if batches != 1 else "", self.node_id,
                    f" ({requests} requests in flight)" if requests > 1 else "")

    def _answered(self, picks: list[tuple[TTP, FetchedBatch]], by_tp: dict,
                  acked: list[tuple[FetchedBatch, int | None]]) -> None:
        """Apply a Produce response to the picks it answers; collect what was acknowledged."""
        for ttp, batch in picks:
            part = by_tp.get(ttp)
            tq = self.partitions[ttp]
            if part is None:
                self._retry(ttp, batch, refresh=False)
                continue
            code = part.error_code
            if code == 0 or code == DUPLICATE_SEQUENCE_NUMBER:
                tq.in_flight -= 1
                if tq.unknown_attempts:
                    self.owner.target_partition_known_again(
                        ttp, f"after {tq.unknown_attempts} UNKNOWN_TOPIC_OR_PARTITION answers")
                    tq.unknown_attempts = 0
                if batch.stamp_generation >= 0:
                    tq.acked_producer_id = batch.producer_id
                    tq.acked_producer_epoch = batch.producer_epoch
                acked.append((batch, part.base_offset if code == 0 else None))
                if tq.failed:
                    self._maybe_requeue(ttp, tq)
                continue
            info = broker_error_info(code)
            where = Where(cluster=self.owner.alias, topic=ttp[0], partition=ttp[1])
            if code in _IDENTITY_ERRORS:
                # Answers of one partition come back in send order (one connection), so only
                # an earlier *failed* batch explains a gap; later batches in flight do not.
                if code == OUT_OF_ORDER_SEQUENCE_NUMBER and tq.failed:
                    self._retry(ttp, batch, refresh=False)   # behind an earlier failed batch
                else:
                    self._retry(ttp, batch, refresh=False)
                    self.owner.request_identity_reset(f"{info.name} from {where}")
            elif code in (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE):
                if ttp[0] in self.owner.limit_lookups_pending:
                    # The error names the topic's max.message.bytes: resend (the partition
                    # waits, nothing overtakes) until the lookup has answered.
                    log.debug("%s from %s before its max.message.bytes is known: resent",
                              info.name, where)
                    self._retry(ttp, batch, refresh=False)
                    continue
                tq.in_flight -= 1
                self.owner.batch_rejected_too_large(batch, info.name)
                self._maybe_requeue(ttp, tq)
            elif code == UNKNOWN_TOPIC_OR_PARTITION:
                tq.unknown_attempts += 1
                if tq.unknown_attempts == 1:
                    self.owner.target_partition_unknown(
                        ttp, batch, f"UNKNOWN_TOPIC_OR_PARTITION from broker {self.node_id}")
                if tq.unknown_attempts > UNKNOWN_TARGET_RETRIES:
                    tq.in_flight -= 1
                    self.owner.batch_failed(batch, BrokerError(code, where, (
                        f"the target topic {ttp[0]} has no partition {ttp[1]}; create it with "
                        "at least as many partitions as the source topic "
                        f"{batch.topic} and compression.type=producer")))
                    self._maybe_requeue(ttp, tq)
                else:
                    self._retry(ttp, batch, refresh=True)
            elif info.retriable or info.invalid_metadata:
                self._retry(ttp, batch, refresh=info.invalid_metadata)
            else:
                tq.in_flight -= 1
                message = part.error_message or (part.record_errors[0][1]
                                                 if part.record_errors else None)
                if code == INVALID_TIMESTAMP:
                    message = (f"{message or 'timestamp rejected'}; the target topic's "
                               "message.timestamp.before.max.ms / message.timestamp.after.max.ms "
                               "(Kafka 4 rejects records over 1 hour in the future by default) "
                               "or message.timestamp.type=LogAppendTime with log.append.time=keep "
                               "decide this")
                self.owner.batch_failed(batch, BrokerError(code, where, message))
                self._maybe_requeue(ttp, tq)

    def _retry(self, ttp: TTP, batch: FetchedBatch, *, refresh: bool) -> None:
        tq = self.partitions[ttp]
        tq.in_flight -= 1
        tq.failed.append(batch)
        if refresh:
            self.owner.target_leader_maybe_moved(ttp)
        self._maybe_requeue(ttp, tq)

    def _maybe_requeue(self, ttp: TTP, tq: TargetPartitionQueue) -> None:
        assert tq.in_flight >= 0
        if tq.failed and tq.in_flight == 0:
            failed = sorted(tq.failed, key=_order)
            tq.failed = []
            tq.queue.extendleft(reversed(failed))
            self.ready[ttp] = None
            attempts = max(b.attempts for b in failed)
            tq.blocked_until = asyncio.get_running_loop().time() + self.owner.backoff_s(attempts)
            self.owner.partition_requeued(self, ttp)
        self.wake.set()


class MessageTooLargeError(LocatedError):
    """A source batch larger than what the target accepts."""


class AckEvents(Protocol):
    """What the sink side reports about each batch it was given: the engine decides what an
    acknowledgement or a failure means for the source partition (offsets, hooks, stopping)."""

    def batch_acked(self, batch: FetchedBatch, target_base: int | None) -> None:
        """The target stored ``batch`` at ``target_base`` (None: a duplicate, offset unknown)."""

    def batch_failed(self, batch: FetchedBatch, err: BaseException) -> None:
        """``batch`` can never be written (``err`` names why and where)."""

    def target_partition_unknown(self, ttp: TTP) -> None:
        """The target does not know ``ttp`` (deleted, or too few partitions): its batches wait."""

    def target_repaired(self) -> bool:
        """Whether someone acts on ``target_partition_unknown`` (a mirror flow re-creates and
        widens remote topics): then batches for a partition the target lacks wait for it."""


def target_partition_known_again(alias: str, ttp: TTP, after: str) -> None:
    """Say that target ``alias`` takes ``ttp``'s batches again, after it did not know it."""
    log.info("target %s: %s-%d takes batches again (%s)", alias, ttp[0], ttp[1], after)


class Sinks:
    """The produce side of one engine: a ``Sink`` per target broker, and the decisions that span
    brokers - where a batch goes (the partition's leader, looked up again when unknown or
    moved), stamping the producer identity, resetting it after a sequence or fencing error,
    and turning a rejected or oversized batch into an error naming source and target."""

    def __init__(self, runtime: Runtime, events: AckEvents, *, alias: str,
                 source_alias: str) -> None:
        settings = runtime.settings
        self.runtime = runtime
        self.events = events
        many = getattr(events, "batches_acked", None)
        #: The batches one Produce response acknowledged, in request order: ``events``' own
        #: ``batches_acked`` where it has one (looked up once, not once a request).
        self.batches_acked: Callable[[list[tuple[FetchedBatch, int | None]]], None] = (
            many if many is not None else self._acked_one_by_one)
        self.alias = alias
        self.source_alias = source_alias
        self.cluster: Cluster | None = None
        self.identity = ProducerIdentity(idempotent=settings["enable.idempotence"],
                                         init_call=self._init_producer_id,
                                         fixed_producer_id=settings["producer.id"])
        self.acks = acks_value(settings)
        self.clear_log_append_time = settings["log.append.time"] == "clear"
        #: One sink per (target broker, lane): ``target.connections.per.broker`` lanes each.
        self.by_node: dict[tuple[int, int], Sink] = {}
        self.lanes = settings["target.connections.per.broker"]
        #: Target partition -> its lane, for life: one connection per partition keeps its order.
        self._lane_of: dict[TTP, int] = {}
        self._spread = 0             # large-batch partitions pinned so far (round robin)
        #: Set at shutdown, after what was in flight had its chance: produce loops end.
        self.stopped = False
        self.identity_resetting = False
        self._moving: set[TTP] = set()
        #: Target partitions whose leader is being looked up -> batches waiting, in order.
        self._awaiting_leader: dict[TTP, list[FetchedBatch]] = {}
        #: Target topics said to be missing (one warning per topic, not one per partition
        #: waiting for it); a topic leaves it when one of its partitions is found.
        self._missing_told: set[str] = set()
        #: Target partition -> the sink holding its queue (a partition's batches are queued on
        #: one sink at a time; ``partition_requeued`` moves them, whole and in order).
        self.holder: dict[TTP, Sink] = {}
        #: Target partitions batches were ever queued for.
        self.forwarded: set[TTP] = set()
        self._enqueue_no = 0
        #: target topic -> its max.message.bytes (None: not known), learnt once per topic so a
        #: MESSAGE_TOO_LARGE can name the limit without a round trip at failure time.
        self._message_limits: dict[str, int | None] = {}
        #: Target topics whose max.message.bytes lookup has not answered yet.
        self.limit_lookups_pending: set[str] = set()

    @property
    def settings(self) -> Mapping[str, Any]:
        return self.runtime.settings

    async def start(self, cluster: Cluster) -> None:
        """Produce to ``cluster`` (started) under a producer identity of its own."""
        self.cluster = cluster
        await self.identity.init()

    def values(self) -> list[Sink]:
        """The sink of every target broker written to so far."""
        return list(self.by_node.values())

    def pending_batches(self) -> int:
        return sum(s.pending_batches() for s in self.by_node.values())

    def stop(self) -> None:
        """End the produce loops (what is still queued stays unacknowledged)."""
        self.stopped = True
        for sink in self.by_node.values():
            sink.abandon_requests()
            sink.wake.set()
        self.runtime.progress.notify()

    def next_enqueue_no(self) -> int:
        self._enqueue_no += 1
        return self._enqueue_no

    def take_enqueue_nos(self, n: int) -> int:
        """Reserve ``n`` enqueue numbers: they are the returned value + 1 .. + n."""
        first = self._enqueue_no
        self._enqueue_no += n
        return first

    async def connection(self, node_id: int, lane: int = 0):
        assert self.cluster is not None
        return await self.cluster.connection(node_id, lane)

    def live_connection(self, node_id: int, lane: int = 0) -> BrokerConnection | None:
        """The open connection ``connection`` would return at once, else None (no waiting)."""
        assert self.cluster is not None
        return self.cluster.live_connection(node_id, lane)

    def note_unreachable(self, err: BaseException) -> None:
        self.runtime.note_unreachable(self.alias, err)

    def backoff_s(self, attempts: int) -> float:
        return self.runtime.backoff_s(attempts)

    def batch_acked(self, batch: FetchedBatch, target_base: int | None) -> None:
        self.events.batch_acked(batch, target_base)

    def _acked_one_by_one(self, acked: list[tuple[FetchedBatch, int | None]]) -> None:
        for batch, target_base in acked:
            self.events.batch_acked(batch, target_base)

    def batch_failed(self, batch: FetchedBatch, err: BaseException) -> None:
        self.events.batch_failed(batch, err)

    async def _init_producer_id(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        assert self.cluster is not None
        backoff = self.runtime.backoff()
        while True:
            conn = await self.cluster.any_connection()
            version = conn.api_version(InitProducerIdRequest.API_KEY,
                                       versions(InitProducerIdRequest.API_KEY))
            req = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000,
                                        producer_id=-1, producer_epoch=-1, version=version)
            resp = await conn.request(req)
            if resp.error_code == 0:
                return resp.producer_id, resp.producer_epoch
            err = BrokerError(resp.error_code, Where(cluster=self.alias), "in InitProducerId")
            if not err.retriable:
                raise err
            await asyncio.sleep(backoff.next_s())

    # ---- routing ----
    def forward(self, batch: FetchedBatch, target_topic: str, target_partition: int) -> None:
        """Queue ``batch`` for ``target_topic``/``target_partition`` on the leader's sink."""
        assert self.cluster is not None
        batch.target_topic, batch.target_partition = target_topic, target_partition
        if target_topic not in self._message_limits:
            self._message_limits[target_topic] = None
            self.limit_lookups_pending.add(target_topic)
            self.runtime.supervisor.spawn(
                self._learn_message_limit(target_topic), what="target topic limit lookup",
                where=Where(cluster=self.alias, topic=target_topic))
        ttp = (target_topic, target_partition)
        sink = self._queue_of(ttp)
        if sink is None:
            waiting = self._awaiting_leader.get(ttp) if self._awaiting_leader else None
            if waiting is not None:      # a leader lookup is on: queue behind it, in order
                waiting.append(batch)
                return
            leader = self.cluster.leader(target_topic, target_partition)
            if leader is None:
                self._await_leader(ttp, [batch])
                return
            sink = self._sink(leader, ttp, batch.size)
        sink.enqueue(batch, ttp)

    def _await_leader(self, ttp: TTP, batches: list[FetchedBatch]) -> None:
        """Hold ``batches`` (in order) until ``ttp``'s leader is found (``_forward_later``)."""
        self._awaiting_leader[ttp] = batches
        self.runtime.supervisor.spawn(
            self._forward_later(ttp), what="target leader lookup",
            where=Where(cluster=self.alias, topic=ttp[0], partition=ttp[1]))

    def forward_all(self, batches: list[FetchedBatch], target_topic: str,
                    target_partition: int) -> None:
        """``forward`` each of ``batches`` (in order) to one target partition: the checks and
        the leader lookup once, then one queue extension."""
        assert self.cluster is not None
        ttp = (target_topic, target_partition)
        sink = None
        if target_topic in self._message_limits:
            sink = self._queue_of(ttp)
            if sink is None and not (self._awaiting_leader and ttp in self._awaiting_leader):
                leader = self.cluster.leader(target_topic, target_partition)
                if leader is not None:
                    sink = self._sink(leader, ttp, batches[0].size if batches else 0)
        if sink is None:
            for batch in batches:         # first sight of the topic, or no leader: one by one
                self.forward(batch, target_topic, target_partition)
            return
        sink.enqueue_all(batches, ttp)    # addresses them to ``ttp`` too

    def _queue_of(self, ttp: TTP) -> Sink | None:
        """The sink holding ``ttp``'s queue, where its next batches must go whatever the
        metadata says now: behind the batches waiting or in flight there, which move to a new
        leader together, in order, once nothing is in flight (``partition_requeued``). Queued
        on the new leader instead, new batches overtook them (tried on Kafka 3.7 with a leader
        moving back after a broker restart: a batch 12,800 records ahead landed first, after
        an OUT_OF_ORDER_SEQUENCE_NUMBER and a new producer identity). A partition with nothing
        in flight or failed is moved first if its leader changed, and given to a leader lookup
        (``_await_leader``, None returned) if the metadata names none: the lookup is what
        notices a deleted or narrowed target topic. While a lookup holds a partition's
        batches no sink holds its queue: ``_forward_later`` makes the next one."""
        sink = self.holder.get(ttp)
        if sink is None:
            return None
        tq = sink.partitions[ttp]
        if tq.in_flight or tq.failed:
            return sink
        assert self.cluster is not None
        if self.cluster.leader(*ttp) is None:
            self._await_leader(ttp, sink.take_partition(ttp))
            return None
        self.partition_requeued(sink, ttp)
        return self.holder.get(ttp)

    def _sink(self, node_id: int, ttp: TTP, batch_size: int = 0) -> Sink:
        """The sink of ``ttp`` on broker ``node_id``: the lane it was given when first seen (by
        ``batch_size``, its first batch's: see the module docstring), so its batches always share
        one connection, in order."""
        lane = self._lane_of.get(ttp) if self.lanes > 1 else 0
        if lane is None:
            lane = self._lane_of[ttp] = self._pick_lane(batch_size)
        sink = self.by_node.get((node_id, lane))
        if sink is None:
            sink = self.by_node[(node_id, lane)] = Sink(self, node_id, lane)
            self.runtime.supervisor.spawn_loop(
                sink.run, what=lambda: (f"produce loop of target broker {node_id} (partitions "
                                        f"{partitions_text(sink.partitions)})"),
                where=lambda: where_of(self.alias, sink.partitions))
        return sink

    def _forwarded_before(self, ttp: TTP) -> bool:
        """Whether batches were queued for ``ttp`` before (a sink holds its queue)."""
        return ttp in self.forwarded

    def _pick_lane(self, batch_size: int) -> int:
        """Large batches round robin over the lanes, small ones lane 0."""
        if batch_size < SPREAD_MIN_BATCH_BYTES:
            return 0
        lane = self._spread % self.lanes
        self._spread += 1
        return lane

    async def _forward_later(self, ttp: TTP) -> None:
        """Find ``ttp``'s leader, then queue every batch that waited for it, in the order they
        came: one lookup per partition, so batches of a partition never overtake each other."""
        assert self.cluster is not None
        backoff = self.runtime.backoff()
        missing = False
        for attempt in range(UNKNOWN_TARGET_RETRIES):
            with contextlib.suppress(ConnectionFailedError):
                await self.cluster.refresh_metadata([ttp[0]])
            parts = self.cluster.partitions(ttp[0])
            narrower = parts is not None and ttp[1] not in parts
            if narrower and not missing and not self.events.target_repaired():
                break           # nobody adds the partition (no mirror flow): fail now
            leader = self.cluster.leader(*ttp)
            if leader is not None:
                self._missing_told.discard(ttp[0])
                waiting = self._awaiting_leader[ttp]
                if missing:
                    self.target_partition_known_again(
                        ttp, f"in the target's metadata at lookup {attempt + 1}")
                sink = self._sink(leader, ttp, waiting[0].size)
                for batch in self._awaiting_leader.pop(ttp):
                    sink.enqueue(batch)
                return
            if not missing and (narrower or (parts is None and self._forwarded_before(ttp))):
                # Fewer partitions than the source (the source topic grew), or gone from a target
                # that took batches there: deleted. (A topic only just created may be missing
                # from the metadata a moment; that is no news.)
                missing = True
                self.target_partition_unknown(
                    ttp, self._awaiting_leader[ttp][0],
                    f"the target's metadata lists {len(parts)} partitions" if narrower
                    else "not in the target's metadata")
            elif (parts is None and attempt == _QUIET_LOOKUPS
                  and ttp[0] not in self._missing_told):
                # Never forwarded to: a topic that is only being created is there by now, so
                # say why nothing moves (the lookups go on for about a minute before failing),
                # once for the topic: each of its partitions waits on the same lookup.
                self._missing_told.add(ttp[0])
                first = self._awaiting_leader[ttp][0]
                others = sum(1 for waiting in self._awaiting_leader
                             if waiting[0] == ttp[0] and waiting != ttp)
                log.warning(
                    "target %s has no topic %s (not in its metadata after %d lookups; for "
                    "source %s-%d offset %d%s): its batches wait and the lookup is retried, %d "
                    "times at most, before the partition stops; create it with at least as "
                    "many partitions as the source topic and compression.type=producer",
                    self.alias, ttp[0], attempt + 1, first.topic, first.partition,
                    first.source_base,
                    f", and {others} more partition{'s' if others != 1 else ''} of it"
                    if others else "", UNKNOWN_TARGET_RETRIES)
            await asyncio.sleep(backoff.next_s())
        batches = self._awaiting_leader.pop(ttp)
        parts = self.cluster.partitions(ttp[0])
        what = (f"topic {ttp[0]} does not exist" if parts is None else
                f"topic {ttp[0]} has {len(parts)} partitions, no partition {ttp[1]}")
        source_cluster = getattr(self.events, "source", None)
        for batch in batches:
            source_count = (source_cluster.partitions(batch.topic)
                            if source_cluster is not None else None)
            if parts is not None and source_count is not None and \
                    len(parts) >= len(source_count):
                # It already has as many as the source: the partition asked for is the
                # program's own choice (forward(batch, topic, 99)), not a topic to widen.
                advice = (f"it has as many partitions as source topic {batch.topic} "
                          f"({len(source_count)}): forward to one of 0-{len(parts) - 1}")
            else:
                advice = (f"create it with at least as many partitions as source topic "
                          f"{batch.topic} and compression.type=producer")
            self.batch_failed(batch, LocatedError(
                f"cannot forward source {batch.topic}-{batch.partition} offset "
                f"{batch.source_base} to cluster {self.alias}: {what}; {advice}",
                Where(cluster=self.alias, topic=ttp[0], partition=ttp[1])))

    # ---- what a sink asks for ----
    def stamp_all(self, picks: list[tuple[TTP, FetchedBatch]]) -> None:
        """Stamp the producer identity into the headers of one request's batches (each once per
        identity generation: a resend keeps its bytes and its sequence), in one codec call."""
        identity = self.identity
        codec.stamp_batches(
            picks, producer_id=identity.producer_id, producer_epoch=identity.producer_epoch,
            generation=identity.generation, sequences=identity.sequences(),
            clear_log_append_time=self.clear_log_append_time, headers=False)

    def batch_too_large(self, batch: FetchedBatch, limit: int) -> None:
        self.batch_failed(batch, MessageTooLargeError(
            f"source batch of {batch.size} bytes (cluster {self.source_alias}, "
            f"{batch.topic}-{batch.partition} offset {batch.source_base}) does not fit "
            f"max.request.size={limit} for target {self.alias}: raise max.request.size "
            f"(mm2.properties: {self.alias}.producer.max.request.size) and the target topic's "
            f"max.message.bytes (broker message.max.bytes) above {batch.size}",
            Where(cluster=self.alias, topic=batch.target_topic,
                  partition=batch.target_partition)))

    async def _learn_message_limit(self, topic: str) -> None:
        """Ask the target once for ``topic``'s max.message.bytes (topic override or broker
        default); any failure just leaves it unknown: it only improves an error message. Until
        it has answered, a batch the target rejects as too large is resent, so that the error
        can name the limit (``Sink._answered``)."""
        assert self.cluster is not None
        try:
            with contextlib.suppress(Exception):
                conn = await self.cluster.any_connection()
                # All keys (None), not ["max.message.bytes"]: tansu 0.6 closes the connection on a
                # key list, and with it every produce request in flight on that connection.
                req = DescribeConfigsRequest(
                    resources=[DescribeConfigsRequest.DescribeConfigsResource(
                        resource_type=2, resource_name=topic,  # 2: TOPIC
                        configuration_keys=None)],
                    include_synonyms=False, include_documentation=False,
                    version=conn.api_version(DescribeConfigsRequest.API_KEY,
                                             versions(DescribeConfigsRequest.API_KEY)))
                result = (await conn.request(req)).results[0]
                for entry in result.configs if result.error_code == 0 else []:
                    if entry.name == "max.message.bytes" and entry.value:
                        self._message_limits[topic] = int(entry.value)
        finally:
            self.limit_lookups_pending.discard(topic)

    def batch_rejected_too_large(self, batch: FetchedBatch, error_name: str) -> None:
        limit = self._message_limits.get(batch.target_topic)
        known = f" (max.message.bytes={limit})" if limit else ""
        self.batch_failed(batch, MessageTooLargeError(
            f"target {self.alias} rejected a {batch.size}-byte batch with {error_name} "
            f"(source {batch.topic}-{batch.partition} offset {batch.source_base}): raise the "
            f"target topic {batch.target_topic}'s max.message.bytes{known} (or broker "
            f"message.max.bytes) above {batch.size}",
            Where(cluster=self.alias, topic=batch.target_topic,
                  partition=batch.target_partition)))

    def target_partition_unknown(self, ttp: TTP, batch: FetchedBatch, how: str) -> None:
        """The target does not know ``ttp`` (``how`` we learnt it: a Produce answer, or its
        metadata), the first time since it last took a batch there: say so once (the retries
        that follow are quiet) and tell the engine, whose hook lets a mirror flow re-create the
        topic without waiting for its next refresh."""
        log.warning(
            "target %s has no partition %s-%d (%s, for source %s-%d offset %d): the topic was "
            "deleted, or has fewer partitions than the source; its batches wait and are "
            "retried, %d times at most, before the partition stops", self.alias, ttp[0], ttp[1],
            how, batch.topic, batch.partition, batch.source_base, UNKNOWN_TARGET_RETRIES)
        self.events.target_partition_unknown(ttp)

    def target_partition_known_again(self, ttp: TTP, after: str) -> None:
        target_partition_known_again(self.alias, ttp, after)

    def request_identity_reset(self, reason: str) -> None:
        if self.identity_resetting:
            return
        self.identity_resetting = True
        self.runtime.supervisor.spawn(self._reset_identity(reason),
                                      what="producer identity reset",
                                      where=Where(cluster=self.alias))

    async def _reset_identity(self, reason: str) -> None:
        # A new identity only once every request stamped with the old one has answered.
        await self.runtime.progress.wait_until(
            lambda: not any(s.requests_in_flight for s in self.by_node.values()))
        await self.identity.reset(reason)
        self.identity_resetting = False
        for sink in self.by_node.values():
            sink.wake.set()

    def target_leader_maybe_moved(self, ttp: TTP) -> None:
        if ttp in self._moving or self.cluster is None:
            return
        self._moving.add(ttp)

        async def refresh() -> None:
            try:
                assert self.cluster is not None
                with contextlib.suppress(ConnectionFailedError):
                    await self.cluster.refresh_metadata([ttp[0]])
                for sink in list(self.by_node.values()):
                    tq = sink.partitions.get(ttp)
                    if tq is not None and tq.in_flight == 0 and not tq.failed:
                        self.partition_requeued(sink, ttp)
            finally:
                self._moving.discard(ttp)

        self.runtime.supervisor.spawn(refresh(), what="target leader lookup",
                                      where=Where(cluster=self.alias, topic=ttp[0],
                                                  partition=ttp[1]))

    def partition_requeued(self, sink: Sink, ttp: TTP) -> None:
        """A target partition has nothing in flight: move it if its leader changed."""
        assert self.cluster is not None
        leader = self.cluster.leader(*ttp)
        if leader is None or leader == sink.node_id:
            return
        batches = sink.take_partition(ttp)
        log.info("target %s %s-%d moved from broker %d to %d; %d batches follow",
                 self.alias, ttp[0], ttp[1], sink.node_id, leader, len(batches))
        new = self._sink(leader, ttp)
        for batch in batches:
            new.enqueue(batch)




def _order(batch: FetchedBatch) -> int:
    """Resend order: the order batches were first queued, which is their sequence order."""
    return batch.enqueue_no
