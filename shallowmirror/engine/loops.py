"""The engine's per-batch loops, pure Python (the twin of ``native/_cloops.pyx``).

These loops run for every forwarded batch, once per fetched partition, Produce request or
answer: making the batches of a fetched partition (``prepare_usual``), registering them with
the partition's offsets (``add_batches``) and addressing them to a target partition's queue
(``enqueue_run``), planning a request (``plan_picks``), applying an answer's usual outcome
(``settle_picks``) and acknowledging the batches it wrote (``ack_batches``). They are here,
apart from the sink and the engine that call them, so that a native build can run the same
loops without one interpreted step per batch (``shallowmirror.engine.hotpath`` chooses, as
``shallowmirror.codec`` does for the codec). Each handles the usual case only and hands
everything else back to the caller's Python, which keeps every decision about errors, retries
and hooks; the differential tests hold both builds to the same results on the same objects.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Mapping
from typing import Any

from kafka import errors as Errors

from shallowmirror.codec.layout import TRANSACTIONAL_MASK
from shallowmirror.engine.packing import plan_request

TTP = tuple[str, int]
#: The batch is already written: an acknowledgement (kafka-python's table of Kafka's Errors.java).
DUPLICATE_SEQUENCE_NUMBER = Errors.DuplicateSequenceNumberError.errno

_size_of = operator.attrgetter("size")
_topic_of = operator.itemgetter(0)


def prepare_usual(views: list, start: int, position: int, topic: str, partition: int,
                  lease: Any, high_watermark: int, fetched_at: float,
                  stop_at_transactional: bool, batch_class: type) -> tuple[list, int]:
    """The engine's batches (``batch_class``: ``FetchedBatch``) for the usual fetched views from
    ``views[start]`` on: v2, at or past the fetch ``position``, no offset gaps (so at least one
    record), and not transactional while ``stop_at_transactional`` (the caller warns about the
    first one). Returns them and the index of the first view that is not usual (``len(views)``:
    none). The caller holds ``lease`` once for each batch made."""
    out = []
    i = start
    n = len(views)
    while i < n:
        view = views[i]
        if stop_at_transactional and view.magic >= 2 and view.attributes & TRANSACTIONAL_MASK:
            break
        if not (view.magic == 2 and view.base_offset >= position
                and view.record_count == view.last_offset_delta + 1):
            break
        out.append(batch_class(topic, partition, view, lease, view.base_offset,
                               view.next_offset, None, high_watermark, fetched_at))
        i += 1
    return out, i


def add_batches(offsets: Any, batches: list) -> None:
    """Register a fetched partition's new batches with its offsets (``PartitionOffsets``):
    the method itself here; the native build runs its loop without the interpreter."""
    offsets.add_batches(batches)


def enqueue_run(batches: list, target_topic: str, target_partition: int, last_no: int) -> None:
    """Address ``batches`` (one source partition's, in order) to the target partition, and
    number the ones not numbered yet ``last_no + 1``, ``+ 2``, ... in order (what
    ``Sinks.forward`` and ``Sink.enqueue`` do one by one)."""
    no = last_no
    for batch in batches:
        batch.target_topic = target_topic
        batch.target_partition = target_partition
        no += 1
        if batch.enqueue_no < 0:
            batch.enqueue_no = no


def can_send(sink: Any, conn: Any, ttp: TTP) -> bool:
    """Whether ``ttp``'s head batch may go into the next request on ``conn``. Heads abandoned
    meanwhile (partition revoked or stopped) are dropped here first: the planner visits every
    queue anyway, so this costs no loop of its own."""
    tq = sink.partitions[ttp]
    queue = tq.queue
    while queue and queue[0].abandoned:
        queue.popleft().release()
    if not queue or tq.failed or tq.in_flight >= sink.per_partition:
        return False
    if tq.in_flight and (tq.conn is None or tq.conn is not conn):
        return False        # the ones in flight ride another connection (or none yet)
    identity = sink.owner.identity
    if identity.idempotent and tq.in_flight and (
            tq.acked_producer_id != identity.producer_id
            or tq.acked_producer_epoch != identity.producer_epoch):
        # Kafka accepts *any* first sequence from a producer it holds no state for (KIP-360,
        # ProducerAppendInfo.checkSequence): if the first batch failed (NOT_LEADER right
        # after a topic is created) the second could land before it. So one batch at a time
        # until the broker has acknowledged one; then it refuses every gap itself.
        return False
    if tq.blocked_until and asyncio.get_running_loop().time() < tq.blocked_until:
        return False
    return not sink.owner.identity_resetting


def plan_picks(sink: Any, conn: Any) -> tuple[list[tuple[TTP, Any]], list[tuple[TTP, Any]]]:
    """Plan ``sink``'s next request to go on ``conn`` (None: not connected yet): the head batch
    of every partition that may send, least recently sent first (``sink.ready``), while
    ``max.request.size`` holds. The picks leave their queues and count as in flight on ``conn``
    (one more attempt each). Returns the picks and the head batches too large for any request
    (still queued).

    ``sink.ready`` afterwards: the partitions met with an empty queue are gone, the picked ones
    with more queued are at the back in pick order, the others keep their places; so a
    request's cost follows the partitions with something queued, not every one owned."""
    ready = sink.ready
    order = list(ready)
    plan = plan_request(sink.queues, order, size_of=_size_of, topic_of=_topic_of,
                        can_send=lambda ttp: can_send(sink, conn, ttp),
                        max_request_bytes=sink.max_request_bytes)
    partitions = sink.partitions
    for ttp, batch in plan.picks:
        tq = partitions[ttp]
        tq.queue.popleft()
        tq.in_flight += 1
        tq.conn = conn
        batch.attempts += 1
    settle_ready(ready, partitions, order, plan.picks)
    return plan.picks, plan.too_large


def settle_ready(ready: dict, partitions: Mapping[TTP, Any], order: list[TTP],
                 picks: list[tuple[TTP, Any]]) -> None:
    """``ready`` after a plan over ``order`` that picked ``picks`` (see ``plan_picks``)."""
    for ttp in order:
        if not partitions[ttp].queue:
            del ready[ttp]
    for ttp, _batch in picks:
        if ttp in ready:
            del ready[ttp]
            ready[ttp] = None


def answer_by_partition(response: Any) -> dict:
    """A decoded Produce ``response``'s partitions by target partition (a partition answered
    twice: the last answer)."""
    return {(topic, part.partition): part for topic, parts in response.topics for part in parts}


def settle_picks(sink: Any, picks: list[tuple[TTP, Any]], response: Any,
                 acked: list[tuple[Any, int | None]]) -> list[tuple[TTP, Any]]:
    """Apply a decoded Produce ``response``'s usual outcome to ``picks``: each batch written
    (or already written: DUPLICATE_SEQUENCE_NUMBER) to a partition with no failure to settle
    leaves the in-flight count and goes to ``acked`` with its target offset (None when the
    broker did not say). Returns the picks left to the caller (an error, no answer, a partition
    recovering), in pick order. (The native build finds a small answer's partitions by scanning
    it, without this dict.)"""
    by_tp = answer_by_partition(response)
    partitions = sink.partitions
    rest = []
    for pick in picks:
        ttp, batch = pick
        part = by_tp.get(ttp)
        if part is None:
            rest.append(pick)
            continue
        code = part.error_code
        tq = partitions[ttp]
        if (code != 0 and code != DUPLICATE_SEQUENCE_NUMBER) or tq.unknown_attempts or tq.failed:
            rest.append(pick)
            continue
        tq.in_flight -= 1
        if batch.stamp_generation >= 0:
            tq.acked_producer_id = batch.producer_id
            tq.acked_producer_epoch = batch.producer_epoch
        acked.append((batch, part.base_offset if code == 0 else None))
    return rest


def ack_batches(partitions: dict, acked: list[tuple[Any, int | None]],
                follow_runs: bool = False, tally_now: float = -1.0) -> int:
    """Acknowledge ``acked`` (batch, target offset) in order while each is the usual batch: a
    plain batch of an owned partition (``partitions``: the engine's source partitions),
    acknowledged with an offset, nobody awaiting it. Its offsets entry is acknowledged (the
    partition's committed position and offset map advance), its counters grow, its frame goes
    back to the budget. Returns how many were applied: the caller takes the rest, from the first
    unusual one on, so acknowledgements stay in order. No hook may listen, unless
    ``follow_runs``: then the only ``batch_acknowledged`` callback gave its run maps
    (``hooks.AckRun``, the partition's ``ack_run``), and a usual batch is also one that extends
    its partition's run (not re-packed, on the run's delta), whose end it moves. No metrics may
    record, unless ``tally_now`` (>= 0: the ``time.monotonic()`` of the acknowledgement): then
    each batch is added to its partition's ``ack_tally`` (``metrics.AckTally``). A partition
    without its run map or tally yet is the caller's."""
    for i, (batch, target_base) in enumerate(acked):
        sp = partitions.get((batch.topic, batch.partition))
        if (target_base is None or sp is None or batch.abandoned or batch.acked
                or batch.start < 0 or batch.done or batch._future is not None
                or batch._callbacks is not None):
            return i
        run = None
        if follow_runs:
            run = sp.ack_run
            if (run is None or batch.record_offsets is not None
                    or not run.extends(batch.source_base, target_base)):
                return i
        tally = None
        if tally_now >= 0:
            tally = sp.ack_tally
            if tally is None:
                return i
        sp.offsets.ack(batch, target_base)
        sp.records += batch.record_count
        sp.batches += 1
        sp.bytes += batch.size
        if run is not None:
            run.extend(batch.source_base, batch.next_offset, target_base)
        if tally is not None:
            tally.add(batch.compression, batch.record_count, batch.size,
                      (tally_now - batch.fetched_at) * 1000,
                      None if sp.high_watermark < 0
                      else max(0, sp.high_watermark - sp.offsets.committed))
        batch.done = True
        lease = batch.lease
        if lease is not None:
            lease.drop()
            batch.lease = None
        batch.view = None
        batch.rest = None
    return len(acked)


# ---- the fetch loop's passes over every owned partition ----
# A Fetch in a session names only the partitions that changed, yet the loop reads every owned
# partition's state once per request: with 10,000 of them a pass in Python is ~5-7 ms.

def fetch_positions(order: list[TTP], partitions: Mapping[TTP, Any]) -> dict[TTP, int]:
    """The partitions of ``order`` still owned (in ``partitions``) and fetchable, with their
    fetch positions, in ``order``: what the next Fetch asks for."""
    return {tp: sp.fetch_position for tp in order
            if (sp := partitions.get(tp)) is not None and sp.fetchable}


def mark_unchanged(asked: Mapping[TTP, int], answered: Any, partitions: Mapping[TTP, Any],
                   sent_at: float) -> None:
    """An incremental Fetch for ``asked`` (tp -> fetch offset) answered only ``answered``
    (a set of tp): the others' high watermarks did not change since the session last answered
    them, so theirs holds as of ``sent_at`` (for a partition still owned, with a high watermark,
    at the position it was fetched at)."""
    for tp, position in asked.items():
        if tp in answered:
            continue
        sp = partitions.get(tp)
        if sp is not None and sp.high_watermark >= 0 and sp.fetch_position == position:
            sp.high_watermark_at = sent_at


def changed_positions(wanted: Mapping[TTP, int], sent: Mapping[TTP, int],
                      max_bytes: int) -> list[tuple[TTP, int, int]]:
    """(tp, fetch offset, ``max_bytes``) for each partition of ``wanted`` (in its order) whose
    offset ``sent`` does not hold: what an incremental Fetch must send."""
    return [(tp, off, max_bytes) for tp, off in wanted.items() if sent.get(tp) != off]
