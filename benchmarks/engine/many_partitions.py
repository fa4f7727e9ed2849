"""Many partitions: one busy topic among thousands of nearly idle partitions, against the busy
topic alone.

    .venv/bin/python benchmarks/engine/many_partitions.py [--broker kafka|tansu]
        [--kafka-home DIR] [--sizes 1000,10000] [--per-topic 10] [--busy-records 300000]
        [--value-bytes 300] [--batch-bytes 262144] [--sessions on,off] [--idle-s 5]
        [--busy-load live|backlog] [--out many_partitions.jsonl]

Per size S (idle partitions): start a source and a target cluster (real Kafka by default; each
size gets fresh clusters), create S/per-topic small topics of ``--per-topic`` partitions on both
(in chunks: 10,000 partitions take a while), write one lz4 record into every small partition and
create the (empty) busy topic (8 partitions), then run child processes, each a fresh engine
(``partition.assignment=all``, a fresh group, from offset 0):

1. ``busy``: only the busy topic (8 partitions): the reference;
2. ``many``: the busy topic and every small topic (8 + S partitions), per ``--sessions`` value.

Each child first catches up on what is there (every small partition's record: the one-time cost
per partition, reported apart as "first catch-up"); then the parent appends ``--busy-records``
lz4 records to the busy topic and the child measures, until every partition is caught up again:
wall time, its own CPU (user+sys), bytes moved in that window, Fetch requests and the partition
entries they carried: the busy topic's steady-state cost with S idle partitions owned beside it.
``--busy-load live`` (the default) mirrors the records as they are written, so the window's wall
time is the loader's and only CPU per GB compares; ``backlog`` stops the child (SIGSTOP) while
the records are written and resumes it once they are all there, so the window is the mirror
working through the whole load: its MB/s is the busy topic's throughput, comparable between the
busy topic alone and beside S idle partitions. Then, idle
for ``--idle-s`` seconds, the Fetch requests and entries again (what a fetch costs when nothing
changes). Peak RSS is sampled over the whole run. Nothing is asserted; figures go to
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

BUSY = "busy"
BUSY_PARTITIONS = 8


# ---------------------------------------------------------------- child: one engine run
def _child(spec: dict[str, Any]) -> dict[str, Any]:
    import psutil

    from shallowmirror.engine import MirrorEngine
    from shallowmirror.net.connection import BrokerConnection
    from shallowmirror.net.protocol import FETCH_API_KEY

    counts = {"requests": 0, "entries": 0}
    original = BrokerConnection.request_frame

    async def observed(self, req, *args, **kwargs):
        if req.API_KEY == FETCH_API_KEY:
            counts["requests"] += 1
            counts["entries"] += sum(len(t.partitions) for t in req.topics)
        return await original(self, req, *args, **kwargs)

    BrokerConnection.request_frame = observed
    settings = {"partition.assignment": "all", "group.id": f"many-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest", **spec["settings"]}
    engine = MirrorEngine({"bootstrap.servers": spec["source"]},
                          {"bootstrap.servers": spec["target"]}, topics=spec["topics"],
                          settings=settings)

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    me = psutil.Process()
    peak = {"rss": 0}

    def sample_rss() -> None:
        # Sampled, not ru_maxrss: Linux carries ru_maxrss over exec from the parent.
        peak["rss"] = max(peak["rss"], me.memory_info().rss)

    def caught_up() -> bool:
        sample_rss()
        return all(sp.high_watermark >= 0 and sp.offsets.committed >= sp.high_watermark
                   for sp in engine.partitions.values() if sp.error is None)

    def busy_records() -> int:
        return sum(sp.records for tp, sp in engine.partitions.items() if tp[0] == BUSY)

    async def until_caught_up(task: asyncio.Task) -> None:
        # Polled (5/s) rather than engine.wait_caught_up, which re-checks every partition on
        # each acknowledgement: with 10,000 partitions that would be the benchmark's cost.
        await asyncio.sleep(0.2)
        while not caught_up():
            if task.done():
                await task
            await asyncio.sleep(0.2)

    async def run() -> dict[str, Any]:
        stop = asyncio.Event()
        task = asyncio.create_task(engine.run(stop))
        try:
            while len(engine.partitions) < spec["partitions"]:
                if task.done():
                    await task
                await asyncio.sleep(0.01)
            i0, ic0 = time.monotonic(), cpu()
            await until_caught_up(task)              # every small partition's one record
            i1, ic1 = time.monotonic(), cpu()
            # Steady state: the parent loads the busy topic now, and it is mirrored as it
            # arrives with every other partition owned and idle. The window starts here, so
            # its wall time includes the load (producer-bound): compare CPU, not MB/s.
            before = busy_records()
            t0, c0, r0, s0 = time.monotonic(), cpu(), dict(counts), engine.stats()
            print("caught-up", flush=True)
            expected = int(await asyncio.to_thread(sys.stdin.readline)) + before
            if spec["busy_load"] == "backlog":
                # Stopped while the parent wrote the load, resumed just now: the window starts
                # with all of it waiting on the source.
                t0, c0, r0, s0 = time.monotonic(), cpu(), dict(counts), engine.stats()
            while busy_records() < expected:      # high watermarks lag: count the records
                if task.done():
                    await task
                await asyncio.sleep(0.1)
            await until_caught_up(task)
            t1, c1, r1, s1 = time.monotonic(), cpu(), dict(counts), engine.stats()
            for _ in range(int(spec["idle_s"] * 5)):
                sample_rss()
                await asyncio.sleep(0.2)
            r2 = dict(counts)
        finally:
            stop.set()
            await task
        def busy_bytes(stats) -> int:
            return sum(p.bytes for tp, p in stats.partitions.items() if tp[0] == BUSY)

        # Bytes of the window only: the first catch-up may have copied earlier runs' records.
        return {"initial_s": i1 - i0, "initial_cpu_s": ic1 - ic0, "wall_s": t1 - t0,
                "cpu_s": c1 - c0, "bytes": s1.bytes - s0.bytes,
                "busy_bytes": busy_bytes(s1) - busy_bytes(s0), "busy_load": spec["busy_load"],
                "records": s1.records - s0.records, "partitions": len(s1.partitions),
                "fetches": r1["requests"] - r0["requests"],
                "fetch_entries": r1["entries"] - r0["entries"],
                "idle_fetches": r2["requests"] - r1["requests"],
                "idle_fetch_entries": r2["entries"] - r1["entries"],
                "peak_rss_mb": peak["rss"] / 2**20,
                "buffer_memory_mb": engine.settings["buffer.memory"] / 2**20,
                "startup": s1.startup}

    return asyncio.run(run())


# ---------------------------------------------------------------- parent: clusters and data
def _create_topics(config: dict[str, str], names: list[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(config)
    for i in range(0, len(names), 100):
        chunk = [NewTopic(n, num_partitions=partitions, replication_factor=1)
                 for n in names[i:i + 100]]
        for future in admin.create_topics(chunk, operation_timeout=120).values():
            future.result()


def _one_record_each(config: dict[str, str], names: list[str], partitions: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({**config, "compression.type": "lz4", "linger.ms": 50})
    for name in names:
        for p in range(partitions):
            while True:
                try:
                    producer.produce(name, value=b"v" * 100, partition=p)
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(300) == 0


def _run_child(source: Any, target: Any, topics: list[str], partitions: int,
               settings: dict[str, Any], idle_s: float, load_busy,
               records: int, busy_load: str = "live") -> dict[str, Any]:
    """One engine in a child process; ``load_busy()`` runs once it has caught up on what is
    there, and the child then measures mirroring that load (as it is written, or, with
    ``busy_load="backlog"``, stopped meanwhile and resumed once it is all there)."""
    spec = {"source": source.bootstrap, "target": target.bootstrap, "topics": topics,
            "partitions": partitions, "settings": settings, "idle_s": idle_s,
            "busy_load": busy_load}
    # The child's log goes to a file: a pipe nobody reads while the busy topic loads would fill
    # up and block the engine mid-run.
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                 text=True, env=os.environ)
        assert child.stdout is not None and child.stdin is not None
        try:
            out = _drive_child(child, load_busy, records, busy_load)
        except BaseException:           # a stop (Ctrl-C, SIGTERM) or a failed load
            child.kill()
            child.wait()
            raise
        if child.returncode or not out.strip():
            log.seek(0)
            raise RuntimeError(f"child failed: {out[-1000:]}{log.read()[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _drive_child(child: subprocess.Popen, load_busy, records: int, busy_load: str) -> str:
    """Load the busy topic once ``child`` has caught up (stopping it meanwhile for a backlog),
    then wait for its result line."""
    assert child.stdout is not None and child.stdin is not None
    line = child.stdout.readline()
    if line.strip() == "caught-up" and busy_load == "backlog":
        os.kill(child.pid, signal.SIGSTOP)
        try:
            load_busy()
            child.stdin.write(f"{records}\n")
            child.stdin.flush()
        finally:
            os.kill(child.pid, signal.SIGCONT)
        return child.communicate(timeout=3600)[0]
    if line.strip() == "caught-up":
        load_busy()
        return child.communicate(f"{records}\n", timeout=3600)[0]
    child.kill()
    return line + child.communicate()[0]


def _clusters(args: argparse.Namespace):
    if args.broker == "kafka":
        from shallowmirror.testing.kafka import kafka_clusters

        return kafka_clusters("source", "target", kafka_home=args.kafka_home,
                              overrides={"num.partitions": "1"})
    from shallowmirror.testing import embedded

    return embedded.embedded_clusters("source", "target")


def _row(size: int, mode: str, sessions: str, got: dict[str, Any]) -> str:
    gb = got["bytes"] / 1e9
    return (f"{size:>6} {mode:5s} first catch-up {got['initial_s']:.1f} s / "
            f"{got['initial_cpu_s']:.2f} CPU s; then sessions={sessions:3s} partitions {got['partitions']:>6}: "
            f"busy {got['busy_bytes'] / 1e6 / got['wall_s']:7.1f} MB/s, "
            f"CPU {got['cpu_s'] / gb if gb else 0:6.2f} s/GB, RSS {got['peak_rss_mb']:6.0f} MB "
            f"(buffer.memory {got['buffer_memory_mb']:.0f}), "
            f"fetches {got['fetches']} x {got['fetch_entries'] / max(1, got['fetches']):.0f} "
            f"entries; idle {got['idle_fetches']} x "
            f"{got['idle_fetch_entries'] / max(1, got['idle_fetches']):.0f} entries")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--broker", choices=("kafka", "tansu"), default="kafka")
    parser.add_argument("--kafka-home")
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--per-topic", type=int, default=10)
    parser.add_argument("--busy-records", type=int, default=300_000)
    parser.add_argument("--value-bytes", type=int, default=300)
    parser.add_argument("--batch-bytes", type=int, default=262_144)
    parser.add_argument("--sessions", default="on,off")
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--busy-load", choices=("live", "backlog"), default="live",
                        help="live: mirror the busy topic as it is written (compare CPU per "
                             "GB); backlog: pause the engine while it is written, then time it "
                             "through the whole load (throughput)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))), flush=True)
        return 0
    from shallowmirror.testing.workload import Workload, create_topic, load

    extra = dict(item.split("=", 1) for item in args.set)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        names = [f"small-{i:05d}" for i in range(size // args.per_topic)]
        with _clusters(args) as (source, target):
            started = time.monotonic()
            for cluster in (source, target):
                _create_topics(cluster.client_config(), names, args.per_topic)
            print(f"{size} small partitions created on both clusters in "
                  f"{time.monotonic() - started:.0f} s", flush=True)
            _one_record_each(source.client_config(), names, args.per_topic)
            busy = Workload(topic=BUSY, records=args.busy_records, partitions=BUSY_PARTITIONS,
                            codec="lz4", value_bytes=args.value_bytes,
                            batch_bytes=args.batch_bytes, linger_ms=100, create_topic=False)
            for cluster in (source, target):
                create_topic(cluster.client_config(), busy)
            load_busy = functools.partial(load, source.client_config(), busy)
            runs = [("busy", "on", [BUSY], BUSY_PARTITIONS)] + [
                ("many", s, [BUSY, *names], BUSY_PARTITIONS + size)
                for s in args.sessions.split(",")]
            for mode, sessions, topics, partitions in runs:
                settings = {**extra, "fetch.session.enable": sessions == "on"}
                got = _run_child(source, target, topics, partitions, settings, args.idle_s,
                                 load_busy, args.busy_records, args.busy_load)
                got.update(size=size, mode=mode, sessions=sessions, broker=args.broker)
                rows.append(got)
                print(_row(size, mode, sessions, got), flush=True)
    if args.out:
        with open(args.out, "a") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    from shallowmirror.bench.interrupts import run_script

    sys.exit(run_script(main))
