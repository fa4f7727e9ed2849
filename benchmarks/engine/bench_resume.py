"""Exact resume from the target against at-least-once, side by side, with `shallowmirror mirror`.

    .venv/bin/python benchmarks/engine/bench_resume.py [--records 400000] [--partitions 6]
        [--codec zstd] [--kills 8] [--kill-after 1.5,4.0] [--cpu-records 2000000]
        [--cpu-codec lz4] [--repeat 3]
        [--broker tansu|kafka] [--out bench_resume.jsonl]

Two clusters are started here (``--broker kafka`` with ``KAFKA_HOME``: real Apache Kafka; or
SHALLOWMIRROR_SOURCE/TARGET_BOOTSTRAP). For each mode - ``exact`` (the default,
``resume.from.target=true``) and ``at-least-once`` (``resume.from.target=false``), each on its own
topic and group:

1. kills: load ``--records`` records, run ``shallowmirror mirror mm2.properties`` (default
   ``offset.commit.interval.ms``, 5 s), and ``--kills`` times: wait until the target grows, let
   it copy for a random ``--kill-after`` seconds, ``kill -9``, start it again. Then run it with
   ``--exit-when-caught-up`` and count what is on the target: lost and duplicated records (key,
   value, timestamp per partition), order. **Time to resume**: from starting a process after a
   kill to the target growing again, and the engine's own "resume from the target ... read in
   N ms" line.
2. CPU per GB: a fresh topic of ``--cpu-records`` records (``--cpu-codec``) mirrored in one go, ``--repeat`` times
   per mode, alternating; the mirror's CPU seconds from the moment the target starts growing
   until it holds every record (start-up excluded), per GB of compressed source batches.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from shallowmirror.bench.watermarks import HighWatermarks
from shallowmirror.testing import clusters as test_clusters
from shallowmirror.testing.topics import read_topic, tally_copies
from shallowmirror.testing.workload import Workload, create_topic, load

MODES = {"exact": "true", "at-least-once": "false"}


def _properties(path: Path, source: str, target: str, topic: str, resume: str,
                separator: str = ".") -> Path:
    """One flow A->B of ``topic``; its remote topic is A<separator><topic>."""
    path.write_text("\n".join([f"A->B.replication.policy.separator = {separator}",
        "clusters = A, B", f"A.bootstrap.servers = {source}", f"B.bootstrap.servers = {target}",
        "A->B.enabled = true", f"A->B.topics = {re.escape(topic)}",
        f"A->B.group.id = bench-resume-{uuid.uuid4().hex[:8]}",
        f"A->B.resume.from.target = {resume}", "session.timeout.ms = 6000",
        "heartbeat.interval.ms = 1000", "emit.heartbeats.enabled = false"]) + "\n")
    return path


def _mirror(props: Path, log: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shallowmirror", "mirror", str(props), *extra],
                            stdout=open(log, "a"), stderr=subprocess.STDOUT)  # noqa: SIM115


def _size(watcher: HighWatermarks) -> int:
    """Records on the target (retried while a just-created topic has no leader yet)."""
    for _ in range(100):
        try:
            return sum(max(0, v) for v in watcher.read().values())
        except Exception:  # noqa: BLE001 - NOT_LEADER right after creation
            time.sleep(0.1)
    return sum(max(0, v) for v in watcher.read().values())


def _wait_growth(watcher: HighWatermarks, beyond: int, proc: subprocess.Popen,
                 timeout_s: float = 30) -> float | None:
    """Seconds until the target holds more than ``beyond`` records (None: it did not grow)."""
    t0 = time.monotonic()
    while _size(watcher) <= beyond:
        if proc.poll() is not None:
            raise RuntimeError(f"mirror exited ({proc.returncode}) before the target grew")
        if time.monotonic() - t0 > timeout_s:
            return None
        time.sleep(0.02)
    return time.monotonic() - t0


def _count(source: str, target: str, topic: str) -> dict:
    tally = tally_copies(read_topic({"bootstrap.servers": source}, topic),
                         read_topic({"bootstrap.servers": target}, f"A.{topic}"))
    return {"records": tally.records, "lost": tally.lost, "duplicates": tally.duplicates,
            "order_kept": tally.order_kept}


def kill_run(source: str, target: str, mode: str, args, work: Path, rng: random.Random) -> dict:
    topic = f"resume-kill-{mode}-{uuid.uuid4().hex[:6]}"
    load({"bootstrap.servers": source}, Workload(
        topic=topic, records=args.records, partitions=args.partitions, codec=args.codec,
        value_bytes=200, keys=1000, headers=1, batch_bytes=64_000, linger_ms=20))
    # The remote topic exists before the first start, so the target is watched from the start.
    create_topic({"bootstrap.servers": target}, Workload(topic=f"A.{topic}",
                                                        partitions=args.partitions))
    watcher = HighWatermarks(target, f"A.{topic}")
    props = _properties(work / f"{topic}.properties", source, target, topic, MODES[mode])
    log = work / f"{topic}.log"
    lo, hi = (float(x) for x in args.kill_after.split(","))
    resumes, kills = [], 0
    for _ in range(args.kills):
        before = _size(watcher)
        proc = _mirror(props, log)
        try:
            grew = _wait_growth(watcher, before, proc)
            if grew is not None:
                resumes.append(grew)
                time.sleep(rng.uniform(lo, hi))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        if grew is None:
            break                       # everything was copied: no kill while batches move
        kills += 1
    final = _mirror(props, log, "--exit-when-caught-up", "--caught-up-timeout", "600")
    final.wait(700)
    watcher.close()
    walks = [float(ms) for ms in re.findall(r"resume from the target: \d+ of \d+ partitions "
                                            r"read in (\d+) ms", log.read_text())]
    counts = _count(source, target, topic)
    return {"mode": mode, "kills": kills, "exit": final.returncode, **counts,
            "first_growth_s": resumes[0], "resume_s": resumes[1:],
            "resume_walk_ms": walks}


def cpu_run(source: str, target: str, mode: str, topic: str, total: int, work: Path,
            compressed_bytes: int, partitions: int, run: int) -> dict:
    separator = f"-cpu{run}{mode[0]}-"          # a fresh remote topic per run
    props = _properties(work / f"cpu-{mode}-{run}.properties", source, target, topic,
                        MODES[mode], separator)
    remote = f"A{separator}{topic}"
    create_topic({"bootstrap.servers": target}, Workload(topic=remote, partitions=partitions))
    watcher = HighWatermarks(target, remote)
    _size(watcher)                        # leaders known before the window opens
    proc = _mirror(props, work / "cpu.log")
    ps = psutil.Process(proc.pid)
    try:
        if _wait_growth(watcher, 0, proc, timeout_s=120) is None:
            raise RuntimeError("the mirror did not start copying")
        t = ps.cpu_times()
        cpu0, t0 = t.user + t.system, time.monotonic()
        while _size(watcher) < total:
            time.sleep(0.02)
        t = ps.cpu_times()
        cpu = t.user + t.system - cpu0
        wall = time.monotonic() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    watcher.close()
    return {"mode": mode, "cpu_s": cpu, "wall_s": wall,
            "cpu_s_per_gb": cpu / (compressed_bytes / 1e9)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--codec", default="zstd")
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--kill-after", default="1.5,4.0", help="seconds of copying, min,max")
    parser.add_argument("--cpu-records", type=int, default=2_000_000, help="0: skip")
    parser.add_argument("--cpu-codec", default="lz4")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--broker", choices=test_clusters.FLAVORS)
    parser.add_argument("--out", default="bench_resume.jsonl")
    args = parser.parse_args()
    work = Path(f"/tmp/bench-resume-{os.getpid()}")
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(12)
    with test_clusters.source_and_target(args.broker) as (flavor, (src, dst)):
        source, target = src.bootstrap, dst.bootstrap
        results = [kill_run(source, target, mode, args, work, rng) for mode in MODES]
        cpu, compressed = [], 0
        if args.cpu_records:
            topic = f"resume-cpu-{uuid.uuid4().hex[:6]}"
            load({"bootstrap.servers": source}, Workload(
                topic=topic, records=args.cpu_records, partitions=args.partitions,
                codec=args.cpu_codec, value_bytes=200, keys=1000, headers=1,
                batch_bytes=256_000, linger_ms=20))
            compressed = _compressed_bytes(source, topic)
            cpu = [cpu_run(source, target, mode, topic, args.cpu_records, work, compressed,
                           args.partitions, run)
                   for run in range(args.repeat) for mode in MODES]
    with open(args.out, "a") as out:
        for row in results + cpu:
            out.write(json.dumps(row) + "\n")
    where = "clusters from the environment" if flavor == "external" else flavor
    print(f"{args.records} {args.codec} records in {args.partitions} partitions, "
          f"`shallowmirror mirror` killed (-9) while batches move, on {where}:")
    for r in results:
        print(f"  {r['mode']:>13}: {r['kills']} kills; lost {r['lost']}, duplicates "
              f"{r['duplicates']} of {r['records']}, order kept {r['order_kept']}; time to "
              f"resume (start -> target grows) median {_median(r['resume_s'], 's')}; target "
              f"walk median {_median(r['resume_walk_ms'], 'ms')}")
    if not cpu:
        return 0
    print(f"CPU per GB ({args.cpu_records} {args.cpu_codec} records, {compressed / 1e6:.0f} MB "
          f"compressed, median of {args.repeat}, start-up excluded):")
    for mode in MODES:
        rows = [c for c in cpu if c["mode"] == mode]
        print(f"  {mode:>13}: {statistics.median(c['cpu_s_per_gb'] for c in rows):.2f} CPU s/GB,"
              f" {statistics.median(c['wall_s'] for c in rows):.2f} s wall")
    return 0


def _median(values: list[float], unit: str) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} {unit}" if unit == "s" else \
        f"{statistics.median(values):.0f} {unit}"


def _compressed_bytes(bootstrap: str, topic: str) -> int:
    import asyncio

    from shallowmirror.engine.rawfetch import fetch_all
    _, totals = asyncio.run(fetch_all({"bootstrap.servers": bootstrap}, topic, keep=False))
    return totals.bytes


if __name__ == "__main__":
    from shallowmirror.bench.interrupts import run_script

    raise SystemExit(run_script(main))
