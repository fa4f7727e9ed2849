"""A sink: the produce loop for the partitions one target broker leads (franz-go's ``sink``).

Batches wait in one queue per target partition, in source order. Each round the planner
(``packing.plan_request``) takes the head batch of as many partitions as fit ``max.request.size``
(exactly one batch per partition: stock brokers reject more), stamps the producer identity into
each batch header the first time it is sent (``rewrite_for_produce``: a new 61-byte header plus a
view of the rest; the payload is never copied or decompressed), and sends the request while up to
``max.in.flight.requests.per.connection`` others are outstanding.

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
import logging
from collections import deque
from typing import TYPE_CHECKING

from shallowmirror import codec
from shallowmirror.engine.batch import FetchedBatch
from shallowmirror.engine.packing import Plan, Rotation, plan_request
from shallowmirror.engine.supervisor import is_transient, partitions_text, where_of
from shallowmirror.errors import BrokerError, ConnectionFailedError, Where, broker_error_info

if TYPE_CHECKING:
    from shallowmirror.engine.core import EngineCore

log = logging.getLogger(__name__)

PRODUCE_API_KEY = 0
PRODUCE_VERSIONS = (3, 9)

# Kafka error codes the sink treats specially.
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
RECORD_LIST_TOO_LARGE = 18
INVALID_TIMESTAMP = 32
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
UNKNOWN_PRODUCER_ID = 59
PRODUCER_FENCED = 90
INVALID_PRODUCER_ID_MAPPING = 49
_IDENTITY_ERRORS = {OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER_ID,
                    PRODUCER_FENCED, INVALID_PRODUCER_ID_MAPPING}
#: UNKNOWN_TOPIC_OR_PARTITION is retriable in Kafka (metadata may lag); give up after this many.
UNKNOWN_TARGET_RETRIES = 20

TTP = tuple[str, int]


class TargetPartitionQueue:
    """Batches waiting for one target partition, and what is in flight for it."""

    __slots__ = ("queue", "in_flight", "failed", "blocked_until", "unknown_attempts")

    def __init__(self) -> None:
        self.queue: deque[FetchedBatch] = deque()
        self.in_flight = 0
        self.failed: list[FetchedBatch] = []   # waiting for in_flight == 0 to be requeued
        self.blocked_until = 0.0
        self.unknown_attempts = 0


class Sink:
    """Produces to every partition led by one target broker."""

    def __init__(self, core: EngineCore, node_id: int) -> None:
        self.core = core
        self.node_id = node_id
        self.partitions: dict[TTP, TargetPartitionQueue] = {}
        self.rotation: Rotation[TTP] = Rotation()
        self.wake = asyncio.Event()
        self.requests_in_flight = 0
        s = core.settings
        self.max_request_bytes = s["max.request.size"]
        self.max_requests = s["max.in.flight.requests.per.connection"]
        self.per_partition = min(5, self.max_requests) if s["enable.idempotence"] else \
            self.max_requests
        self.allow_multiple = s["multiple.batches.per.partition"]
        self.requests_sent = 0

    # ---- queueing ----
    def enqueue(self, batch: FetchedBatch) -> None:
        ttp = (batch.target_topic, batch.target_partition)
        tq = self.partitions.get(ttp)
        if tq is None:
            tq = self.partitions[ttp] = TargetPartitionQueue()
            self.rotation.add(ttp)
        if batch.enqueue_no < 0:
            batch.enqueue_no = self.core.next_enqueue_no()
        tq.queue.append(batch)
        self.wake.set()

    def take_partition(self, ttp: TTP) -> list[FetchedBatch]:
        """Remove a partition (leader moved): its queued and failed batches, in order. Only
        once nothing of it is in flight."""
        tq = self.partitions.get(ttp)
        if tq is None:
            return []
        assert tq.in_flight == 0, "moving a partition with batches in flight"
        self.partitions.pop(ttp)
        self.rotation.remove(ttp)
        return sorted(tq.failed, key=_order) + list(tq.queue)

    def pending_batches(self) -> int:
        return sum(len(tq.queue) + tq.in_flight + len(tq.failed)
                   for tq in self.partitions.values())

    def _can_send(self, ttp: TTP) -> bool:
        tq = self.partitions[ttp]
        if tq.failed or tq.in_flight >= self.per_partition:
            return False
        if tq.blocked_until and asyncio.get_running_loop().time() < tq.blocked_until:
            return False
        return not self.core.identity_resetting

    # ---- the loop ----
    async def run(self) -> None:
        """The produce loop (supervised by the engine: an error escaping it is not swallowed)."""
        loop = asyncio.get_running_loop()
        while not self.core.sinks_stopped:
            self._drop_abandoned_heads()
            if self.requests_in_flight >= self.max_requests:
                self.wake.clear()
                await self.wake.wait()
                continue
            plan: Plan = plan_request(
                {k: tq.queue for k, tq in self.partitions.items()}, self.rotation.next_order(),
                size_of=lambda b: b.size, topic_of=lambda k: k[0], can_send=self._can_send,
                max_request_bytes=self.max_request_bytes)
            for ttp, batch in plan.too_large:
                self.partitions[ttp].queue.popleft()
                self.core.batch_too_large(batch, self.max_request_bytes)
            if not plan.picks:
                self.wake.clear()
                blocked = [tq.blocked_until for tq in self.partitions.values()
                           if tq.blocked_until and tq.queue]
                timeout = max(0.0, min(blocked) - loop.time()) if blocked else None
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout)
                continue
            picks = []
            for ttp, batch in plan.picks:
                tq = self.partitions[ttp]
                tq.queue.popleft()
                tq.in_flight += 1
                self.core.stamp(batch)
                batch.attempts += 1
                picks.append((ttp, batch))
            self.requests_in_flight += 1
            self.core.supervisor.spawn(
                self._send(picks), what=f"produce request to target broker {self.node_id} "
                f"(partitions {partitions_text(ttp for ttp, _ in picks)})",
                where=where_of(self.core.target_alias, (ttp for ttp, _ in picks)))

    def _drop_abandoned_heads(self) -> None:
        for tq in self.partitions.values():
            while tq.queue and tq.queue[0].abandoned:
                tq.queue.popleft().release()

    async def _send(self, picks: list[tuple[TTP, FetchedBatch]]) -> None:
        try:
            conn = await self.core.target_connection(self.node_id)
            version = conn.api_version(PRODUCE_API_KEY, PRODUCE_VERSIONS)
            topics: dict[str, list] = {}
            for (topic, partition), batch in picks:
                topics.setdefault(topic, []).append((partition, [[batch.header, batch.rest]]))
            cid = conn.next_correlation_id()
            buffers = codec.encode_produce_request(
                version=version, correlation_id=cid, client_id=conn.client_id,
                transactional_id=self.core.identity.transactional_id, acks=self.core.acks,
                timeout_ms=self.core.settings["request.timeout.ms"],
                topics=list(topics.items()), allow_multiple_batches=self.allow_multiple)
            self.requests_sent += 1
            frame = await conn.send_raw(buffers, cid)
            response = codec.decode_produce_response(frame, version)
        except ConnectionFailedError as err:
            log.warning("%s; %d batches to target broker %d will be resent", err, len(picks),
                        self.node_id)
            self.core.note_unreachable(self.core.target_alias, err)
            for ttp, batch in picks:
                self._retry(ttp, batch, refresh=True)
            return
        except asyncio.CancelledError:
            for ttp, _batch in picks:        # engine stopping: these are no longer outstanding
                self.partitions[ttp].in_flight -= 1
            raise
        except Exception as err:
            if is_transient(err):
                log.warning("%s; %d batches to target broker %d will be resent", err,
                            len(picks), self.node_id)
                for ttp, batch in picks:
                    self._retry(ttp, batch, refresh=True)
                return
            # Nothing retry can fix: these batches fail (their partitions stop, nothing is left
            # counted in flight) and the error escapes to the supervisor, which fails the engine.
            for ttp, batch in picks:
                self.partitions[ttp].in_flight -= 1
                self.core.batch_failed(batch, err)
            raise
        finally:
            self.requests_in_flight -= 1
            self.wake.set()
        by_tp = {}
        for topic, parts in response.topics:
            for part in parts:
                by_tp[(topic, part.partition)] = part
        for ttp, batch in picks:
            part = by_tp.get(ttp)
            tq = self.partitions[ttp]
            if part is None:
                self._retry(ttp, batch, refresh=False)
                continue
            code = part.error_code
            if code == 0 or code == DUPLICATE_SEQUENCE_NUMBER:
                tq.in_flight -= 1
                tq.unknown_attempts = 0
                self.core.batch_acked(batch, part.base_offset if code == 0 else None)
                self._maybe_requeue(ttp, tq)
                continue
            info = broker_error_info(code)
            where = Where(cluster=self.core.target_alias, topic=ttp[0], partition=ttp[1])
            if code in _IDENTITY_ERRORS:
                # Answers of one partition come back in send order (one connection), so only
                # an earlier *failed* batch explains a gap; later batches in flight do not.
                if code == OUT_OF_ORDER_SEQUENCE_NUMBER and tq.failed:
                    self._retry(ttp, batch, refresh=False)   # behind an earlier failed batch
                else:
                    self._retry(ttp, batch, refresh=False)
                    self.core.request_identity_reset(f"{info.name} from {where}")
            elif code in (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE):
                tq.in_flight -= 1
                self.core.batch_rejected_too_large(batch, info.name)
                self._maybe_requeue(ttp, tq)
            elif code == UNKNOWN_TOPIC_OR_PARTITION:
                tq.unknown_attempts += 1
                if tq.unknown_attempts > UNKNOWN_TARGET_RETRIES:
                    tq.in_flight -= 1
                    self.core.batch_failed(batch, BrokerError(code, where, (
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
                self.core.batch_failed(batch, BrokerError(code, where, message))
                self._maybe_requeue(ttp, tq)

    def _retry(self, ttp: TTP, batch: FetchedBatch, *, refresh: bool) -> None:
        tq = self.partitions[ttp]
        tq.in_flight -= 1
        tq.failed.append(batch)
        if refresh:
            self.core.target_leader_maybe_moved(ttp)
        self._maybe_requeue(ttp, tq)

    def _maybe_requeue(self, ttp: TTP, tq: TargetPartitionQueue) -> None:
        assert tq.in_flight >= 0
        if tq.failed and tq.in_flight == 0:
            failed = sorted(tq.failed, key=_order)
            tq.failed = []
            tq.queue.extendleft(reversed(failed))
            attempts = max(b.attempts for b in failed)
            tq.blocked_until = asyncio.get_running_loop().time() + self.core.backoff_s(attempts)
            self.core.partition_requeued(self, ttp)
        self.wake.set()


def _order(batch: FetchedBatch) -> int:
    """Resend order: the order batches were first queued, which is their sequence order."""
    return batch.enqueue_no
