"""The mirror's own instructions per forwarded batch end to end, against two real clusters.

    PYTHONPATH=. .venv/bin/python benchmarks/engine/mirror_instructions.py --broker kafka \
        --kafka-home "$KAFKA_HOME" [--records 1000000] [--batch-bytes 16384,262144] \
        [--partitions 8] [--baseline DIR] [--process engine|mirror]

``hotpath_instructions.py`` counts the engine alone (fake clusters, no sockets). This counts the
whole mirror process as ``bench_mirror.py`` runs it (``python -m shallowmirror.engine.run``,
real connections, event loop, fetch and produce paths), under ``valgrind --tool=callgrind``
with collection switched on when the engine says it is ready and off once the target holds
every record. Each tree mirrors a topic of ``--records`` and one of a tenth as many: the
difference divided by the difference in batches is the user-space instructions per batch (and
per MB) with the fixed work after "engine ready" (first requests, metadata, kafka-python
compiling its encoders) left out; that fixed part is printed too. Timings on the
VMs this project runs on swing by +-25% from one run to the next and the machines expose no
performance counters, so an end-to-end change smaller than that can only be seen this way.

What it does not see: kernel time (socket copies, wake-ups) and memory stalls, which make up
much of a real run's CPU (bench_mirror.py measures those). Under valgrind the mirror runs 50-100x
slower than the brokers, so every answer is already there when it wakes: requests and wake-ups
per batch are the fewest the code allows, not what a run at full speed makes. Compare trees
side by side (``--baseline``), not against timed figures. Needs valgrind; a few minutes per
tree and size.

``--process mirror`` counts what users run instead: ``shallowmirror mirror`` on an
mm2.properties with one flow (MM2's defaults: offset syncs, checkpoints, heartbeats, metrics for
its status lines) and ``--exit-when-caught-up``, counted from its start to its exit (its start-up
and shutdown are the same for both topics, so the difference leaves them out; "fixed" is then
all of that). Each run's source alias is new, so its remote topic is too.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_mirror import _bytes_of, _source_ends  # noqa: E402

from shallowmirror.bench.watermarks import HighWatermarks  # noqa: E402
from shallowmirror.testing import clusters as test_clusters  # noqa: E402
from shallowmirror.testing.workload import Workload, create_topic, load  # noqa: E402

#: callgrind's count of what it collected ("summary:" near the top is the count before it was
#: switched on, 0 here).
_TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)


def _callgrind_control(pid: int, switch: str) -> None:
    subprocess.run(["callgrind_control", "-i", switch, str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _callgrind_total(out: str) -> int:
    """The instructions callgrind counted, from its output file ``out``."""
    with open(out, "rb") as f:
        found = _TOTALS.search(f.read())
    if found is None:
        raise RuntimeError("callgrind wrote no totals")
    return int(found.group(1))


def count_mirror(source: str, target: str, topic: str, partitions: int,
                 ends: dict[int, int], pythonpath: str) -> int:
    """User-space instructions of one mirror process from "engine ready" to caught up."""
    prefix = f"i{uuid.uuid4().hex[:6]}"
    create_topic({"bootstrap.servers": target},
                 Workload(topic=f"{prefix}.{topic}", partitions=partitions))
    watcher = HighWatermarks(target, f"{prefix}.{topic}")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={out}", sys.executable, "-m", "shallowmirror.engine.run",
               "--source", source, "--target", target, "--topics", topic, "--prefix", prefix,
               "--log-level", "WARNING", "--set", "partition.assignment=all",
               "--set", f"group.id=g{prefix}"]
        # cwd too: ``python -m`` puts the working directory ahead of PYTHONPATH.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={"PYTHONHASHSEED": "0", **os.environ, "PYTHONPATH": pythonpath},
                                cwd=pythonpath or None)
        try:
            line = proc.stdout.readline()
            if not line.startswith(b"engine ready"):
                raise RuntimeError(f"the mirror did not start: {line!r}")
            _callgrind_control(proc.pid, "on")
            deadline = time.monotonic() + 1800
            while not all(watcher.read().get(p, -1) >= end for p, end in ends.items()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the mirror stopped or did not catch up in 30 minutes")
                time.sleep(0.2)
            _callgrind_control(proc.pid, "off")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(300)
            watcher.close()
        return _callgrind_total(out)


def count_mirror_process(source: str, target: str, topic: str, partitions: int,
                         ends: dict[int, int], pythonpath: str) -> int:
    """User-space instructions of one ``shallowmirror mirror --exit-when-caught-up`` run of a
    one-flow mm2.properties, from its start to its exit."""
    alias = f"S{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp:
        props = os.path.join(tmp, "mm2.properties")
        with open(props, "w") as f:
            f.write(f"clusters = {alias}, B\n{alias}.bootstrap.servers = {source}\n"
                    f"B.bootstrap.servers = {target}\n{alias}->B.enabled = true\n"
                    f"{alias}->B.topics = {topic}\n")
        out = os.path.join(tmp, "callgrind.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
               "-m", "shallowmirror", "mirror", props, "--exit-when-caught-up",
               "--caught-up-timeout", "1800", "--log-level", "WARNING"]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={"PYTHONHASHSEED": "0", **os.environ,
                                   "PYTHONPATH": pythonpath},
                              cwd=pythonpath or None, timeout=2400)
        if done.returncode != 0:
            raise RuntimeError(f"the mirror failed ({done.returncode}): "
                               f"{done.stderr[-2000:].decode(errors='replace')}")
        watcher = HighWatermarks(target, f"{alias}.{topic}")
        try:
            if not all(watcher.read().get(p, -1) >= end for p, end in ends.items()):
                raise RuntimeError("the mirror exited before the target held every record")
        finally:
            watcher.close()
        return _callgrind_total(out)


def _load(source: str, args: argparse.Namespace, batch_bytes: int,
          records: int) -> tuple[str, dict[int, int], int, int]:
    """A new topic of ``records``: (name, end offset per partition, batches, bytes)."""
    topic = f"instr-{batch_bytes}-{records}-{uuid.uuid4().hex[:6]}"
    load({"bootstrap.servers": source},
         Workload(topic=topic, records=records, partitions=args.partitions, codec=args.codec,
                  value_bytes=args.value_bytes, batch_bytes=batch_bytes, linger_ms=50))
    ends = _source_ends(source, topic, records)
    total_bytes, batches = _bytes_of(source, topic)
    return topic, ends, batches, total_bytes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", choices=test_clusters.FLAVORS,
                        help="clusters started here: tansu (default) or Apache Kafka")
    parser.add_argument("--kafka-home", help="Kafka distribution (default: $KAFKA_HOME)")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=300)
    parser.add_argument("--batch-bytes", default="16384,262144",
                        help="producer batch.size of the loaded topics, a comma list")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--codec", default="lz4")
    parser.add_argument("--baseline", metavar="DIR",
                        help="also count the tree at DIR (PYTHONPATH=DIR), on the same topics")
    parser.add_argument("--process", choices=("engine", "mirror"), default="engine",
                        help="the engine alone (python -m shallowmirror.engine.run, as "
                             "bench_mirror.py runs it) or the mirror process "
                             "(shallowmirror mirror)")
    args = parser.parse_args()
    count = count_mirror if args.process == "engine" else count_mirror_process
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            print(f"mirror_instructions: {tool} is not installed (Debian: apt-get install "
                  "valgrind)", file=sys.stderr)
            return 2
    trees = [("new", os.environ.get("PYTHONPATH", ""))]
    if args.baseline:
        trees.append(("base", args.baseline))
    with test_clusters.source_and_target(args.broker, args.kafka_home) as (flavor, clusters):
        source, target = clusters[0].bootstrap, clusters[1].bootstrap
        print(f"brokers {flavor}; {args.records} {args.codec} records of {args.value_bytes} B; "
              f"{args.partitions} partitions", flush=True)
        for batch_bytes in (int(b) for b in args.batch_bytes.split(",")):
            loaded = [_load(source, args, batch_bytes, records)
                      for records in (args.records, max(1, args.records // 10))]
            (_, _, big_batches, big_bytes), (_, _, small_batches, small_bytes) = loaded
            for name, path in trees:
                big_count, small_count = (
                    count(source, target, topic, args.partitions, ends, path)
                    for topic, ends, _batches, _size in loaded)
                per_batch = (big_count - small_count) / (big_batches - small_batches)
                per_mb = (big_count - small_count) / ((big_bytes - small_bytes) / 1e6)
                fixed = small_count - per_batch * small_batches
                fixed_part = "start-up work after ready" if args.process == "engine" else \
                    "start-up and shutdown"
                print(f"{name:4} {args.process} batch.size {batch_bytes:7}: {big_batches:6} batches of "
                      f"{big_bytes / big_batches:8,.0f} B: {per_batch:9,.0f} instructions "
                      f"per batch, {per_mb:9,.0f} per MB; {fixed / 1e6:5.0f}M fixed ({fixed_part}), "
                      f"{big_count / big_batches:9,.0f} per batch with it",
                      flush=True)
    return 0


if __name__ == "__main__":
    from shallowmirror.bench.interrupts import run_script

    raise SystemExit(run_script(main))
