"""Does the mirror's memory stay flat while it runs? A continuous load, mirrored by the CLI.

    KAFKA_HOME=... .venv/bin/python benchmarks/engine/soak_rss.py [--broker kafka|tansu]
        [--seconds 180] [--mb-per-s 8] [--batch-bytes 1024] [--tree DIR]

Starts two clusters, creates an 8-partition topic, and keeps producing ~300-byte lz4 records into
it (``--mb-per-s`` uncompressed, producer ``batch.size`` ``--batch-bytes``: small batches make
many of them, which is what per-batch state would grow with) while ``shallowmirror mirror`` runs
an MM2 file with one flow and every default (offset syncs, checkpoints, resume). Prints the
mirror process's RSS every 10 s. ``--tree DIR`` runs the mirror from another tree (an exported
older version, with its built codec): its working directory is DIR, since ``python -m`` puts the
working directory ahead of ``PYTHONPATH``. RSS is expected to level off at about the engine's
base plus what ``buffer.memory`` lets it hold; it should not keep climbing. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from shallowmirror.bench import topics as bench_topics
from shallowmirror.testing import clusters as test_clusters

TOPIC = "soak"
PARTITIONS = 8
VALUE_BYTES = 300
TICKS_PER_S = 20


def produce(bootstrap: str, mb_per_s: float, batch_bytes: int, stop: threading.Event,
            produced: list[int]) -> None:
    """Records at about ``mb_per_s`` (uncompressed), round robin over the partitions."""
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4",
                         "batch.size": batch_bytes, "linger.ms": 20})
    value = os.urandom(VALUE_BYTES // 2) * 2
    per_tick = max(1, int(mb_per_s * 1e6 / VALUE_BYTES / TICKS_PER_S))
    while not stop.is_set():
        started = time.monotonic()
        for i in range(per_tick):
            while True:
                try:
                    producer.produce(TOPIC, value=value, key=str(i % 1000).encode(),
                                     partition=i % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.poll(0)
        produced[0] += per_tick
        time.sleep(max(0.0, 1 / TICKS_PER_S - (time.monotonic() - started)))
    producer.flush(10)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=test_clusters.FLAVORS, default="kafka")
    parser.add_argument("--kafka-home", default=os.environ.get("KAFKA_HOME"))
    parser.add_argument("--seconds", type=int, default=180)
    parser.add_argument("--mb-per-s", type=float, default=8.0)
    parser.add_argument("--batch-bytes", type=int, default=1024)
    parser.add_argument("--tree", help="run the mirror from this tree (default: this one)")
    args = parser.parse_args()
    tree = Path(args.tree or Path(__file__).resolve().parents[2]).resolve()
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    with test_clusters.started_clusters(args.broker, "src", "dst",
                                        kafka_home=args.kafka_home) as (src, dst):
        bench_topics.create(src.bootstrap, TOPIC, PARTITIONS)
        (work / "mm2.properties").write_text(
            f"clusters = src, dst\nsrc.bootstrap.servers = {src.bootstrap}\n"
            f"dst.bootstrap.servers = {dst.bootstrap}\nsrc->dst.enabled = true\n"
            f"src->dst.topics = {TOPIC}\n")
        stop, produced = threading.Event(), [0]
        loader = threading.Thread(target=produce, daemon=True,
                                  args=(src.bootstrap, args.mb_per_s, args.batch_bytes, stop,
                                        produced))
        loader.start()
        with open(work / "mirror.log", "w") as log:
            mirror = subprocess.Popen(
                [sys.executable, "-m", "shallowmirror", "mirror", str(work / "mm2.properties")],
                env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, stdout=log,
                stderr=subprocess.STDOUT)
        print(f"mirror from {tree}, log {work / 'mirror.log'}", flush=True)
        started = time.monotonic()
        try:
            while time.monotonic() - started < args.seconds and mirror.poll() is None:
                time.sleep(10)
                print(f"{time.monotonic() - started:5.0f}s  produced {produced[0]:>10,} records"
                      f"  mirror RSS {rss_mb(mirror.pid):6.1f} MB", flush=True)
        finally:
            stop.set()
            mirror.terminate()
            mirror.wait(30)
            loader.join(15)
    return 0 if mirror.returncode in (0, -15) else 1


if __name__ == "__main__":
    from shallowmirror.bench.interrupts import run_script

    raise SystemExit(run_script(main))
