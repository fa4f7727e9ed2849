"""`shallowmirror verify` read rate: compressed source bytes compared per second, and per CPU
second of the verify process (one core: verify is one asyncio thread).

    .venv/bin/python benchmarks/verify/bench_verify.py [--records 1500000] [--codec lz4]
        [--partitions 8] [--repeat 3] [--broker tansu|kafka] [--kafka-home DIR]

Starts two clusters (tansu, or Apache Kafka with ``--broker kafka`` and ``KAFKA_HOME``), loads
the topic into the source (~300-byte values, 1 MB producer batches), mirrors it with
``shallowmirror mirror --exit-when-caught-up``, then runs ``shallowmirror verify --quiet``
``--repeat`` times as a child process and reports, per run, the source bytes compared, the wall
time, MB/s, CPU seconds (user + system) and MB per CPU second as verify prints them (from
connecting to the summary), and the child's whole CPU including the interpreter's start-up;
after each run, the CPU of only fetching both sides (the floor under verify); finally
``verify()`` called in this process, warm (see ``_in_process``). Clusters are stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from shallowmirror.cli.verify import keep_freed_fetch_buffers
from shallowmirror.engine.rawfetch import fetch_all
from shallowmirror.mirror.config import load_mm2
from shallowmirror.mirror.verify import verify
from shallowmirror.testing.clusters import broker_flavor, started_clusters
from shallowmirror.testing.workload import Workload, load


def _mm2(path: Path, source, target, topic: str) -> Path:
    path.write_text("\n".join([
        "clusters = A, B", f"A.bootstrap.servers = {source.bootstrap}",
        f"B.bootstrap.servers = {target.bootstrap}", "A->B.enabled = true",
        f"A->B.topics = {topic}", f"group.id = bench-verify-{uuid.uuid4().hex[:8]}",
        "status.interval.seconds = 0"]) + "\n")
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shallowmirror", *args], capture_output=True,
                          text=True, check=False)


def _timed_verify(config: Path) -> dict[str, float]:
    """One verify child: its own figures (from connecting to the summary: the interpreter's
    start-up left out) and the child process's whole CPU (start-up included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = _cli("verify", str(config), "--quiet")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"verify failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    match = re.search(r"([\d,]+) source bytes in ([\d.]+) s .*CPU ([\d.]+) s", result.stdout)
    assert match, result.stdout
    source_bytes = int(match.group(1).replace(",", ""))
    wall_s, cpu_s = float(match.group(2)), float(match.group(3))
    process_cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"bytes": source_bytes, "wall_s": wall_s, "cpu_s": cpu_s,
            "process_cpu_s": process_cpu_s, "mb_s": source_bytes / wall_s / 1e6,
            "mb_per_cpu_s": source_bytes / cpu_s / 1e6}


def _fetch_floor(source, target, topic: str) -> dict[str, float]:
    """Reading both sides and nothing else (``rawfetch.fetch_all``: net layer + split, same
    4 partitions' worth of bytes per request), in this process with verify's malloc setting:
    the floor under verify's CPU."""
    keep_freed_fetch_buffers()
    started = time.process_time()
    _, totals = asyncio.run(fetch_all(source.client_config(), topic, keep=False,
                                      max_bytes=8 * 1024 * 1024))
    asyncio.run(fetch_all(target.client_config(), f"A.{topic}", keep=False,
                          max_bytes=8 * 1024 * 1024))
    cpu_s = time.process_time() - started
    return {"bytes": totals.bytes, "cpu_s": cpu_s, "mb_per_cpu_s": totals.bytes / cpu_s / 1e6}


def _in_process(config: Path, runs: int = 3) -> list[float]:
    """Source MB per CPU second of ``verify()`` called in this process after one warm-up call:
    connections, the request encoders and the heap already warm (a long-running verify's steady
    state, which a one-shot CLI run of a 168 MB topic does not reach)."""
    keep_freed_fetch_buffers()
    config_obj = load_mm2(config)
    asyncio.run(verify(config_obj))
    rates = []
    for _ in range(runs):
        result = asyncio.run(verify(config_obj))
        rates.append(result.source_bytes / result.cpu_s / 1e6)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_500_000)
    parser.add_argument("--codec", default="lz4")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--broker", choices=("tansu", "kafka"), default=None)
    parser.add_argument("--kafka-home", default=None)
    args = parser.parse_args(argv)
    flavor = broker_flavor(args.broker)
    topic = f"bench-verify-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp, \
            started_clusters(flavor, "A", "B", log_dir=tmp, kafka_home=args.kafka_home) as (a, b):
        print(f"{flavor}: loading {args.records:,} records ({args.codec}) into {topic}",
              flush=True)
        load(a, Workload(topic, records=args.records, partitions=args.partitions,
                         codec=args.codec, value_bytes=300, batch_bytes=1_000_000,
                         linger_ms=50), timeout_s=1800)
        config = _mm2(Path(tmp) / "mm2.properties", a, b, topic)
        mirrored = _cli("mirror", str(config), "--exit-when-caught-up")
        if mirrored.returncode != 0:
            raise SystemExit(f"mirror failed:\n{mirrored.stderr[-3000:]}")
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}")
        for i in range(args.repeat):
            run = _timed_verify(config)
            print(f"run {i + 1}: {run['bytes'] / 1e6:,.1f} MB compared in {run['wall_s']:.2f} s "
                  f"= {run['mb_s']:,.0f} MB/s wall; verify CPU {run['cpu_s']:.2f} s = "
                  f"{run['mb_per_cpu_s']:,.0f} MB per CPU second (whole process with "
                  f"interpreter start-up: {run['process_cpu_s']:.2f} s CPU)", flush=True)
            floor = _fetch_floor(a, b, topic)
            print(f"  fetch-only floor, both sides: CPU {floor['cpu_s']:.2f} s = "
                  f"{floor['mb_per_cpu_s']:,.0f} source MB per CPU second", flush=True)
        rates = _in_process(config)
        print("in process, warm: " + ", ".join(f"{r:,.0f}" for r in rates)
              + " source MB per CPU second", flush=True)
    return 0


if __name__ == "__main__":
    from shallowmirror.bench.interrupts import run_script

    raise SystemExit(run_script(main))
