"""At-least-once vs transactional exactly-once: throughput and CPU per GB, side by side.

    KAFKA_HOME=... .venv/bin/python benchmarks/engine/bench_exactly_once.py \
        [--records 300000] [--partitions 6] [--repeat 3] [--sizes 1,4,16] [--out eos.jsonl]

Starts two Apache Kafka clusters (KAFKA_HOME), loads ``--records`` lz4 records (200-byte
values) into a source topic once, then runs, in rotation ``--repeat`` times, one in-process
``MirrorEngine`` per mode from offset 0 into a fresh target topic: at-least-once (idempotent,
the default) and exactly-once with ``transaction.max.bytes`` of each ``--sizes`` MiB
(``transaction.interval.ms`` 5000, so the size closes transactions). A run is timed from
``engine ready`` until every partition's committed position (under exactly-once: committed
transactions) reaches the source's end; CPU is this process's (engine + membership thread) over
the same window. Prints medians per mode and appends every run to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid

import psutil

from shallowmirror.engine import MirrorEngine
from shallowmirror.testing.kafka import kafka_clusters
from shallowmirror.testing.workload import Workload, create_topic, load

MIB = 1024 * 1024


async def mirror_once(source, target, topic: str, partitions: int, settings: dict) -> dict:
    remote = f"{topic}.{uuid.uuid4().hex[:6]}"
    create_topic(target.client_config(), Workload(topic=remote, partitions=partitions))
    engine = MirrorEngine(source.client_config(), target.client_config(), topics=[topic],
                          topic_mapper=lambda _t: remote, settings={
                              "partition.assignment": "all", "fetch.max.wait.ms": 100,
                              "group.id": f"bench-{uuid.uuid4().hex[:8]}", **settings})
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    while not engine.ready:
        if task.done():
            await task
        await asyncio.sleep(0.01)
    proc = psutil.Process()
    cpu0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
    assert await engine.wait_caught_up(600), engine.stats()
    wall, cpu = time.perf_counter() - t0, sum(proc.cpu_times()[:2]) - cpu0
    stats = engine.stats()
    sinks = engine.sinks
    stop.set()
    await task
    gb = stats.bytes / 1e9
    return {"records": stats.records, "bytes": stats.bytes, "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "mb_per_s": round(stats.bytes / 1e6 / wall, 1),
            "cpu_s_per_gb": round(cpu / gb, 2),
            "transactions": getattr(sinks, "committed_transactions", 0),
            "aborted": getattr(sinks, "aborted_transactions", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="1,4,16", help="transaction.max.bytes values, MiB")
    ap.add_argument("--out", default="bench_exactly_once.jsonl")
    args = ap.parse_args()
    modes = [("at-least-once", {})] + [
        (f"exactly-once {s} MiB", {"exactly.once": "true", "transaction.max.bytes": int(s) * MIB,
                                   "transaction.interval.ms": 5000})
        for s in args.sizes.split(",")]
    runs: dict[str, list[dict]] = {name: [] for name, _ in modes}
    with kafka_clusters("A", "B", kafka_home=os.environ.get("KAFKA_HOME")) as (source, target):
        topic = "bench-eos"
        load(source.client_config(), Workload(topic=topic, records=args.records,
                                              partitions=args.partitions, codec="lz4",
                                              value_bytes=200))
        with open(args.out, "a") as out:
            for repeat in range(args.repeat):
                for name, settings in modes:
                    row = asyncio.run(mirror_once(source, target, topic, args.partitions,
                                                  settings))
                    row.update(mode=name, repeat=repeat)
                    runs[name].append(row)
                    out.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)
    print(f"\n{'mode':24} {'MB/s':>7} {'CPU s/GB':>9} {'txns':>6}  (medians of {args.repeat};"
          " compressed bytes)")
    for name, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows)
               for k in ("mb_per_s", "cpu_s_per_gb", "transactions")}
        print(f"{name:24} {med['mb_per_s']:7.1f} {med['cpu_s_per_gb']:9.2f} "
              f"{med['transactions']:6.0f}")


if __name__ == "__main__":
    main()
