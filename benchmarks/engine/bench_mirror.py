"""Mirror-process cost per codec: CPU seconds per GB moved, peak RSS against buffer.memory, and
throughput next to a fetch-only raw consumer of the same source topic in the same run.

    .venv/bin/python benchmarks/engine/bench_mirror.py [--records 1000000] [--codecs lz4,zstd]
        [--buffer-memory 67108864] [--out bench_mirror.jsonl]

Per codec: load N records (8 partitions, ~200-byte values) into an embedded source cluster (or
SHALLOWMIRROR_SOURCE/TARGET_BOOTSTRAP), then
1. fetch-only: a child process reads every batch with raw Fetch requests (net layer + codec,
   nothing forwarded) — the ceiling for a mirror reading this source;
2. mirror: a child ``python -m shallowmirror.engine.run`` from offset 0 until the group's committed
   offsets reach the end; its CPU (user+sys) and RSS are sampled by pid every 50 ms.
Prints a table and appends one JSON object per codec to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
from confluent_kafka import Consumer, TopicPartition

from shallowmirror import codec as codec_impl
from shallowmirror.testing import embedded
from shallowmirror.testing.workload import Workload, create_topic, load

_FETCH_ONLY = """
import asyncio, json, sys, time
from shallowmirror.engine.rawfetch import fetch_all
t0 = time.monotonic()
_, totals = asyncio.run(fetch_all({"bootstrap.servers": sys.argv[1]}, sys.argv[2], keep=False))
print(json.dumps({"wall_s": time.monotonic() - t0, "bytes": totals.bytes,
                  "records": totals.records, "batches": totals.batches}))
"""


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=20)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


def _ends(bootstrap: str, topic: str) -> tuple[dict[int, int], int]:
    import asyncio

    from shallowmirror.engine.rawfetch import fetch_all
    batches, totals = asyncio.run(fetch_all({"bootstrap.servers": bootstrap}, topic))
    return ({p: bs[-1].base_offset + bs[-1].record_count for p, bs in batches.items()},
            totals.bytes)


def fetch_only(source: str, topic: str) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", _FETCH_ONLY, source, topic],
                            stdout=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    cpu = 0.0
    while proc.poll() is None:
        try:
            t = ps.cpu_times()
            cpu = t.user + t.system
        except psutil.Error:
            pass
        time.sleep(0.05)
    result = json.loads(proc.stdout.read())
    result["cpu_s"] = cpu
    return result


def mirror_run(source: str, target: str, topic: str, partitions: int, ends: dict[int, int],
               buffer_memory: int) -> dict:
    group = f"bench-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "shallowmirror.engine.run", "--source", source, "--target",
           target, "--topics", topic, "--log-level", "WARNING",
           "--set", "partition.assignment=all", "--set", f"group.id={group}",
           "--set", f"buffer.memory={buffer_memory}", "--set", "offset.commit.interval.ms=200"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"engine ready")
    ps = psutil.Process(proc.pid)
    t0 = time.monotonic()
    start = ps.cpu_times()
    startup_cpu = start.user + start.system      # interpreter + imports + connect: not per GB
    peak_rss, cpu, last_check = 0, 0.0, 0.0
    while True:
        t = ps.cpu_times()
        cpu = t.user + t.system
        peak_rss = max(peak_rss, ps.memory_info().rss)
        now = time.monotonic()
        if now - last_check > 0.25:
            last_check = now
            if _committed(source, group, topic, partitions) == ends:
                break
        if now - t0 > 600:
            raise RuntimeError("mirror did not finish in 600 s")
        time.sleep(0.05)
    wall = time.monotonic() - t0
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return {"wall_s": wall, "cpu_s": cpu - startup_cpu, "startup_cpu_s": startup_cpu,
            "peak_rss_bytes": peak_rss}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--codecs", default="none,gzip,snappy,lz4,zstd")
    parser.add_argument("--buffer-memory", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--out", default="bench_mirror.jsonl")
    args = parser.parse_args()
    external = embedded.external_from_env()
    ctx = embedded.embedded_clusters("source", "target") if external is None else None
    clusters = external or ctx.__enter__()
    source, target = clusters[0].bootstrap, clusters[1].bootstrap
    print(f"codec impl {codec_impl.IMPLEMENTATION}; {args.records} records per codec; "
          f"buffer.memory {args.buffer_memory}")
    print(f"{'codec':7} {'MB':>7} {'mirror s':>8} {'MB/s':>7} {'fetch MB/s':>10} {'ratio':>6} "
          f"{'CPU s/GB':>8} {'peak RSS MB':>11}")
    try:
        for codec in args.codecs.split(","):
            topic = f"bench-{codec}-{uuid.uuid4().hex[:6]}"
            w = Workload(topic=topic, records=args.records, partitions=8, codec=codec,
                         value_bytes=200, batch_bytes=1_000_000, linger_ms=50)
            load({"bootstrap.servers": source}, w)
            create_topic({"bootstrap.servers": target}, Workload(topic=topic, partitions=8))
            ends, total_bytes = _ends(source, topic)
            fo = fetch_only(source, topic)
            mr = mirror_run(source, target, topic, 8, ends, args.buffer_memory)
            gb = total_bytes / 1e9
            row = {"codec": codec, "records": args.records, "compressed_bytes": total_bytes,
                   "buffer_memory": args.buffer_memory, "codec_impl": codec_impl.IMPLEMENTATION,
                   "mirror": mr, "fetch_only": fo,
                   "mirror_mb_s": total_bytes / 1e6 / mr["wall_s"],
                   "fetch_only_mb_s": fo["bytes"] / 1e6 / fo["wall_s"],
                   "cpu_s_per_gb": mr["cpu_s"] / gb}
            row["throughput_ratio"] = row["mirror_mb_s"] / row["fetch_only_mb_s"]
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{codec:7} {total_bytes / 1e6:7.1f} {mr['wall_s']:8.2f} "
                  f"{row['mirror_mb_s']:7.1f} {row['fetch_only_mb_s']:10.1f} "
                  f"{row['throughput_ratio']:6.2f} {row['cpu_s_per_gb']:8.2f} "
                  f"{mr['peak_rss_bytes'] / 1e6:11.1f}", flush=True)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    raise SystemExit(main())
