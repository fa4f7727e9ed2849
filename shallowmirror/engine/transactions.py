"""Transactional exactly-once mirroring: KIP-618's fenced transactional producers, KIP-656's
offsets committed on the target in the same transaction as the records.

The unit of fencing is the **source partition**: its transactional id is
``<group.id>:<source alias>-><target alias>:<topic>:<partition>``. Partitions move between
engines through the *source* cluster's consumer group, whose generations the *target*'s
coordinators know nothing about, so KIP-447's group-generation fencing cannot reach across the
two clusters. What does reach is the transactional id: an engine that is given a partition calls
InitProducerId with that partition's id before anything else, which bumps the epoch, aborts
whatever transaction the previous owner left open and fences every request the previous owner
(a zombie paused by GC or SIGSTOP, a process that was killed but whose requests are still in
the network) sends later (Kafka Streams' EOS-alpha, one producer per input partition). An id
per engine process or per task would not do that: the new owner's id differs from the zombie's,
so the zombie could still commit records for a partition it no longer owns.
The price: Kafka 3.6+ accepts the transactional batches of only one producer per Produce request
(ReplicaManager: "Transactional records contained more than one producer ID"), so a request
carries one source partition's batches, and each partition runs its own transactions.

One transaction of one source partition (``PartitionTransaction.run``)::

    InitProducerId(txn id)                 on assignment: fences the previous owner, aborts its
    OffsetFetch(group.id, require_stable)  open transaction; then where to resume (target side)
      |
      |  AddPartitionsToTxn(target partition)      before the first batch for it
      |  Produce(batch) x n  (<= 5 in flight, stamped: producer id/epoch, sequence,
      |                       transactional bit, CRC recomputed)
      |  ... until transaction.max.bytes or transaction.interval.ms, or nothing is queued
      |      and either the last batch reached the source's high watermark or uncommitted
      |      batches hold so much of buffer.memory that fetching waits for a commit
      |  AddOffsetsToTxn(group.id)
      |  TxnOffsetCommit(group.id: the TARGET topic-partition -> next SOURCE offset; the
      |                  broker refuses offsets for topics it does not have)
      v  EndTxn(commit)  -> the batches count as acknowledged (offsets, hooks, metrics)

Errors: a retriable coordinator answer (CONCURRENT_TRANSACTIONS, a coordinator loading or moved)
is retried; any failed produce or commit step aborts the transaction (EndTxn abort), bumps the
epoch (InitProducerId with the current id/epoch, KIP-360) and rewinds the source partition to its
last committed offset: nothing of the aborted transaction is visible to read_committed consumers,
and it is all mirrored again. PRODUCER_FENCED / INVALID_PRODUCER_EPOCH mean another owner (or the
broker, after transaction.timeout.ms) took the id: this engine stops the partition and writes
nothing more to it; it is mirrored again only once the group assigns it anew (a fresh
InitProducerId). The engine never retries a fenced id with its old epoch: that could abort the
new owner's transaction. The same happens to an engine stalled longer than
transaction.timeout.ms (the broker aborts and bumps the epoch; Kafka 3.7 cannot tell that apart
from a takeover): with group assignment the stall also outlasts session.timeout.ms, so the
partition comes back through the rebalance; with ``partition.assignment=all`` it stays stopped
until the mirror restarts (the status line names it).

Out of scope: the source cluster's group offsets are still committed (for lag monitoring), but
are only read the very first time, when the target group has no offset for a partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kafka import errors as Errors
from kafka.protocol.consumer.group import OffsetFetchRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)

from shallowmirror import codec
from shallowmirror.codec.layout import take_sequence
from shallowmirror.codec.messages import PRODUCE_API_KEY
from shallowmirror.engine.batch import TP, FetchedBatch
from shallowmirror.engine.producer_identity import ProducerIdentity, Stamp
from shallowmirror.engine.runtime import Runtime
from shallowmirror.engine.sink import target_partition_known_again
from shallowmirror.errors import (
    BrokerError,
    ConnectionFailedError,
    LocatedError,
    OperatorActionRequired,
    Where,
    broker_error_info,
)
from shallowmirror.net import Cluster
from shallowmirror.net.coordinators import GROUP_KEY, TRANSACTION_KEY, Coordinators
from shallowmirror.net.protocol import versions

log = logging.getLogger(__name__)
UNKNOWN_TOPIC_OR_PARTITION = Errors.UnknownTopicOrPartitionError.errno

TTP = tuple[str, int]
#: Produce requests of one source partition in flight at once (idempotence tracks 5).
MAX_IN_FLIGHT = 5

PRODUCER_FENCED = Errors.ProducerFencedError.errno
INVALID_PRODUCER_EPOCH = Errors.InvalidProducerEpochError.errno
_FENCED = frozenset({PRODUCER_FENCED, INVALID_PRODUCER_EPOCH})
_COORDINATOR_MOVED = frozenset({Errors.NotCoordinatorError.errno,
                                Errors.CoordinatorNotAvailableError.errno})
_RETRY = frozenset({Errors.CoordinatorLoadInProgressError.errno,
                    Errors.ConcurrentTransactionsError.errno,
                    Errors.UnstableOffsetCommitError.errno,
                    Errors.RequestTimedOutError.errno})
_OPERATOR = frozenset({Errors.TransactionalIdAuthorizationFailedError.errno,
                       Errors.GroupAuthorizationFailedError.errno,
                       Errors.ClusterAuthorizationFailedError.errno,
                       Errors.InvalidTransactionTimeoutError.errno,
                       Errors.TopicAuthorizationFailedError.errno})


def transactional_id(group_id: str, flow: str, topic: str, partition: int) -> str:
    """The transactional id of one source partition: unique per group, flow and partition (topic
    names hold no ``:``, so reading from the right is unambiguous)."""
    return f"{group_id}:{flow}:{topic}:{partition}"


class FencedError(LocatedError):
    """Another owner took this source partition's transactional id over (or the broker aborted
    a transaction open longer than transaction.timeout.ms and bumped the epoch)."""


class TransactionAccessError(OperatorActionRequired):
    """The target refused a transactional request for a reason only the operator can fix."""


class _Abort(Exception):
    """The current transaction cannot commit: abort it and rewind."""


class TransactionEvents(Protocol):
    """What the engine is told: committed batches, partitions to rewind or stop."""

    def batch_acked(self, batch: FetchedBatch, target_base: int | None) -> None: ...

    def batch_failed(self, batch: FetchedBatch, err: BaseException) -> None: ...

    def rewind_partition(self, tp: TP) -> None: ...

    def partition_failed(self, tp: TP, err: BaseException) -> None: ...

    def target_partition_unknown(self, ttp: TP) -> None: ...


class PartitionTransaction:
    """One source partition's transactional producer and its loop of transactions."""

    def __init__(self, owner: TransactionalSinks, tp: TP) -> None:
        self.owner = owner
        self.tp = tp
        self.transactional_id = transactional_id(owner.group_id, owner.flow, *tp)
        #: Where the offsets live in the target group: the *target* topic-partition (the broker
        #: refuses offsets for topics it does not have), holding the next *source* offset.
        self.offsets_tp = owner.target_of(tp)
        self.producer_id = -1
        self.producer_epoch = -1
        self.generation = 0
        self._sequences: dict[TTP, int] = {}
        self.queue: deque[FetchedBatch] = deque()
        self.wake = asyncio.Event()
        self.closed = False
        self.transactions = 0
        self.aborted = 0
        self.in_transaction = 0          # batches sent in the open transaction

    @property
    def where(self) -> Where:
        return Where(cluster=self.owner.source_alias, topic=self.tp[0], partition=self.tp[1])

    def pending(self) -> int:
        """Batches not yet committed; when the engine stops, only those of the open transaction
        (what is still queued is mirrored again by the next owner)."""
        return self.in_transaction + (0 if self.owner.stopping else len(self.queue))

    # ---- coordinator requests ----
    async def _call(self, key_type: int, key: str, make: Callable[[int], Any], what: str,
                    error_of: Callable[[Any], int],
                    on_unknown: Callable[[], None] | None = None,
                    on_known: Callable[[int], None] | None = None) -> Any:
        """Send ``make(version)`` to the coordinator of ``key`` until it answers without a
        retriable error; fencing raises FencedError, other errors BrokerError. ``on_unknown``
        runs at the first UNKNOWN_TOPIC_OR_PARTITION answer, ``on_known(attempts)`` at the
        success that follows one."""
        backoff = self.owner.runtime.backoff()
        attempts = 0
        unknown = False
        while True:
            if self.closed:
                raise _Abort(f"source partition {self.tp[0]}-{self.tp[1]} given up")
            try:
                node = await self.owner.coordinators.node(key_type, key)
                conn = await self.owner.cluster.connection(node)
                request = make(conn.api_version(self.owner.api_keys[what],
                                                versions(self.owner.api_keys[what])))
                resp = await conn.request(request)
                code = error_of(resp)
            except ConnectionFailedError as err:
                self.owner.coordinators.forget(key_type, key)
                log.info("%s: %s for %s failed (%s); retrying", self.where, what,
                         self.transactional_id, err)
                await asyncio.sleep(backoff.next_s())
                continue
            except BrokerError as err:          # FindCoordinator answered with an error
                code = err.code
                resp = None
            if code == 0:
                if unknown and on_known is not None:
                    on_known(attempts)
                return resp
            self._raise_if_final(code, what)
            if code in _COORDINATOR_MOVED:
                self.owner.coordinators.forget(key_type, key)
            if code == UNKNOWN_TOPIC_OR_PARTITION and not unknown and on_unknown is not None:
                unknown = True
                on_unknown()
            attempts += 1
            log.log(logging.WARNING if attempts == 10 else logging.DEBUG,
                    "%s: %s for %s answered %s (attempt %d); retrying", self.where, what,
                    self.transactional_id, broker_error_info(code).name, attempts)
            await asyncio.sleep(backoff.next_s())

    def _raise_if_final(self, code: int, what: str) -> None:
        info = broker_error_info(code)
        where = Where(cluster=self.owner.alias)
        if code in _FENCED:
            raise FencedError(
                f"{what} for transactional.id {self.transactional_id!r} answered {info.name}: "
                f"another mirror instance with the same group.id took source partition "
                f"{self.tp[0]}-{self.tp[1]} over (or a transaction stayed open longer than "
                "transaction.timeout.ms and the target aborted it); this instance writes "
                "nothing more to it until the group assigns it again", self.where)
        if code in _OPERATOR:
            raise TransactionAccessError(
                f"target cluster {self.owner.alias} refused {what} for transactional.id "
                f"{self.transactional_id!r} / group {self.owner.group_id!r} with {info.name}: "
                "exactly-once needs WRITE and DESCRIBE on the transactional id (prefix "
                f"{self.owner.group_id!r}), READ on the group, and a transaction.timeout.ms the "
                "broker's transaction.max.timeout.ms allows")
        if code in _COORDINATOR_MOVED or code in _RETRY or info.retriable:
            return
        raise BrokerError(code, where, f"in {what} for transactional.id {self.transactional_id!r}")

    async def init_producer(self, *, bump: bool) -> None:
        """InitProducerId: a fresh one fences every previous owner of the id; ``bump`` (after
        an abort) asks for the next epoch of this producer, refused with PRODUCER_FENCED when
        someone else initialized the id meanwhile."""
        pid, epoch = (self.producer_id, self.producer_epoch) if bump else (-1, -1)
        timeout_ms = self.owner.settings["transaction.timeout.ms"]
        resp = await self._call(
            TRANSACTION_KEY, self.transactional_id,
            lambda v: InitProducerIdRequest(transactional_id=self.transactional_id,
                                            transaction_timeout_ms=timeout_ms, producer_id=pid,
                                            producer_epoch=epoch, version=v),
            "InitProducerId", lambda r: r.error_code)
        self.producer_id, self.producer_epoch = resp.producer_id, resp.producer_epoch
        self._sequences.clear()
        self.generation += 1
        log.info("%s: transactional.id %s is producer %d epoch %d", self.where,
                 self.transactional_id, self.producer_id, self.producer_epoch)

    async def committed_offset(self) -> tuple[int | None, str | None]:
        """This partition's offset in group.id on the target (None: none yet) and its commit
        metadata. ``require_stable`` waits for a pending transactional commit to complete."""
        topic, partition = self.offsets_tp
        resp = await self._call(
            GROUP_KEY, self.owner.group_id,
            lambda v: OffsetFetchRequest(
                group_id=self.owner.group_id, require_stable=True, version=v,
                topics=[OffsetFetchRequest.OffsetFetchRequestTopic(
                    name=topic, partition_indexes=[partition])]),
            "OffsetFetch", _offset_fetch_error)
        for t in resp.topics:
            for p in t.partitions:
                if t.name == topic and p.partition_index == partition:
                    if p.committed_offset < 0:
                        return None, None
                    return p.committed_offset, p.metadata
        return None, None

    async def _add_partition(self, ttp: TTP) -> None:
        def make(v: int) -> Any:
            return AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=self.transactional_id,
                v3_and_below_producer_id=self.producer_id,
                v3_and_below_producer_epoch=self.producer_epoch,
                v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(
                    name=ttp[0], partitions=[ttp[1]])], version=v)

        await self._call(TRANSACTION_KEY, self.transactional_id, make, "AddPartitionsToTxn",
                         _add_partitions_error,
                         on_unknown=lambda: self.owner.target_partition_unknown(ttp, self.tp),
                         on_known=lambda attempts: target_partition_known_again(
                             self.owner.alias, ttp,
                             f"AddPartitionsToTxn answered after {attempts} attempts"))

    async def _commit(self, position: int) -> None:
        txn, group = self.transactional_id, self.owner.group_id
        pid, epoch = self.producer_id, self.producer_epoch
        await self._call(TRANSACTION_KEY, txn, lambda v: AddOffsetsToTxnRequest(
            transactional_id=txn, producer_id=pid, producer_epoch=epoch, group_id=group,
            version=v), "AddOffsetsToTxn", lambda r: r.error_code)
        topic, partition = self.offsets_tp
        metadata = commit_metadata(self.owner.source_alias, self.tp,
                                   self.owner.source_topic_id(self.tp))
        await self._call(GROUP_KEY, group, lambda v: TxnOffsetCommitRequest(
            transactional_id=txn, group_id=group, producer_id=pid, producer_epoch=epoch,
            generation_id=-1, member_id="", group_instance_id=None, version=v,
            topics=[TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(
                name=topic, partitions=[
                    TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
                    .TxnOffsetCommitRequestPartition(
                        partition_index=partition, committed_offset=position,
                        committed_leader_epoch=-1, committed_metadata=metadata)])]),
            "TxnOffsetCommit", _txn_offset_commit_error)
        await self._end(commit=True)

    async def _end(self, *, commit: bool) -> None:
        txn, pid, epoch = self.transactional_id, self.producer_id, self.producer_epoch
        await self._call(TRANSACTION_KEY, txn, lambda v: EndTxnRequest(
            transactional_id=txn, producer_id=pid, producer_epoch=epoch, committed=commit,
            version=v), "EndTxn(commit)" if commit else "EndTxn(abort)",
            lambda r: r.error_code)

    # ---- produce ----
    def _stamp(self, batch: FetchedBatch) -> None:
        ttp = (batch.target_topic, batch.target_partition)
        assert ttp[0] is not None and ttp[1] is not None
        base = take_sequence(self._sequences, ttp, batch.record_count)
        batch.header, batch.rest = codec.rewrite_for_produce(
            batch.view, producer_id=self.producer_id, producer_epoch=self.producer_epoch,
            base_sequence=base, transactional=True,
            clear_log_append_time=self.owner.clear_log_append_time)
        batch.stamp = Stamp(self.producer_id, self.producer_epoch, base, self.generation)

    async def _produce(self, batch: FetchedBatch) -> int:
        """Send one stamped batch; its target base offset, or _Abort / FencedError."""
        cluster = self.owner.cluster
        topic, partition = batch.target_topic, batch.target_partition
        assert topic is not None and partition is not None
        leader = cluster.leader(topic, partition)
        if leader is None:
            with contextlib.suppress(ConnectionFailedError):
                await cluster.refresh_metadata([topic])
            leader = cluster.leader(topic, partition)
            if leader is None:
                raise _Abort(f"target {self.owner.alias} {topic}-{partition} has no leader")
        batch.attempts += 1
        try:
            conn = await cluster.connection(leader)
            version = conn.api_version(PRODUCE_API_KEY, versions(PRODUCE_API_KEY))
            cid = conn.next_correlation_id()
            buffers = codec.encode_produce_request(
                version=version, correlation_id=cid, client_id=conn.client_id,
                transactional_id=self.transactional_id, acks=-1,
                timeout_ms=self.owner.settings["request.timeout.ms"],
                topics=[(topic, [(partition, [[batch.header, batch.rest]])])])
            frame = await conn.send_raw(buffers, cid)
            response = codec.decode_produce_response(frame, version)
        except ConnectionFailedError as err:
            raise _Abort(str(err)) from err
        part = next((p for t, parts in response.topics if t == topic for p in parts
                     if p.partition == partition), None)
        if part is None:
            raise _Abort(f"target {self.owner.alias} did not answer for {topic}-{partition}")
        if part.error_code == 0:
            return part.base_offset
        code = part.error_code
        if code in _FENCED:
            self._raise_if_final(code, "Produce")
        info = broker_error_info(code)
        if info.invalid_metadata:
            with contextlib.suppress(ConnectionFailedError):
                await cluster.refresh_metadata([topic])
        if code in (Errors.MessageSizeTooLargeError.errno, Errors.RecordListTooLargeError.errno):
            raise LocatedError(
                f"target {self.owner.alias} rejected a {batch.size}-byte batch with {info.name} "
                f"(source {batch.topic}-{batch.partition} offset {batch.source_base}): raise the "
                f"target topic {topic}'s max.message.bytes above {batch.size}",
                Where(cluster=self.owner.alias, topic=topic, partition=partition))
        raise _Abort(f"Produce to target {self.owner.alias} {topic}-{partition} answered "
                     f"{info.name}" + (f": {part.error_message}" if part.error_message else ""))

    # ---- the loop ----
    async def run(self) -> None:
        """Transactions, one after the other, until the partition is closed or fenced."""
        backoff = self.owner.runtime.backoff()
        while not self.closed and not self.owner.stopped:
            if not self.queue or self.owner.stopping:
                self.wake.clear()
                await self.wake.wait()
                continue
            try:
                await self._transaction()
                backoff.reset()
            except FencedError as err:
                self._give_up(err)
                return
            except (_Abort, BrokerError) as err:
                if self.closed:
                    return
                try:
                    await self._abort(str(err))
                except FencedError as fenced:
                    self._give_up(fenced)
                    return
                except _Abort:
                    return                       # closed meanwhile
                await asyncio.sleep(backoff.next_s())
            except LocatedError as err:          # a batch the target can never take
                with contextlib.suppress(FencedError, _Abort, BrokerError):
                    await self._abort(str(err), rewind=False)
                self._give_up(err)
                return

    def _take(self) -> FetchedBatch | None:
        while self.queue:
            batch = self.queue.popleft()
            if not batch.abandoned:
                return batch
        return None

    async def _transaction(self) -> None:
        """One transaction: add, produce, commit offsets, end. Batches count as acknowledged
        only once EndTxn(commit) succeeded."""
        loop = asyncio.get_running_loop()
        settings = self.owner.settings
        deadline = loop.time() + settings["transaction.interval.ms"] / 1000
        max_bytes = settings["transaction.max.bytes"]
        added: set[TTP] = set()
        sent: list[tuple[FetchedBatch, asyncio.Task]] = []
        size = 0
        try:
            while True:
                if self.closed or self.owner.stopping or size >= max_bytes \
                        or loop.time() >= deadline:
                    break
                in_flight = [task for _, task in sent if not task.done()]
                if len(in_flight) >= MAX_IN_FLIGHT:
                    await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    self._check_failed(sent)
                    continue
                batch = self._take()
                if batch is None and sent and (_caught_up(sent[-1][0])
                                               or self._fetching_starved()):
                    break       # nothing more will come now: commit instead of waiting
                if batch is None:
                    self.wake.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), deadline - loop.time())
                    self._check_failed(sent)
                    continue
                ttp = (batch.target_topic, batch.target_partition)
                if ttp not in added:
                    await self._add_partition(ttp)   # type: ignore[arg-type]
                    added.add(ttp)                   # type: ignore[arg-type]
                self._stamp(batch)
                sent.append((batch, asyncio.ensure_future(self._produce(batch))))
                self.in_transaction += 1
                size += batch.size
            if sent:
                await asyncio.wait([task for _, task in sent])
            self._check_failed(sent)
            live = [(b, t.result()) for b, t in sent if not b.abandoned]
            if not live:
                if added:
                    await self._end(commit=False)   # everything was revoked meanwhile
                return
            await self._commit(live[-1][0].next_offset)
            self.transactions += 1
            self.owner.committed_transactions += 1
            for batch, base in live:
                self.owner.events.batch_acked(batch, base)
        except BaseException:
            for _, task in sent:
                task.cancel()
            raise
        finally:
            self.in_transaction = 0

    def _fetching_starved(self) -> bool:
        """Uncommitted batches hold the byte budget until their transaction commits: once less
        than the quarter the fetcher waits for is free, no batch comes before a commit."""
        budget = self.owner.runtime.budget
        return budget.limit_bytes - budget.in_use_bytes < budget.limit_bytes // 4

    @staticmethod
    def _check_failed(sent: list[tuple[FetchedBatch, asyncio.Task]]) -> None:
        for _, task in sent:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _abort(self, reason: str, *, rewind: bool = True) -> None:
        """Abort the open transaction, take the next epoch, mirror again from the last commit."""
        self.aborted += 1
        self.owner.aborted_transactions += 1
        log.warning("%s: aborting the transaction of transactional.id %s (%s); the partition "
                    "is mirrored again from its last committed offset", self.where,
                    self.transactional_id, reason)
        try:
            await self._end(commit=False)
        except BrokerError as err:      # e.g. INVALID_TXN_STATE: nothing open; the bump aborts
            log.info("%s: %s", self.where, err)
        try:
            await self.init_producer(bump=True)
        except BrokerError as err:      # a broker without KIP-360 bumps (tansu 0.6: UNKNOWN)
            log.info("%s: epoch bump refused (%s); initializing the id afresh", self.where, err)
            await self.init_producer(bump=False)
        if rewind and self._current:
            self.queue.clear()
            self.owner.events.rewind_partition(self.tp)

    @property
    def _current(self) -> bool:
        """Still this engine's producer of the partition (not revoked, not replaced by a newer
        take-over whose InitProducerId fenced this one)."""
        return not self.closed and self.owner.partitions.get(self.tp) is self

    def _give_up(self, err: BaseException) -> None:
        current = self._current
        self.closed = True
        self.queue.clear()
        if current:
            self.owner.events.partition_failed(self.tp, err)


def _caught_up(batch: FetchedBatch) -> bool:
    """``batch`` ended at the source's high watermark (last stable offset) when fetched: a
    transaction ending with it closes at once rather than waiting for transaction.interval.ms
    (under load more batches are always queued, so this only shortens an idle tail)."""
    return 0 <= batch.high_watermark <= batch.next_offset


def commit_metadata(source_alias: str, tp: TP, topic_id: str | None) -> str:
    """The metadata of a transactional offset commit: whose offset it is, and of which topic
    (its id, when the source cluster gives ids: a topic deleted and created again under the
    same name keeps its name, not its id)."""
    text = f"source {source_alias} {tp[0]}-{tp[1]}"
    return text if topic_id is None else f"{text} topic-id {topic_id}"


def committed_topic_id(metadata: str | None) -> str | None:
    """The source topic id in ``commit_metadata``'s text (None: not there, e.g. a commit by a
    version before ids were recorded)."""
    words = (metadata or "").split()
    if len(words) == 5 and words[0] == "source" and words[3] == "topic-id":
        return words[4]
    return None


def _offset_fetch_error(resp: Any) -> int:
    if resp.error_code:
        return resp.error_code
    return next((p.error_code for t in resp.topics for p in t.partitions if p.error_code), 0)


def _add_partitions_error(resp: Any) -> int:
    if getattr(resp, "error_code", 0):
        return resp.error_code
    for topic in resp.results_by_topic_v3_and_below:
        for part in topic.results_by_partition:
            if part.partition_error_code:
                return part.partition_error_code
    return 0


def _txn_offset_commit_error(resp: Any) -> int:
    return next((p.error_code for t in resp.topics for p in t.partitions if p.error_code), 0)


class TransactionalSinks:
    """The produce side of an exactly-once engine (what ``sink.Sinks`` is otherwise): one
    ``PartitionTransaction`` per owned source partition."""

    def __init__(self, runtime: Runtime, events: TransactionEvents, *, alias: str,
                 source_alias: str, group_id: str, flow: str,
                 target_of: Callable[[TP], TP] = lambda tp: tp,
                 source_topic_id: Callable[[TP], str | None] = lambda tp: None) -> None:
        self.runtime = runtime
        #: source partition -> the id of the source topic its batches now come from.
        self.source_topic_id = source_topic_id
        #: source partition -> the target partition its batches go to (the router's mapping).
        self.target_of = target_of
        self.events = events
        self.alias = alias
        self.source_alias = source_alias
        self.group_id = group_id
        self.flow = flow
        self.clear_log_append_time = runtime.settings["log.append.time"] == "clear"
        #: Stats only: under exactly-once every source partition has its own producer.
        self.identity = ProducerIdentity(idempotent=False)
        self.cluster: Cluster | None = None
        self.coordinators: Coordinators | None = None
        self.partitions: dict[TP, PartitionTransaction] = {}
        self.stopped = False
        self.committed_transactions = 0
        self.aborted_transactions = 0
        self.api_keys = {
            "InitProducerId": InitProducerIdRequest.API_KEY,
            "OffsetFetch": OffsetFetchRequest.API_KEY,
            "AddPartitionsToTxn": AddPartitionsToTxnRequest.API_KEY,
            "AddOffsetsToTxn": AddOffsetsToTxnRequest.API_KEY,
            "TxnOffsetCommit": TxnOffsetCommitRequest.API_KEY,
            "EndTxn(commit)": EndTxnRequest.API_KEY,
            "EndTxn(abort)": EndTxnRequest.API_KEY,
        }

    @property
    def settings(self) -> Mapping[str, Any]:
        return self.runtime.settings

    def target_partition_unknown(self, ttp: TTP, source: TP) -> None:
        """The target does not know ``ttp`` (AddPartitionsToTxn answered
        UNKNOWN_TOPIC_OR_PARTITION): say so once and tell the engine, whose hook lets a mirror
        flow re-create or widen the remote topic now; the transaction keeps asking meanwhile."""
        log.warning("target %s has no partition %s-%d (AddPartitionsToTxn answered "
                    "UNKNOWN_TOPIC_OR_PARTITION, for source %s-%d): the topic was deleted, or has "
                    "fewer partitions than the source; the transaction asks again until it "
                    "exists", self.alias, ttp[0], ttp[1], source[0], source[1])
        self.events.target_partition_unknown(ttp)

    @property
    def stopping(self) -> bool:
        return self.runtime.stopping

    async def start(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.coordinators = Coordinators(cluster, self.alias)
        log.info("exactly-once: one transactional producer per source partition on %s, "
                 "source offsets committed in the transactions to group %s there",
                 self.alias, self.group_id)

    def values(self) -> list[PartitionTransaction]:
        return list(self.partitions.values())

    def pending_batches(self) -> int:
        return sum(p.pending() for p in self.partitions.values())

    def stop(self) -> None:
        self.stopped = True
        for part in self.partitions.values():
            part.wake.set()
        self.runtime.progress.notify()

    async def take_over(self, tps: list[TP],
                        source_committed: Mapping[TP, int | None]) -> dict[TP, int | None]:
        """Own ``tps``: fence their previous owners, and return where each resumes - the
        target group's offset, or (first start) the source group's, taken once."""
        async def one(tp: TP) -> int | None:
            old = self.partitions.pop(tp, None)
            if old is not None:
                old.closed = True
                old.wake.set()
            part = PartitionTransaction(self, tp)
            await part.init_producer(bump=False)
            offset, metadata = await part.committed_offset()
            self.partitions[tp] = part
            self.runtime.supervisor.spawn(
                part.run(), what=f"transactions of {part.transactional_id}", where=part.where)
            was, now = committed_topic_id(metadata), self.source_topic_id(tp)
            if offset is not None and was is not None and now is not None and was != now:
                # The source topic was deleted and created again since that commit: its offset
                # is the old topic's, and the new topic's records below it would be skipped.
                log.warning("%s: the source topic was deleted and created again (topic id %s, "
                            "was %s) since offset %d was committed to group %s on target %s; "
                            "that offset is not used: the new topic starts at "
                            "auto.offset.reset", part.where, now, was, offset, self.group_id,
                            self.alias)
                return None
            if offset is None and source_committed.get(tp) is not None:
                log.info("%s: no offset in group %s on target %s yet; starting from the source "
                         "group's committed offset %d (taken once)", part.where, self.group_id,
                         self.alias, source_committed[tp])
                return source_committed[tp]
            return offset

        results = await asyncio.gather(*(one(tp) for tp in tps))
        return dict(zip(tps, results, strict=True))

    def partitions_revoked(self, tps: list[TP]) -> None:
        """Close the transactions of ``tps`` (whatever is still open is aborted by the next
        owner's InitProducerId)."""
        for tp in tps:
            part = self.partitions.pop(tp, None)
            if part is not None:
                part.closed = True
                part.queue.clear()
                part.wake.set()

    def forward(self, batch: FetchedBatch, target_topic: str, target_partition: int) -> None:
        batch.target_topic, batch.target_partition = target_topic, target_partition
        part = self.partitions.get((batch.topic, batch.partition))
        if part is None or part.closed:
            self.events.batch_failed(batch, LocatedError(
                "source partition not owned by this engine's transactions (revoked or fenced)",
                Where(cluster=self.source_alias, topic=batch.topic, partition=batch.partition,
                      offset=batch.source_base)))
            return
        if batch.enqueue_no < 0:
            batch.enqueue_no = 0
        part.queue.append(batch)
        part.wake.set()
