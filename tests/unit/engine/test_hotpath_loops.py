"""The engine's per-batch loops: the native build against its pure-Python twin.

Each case builds the same random state twice (target partition queues, batches made from real
v2 batches, source partitions with their offsets, frame leases), runs one build on each copy and
compares everything the loops may touch: what they return, every queue's counters, connection
and contents, every batch's fields, every partition's committed position, offset map rows,
counters and leases. Random states cover the unusual cases the loops must hand back (errors, a
partition recovering, abandoned or awaited batches, duplicates, oversized heads).
"""

from __future__ import annotations

import asyncio
import copy
import random
from types import SimpleNamespace

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from shallowmirror import codec
from shallowmirror.codec import records as records_twin
from shallowmirror.engine import hotpath, loops
from shallowmirror.engine.batch import FetchedBatch, SourcePartition
from shallowmirror.engine.budget import ByteBudget, FrameLease
from shallowmirror.engine.metrics import AckTally, FlowRecorder, ListMetricsSink
from shallowmirror.engine.offsets import OffsetMap, PartitionOffsets
from shallowmirror.engine.packing import PARTITION_OVERHEAD_BYTES, REQUEST_OVERHEAD_BYTES
from shallowmirror.engine.sink import TargetPartitionQueue
from shallowmirror.replication.translation import PartitionSyncs, Sync

native = pytest.importorskip("shallowmirror.engine._cloops")
IMPLEMENTATIONS = {"python": loops, "native": native}
TOPICS = ("orders", "zahlungen-\u00fcber")   # a name whose UTF-8 bytes outnumber its characters
SEEDS = range(60)


def _views(records: int, size: int, n: int, first: int = 0) -> list:
    """``n`` real v2 batches of ``records`` records from offset ``first``, split from one
    buffer."""
    data = bytearray()
    for i in range(n):
        builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 24)
        for r in range(records):
            builder.append(r, 1_700_000_000_000, None, b"v" * size, [])
        built = bytearray(builder.build())
        built[0:8] = (first + i * records).to_bytes(8, "big")
        data += built
    return list(codec.split_batches(bytes(data), verify_crc=False).batches)


class World:
    """One random state: a sink's queues, the engine's source partitions, the connections."""

    def __init__(self, seed: int, answer_part=None) -> None:
        answer_part = answer_part or _namespace_part
        rnd = random.Random(seed)
        self.conns = [SimpleNamespace(name="a"), SimpleNamespace(name="b")]
        self.conn = self.conns[0]
        identity = SimpleNamespace(idempotent=rnd.random() < 0.8, producer_id=7,
                                   producer_epoch=rnd.choice((0, 1)))
        owner = SimpleNamespace(identity=identity, identity_resetting=rnd.random() < 0.05)
        self.sink = SimpleNamespace(
            partitions={}, queues={}, ready={}, owner=owner,
            per_partition=rnd.choice((1, 2, 5)),
            max_request_bytes=rnd.choice((600, 3000, 1 << 20)))
        self.budget = ByteBudget(1 << 30)
        self.sps: dict = {}
        self.batches: list[FetchedBatch] = []
        self.picks: list = []
        for p in range(rnd.randint(1, 7)):
            topic = TOPICS[p % 2]
            ttp = (topic, p)
            tq = TargetPartitionQueue()
            tq.in_flight = rnd.choice((0, 0, 1, 2, 5))
            tq.conn = rnd.choice((None, self.conns[0], self.conns[1]))
            tq.failed = [object()] if rnd.random() < 0.1 else []
            tq.blocked_until = rnd.choice((0.0, 0.0, 0.0, 1.0, 1e12))
            tq.unknown_attempts = rnd.choice((0, 0, 0, 2))
            tq.acked_producer_id = rnd.choice((-1, 7, 7, 8))
            tq.acked_producer_epoch = identity.producer_epoch if rnd.random() < 0.8 else 5
            sp = SourcePartition(topic, p, 0, OffsetMap())
            lease = FrameLease(self.budget, 1000)
            views = _views(rnd.randint(1, 4), rnd.choice((10, 300)), rnd.randint(1, 5))
            batches = [FetchedBatch(topic, p, v, lease, v.base_offset, v.next_offset)
                       for v in views]
            lease.hold(len(batches))
            sp.offsets.add_batches(batches)
            for i, b in enumerate(batches):
                b.enqueue_no = len(self.batches) + i
                b.abandoned = rnd.random() < 0.1
                b.attempts = rnd.choice((0, 1))
                b.header, b.rest = b"h%d" % i, memoryview(b"rest")
                if rnd.random() < 0.7:
                    b.stamp = (7, identity.producer_epoch, i, 1)
                if rnd.random() < 0.05:
                    b.add_done_callback(lambda *args: None)
            self.batches.extend(batches)
            self.sink.partitions[ttp] = tq
            self.sink.queues[ttp] = tq.queue
            if rnd.random() < 0.15:
                # Already sent: a partition the planner meets empty (it leaves ``ready``), or
                # one that is not ready at all.
                if rnd.random() < 0.5:
                    self.sink.ready[ttp] = None
                continue
            tq.queue.extend(batches)
            self.sink.ready[ttp] = None
            if rnd.random() < 0.9:
                self.sps[(topic, p)] = sp
            # One request's picks and its answer, for settle_picks and ack_batches.
            head = batches[0]
            self.picks.append((ttp, head))
        self.answer = SimpleNamespace(topics=[])
        by_topic: dict = {}
        self.acked = []
        for ttp, batch in self.picks:
            if rnd.random() < 0.1:
                continue                                   # the answer leaves it out
            code = rnd.choice((0, 0, 0, 0, 46, 6, 10, 3))
            base = rnd.choice((None, 0, 1000))
            by_topic.setdefault(ttp[0], []).append(answer_part(
                ttp[1], code, -1 if base is None else base))
            self.acked.append((batch, base))
        for topic, parts in by_topic.items():
            # The broker's order, not the request's (Kafka's follows a hash map); now and
            # then a partition answered twice (the last answer counts, as in a dict).
            rnd.shuffle(parts)
            if parts and rnd.random() < 0.1:
                twice = rnd.choice(parts)
                parts.append(answer_part(twice.partition, rnd.choice((0, 6)), 2000))
            self.answer.topics.append((topic, parts))
        # Some acknowledgements arrive behind others: ack a random later batch first.
        rnd.shuffle(self.acked)

    def state(self) -> dict:
        """Everything the loops may change, comparable across two worlds."""
        conn_name = {None: None, id(self.conns[0]): "a", id(self.conns[1]): "b"}
        index = {id(b): i for i, b in enumerate(self.batches)}
        queues = {ttp: (tq.in_flight, conn_name[id(tq.conn) if tq.conn else None],
                        [index[id(b)] for b in tq.queue], tq.acked_producer_id,
                        tq.acked_producer_epoch)
                  for ttp, tq in self.sink.partitions.items()}
        batches = [(b.attempts, b.acked, b.done, b.target_base, b.view is None,
                    b.rest is None, b.lease is None, b.start, b.end)
                   for b in self.batches]
        parts = {tp: (sp.offsets.committed, sp.offsets.pending, sp.offsets.offset_map.rows(),
                      sp.records, sp.batches, sp.bytes)
                 for tp, sp in self.sps.items()}
        return {"queues": queues, "batches": batches, "partitions": parts,
                "budget": self.budget.in_use_bytes, "ready": list(self.sink.ready)}


def _pick_names(world: World, picks: list) -> list:
    index = {id(b): i for i, b in enumerate(world.batches)}
    return [(ttp, index[id(b)]) for ttp, b in picks]


def _fetched_views(seed: int, split=codec.split_batches) -> list:
    """Views of one fetched partition, some of them unusual: a transactional batch, one with an
    offset gap (compacted), one below the fetch position."""
    rnd = random.Random(seed)
    data = bytearray()
    base = 0
    for _ in range(rnd.randint(1, 8)):
        records = rnd.randint(1, 4)
        builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 24)
        for r in range(records):
            builder.append(r, 1_700_000_000_000, None, b"v" * 20, [])
        built = bytearray(builder.build())
        built[0:8] = base.to_bytes(8, "big")
        kind = rnd.random()
        if kind < 0.15:
            built[22] |= 0x10                          # attributes: transactional
        elif kind < 0.25:
            built[23:27] = (records + 2).to_bytes(4, "big")   # lastOffsetDelta: a gap
        data += built
        base += records + (3 if kind >= 0.15 and kind < 0.25 else 0)
    return list(split(bytes(data), verify_crc=False).batches)


def _slots(batch: FetchedBatch) -> tuple:
    return tuple(getattr(batch, name, "<unset>") for name in FetchedBatch.__slots__)


# The native loops read a view's fields through the native codec's capsule
# (``native/_fields.pxi``), anything else (the twin codec's views) by name: both agree.
SPLITS = {"native views": codec.split_batches, "twin views": records_twin.split_batches}


@pytest.mark.parametrize("views_of", SPLITS)
@pytest.mark.parametrize("seed", SEEDS)
def test_prepare_usual_agrees(seed: int, views_of: str) -> None:
    views = _fetched_views(seed, SPLITS[views_of])
    rnd = random.Random(seed)
    position = rnd.choice((0, 0, 1, 3))
    lease = object()
    for start in range(len(views) + 1):
        for warn in (False, True):
            results = {}
            for name, impl in IMPLEMENTATIONS.items():
                made, end = impl.prepare_usual(views, start, position, "orders", 3, lease, 99,
                                               12.5, warn, FetchedBatch)
                results[name] = (end, [_slots(b) for b in made])
            assert results["native"] == results["python"], (start, warn)


@pytest.mark.parametrize("seed", SEEDS)
def test_plan_picks_agree(seed: int) -> None:
    async def run(impl) -> tuple:
        world = World(seed)
        conn = world.conns[seed % 3] if seed % 3 < 2 else None
        ready = list(world.sink.ready)
        random.Random(seed).shuffle(ready)     # any order earlier plans left
        world.sink.ready = dict.fromkeys(ready)
        planned = []
        for _ in range(2):                     # the second plan starts where the first left
            picks, too_large = impl.plan_picks(world.sink, conn)
            shape = [(key, bytes(b.header), bytes(b.rest)) for key, b in picks]
            planned.append((_pick_names(world, picks), _pick_names(world, too_large), shape,
                            world.state()))
        return planned

    results = {name: asyncio.run(run(impl)) for name, impl in IMPLEMENTATIONS.items()}
    assert results["native"] == results["python"]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS.keys())
@pytest.mark.parametrize("topic", TOPICS)
def test_plan_counts_topic_names_in_utf8_bytes(impl, topic: str) -> None:
    """A request exactly as large as ``max.request.size`` goes; one byte more is too large,
    with the topic's name counted in its UTF-8 bytes (the random states never land on the
    byte where characters and bytes differ)."""
    async def plan(max_request_bytes: int) -> tuple[int, int]:
        view = _views(2, 300, 1)[0]
        batch = FetchedBatch(topic, 0, view, None, view.base_offset, view.next_offset)
        tq = TargetPartitionQueue()
        tq.queue.append(batch)
        identity = SimpleNamespace(idempotent=False, producer_id=-1, producer_epoch=-1)
        sink = SimpleNamespace(
            partitions={(topic, 0): tq}, queues={(topic, 0): tq.queue}, ready={(topic, 0): None},
            owner=SimpleNamespace(identity=identity, identity_resetting=False), per_partition=5,
            max_request_bytes=max_request_bytes)
        picks, too_large = impl.plan_picks(sink, SimpleNamespace())
        return len(picks), len(too_large)

    view = _views(2, 300, 1)[0]
    needed = (REQUEST_OVERHEAD_BYTES + view.size + PARTITION_OVERHEAD_BYTES
              + 2 + len(topic.encode()) + 4)
    assert asyncio.run(plan(needed)) == (1, 0)
    assert asyncio.run(plan(needed - 1)) == (0, 1)


def _namespace_part(partition: int, code: int, base: int) -> SimpleNamespace:
    return SimpleNamespace(partition=partition, error_code=code, base_offset=base)


def _native_part(partition: int, code: int, base: int) -> object:
    return pytest.importorskip("shallowmirror.codec._cmessages").ProducePartitionResponse(
        partition, code, base, -1, -1, [], None)


# An answer's partitions as the native codec decodes them (read through its capsule) and as
# any other object (read by name).
ANSWER_PARTS = {"native answers": _native_part, "other answers": _namespace_part}


def _settled(impl, world: World) -> tuple:
    """``impl.settle_picks`` on ``world``'s request and answer: the picks left, the
    acknowledgements and the state after."""
    acked: list = []
    rest = impl.settle_picks(world.sink, world.picks, world.answer, acked)
    return (_pick_names(world, rest),
            [(_pick_names(world, [(None, b)])[0][1], base) for b, base in acked],
            world.state())


@pytest.mark.parametrize("answers", ANSWER_PARTS)
@pytest.mark.parametrize("seed", SEEDS)
def test_settle_picks_agree(seed: int, answers: str) -> None:
    results = {name: _settled(impl, World(seed, ANSWER_PARTS[answers]))
               for name, impl in IMPLEMENTATIONS.items()}
    assert results["native"] == results["python"]


@pytest.mark.parametrize("answers", ANSWER_PARTS)
@pytest.mark.parametrize("seed", range(20))
def test_settle_picks_agree_on_an_answer_too_large_to_scan(seed: int, answers: str) -> None:
    """An answer of more partitions than the native build scans (64) goes through a dict
    there: the same results, also with the picks' partitions among 70 others."""
    def run(impl, others: int = 70) -> tuple:
        world = World(seed, ANSWER_PARTS[answers])
        world.answer.topics.append(
            ("elsewhere", [ANSWER_PARTS[answers](p, 0, 5) for p in range(others)]))
        world.answer.topics.reverse()
        return _settled(impl, world)

    results = {name: run(impl) for name, impl in IMPLEMENTATIONS.items()}
    assert results["native"] == results["python"]
    # The other partitions change nothing: as with a small answer, scanned.
    assert results["native"] == run(native, others=0)


def _on_the_wire(answer: SimpleNamespace, version: int = 8) -> memoryview:
    """``answer`` as a broker sends it (kafka-python's encoding), size prefix left out."""
    from kafka.protocol.producer import ProduceResponse as KProduceResponse

    Topic = KProduceResponse.TopicProduceResponse
    msg = KProduceResponse(version=version, throttle_time_ms=0, responses=[
        Topic(name=topic, partition_responses=[Topic.PartitionProduceResponse(
            index=part.partition, error_code=part.error_code, base_offset=part.base_offset,
            log_append_time_ms=-1, log_start_offset=0, record_errors=[], error_message=None)
            for part in parts]) for topic, parts in answer.topics])
    msg.with_header(correlation_id=7)
    return memoryview(bytes(msg.encode(header=True, framed=True))[4:])


@pytest.mark.parametrize("others", [0, 70])
@pytest.mark.parametrize("seed", range(20))
def test_settle_picks_agree_on_the_codecs_compact_answer(seed: int, others: int) -> None:
    """The native codec's ``ProduceAnswer`` (its partitions as C rows, read through the
    capsule) settles as the twin's decoded objects do, small answer or one too large to scan
    (which goes through its ``topics``)."""
    from shallowmirror.codec import messages as messages_twin

    native_messages = pytest.importorskip("shallowmirror.codec._cmessages")

    def run(impl, decode) -> tuple:
        world = World(seed, _namespace_part)
        if others:
            world.answer.topics.insert(0, ("elsewhere", [_namespace_part(p, 0, 5)
                                                         for p in range(others)]))
        world.answer = decode(_on_the_wire(world.answer), 8)
        return _settled(impl, world)

    compact = run(native, native_messages.decode_produce_answer)
    assert type(native_messages.decode_produce_answer(
        _on_the_wire(SimpleNamespace(topics=[])), 8)).__name__ == "ProduceAnswer"
    assert compact == run(loops, messages_twin.decode_produce_response)


@pytest.mark.parametrize("seed", SEEDS)
def test_ack_batches_agree(seed: int) -> None:
    def run(impl) -> tuple:
        world = World(seed)
        done = impl.ack_batches(world.sps, world.acked)
        return done, world.state()

    results = {name: run(impl) for name, impl in IMPLEMENTATIONS.items()}
    assert results["native"] == results["python"]


def _runs_world(seed: int) -> tuple[dict, list, list]:
    """Source partitions whose ``batch_acknowledged`` callback gave run maps (or not yet), and
    acknowledgements that continue a run, jump, repeat it, or carry re-packed records."""
    rnd = random.Random(seed)
    budget = ByteBudget(1 << 30)
    sps: dict = {}
    acked: list = []
    runs: list = []
    for p in range(rnd.randint(1, 5)):
        first = 0 if rnd.random() < 0.1 else 10
        sp = SourcePartition("orders", p, first, OffsetMap())
        records = rnd.randint(1, 4)
        views = _views(records, 10, rnd.randint(1, 6), first)
        lease = FrameLease(budget, 1000)
        batches = [FetchedBatch("orders", p, v, lease, v.base_offset, v.next_offset)
                   for v in views]
        lease.hold(len(batches))
        sp.offsets.add_batches(batches)
        sps[("orders", p)] = sp
        run = None
        if rnd.random() < 0.95:
            run = PartitionSyncs()
            if rnd.random() < 0.9:      # an anchor at or before the first batch, maybe an end
                up = rnd.choice((0, 3, 3, first))
                run.add_anchor(Sync(up, 500 + up))
                if rnd.random() < 0.5:
                    end_up = rnd.choice((up, first, first + 1, first + records))
                    run.set_end(Sync(end_up, 900 if rnd.random() < 0.2 else 500 + end_up))
        sp.ack_run = run
        runs.append(run)
        target = 500
        for b in batches:
            if rnd.random() < 0.04:
                b.record_offsets = tuple(range(b.source_base, b.next_offset))
            jump = rnd.random()
            if jump < 0.04:
                target += 7                                  # a target-side jump
            elif jump < 0.06:
                target -= 1                                  # written twice
            acked.append((b, None if rnd.random() < 0.02 else target + b.source_base))
    # Partitions interleave as a response's batches do; each partition's stay in order.
    rnd.shuffle(acked)
    order = {id(b): b.source_base for b, _ in acked}
    per_tp: dict = {}
    for b, t in acked:
        per_tp.setdefault(b.partition, []).append((b, t))
    for items in per_tp.values():
        items.sort(key=lambda item: order[id(item[0])])
    cursor = {tp: iter(items) for tp, items in per_tp.items()}
    acked = [next(cursor[b.partition]) for b, _ in acked]
    return sps, acked, runs


def _runs_state(sps: dict, acked: list, runs: list) -> tuple:
    return ([None if r is None else (r.run_upstream, r.run_downstream, r.end, r.moved,
                                     r.anchors) for r in runs],
            {tp: (sp.offsets.committed, sp.offsets.offset_map.rows(), sp.records, sp.batches,
                  sp.ack_run is None) for tp, sp in sps.items()},
            [(b.done, b.acked, b.lease is None) for b, _ in acked])


@pytest.mark.parametrize("seed", range(150))
def test_ack_batches_following_runs_agree(seed: int) -> None:
    """With the only callback's run maps (``follow_runs``), both builds stop at the same batch:
    the first that does not simply extend its partition's run, or whose partition has no run
    map yet; the batches before it move their run's end exactly as the callback would."""
    def run(impl) -> tuple:
        sps, acked, runs = _runs_world(seed)
        done = impl.ack_batches(sps, acked, True)
        return done, _runs_state(sps, acked, runs)

    results = {name: run(impl) for name, impl in IMPLEMENTATIONS.items()}
    assert results["native"] == results["python"]


@pytest.mark.parametrize("seed", range(150))
def test_a_followed_run_ends_where_the_callback_would_put_it(seed: int) -> None:
    """What the loop applies to a run map equals what ``PartitionSyncs.add_batch`` (the offset
    syncs' callback) does for the same batches: ends, anchors (none: the loop takes only
    batches that add none) and the moved mark."""
    sps, acked, runs = _runs_world(seed)
    by_callback = {id(r): copy.deepcopy(r) for r in runs if r is not None}
    done = hotpath.ack_batches(sps, acked, True)
    for batch, target in acked[:done]:
        expected = by_callback[id(sps[("orders", batch.partition)].ack_run)]
        assert expected.add_batch(batch.source_base, batch.next_offset, target,
                                  batch.record_offsets) == []
    for r in runs:
        if r is not None:
            twin = by_callback[id(r)]
            assert (r.end, r.anchors, r.run_upstream, r.run_downstream) == (
                twin.end, twin.anchors, twin.run_upstream, twin.run_downstream)
            assert r.moved == twin.moved


def _tallied(seed: int) -> tuple[dict, list, list]:
    """``_runs_world`` with metrics tallies on most partitions (``metrics.AckTally``), a known
    high watermark or none, fetch times and codecs."""
    rnd = random.Random(seed + 1000)
    sps, acked, runs = _runs_world(seed)
    for sp in sps.values():
        sp.high_watermark = rnd.choice((-1, 0, 40, 400))
        if rnd.random() < 0.9:
            sp.ack_tally = AckTally(f"A.{sp.topic}")
            sp.ack_tally.latency_max_ms = rnd.choice((0.0, 2500.0))
    for batch, _ in acked:
        batch.fetched_at = rnd.choice((97.5, 99.0, 99.999))
        batch.compression = rnd.choice((1, 3, 4))
    return sps, acked, runs


def _tallies(sps: dict) -> dict:
    return {tp: None if sp.ack_tally is None else (
        sp.ack_tally.target_topic, sp.ack_tally.codecs, sp.ack_tally.batches,
        sp.ack_tally.records, sp.ack_tally.compressed_bytes, sp.ack_tally.latency_sum_ms,
        sp.ack_tally.latency_max_ms, sp.ack_tally.offset_lag) for tp, sp in sps.items()}


@pytest.mark.parametrize("follow_runs", [False, True])
@pytest.mark.parametrize("seed", range(80))
def test_ack_batches_adding_to_metrics_tallies_agree(seed: int, follow_runs: bool) -> None:
    """Recording metrics (``tally_now``), both builds add the same batches to the same tallies
    (codecs, counts, latency since the fetch, lag after the batch) and hand back a partition
    without one."""
    def run(impl) -> tuple:
        sps, acked, runs = _tallied(seed)
        done = impl.ack_batches(sps, acked, follow_runs, 100.0)
        return done, _tallies(sps), _runs_state(sps, acked, runs)

    results = {name: run(impl) for name, impl in IMPLEMENTATIONS.items()}
    assert results["native"] == results["python"]


def test_a_tally_sums_what_the_per_batch_recorder_sums() -> None:
    """The loop's tally gives the flow record ``FlowRecorder.batch_acked`` gives per batch."""
    sps, acked, _ = _tallied(5)
    for sp in sps.values():
        sp.ack_run = None
        sp.ack_tally = AckTally(f"A.{sp.topic}")
    done = hotpath.ack_batches(sps, acked, False, 100.0)
    assert done == len(acked) > 3
    by_loop, by_recorder = ListMetricsSink(), ListMetricsSink()
    for sink in (by_loop, by_recorder):
        recorder = FlowRecorder(sink, run_id="r", flow="A->B", source_cluster="A",
                                target_cluster="B", interval_s=1.0)
        if sink is by_loop:
            recorder._tallies = {tp: sp.ack_tally for tp, sp in sps.items()}
        else:
            _, again, _ = _tallied(5)
            for batch, _target in again:
                sp = sps[(batch.topic, batch.partition)]
                # A record keeps the last batch's lag: the partition's, once all are in.
                lag = None if sp.high_watermark < 0 else max(
                    0, sp.high_watermark - sp.offsets.committed)
                recorder.batch_acked(
                    batch.topic, batch.partition, f"A.{batch.topic}",
                    compression=batch.compression, records=batch.record_count,
                    compressed_bytes=batch.size, latency_ms=(100.0 - batch.fetched_at) * 1000,
                    offset_lag=lag)
        recorder.flush()

    def comparable(records: list) -> list:
        return sorted((r["partition"], r["codec"], r["batches"], r["records"],
                       r["compressed_bytes"], round(r["latency_ms"], 6),
                       r["latency_ms_max"], r["offset_lag"]) for r in records)
    assert comparable(by_loop.records) == comparable(by_recorder.records)
    assert len(by_loop.records) == len(sps)


def test_following_runs_hands_back_a_partition_without_its_run_map() -> None:
    for impl in IMPLEMENTATIONS.values():
        sps, acked, _ = _runs_world(3)
        for sp in sps.values():
            sp.ack_run = None
        assert impl.ack_batches(sps, acked, True) == 0
        assert impl.ack_batches(sps, acked, False) > 0


def test_a_run_of_acknowledgements_extends_one_offset_map_row_and_frees_the_frame() -> None:
    for impl in IMPLEMENTATIONS.values():
        budget = ByteBudget(1 << 20)
        lease = FrameLease(budget, 5000)
        views = _views(3, 10, 4)
        sp = SourcePartition("orders", 0, 0, OffsetMap())
        batches = [FetchedBatch("orders", 0, v, lease, v.base_offset, v.next_offset)
                   for v in views]
        lease.hold(len(batches))
        lease.drop()                                   # the fetcher handed them all out
        sp.offsets.add_batches(batches)
        acked = [(b, 500 + 3 * i) for i, b in enumerate(batches)]
        assert impl.ack_batches({("orders", 0): sp}, acked) == 4
        assert sp.offsets.committed == 12 and sp.offsets.pending == 0
        assert [tuple(r) for r in sp.offsets.offset_map.rows()] == [(0, 12, 500)]
        assert (sp.records, sp.batches) == (12, 4)
        assert budget.in_use_bytes == 0 and all(b.done and b.lease is None for b in batches)


def test_native_loops_refuse_objects_without_the_engine_slots() -> None:
    batch = SimpleNamespace(topic="orders", partition=0)
    with pytest.raises(TypeError, match="__slots__ field"):
        native.ack_batches({}, [(batch, 5)])


def test_the_engine_runs_the_native_loops_when_built() -> None:
    assert hotpath.IMPLEMENTATION == codec.IMPLEMENTATION
    if hotpath.IMPLEMENTATION == "native":
        assert hotpath.ack_batches is native.ack_batches


def _fresh_batches(seed: int) -> list[FetchedBatch]:
    rnd = random.Random(seed)
    views = _views(rnd.randint(1, 4), rnd.choice((10, 300)), rnd.randint(0, 6))
    batches = [FetchedBatch("orders", 3, v, None, v.base_offset, v.next_offset, fetched_at=1.0)
               for v in views]
    for batch in batches:
        batch.enqueue_no = rnd.choice((-1, -1, 5))
    return batches


def _fields(batch: FetchedBatch) -> tuple:
    """``_slots`` with the view as its repr (each world splits its own views) and the offsets
    that registered it as whether any did (each world has its own)."""
    return tuple(repr(v) if isinstance(v, type(batch.view))
                 else "<registered>" if isinstance(v, PartitionOffsets) else v
                 for v in _slots(batch))


@pytest.mark.parametrize("seed", SEEDS)
def test_add_batches_agree(seed: int) -> None:
    def run(impl) -> tuple:
        batches = _fresh_batches(seed)
        offsets = PartitionOffsets(random.Random(seed).choice((0, 0, 1)))
        try:
            impl.add_batches(offsets, batches)
        except AssertionError as err:       # a batch below the fetched end
            return ("refused", str(err), [_fields(b) for b in batches])
        return (offsets.pending, [e is b for e, b in zip(offsets._entries, batches, strict=True)],
                [b.offsets is offsets for b in batches], [_fields(b) for b in batches])

    results = {name: run(impl) for name, impl in IMPLEMENTATIONS.items()}
    assert results["native"] == results["python"]


def test_add_batches_refuses_a_batch_below_the_fetched_end() -> None:
    for impl in IMPLEMENTATIONS.values():
        batches = _fresh_batches(1)
        offsets = PartitionOffsets(batches[0].source_base + 1)
        with pytest.raises(AssertionError, match="starts below the fetched end"):
            impl.add_batches(offsets, batches)


@pytest.mark.parametrize("seed", SEEDS)
def test_enqueue_run_agrees(seed: int) -> None:
    def run(impl) -> list:
        batches = _fresh_batches(seed)
        impl.enqueue_run(batches, "orders.mirror", 7, 100 + seed)
        return [_fields(b) for b in batches]

    results = {name: run(impl) for name, impl in IMPLEMENTATIONS.items()}
    assert results["native"] == results["python"]
    assert all(b[FetchedBatch.__slots__.index("target_topic")] == "orders.mirror"
               for b in results["native"])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS.keys())
def test_plan_walks_the_ready_partitions_least_recently_sent_first(impl) -> None:
    """Requests that fit two batches take the ready partitions in turn (the ones left out go
    first next time), a partition whose queue ran dry leaves ``ready``, and an owned partition
    with nothing queued is not in it to be walked at all."""
    async def plans() -> tuple[list, list]:
        view = _views(2, 300, 1)[0]
        identity = SimpleNamespace(idempotent=False, producer_id=-1, producer_epoch=-1)
        sink = SimpleNamespace(
            partitions={}, queues={}, ready={},
            owner=SimpleNamespace(identity=identity, identity_resetting=False), per_partition=5,
            max_request_bytes=REQUEST_OVERHEAD_BYTES + 2 * (view.size + 40))
        for p in range(1000):                  # owned, idle
            tq = sink.partitions[("idle", p)] = TargetPartitionQueue()
            sink.queues[("idle", p)] = tq.queue
        for p, queued in enumerate((2, 1, 2)):
            tq = sink.partitions[("busy", p)] = TargetPartitionQueue()
            sink.queues[("busy", p)] = tq.queue
            tq.queue.extend(FetchedBatch("busy", p, view, None, view.base_offset,
                                         view.next_offset) for _ in range(queued))
            sink.ready[("busy", p)] = None
        picked, readies = [], []
        conn = SimpleNamespace()
        for _ in range(3):
            picks, too_large = impl.plan_picks(sink, conn)
            assert not too_large
            picked.append([ttp[1] for ttp, _ in picks])
            readies.append([ttp[1] for ttp in sink.ready])
        return picked, readies

    picked, readies = asyncio.run(plans())
    assert picked == [[0, 1], [2, 0], [2]]
    assert readies == [[2, 0], [2], []]


def _fetching_world(seed: int) -> tuple[dict, list]:
    """Owned source partitions in every state the fetch loop meets (paused, stopped, no
    leader, no high watermark yet, moved on since a request), and a rotation order that also
    names partitions no longer owned."""
    rnd = random.Random(seed)
    partitions: dict = {}
    for p in range(rnd.randint(0, 40)):
        sp = SourcePartition(TOPICS[p % 2], p, rnd.choice((0, 5, 1 << 40)), OffsetMap())
        sp.paused = rnd.random() < 0.15
        sp.error = "stopped" if rnd.random() < 0.1 else None
        sp.leader = None if rnd.random() < 0.1 else rnd.choice((1, 2))
        sp.high_watermark = rnd.choice((-1, 0, 7, 1 << 40))
        partitions[sp.tp] = sp
    order = list(partitions) + [("gone", p) for p in range(rnd.randint(0, 3))]
    rnd.shuffle(order)
    return partitions, order


def _fetching_state(partitions: dict) -> list:
    return [(tp, sp.high_watermark_at, sp.fetch_position) for tp, sp in partitions.items()]


@pytest.mark.parametrize("seed", SEEDS)
def test_fetch_loop_passes_agree(seed: int) -> None:
    def run(impl) -> tuple:
        partitions, order = _fetching_world(seed)
        rnd = random.Random(seed + 1)
        asked = impl.fetch_positions(order, partitions)
        # The answer names some of them; some moved on meanwhile, some were revoked.
        answered = {tp for tp in asked if rnd.random() < 0.3}
        for tp in list(asked):
            if rnd.random() < 0.1:
                partitions[tp].offsets._end += 1
            elif rnd.random() < 0.05:
                del partitions[tp]
        impl.mark_unchanged(asked, answered, partitions, 12.5)
        sent = {tp: off + (rnd.random() < 0.3) for tp, off in asked.items()
                if rnd.random() < 0.8}
        send = impl.changed_positions(asked, sent, 1 << 20)
        return list(asked.items()), _fetching_state(partitions), send

    results = {name: run(impl) for name, impl in IMPLEMENTATIONS.items()}
    assert results["native"] == results["python"]


def test_fetch_positions_takes_the_fetchable_ones_in_order() -> None:
    partitions, order = _fetching_world(3)
    want = [(tp, partitions[tp].fetch_position) for tp in order
            if tp in partitions and not partitions[tp].paused
            and partitions[tp].error is None and partitions[tp].leader is not None]
    assert want, "the world has fetchable partitions"
    assert list(native.fetch_positions(order, partitions).items()) == want
