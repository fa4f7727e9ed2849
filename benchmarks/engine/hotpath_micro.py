"""The engine's data plane alone, in one process: CPU per batch from fetch decode to target
acknowledgement, without sockets or brokers (so without their noise).

    PYTHONPATH=. .venv/bin/python benchmarks/engine/hotpath_micro.py [--batch-bytes 5800]
        [--batches 22224] [--partitions 8 | 1,8,32] [--repeat 3] [--baseline DIR]
        [--offset-syncs] [--metrics]

A ``MirrorEngine`` (real sources, sinks, planner, stamping, encoder, offsets, acknowledgement) runs
against two in-process FAKE clusters that answer instantly: the source connection returns
pre-encoded Fetch response frames (``--partitions``, 8 by default, about 1 MiB of batches each
per fetch, plain v2 batches of ``--batch-bytes``, all partitions in step), the target answers every
Produce request with a pre-encoded success frame (the k-th request's batches at offset k x records
per batch, as a real target would place them). Time spent inside the source fake is measured and
subtracted. Prints CPU microseconds per batch and per MB for each run; ``--baseline DIR`` runs the
same in a child with ``PYTHONPATH=DIR`` (an older tree), interleaved. Several partition counts
also fit the cost as per batch plus per request (a request carries one batch per partition).
The real figure (with the network and the brokers) is bench_mirror.py's; this one shows where
the engine's own Python goes. ``--offset-syncs`` adds what the mirror process (``shallowmirror
mirror``, a flow with MM2's default ``emit.offset-syncs.enabled = true``) adds to the engine:
its offset-sync writer on the ``batch_acknowledged`` hook, attached as the flow attaches it, with
a stand-in for the producer that would write the syncs (the records are made, not sent);
``--metrics`` the metrics records it keeps (its status lines' latency: a ``LatencyObserver``
sink, as the process gives every engine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import subprocess
import sys
import time

from kafka.protocol.consumer import FetchResponse as KFetchResponse
from kafka.protocol.producer import ProduceResponse as KProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

TOPIC = "micro"
PARTITIONS = 8
FETCH_VERSION = 11
PRODUCE_VERSION = 8


def template_batch(batch_bytes: int, value_bytes: int = 300) -> tuple[bytes, int]:
    """One uncompressed v2 batch of about ``batch_bytes`` (base offset patched per copy)."""
    count = max(1, batch_bytes // (value_bytes + 20))
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 24)
    for i in range(count):
        builder.append(i, 1_700_000_000_000 + i, None, bytes([65 + i % 26]) * value_bytes, [])
    return bytes(builder.build()), count


def fetch_frames(batch: bytes, count: int, per_fetch: int, rounds: int,
                 partitions: int = PARTITIONS) -> list[bytes]:
    """Frame r: every partition's batches [r*per_fetch, (r+1)*per_fetch)."""
    KT = KFetchResponse.FetchableTopicResponse
    KP = KT.PartitionData
    end = rounds * per_fetch * count
    frames = []
    for r in range(rounds):
        chunk = bytearray()
        for i in range(per_fetch):
            b = bytearray(batch)
            struct.pack_into(">q", b, 0, (r * per_fetch + i) * count)
            chunk += b
        parts = [KP(partition_index=p, error_code=0, high_watermark=end, last_stable_offset=end,
                    log_start_offset=0, aborted_transactions=[], preferred_read_replica=-1,
                    records=bytes(chunk)) for p in range(partitions)]
        msg = KFetchResponse(version=FETCH_VERSION, throttle_time_ms=0, error_code=0,
                             session_id=0, responses=[KT(topic=TOPIC, partitions=parts)])
        msg.with_header(correlation_id=0)
        frames.append(bytes(msg.encode(header=True, framed=True))[4:])
    return frames


def produce_frame(partitions: int = PARTITIONS, base_offset: int = 0) -> bytes:
    KT = KProduceResponse.TopicProduceResponse
    KP = KT.PartitionProduceResponse
    msg = KProduceResponse(version=PRODUCE_VERSION, throttle_time_ms=0, responses=[
        KT(name=TOPIC, partition_responses=[
            KP(index=p, error_code=0, base_offset=base_offset, log_append_time_ms=-1,
               log_start_offset=0, record_errors=[], error_message=None)
            for p in range(partitions)])])
    msg.with_header(correlation_id=0)
    return bytes(msg.encode(header=True, framed=True))[4:]


def produce_frames(partitions: int, records_per_batch: int, requests: int) -> list[memoryview]:
    """Answer k (0-based) puts every partition's batch at ``k * records_per_batch``, as a real
    target does when each request carries one batch of every partition (the partitions here
    move in step): the engine's offset map then sees batches that follow each other."""
    return [memoryview(produce_frame(partitions, k * records_per_batch))
            for k in range(requests)]


class Clock:
    """CPU seconds spent inside the fakes (subtracted from the engine's)."""

    fake_s = 0.0


class FakeSourceConnection:
    """FAKE: answers each Fetch with the pre-encoded frame of the round its positions ask for."""

    client_id = "micro"

    def __init__(self, frames: list[bytes], per_round: int) -> None:
        self.frames = frames
        self.per_round = per_round

    def api_version(self, key: int, bounds: object) -> int:
        return FETCH_VERSION

    async def request_frame(self, req, timeout_ms=None):
        t0 = time.process_time()
        offsets = {p.fetch_offset for t in req.topics for p in t.partitions}
        assert len(offsets) == 1, f"partitions out of step: {offsets}"
        r = offsets.pop() // self.per_round
        Clock.fake_s += time.process_time() - t0
        if r >= len(self.frames):
            await asyncio.sleep(3600)       # caught up: nothing more (cancelled at the end)
        return memoryview(self.frames[r])


class FakeTargetConnection:
    """FAKE: answers every Produce request with success for every partition."""

    client_id = "micro"

    def __init__(self, frames: list[memoryview]) -> None:
        self.frames = frames
        self.answered = 0
        self.cid = 0

    def next_answer(self) -> memoryview:
        """The next answer (the last one again past the end): answers go in send order."""
        frame = self.frames[min(self.answered, len(self.frames) - 1)]
        self.answered += 1
        return frame

    def api_version(self, key: int, bounds: object) -> int:
        return PRODUCE_VERSION

    def next_correlation_id(self) -> int:
        self.cid += 1
        return self.cid

    async def send_raw(self, buffers, cid, *args, **kwargs):
        await asyncio.sleep(0)              # the answer comes on a later loop iteration
        return self.next_answer()

    def send_nowait(self, buffers, cid, *args, **kwargs) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        answer = self.next_answer()      # taken now: answers go in send order
        loop.call_soon(lambda: future.done() or future.set_result(answer))  # a later turn
        return future

    def coalesce_answers(self, answers: int) -> None:
        pass

    def send_with_callback(self, buffers, cid, callback, timeout_ms=None,
                           min_response_bytes=0) -> None:
        # The answer comes on a later turn, as from a socket: the callback runs on it.
        asyncio.get_running_loop().call_soon(callback, self.next_answer(), None)


class FakeCluster:
    """FAKE: one broker (node 1) leading every partition of ``TOPIC``."""

    def __init__(self, conn, partitions: int = PARTITIONS) -> None:
        self.conn = conn
        self.n_partitions = partitions
        self.topic_recreated_listeners: list = []
        self.metadata_listeners: list = []

    def topic_id(self, topic: str) -> None:
        return None

    async def connection(self, node_id: int, lane: int = 0):
        return self.conn

    def live_connection(self, node_id: int, lane: int = 0):
        return self.conn

    async def any_connection(self):
        raise ConnectionError("not in the micro benchmark")

    def leader(self, topic: str, partition: int) -> int:
        return 1

    def partitions(self, topic: str):
        return list(range(self.n_partitions))

    async def refresh_metadata(self, topics=None) -> None:
        return None


class _UnsentSyncs:
    """Stands in for the offset-sync writer's producer (``TopicWriter``)."""

    failed = None

    def write(self, key: bytes, value: bytes) -> None:
        return None


def attach_offset_syncs(engine) -> None:
    """The flow's offset-sync writer on ``engine``'s hook, as ``mirror.flows`` attaches it (older
    trees: without ``runs=``, which they do not take)."""
    from shallowmirror.replication.offset_syncs import OffsetSyncWriter

    writer = OffsetSyncWriter({}, "mm2-offset-syncs.fake.internal", alias="fake")
    writer._writer = _UnsentSyncs()
    try:
        engine.hooks.batch_acknowledged.add(writer.on_batch_ack, runs=writer.table.partition)
    except TypeError:
        engine.hooks.batch_acknowledged.add(writer.on_batch_ack)


def _observer():
    from shallowmirror.mirror.status import LatencyObserver

    return LatencyObserver()


async def run_once(frames: list[bytes], per_round: int, end: int,
                   partitions: int = PARTITIONS, answers: list[memoryview] | None = None,
                   offset_syncs: bool = False, metrics: bool = False) -> dict:
    from shallowmirror.engine.batch import SourcePartition
    from shallowmirror.engine.engine import MirrorEngine
    from shallowmirror.engine.offsets import OffsetMap

    engine = MirrorEngine({"bootstrap.servers": "fake:1"}, {"bootstrap.servers": "fake:2"},
                          topics=[TOPIC], settings={"producer.id": 7,
                                                    "fetch.session.enable": "false"},
                          metrics_sink=_observer() if metrics else None)
    engine.runtime.loop = asyncio.get_running_loop()
    if offset_syncs:
        attach_offset_syncs(engine)
    engine.sources.start(FakeCluster(FakeSourceConnection(frames, per_round), partitions))
    answers = answers or [memoryview(produce_frame(partitions))]
    await engine.sinks.start(FakeCluster(FakeTargetConnection(answers), partitions))
    engine.ready = True
    Clock.fake_s = 0.0
    cpu0, t0 = time.process_time(), time.monotonic()
    sps = []
    for p in range(partitions):
        sp = SourcePartition(TOPIC, p, 0, engine.offset_map(TOPIC, p))
        engine.partitions[sp.tp] = sp
        sps.append(sp)
    for sp in sps:
        engine.sources.attach(sp)
    # Polled, not a progress waiter: a waiter is woken at every notify (a few per request),
    # which would be the harness's cost counted as the engine's.
    deadline = time.monotonic() + 600
    while not (done := all(sp.offsets.committed >= end for sp in sps)) and (
            engine._fatal is None and time.monotonic() < deadline):
        await asyncio.sleep(0.01)
    cpu = time.process_time() - cpu0 - Clock.fake_s
    wall = time.monotonic() - t0
    if engine._fatal is not None:
        raise engine._fatal
    assert done, "not caught up"
    assert isinstance(engine.offset_map(TOPIC, 0), OffsetMap)
    engine.runtime.stopping = True
    engine.sinks.stop()
    await engine.supervisor.cancel_all()
    requests = sum(sink.requests_sent for sink in engine.sinks.by_node.values())
    return {"cpu_s": cpu, "wall_s": wall, "requests": requests,
            "batches": sum(sp.batches for sp in sps),
            "bytes": sum(sp.bytes for sp in sps)}


def child(args: argparse.Namespace) -> None:
    try:        # the mirror entry points' process settings, where the measured tree has them
        from shallowmirror.engine.process_tuning import tune_for_mirroring
    except ImportError:
        try:    # older trees: the GC part only
            from shallowmirror.engine.gc_tuning import tune_for_mirroring
        except ImportError:
            def tune_for_mirroring() -> None:
                return None
    tune_for_mirroring()
    batch, count = template_batch(args.batch_bytes)
    per_fetch = max(1, (1 << 20) // len(batch))
    partitions = int(args.partitions)
    rounds = max(1, args.batches // (per_fetch * partitions))
    frames = fetch_frames(batch, count, per_fetch, rounds, partitions)
    end = rounds * per_fetch * count
    answers = produce_frames(partitions, count, rounds * per_fetch)
    if getattr(args, "setup_only", False):   # hotpath_instructions.py subtracts the set-up's instructions
        print(json.dumps({"batches": rounds * per_fetch * partitions}), flush=True)
        return
    result = asyncio.run(run_once(frames, per_fetch * count, end, partitions, answers,
                                  offset_syncs=getattr(args, "offset_syncs", False),
                                  metrics=getattr(args, "metrics", False)))
    result["batch_bytes"] = len(batch)
    print(json.dumps(result), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-bytes", type=int, default=5800,
                        help="bytes per batch (5800: what a 16 KiB lz4 producer batch of "
                             "300-byte values weighs)")
    parser.add_argument("--batches", type=int, default=22224)
    parser.add_argument("--partitions", default=str(PARTITIONS),
                        help="partitions of the fake topic: a request carries one batch of "
                             "each; a comma list (e.g. 1,8,32) also splits the cost into per "
                             "batch and per request")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", metavar="DIR")
    parser.add_argument("--offset-syncs", action="store_true",
                        help="with the mirror process's offset-sync writer on the hook")
    parser.add_argument("--metrics", action="store_true",
                        help="with the metrics records the mirror process keeps")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setup-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    if args.baseline:
        variants = [("new", os.environ.get("PYTHONPATH", "")), ("base", args.baseline)]
    else:
        variants = [("new", os.environ.get("PYTHONPATH", ""))]
    counts = [int(n) for n in str(args.partitions).split(",") if n.strip()]
    from shallowmirror.bench.machine import python_reference_us

    # The same code measures 2-3x apart on the hosts sessions run on: this says which host.
    print(f"host reference: {python_reference_us():.0f} us (shallowmirror.bench.machine."
          "python_reference_us; compare us/batch across hosts as a multiple of it)", flush=True)
    results: dict[tuple[str, int], list[dict]] = {
        (name, n): [] for name, _ in variants for n in counts}
    for _ in range(args.repeat):
        for n in counts:
            for name, path in variants:
                r = run_child(args, n, path)
                results[(name, n)].append(r)
                per_request = (f", {r['batches'] / r['requests']:.1f} batches per request"
                               if r.get("requests") else "")
                print(f"{name:4} {r['batches']:6} batches of {r['batch_bytes']} B: "
                      f"{r['cpu_s'] / r['batches'] * 1e6:6.2f} us/batch, "
                      f"{r['cpu_s'] / (r['bytes'] / 1e9):5.2f} CPU s/GB, wall {r['wall_s']:.2f}s"
                      f"{per_request}", flush=True)
    for name, _ in variants:
        points = []
        for n in counts:
            runs = results[(name, n)]
            per = statistics.median(r["cpu_s"] / r["batches"] * 1e6 for r in runs)
            per_req = statistics.median(r["requests"] / r["batches"] for r in runs)
            points.append((per_req, per))
            suffix = f" ({n} partitions)" if len(counts) > 1 else ""
            print(f"median {name}: {per:.2f} us/batch{suffix}")
        if len(counts) > 1:
            per_batch, per_request = split_cost(points)
            print(f"fit {name}: {per_batch:.2f} us per batch + {per_request:.2f} us per request")
    return 0


def run_child(args: argparse.Namespace, partitions: int, path: str) -> dict:
    """One measurement in a fresh interpreter with ``PYTHONPATH=path``."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--batch-bytes", str(args.batch_bytes),
         "--batches", str(args.batches), "--partitions", str(partitions)]
        + (["--offset-syncs"] if args.offset_syncs else [])
        + (["--metrics"] if args.metrics else []),
        env={**os.environ, "PYTHONPATH": path}, check=True, capture_output=True,
        text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def split_cost(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares of us/batch = per_batch + per_request * (requests per batch)."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = (sum((x - mx) * (y - my) for x, y in points)
             / sum((x - mx) ** 2 for x in xs))
    return my - slope * mx, slope


if __name__ == "__main__":
    raise SystemExit(main())
