"""Start-up: time from an engine's start to the first record acknowledged by the target, per phase.

    .venv/bin/python benchmarks/engine/startup.py [--broker tansu|kafka] [--kafka-home DIR]
        [--runs 3] [--rebalance-delay-ms 3000] [--modes group,classic,all,static,consumer]
        [--kip848 on|off] [--set KEY=VALUE ...] [--out startup.jsonl]

Starts a source and a target cluster (real Kafka with ``group.initial.rebalance.delay.ms`` at
Kafka's default of 3000 unless told otherwise; tansu has no such setting but holds a first
JoinGroup for ``session.timeout.ms / 2``), loads a small 8-partition lz4 topic, warms up the group
coordinator once (a cluster's first group creates ``__consumer_offsets``, which a user's cluster
has long had), then for each mode and run starts a fresh engine (a fresh group id, a fresh target
topic) in this process and prints the engine's start-up timeline (``EngineStats.startup``):
seconds after start at which each phase was reached. Modes:

- ``group``: ``partition.assignment=group`` with every default (``group.protocol=auto``: the
  consumer protocol where the source serves it, classic otherwise), a new group each run;
- ``classic``: the same with ``group.protocol=classic``;
- ``static``: classic with ``group.instance.id`` set, started twice on the same group: the
  second start is a restart within ``session.timeout.ms`` (the group is not Empty);
- ``all``: ``partition.assignment=all`` (opt-in, single process only);
- ``consumer``: ``group.protocol=consumer`` (KIP-848: the broker assigns at the first
  heartbeat), a new group each run; on Kafka the clusters then also get
  ``group.coordinator.rebalance.protocols=classic,consumer`` (3.7 serves KIP-848 only so;
  ``--kip848 on|off`` says it for any set of modes).

Nothing is asserted; the figures go to ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from shallowmirror.engine import MirrorEngine
from shallowmirror.testing import embedded
from shallowmirror.testing.workload import Workload, create_topic, load

PHASES = ("source metadata", "target metadata", "producer id", "subscribed", "assigned",
          "offsets fetched", "positions known", "target read", "first fetch", "first record")


def _clusters(args: argparse.Namespace):
    if args.broker == "kafka":
        from shallowmirror.testing.kafka import kafka_clusters

        overrides = {"group.initial.rebalance.delay.ms": str(args.rebalance_delay_ms)}
        if args.kip848 == "on":                    # Kafka 3.7 serves KIP-848 only when asked
            overrides["group.coordinator.rebalance.protocols"] = "classic,consumer"
        return kafka_clusters("source", "target", kafka_home=args.kafka_home,
                              overrides=overrides)
    return embedded.embedded_clusters("source", "target")


async def _one_run(source: Any, target: Any, topic: str, settings: dict[str, Any],
                   timeout_s: float = 60.0) -> dict[str, float]:
    copy = f"copy-{uuid.uuid4().hex[:8]}"
    create_topic(target.client_config(), Workload(topic=copy, partitions=8))
    engine = MirrorEngine(source.client_config(), target.client_config(), topics=[topic],
                          settings=settings, topic_mapper=lambda _: copy)
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    deadline = time.monotonic() + timeout_s
    try:
        while "first record" not in engine.stats().startup and time.monotonic() < deadline:
            if task.done():
                await task
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await task
    return engine.stats().startup


def _settings(mode: str, group: str, extra: dict[str, str]) -> dict[str, Any]:
    s: dict[str, Any] = {"group.id": group, "auto.offset.reset": "earliest",
                         "partition.assignment": "all" if mode == "all" else "group"}
    if mode == "static":
        s["group.instance.id"] = f"{group}-1"
    if mode in ("consumer", "classic", "static"):
        s["group.protocol"] = "classic" if mode == "static" else mode
    s.update(extra)
    return s


def _cli_run(source: Any, target: Any, mode: str, extra: dict[str, str],
             workdir: Path, timeout_s: float = 60.0) -> dict[str, Any]:
    """``shallowmirror mirror`` as a user launches it, into a target topic it creates itself
    (topic sync): seconds from launch to the first record on the target (its high watermark,
    polled every 10 ms from outside), and the engine's own start-up line."""
    from shallowmirror.bench.watermarks import HighWatermarks

    topic = f"cli-{uuid.uuid4().hex[:8]}"
    load(source.client_config(), Workload(topic=topic, records=2_000, partitions=8,
                                          codec="lz4", value_bytes=200))
    keys = {"partition.assignment": "all"} if mode == "all" else {}
    if mode in ("consumer", "classic"):
        keys["group.protocol"] = mode
    keys.update(extra)
    props = workdir / f"{topic}.properties"
    props.write_text("\n".join([
        "clusters = A, B", f"A.bootstrap.servers = {source.bootstrap}",
        f"B.bootstrap.servers = {target.bootstrap}", "A->B.enabled = true",
        f"A->B.topics = {topic}", f"group.id = startup-{topic}",
        *(f"A->B.{k} = {v}" for k, v in keys.items())]) + "\n")
    # As an installed package starts: with its bytecode cached (some machines set
    # PYTHONDONTWRITEBYTECODE, which makes every launch compile the package again, ~0.3 s here).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", "import shallowmirror.mirror.process"], env=env,
                   check=True)
    launched = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "shallowmirror", "mirror", str(props),
                             "--log-level", "INFO"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    first = None
    try:
        while first is None and time.monotonic() - launched < timeout_s:
            try:
                with HighWatermarks(target.bootstrap, f"A.{topic}") as marks:
                    while time.monotonic() - launched < timeout_s:
                        if any(marks.read().values()):
                            first = time.monotonic() - launched
                            break
                        time.sleep(0.01)
            except Exception:  # noqa: BLE001 - the target topic does not exist yet
                time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    line = next((ln for ln in err.splitlines() if "start-up: first record" in ln), "")
    return {"first_record_s": first, "engine": line.split("start-up: ", 1)[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=("tansu", "kafka"), default="tansu")
    parser.add_argument("--kafka-home")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rebalance-delay-ms", type=int, default=3000)
    parser.add_argument("--modes", default="group,static,all")
    parser.add_argument("--kip848", choices=("on", "off"),
                        help="Kafka: serve the KIP-848 consumer group protocol (default: on when "
                             "consumer is among --modes)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cli", action="store_true",
                        help="also launch `shallowmirror mirror` per mode and run (group, all, and "
                             "classic and consumer when among --modes)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.kip848 is None:
        args.kip848 = "on" if "consumer" in args.modes.split(",") else "off"
    extra = dict(item.split("=", 1) for item in args.set)
    logging.basicConfig(level=logging.WARNING)
    rows = []
    cli_modes = ["group", "all"] + [m for m in ("classic", "consumer")
                                    if m in args.modes.split(",")]
    with _clusters(args) as (source, target):
        topic = "startup"
        load(source.client_config(), Workload(topic=topic, records=20_000, partitions=8,
                                              codec="lz4", value_bytes=200))
        create_topic(target.client_config(), Workload(topic="warm-up", partitions=1))
        # Warm-up: the first group on a fresh cluster creates __consumer_offsets.
        asyncio.run(_one_run(source, target, topic, _settings("group", "warm-up", extra)))
        for mode in args.modes.split(","):
            for run in range(args.runs):
                group = f"startup-{mode}-{uuid.uuid4().hex[:6]}"
                starts = 2 if mode == "static" else 1
                for start in range(starts):
                    if start:       # something new to mirror from the committed offsets
                        load(source.client_config(), Workload(
                            topic=topic, records=800, partitions=8, codec="lz4",
                            value_bytes=200, create_topic=False))
                    phases = asyncio.run(_one_run(source, target, topic,
                                                  _settings(mode, group, extra)))
                    row = {"broker": args.broker, "mode": mode, "run": run, "start": start,
                           "rebalance_delay_ms": args.rebalance_delay_ms, "kip848": args.kip848,
                           "phases": phases}
                    rows.append(row)
                    print(f"{mode:7s} run {run} start {start}: " + ", ".join(
                        f"{p} {phases[p]:.2f}" for p in PHASES if p in phases), flush=True)
        if args.cli:
            with tempfile.TemporaryDirectory() as tmp:
                for mode in cli_modes:
                    for run in range(args.runs):
                        got = _cli_run(source, target, mode, extra, Path(tmp))
                        rows.append({"broker": args.broker, "mode": f"cli-{mode}", "run": run,
                                     "start": 0, "rebalance_delay_ms": args.rebalance_delay_ms,
                                     "phases": {"first record": got["first_record_s"]},
                                     "engine": got["engine"]})
                        print(f"cli {mode:8s} run {run}: first record on the target "
                              f"{got['first_record_s']} s after launch; engine: {got['engine']}",
                              flush=True)
    print("\nmedian seconds to the first record on the target:")
    for mode in args.modes.split(",") + ([f"cli-{m}" for m in cli_modes] if args.cli else []):
        for start in (0, 1):
            firsts = [r["phases"].get("first record") for r in rows
                      if r["mode"] == mode and r["start"] == start]
            firsts = [f for f in firsts if f is not None]
            if firsts:
                label = f"{mode} (restart)" if start else mode
                print(f"  {label:16s} {statistics.median(firsts):.2f} s over {len(firsts)} runs")
    if args.out:
        with open(args.out, "a") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    from shallowmirror.bench.interrupts import run_script

    sys.exit(run_script(main))
