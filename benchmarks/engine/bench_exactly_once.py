"""At-least-once vs transactional exactly-once: throughput and CPU per GB, side by side.

    KAFKA_HOME=... .venv/bin/python benchmarks/engine/bench_exactly_once.py \
        [--records 300000] [--partitions 6] [--repeat 3] [--sizes 1,4,16] [--out eos.jsonl]
        [--mm2]

Starts two Apache Kafka clusters (KAFKA_HOME), loads ``--records`` lz4 records (200-byte
values) into a source topic once, then runs, in rotation ``--repeat`` times, one in-process
``MirrorEngine`` per mode from offset 0 into a fresh target topic: at-least-once (idempotent,
the default) and exactly-once with ``transaction.max.bytes`` of each ``--sizes`` MiB
(``transaction.interval.ms`` 5000, so the size closes transactions). A run is timed from
``engine ready`` until every partition's committed position (under exactly-once: committed
transactions) reaches the source's end; CPU is this process's (engine + membership thread) over
the same window. Prints medians per mode and appends every run to ``--out``.

``--mm2`` adds one run of MirrorMaker 2 (``KAFKA_HOME/bin/connect-mirror-maker.sh``, dedicated
mode) with ``exactly.once.source.support = enabled`` and ``dedicated.mode.enable.internal.rest =
true``: timed from its first record on the target until read_committed sees every record; CPU of
the JVM over that window; its target batches are checked to be transactional.
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


def mm2_exactly_once(source, target, topic: str, records: int, partitions: int) -> dict:
    """One MirrorMaker 2 exactly-once run (see the module docstring)."""
    import subprocess
    import tempfile

    from shallowmirror.bench.modes import mm2
    from shallowmirror.engine.rawfetch import fetch_all
    from shallowmirror.testing.topics import read_topic

    run = mm2.prepare(os.environ["KAFKA_HOME"], source=source.bootstrap, target=target.bootstrap,
                      topics=[topic], codec="lz4", run_id=f"eos-{uuid.uuid4().hex[:6]}",
                      parent=tempfile.gettempdir())
    props = run.work_dir / "mm2.properties"
    props.write_text(props.read_text() + "exactly.once.source.support = enabled\n"
                     "dedicated.mode.enable.internal.rest = true\n"
                     "listeners = http://127.0.0.1:0\n")
    remote = mm2.remote_topic(topic)
    with open(run.console_path, "w") as console:
        jvm = subprocess.Popen(run.command, env=run.env, stdout=console,
                               stderr=subprocess.STDOUT)
    started = time.perf_counter()
    try:
        while not _visible(target, remote, 1, read_topic):
            assert jvm.poll() is None, run.log_tail()
            assert time.perf_counter() - started < 300, "MirrorMaker 2 wrote nothing in 300 s"
            time.sleep(0.5)
        first = time.perf_counter()
        proc = psutil.Process(jvm.pid)
        cpu0 = sum(proc.cpu_times()[:4])
        while not _visible(target, remote, records, read_topic):
            assert jvm.poll() is None, run.log_tail()
            time.sleep(0.5)
        wall, cpu = time.perf_counter() - first, sum(proc.cpu_times()[:4]) - cpu0
    finally:
        jvm.kill()
        jvm.wait()
        run.remove()
    batches, _ = asyncio.run(fetch_all(target.client_config(), remote))
    data = [b for bs in batches.values() for b in bs if not b.is_control]
    source_bytes = sum(b.size for bs in asyncio.run(fetch_all(source.client_config(), topic))[0]
                       .values() for b in bs)
    return {"mode": "MirrorMaker 2 exactly-once", "records": records, "bytes": source_bytes,
            "start_s": round(first - started, 1), "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2), "mb_per_s": round(source_bytes / 1e6 / wall, 1),
            "cpu_s_per_gb": round(cpu / (source_bytes / 1e9), 1),
            "transactional": all(b.is_transactional for b in data)}


def _visible(cluster, topic: str, records: int, read_topic) -> bool:
    try:
        return sum(map(len, read_topic(cluster, topic, timeout_s=30).values())) >= records
    except Exception:  # noqa: BLE001 - not created yet
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="1,4,16", help="transaction.max.bytes values, MiB")
    ap.add_argument("--out", default="bench_exactly_once.jsonl")
    ap.add_argument("--mm2", action="store_true", help="also one MirrorMaker 2 run")
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
            if args.mm2:
                row = mm2_exactly_once(source, target, topic, args.records, args.partitions)
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
    from shallowmirror.bench.interrupts import run_script

    raise SystemExit(run_script(main))
