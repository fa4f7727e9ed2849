"""Mirror-process cost per codec: throughput next to its two ceilings, CPU seconds per GB moved,
the brokers' CPU, and peak RSS against buffer.memory.

    .venv/bin/python benchmarks/engine/bench_mirror.py [--records 1000000 | none=3000000,...]
        [--codecs none,gzip,snappy,lz4,zstd] [--repeat 3] [--buffer-memory 67108864]
        [--set KEY=VALUE ...] [--mirror-set KEY=VALUE ...] [--py-spy DIR] [--perf DIR]
        [--out bench_mirror.jsonl]
        [--broker tansu|kafka] [--kafka-home DIR] [--value-bytes 200]
        [--batch-bytes 1000000 | 16384,262144] [--partitions 8] [--baseline DIR]
        [--process engine|mirror]

Per codec and producer ``batch.size`` (``--batch-bytes``, uncompressed bytes as librdkafka counts
them; several sizes give one row each, side by side on the same brokers): load N records
(``--partitions``, 8 by default; ``--value-bytes`` values) into a source cluster started here
(embedded tansu, or real Apache Kafka with ``--broker kafka``/``SHALLOWMIRROR_BROKER=kafka`` and
``KAFKA_HOME`` or ``--kafka-home``; or SHALLOWMIRROR_SOURCE/TARGET_BOOTSTRAP), then, ``--repeat``
times, side by side:
1. fetch-only: a child process reads every batch with raw Fetch requests (net layer + codec,
   nothing forwarded): the source-side ceiling for a mirror reading this source;
2. produce-only: a child process (``produce_ceiling.py``) pre-fetches every batch, then sends them
   with the engine's own Sink (same planner, stamping, encoder, requests in flight) to a fresh
   target topic: the target-side ceiling, nothing fetched while sending;
3. mirror: a child ``python -m shallowmirror.engine.run`` from offset 0 into a fresh target topic,
   timed from ``engine ready`` until the target's high watermark reaches the source's end on
   every partition (``shallowmirror.bench.watermarks``, probed every 20 ms; no commit polling).
   Both ends are read the way each broker answers correctly (tansu: a Fetch past the end; Kafka,
   which answers that with OFFSET_OUT_OF_RANGE and no high watermark: ListOffsets), and the
   source's ends must add up to the records loaded, so a mirror phase cannot "finish" at once.
   ``--process mirror`` runs what users run instead: ``python -m shallowmirror mirror`` on an
   mm2.properties with one flow from a new source alias (so a new remote topic, ``<alias>.<topic>``
   as the engine phase names it) with MM2's defaults (consumer group, offset syncs, checkpoints,
   heartbeats, the metrics its status lines use), timed from its "first record on the target"
   log line (start-up and group join left out) to the same end; its CPU is the whole process's;
4. floor (only when asked: ``--phases fetch,produce,mirror,floor``): ``mirror_floor.c``, the same
   copy from C with no interpreter (Fetch answers split and CRC-checked, one batch per partition
   per Produce request sent from the Fetch answer's buffer, the mirror's requests in flight and
   answers per wake-up, its buffer.memory), into a fresh target topic: what the mirror's cycle
   costs with the least user-space work, so the mirror's CPU per GB can be read against it
   (single-broker clusters only; compiled here with ``cc``).
With ``--baseline DIR`` the produce-only and mirror phases also run with ``PYTHONPATH=DIR`` (an
exported older tree, e.g. ``git archive <commit> shallowmirror | tar -x -C DIR`` plus its built
codec), interleaved with the current code's runs on the same topics and brokers (which code
runs first alternates per repeat): before/after side by side, one row each ("base" and "new").
Each phase records its process's CPU and the started brokers' CPU (psutil on their pids) over the
same window. Prints one row per codec (medians over the repeats) and appends every run as a JSON
object to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from shallowmirror import codec as codec_impl
from shallowmirror.bench.interrupts import BenchmarkFailed
from shallowmirror.bench.machine import python_reference_us
from shallowmirror.bench.watermarks import HighWatermarks
from shallowmirror.engine.config import resolve_settings
from shallowmirror.engine.fetch_share import fair_partition_bytes
from shallowmirror.testing import clusters as test_clusters
from shallowmirror.testing.workload import Workload, create_topic, load

HERE = Path(__file__).resolve().parent

_FETCH_ONLY = """
import asyncio, json, sys, time
from shallowmirror.engine.rawfetch import fetch_all
sys.stdin.readline()
t0 = time.monotonic()
_, totals = asyncio.run(fetch_all({"bootstrap.servers": sys.argv[1]}, sys.argv[2], keep=False))
print(json.dumps({"wall_s": time.monotonic() - t0, "bytes": totals.bytes,
                  "records": totals.records, "batches": totals.batches,
                  "fetches": totals.fetches}))
"""


def _sched(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one), summed over the threads
    (/proc/PID/task/*/schedstat; zeros where unavailable)."""
    run = wait = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0, 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            run += int(fields[0])
            wait += int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return run / 1e9, wait / 1e9


class CpuWindow:
    """CPU seconds (user+system, psutil) and run-queue wait seconds (schedstat) of some processes
    between ``start`` and ``stop``. Wait time says the process was ready to run but every core
    was busy: the machine, not the process, was the limit for that long."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.procs = [psutil.Process(p) for p in pids]
        self.first: list[float] = []
        self.first_wait: list[float] = []
        self.wait_s: list[float] = []

    def _now(self) -> list[float]:
        out = []
        for p in self.procs:
            try:
                t = p.cpu_times()
                out.append(t.user + t.system)
            except psutil.Error:
                out.append(0.0)
        return out

    def start(self) -> None:
        self.first = self._now()
        self.first_wait = [_sched(p)[1] for p in self.pids]

    def stop(self) -> list[float]:
        self.wait_s = [_sched(p)[1] - w for p, w in zip(self.pids, self.first_wait,
                                                          strict=True)]
        return [b - a for a, b in zip(self.first, self._now(), strict=True)]


def _source_ends(bootstrap: str, topic: str, records: int) -> dict[int, int]:
    """High watermark per partition; they must add up to the ``records`` just loaded."""
    watcher = HighWatermarks(bootstrap, topic)
    try:
        ends = watcher.read()
    finally:
        watcher.close()
    if sum(ends.values()) != records or any(end < 0 for end in ends.values()):
        raise RuntimeError(f"{topic}: source ends {ends} do not add up to the {records} records "
                           "loaded")
    return ends


def _bytes_of(bootstrap: str, topic: str) -> tuple[int, int]:
    """(compressed bytes, batches) of the whole topic."""
    from shallowmirror.engine.rawfetch import fetch_all
    _, totals = asyncio.run(fetch_all({"bootstrap.servers": bootstrap}, topic, keep=False))
    return totals.bytes, totals.batches


def fetch_only(source: str, topic: str, broker_pids: list[int]) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", _FETCH_ONLY, source, topic],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    mine, brokers = CpuWindow([proc.pid]), CpuWindow(broker_pids)
    time.sleep(0.3)                 # imports done before the window opens
    mine.start()
    brokers.start()
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    out = proc.stdout.read()
    cpu = mine.stop()[0]
    broker_cpu = brokers.stop()
    result_wait = {"wait_s": mine.wait_s[0], "broker_wait_s": brokers.wait_s}
    proc.wait()
    result = json.loads(out)
    result["cpu_s"] = cpu
    result["broker_cpu_s"] = broker_cpu
    result.update(result_wait)
    return result


def _env(pythonpath: str | None) -> dict | None:
    """The environment of a child running the code at ``pythonpath`` (None: this code)."""
    return None if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath}


def produce_only(source: str, target: str, topic: str, target_topic: str,
                 broker_pids: list[int], sets: list[str], pythonpath: str | None = None) -> dict:
    cmd = [sys.executable, str(HERE / "produce_ceiling.py"), "--source", source, "--target",
           target, "--topic", topic, "--target-topic", target_topic]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=_env(pythonpath))
    assert proc.stdout.readline().startswith(b"ready")
    mine, brokers = CpuWindow([proc.pid]), CpuWindow(broker_pids)
    mine.start()
    brokers.start()
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    broker_cpu = brokers.stop()
    mine.stop()
    proc.wait(60)
    result = json.loads(line)
    result["broker_cpu_s"] = broker_cpu
    result["wait_s"] = mine.wait_s[0]
    result["broker_wait_s"] = brokers.wait_s
    return result


def _watch_mirror(proc: subprocess.Popen, watcher: HighWatermarks, ends: dict[int, int],
                  broker_pids: list[int]) -> dict:
    """Called the instant the mirror says "engine ready": the window opens here."""
    ps = psutil.Process(proc.pid)
    start = ps.cpu_times()
    startup_cpu = start.user + start.system      # interpreter + imports + connect: not per GB
    ready_rss = ps.memory_info().rss             # the fixed base: before anything is fetched
    switches0 = sum(ps.num_ctx_switches())       # each one a wake-up (or a preemption)
    brokers, mine = CpuWindow(broker_pids), CpuWindow([proc.pid])
    brokers.start()
    mine.start()
    t0 = time.monotonic()
    peak_rss, next_probe = 0, 0.0
    while True:
        peak_rss = max(peak_rss, ps.memory_info().rss)
        now = time.monotonic()
        if now >= next_probe:
            next_probe = now + 0.02
            high = watcher.read()
            if all(high.get(p, -1) >= end for p, end in ends.items()):
                break
        if proc.poll() is not None:
            raise BenchmarkFailed(f"mirror exited with status {proc.returncode} before the "
                                  "target caught up")
        if now - t0 > 600:
            raise BenchmarkFailed("mirror did not finish in 600 s")
        time.sleep(0.01)
    wall = time.monotonic() - t0
    t = ps.cpu_times()
    cpu = t.user + t.system
    switches = sum(ps.num_ctx_switches()) - switches0
    broker_cpu = brokers.stop()
    mine.stop()
    return {"wall_s": wall, "cpu_s": cpu - startup_cpu, "startup_cpu_s": startup_cpu,
            # Kernel time (socket reads and writes, wake-ups) apart from the process's own.
            "user_s": t.user - start.user, "system_s": t.system - start.system,
            "context_switches": switches,
            "peak_rss_bytes": peak_rss, "ready_rss_bytes": ready_rss,
            "broker_cpu_s": broker_cpu, "wait_s": mine.wait_s[0],
            "broker_wait_s": brokers.wait_s}


def _py_spy() -> str | None:
    """The py-spy executable: on PATH, else beside this interpreter (the venv's); None."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def mirror_run(source: str, target: str, topic: str, prefix: str, ends: dict[int, int],
               buffer_memory: int, broker_pids: list[int], sets: list[str],
               py_spy: str | None, pythonpath: str | None = None,
               perf: str | None = None) -> dict:
    group = f"bench-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "shallowmirror.engine.run", "--source", source, "--target",
           target, "--topics", topic, "--prefix", prefix, "--log-level", "WARNING",
           "--set", "partition.assignment=all", "--set", f"group.id={group}",
           "--set", f"buffer.memory={buffer_memory}"]
    for s in sets:
        cmd += ["--set", s]
    # Connected (and, on Kafka, switched to ListOffsets) before the mirror starts: the window
    # must not include the watcher's own set-up.
    watcher = HighWatermarks(target, f"{prefix}.{topic}")
    if any(watcher.read().values()):
        raise RuntimeError(f"{prefix}.{topic} is not empty before the mirror starts")
    # cwd too: ``python -m`` puts the working directory ahead of PYTHONPATH.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=_env(pythonpath), cwd=pythonpath)
    if not proc.stdout.readline().startswith(b"engine ready"):
        # Its own error (a setting refused, a cluster unreachable) is on stderr, above.
        status = proc.wait(60)
        watcher.close()
        raise BenchmarkFailed(f"the engine under test exited with status {status} before it "
                              "was ready (its error is above)")
    spy = None
    try:
        if py_spy:
            spy = subprocess.Popen(
                [_py_spy(), "record", "--pid",
                 str(proc.pid), "--rate", "200", "--format", "raw", "-o", py_spy,
                 "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        if perf:
            os.makedirs(os.path.dirname(perf) or ".", exist_ok=True)
            # Native stacks (CPython's C functions, the codec, libc, the kernel's syscalls):
            # where a batch's CPU goes below the interpreter, which py-spy does not see.
            spy = subprocess.Popen(["perf", "record", "-F", "997", "-g", "-p", str(proc.pid),
                                    "-o", perf], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        result = _watch_mirror(proc, watcher, ends, broker_pids)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        watcher.close()
    return result


def mirror_process_run(source: str, target: str, topic: str, prefix: str,
                       ends: dict[int, int], buffer_memory: int, broker_pids: list[int],
                       sets: list[str], pythonpath: str | None = None) -> dict:
    """``mirror_run`` for ``shallowmirror mirror``: flow ``<prefix>->B`` of ``topic``."""
    import threading

    watcher = HighWatermarks(target, f"{prefix}.{topic}")
    if any(watcher.read().values()):
        raise RuntimeError(f"{prefix}.{topic} is not empty before the mirror starts")
    flow = f"{prefix}->B"
    lines = [f"clusters = {prefix}, B", f"{prefix}.bootstrap.servers = {source}",
             f"B.bootstrap.servers = {target}", f"{flow}.enabled = true",
             f"{flow}.topics = {topic}", f"{flow}.buffer.memory = {buffer_memory}"]
    lines += [f"{flow}.{key} = {value}" for key, _, value in (s.partition("=") for s in sets)]
    with tempfile.TemporaryDirectory() as tmp:
        props = os.path.join(tmp, "mm2.properties")
        with open(props, "w") as f:
            f.write("\n".join(lines) + "\n")
        cmd = [sys.executable, "-m", "shallowmirror", "mirror", props, "--log-level", "INFO",
               "--status-interval", "0"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=_env(pythonpath), cwd=pythonpath)
        started = threading.Event()
        said: list[bytes] = []

        def read_log() -> None:          # drained to the end: a full pipe would stall it
            for line in proc.stderr:
                said.append(line)
                if b"first record on the target" in line:
                    started.set()

        threading.Thread(target=read_log, daemon=True).start()
        try:
            while not started.wait(0.05):
                if proc.poll() is not None:
                    raise BenchmarkFailed(f"mirror exited with status {proc.returncode}: "
                                       f"{b''.join(said[-20:]).decode(errors='replace')}")
            return _watch_mirror(proc, watcher, ends, broker_pids)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
            watcher.close()


#: The mirror's settings ``mirror_floor.c`` takes (the others mean nothing to it).
_FLOOR_KEYS = {"fetch.max.bytes", "max.partition.fetch.bytes",
               "max.in.flight.requests.per.connection", "target.answers.per.wakeup"}


def floor_run(source: str, target: str, topic: str, target_topic: str, ends: dict[int, int],
              buffer_memory: int, broker_pids: list[int], binary: str,
              sets: list[str]) -> dict:
    """``mirror_floor.c`` copying ``topic`` into ``target_topic``: its own JSON line (CPU from
    its ``getrusage``, wall from its clock) and the brokers' CPU over the same run. Requests in
    flight, answers per wake-up and the bytes asked per partition are the mirror's, from the
    same settings (``sets``, else the engine's defaults)."""
    given = dict(s.split("=", 1) for s in sets)
    settings = resolve_settings({**{k: v for k, v in given.items() if k in _FLOOR_KEYS},
                                 "buffer.memory": buffer_memory})
    partition_bytes = fair_partition_bytes(settings["fetch.max.bytes"], len(ends),
                                           settings["max.partition.fetch.bytes"])
    source_host, source_port = source.rsplit(":", 1)
    target_host, target_port = target.rsplit(":", 1)
    cmd = [binary, source_host, source_port, target_host, target_port, topic, target_topic,
           ",".join(str(ends[p]) for p in range(len(ends))),
           str(settings["max.in.flight.requests.per.connection"]),
           str(settings["target.answers.per.wakeup"]), str(partition_bytes), str(buffer_memory)]
    brokers = CpuWindow(broker_pids)
    brokers.start()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    broker_cpu = brokers.stop()
    if done.returncode != 0:
        hint = (" (mirror_floor talks to each cluster's bootstrap broker only: it needs "
                "single-broker clusters)" if " error 6" in done.stderr else "")
        raise RuntimeError(f"mirror_floor failed ({done.returncode}): {done.stderr.strip()}"
                           f"{hint}")
    result = json.loads(done.stdout)
    result["cpu_s"] = result["user_s"] + result["system_s"]
    result["broker_cpu_s"] = broker_cpu
    return result


def _records_for(spec: str, codec: str) -> int:
    if "=" not in spec:
        return int(spec)
    table = dict(item.split("=", 1) for item in spec.split(","))
    return int(table.get(codec, table.get("default", "1000000")))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", default="1000000",
                        help="N, or per codec: none=3000000,lz4=3000000,default=1000000")
    parser.add_argument("--codecs", default="none,gzip,snappy,lz4,zstd")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--buffer-memory", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="engine setting for the mirror and the produce-only run")
    parser.add_argument("--mirror-set", action="append", default=[], metavar="KEY=VALUE",
                        help="engine setting for the mirror run only (e.g. more target "
                             "connections measured against the default produce-only ceiling)")
    parser.add_argument("--phases", default="fetch,produce,mirror",
                        help="comma list of fetch, produce, mirror, floor (floor: mirror_floor.c)")
    parser.add_argument("--py-spy", help="directory: record the mirror with py-spy (raw stacks)")
    parser.add_argument("--perf", help="directory: record the mirror (--process engine) with "
                                       "perf record -g (native stacks)")
    parser.add_argument("--out", default="bench_mirror.jsonl")
    parser.add_argument("--broker", choices=test_clusters.FLAVORS,
                        help="clusters started here: tansu (default) or Apache Kafka "
                             "(default: $SHALLOWMIRROR_BROKER)")
    parser.add_argument("--kafka-home", help="Kafka distribution (default: $KAFKA_HOME)")
    parser.add_argument("--baseline", metavar="DIR",
                        help="also run produce-only and mirror with PYTHONPATH=DIR (an older "
                             "tree), interleaved: before/after side by side")
    parser.add_argument("--value-bytes", type=int, default=200, help="record value size")
    parser.add_argument("--process", choices=("engine", "mirror"), default="engine",
                        help="mirror phase: the engine alone (python -m shallowmirror.engine.run)"
                             " or what users run (shallowmirror mirror, one flow)")
    parser.add_argument("--batch-bytes", default="1000000",
                        help="producer batch.size of the loaded topic; a comma list gives one "
                             "row per size (e.g. 16384,262144)")
    parser.add_argument("--partitions", type=int, default=8,
                        help="partitions of the loaded topic (a Produce request carries at "
                             "most one batch of each)")
    args = parser.parse_args()
    phases = set(args.phases.split(","))
    unknown = phases - {"fetch", "produce", "mirror", "floor"}
    if unknown:
        parser.error(f"--phases: {', '.join(sorted(unknown))} is not one of fetch, produce, "
                     "mirror, floor")
    if args.perf and (args.py_spy or args.process != "engine"):
        parser.error("--perf records the engine process alone: give it with --process engine "
                     "and without --py-spy")
    if args.py_spy and not _py_spy():
        parser.error("--py-spy needs py-spy, which is not installed: .venv/bin/pip install py-spy")
    if args.perf and not shutil.which("perf"):
        parser.error("--perf needs Linux perf on PATH (Debian: apt-get install linux-perf)")
    stack = contextlib.ExitStack()
    flavor, clusters = stack.enter_context(
        test_clusters.source_and_target(args.broker, args.kafka_home))
    source, target = clusters[0].bootstrap, clusters[1].bootstrap
    broker_pids = [c.pid for c in clusters] if flavor != "external" else []
    # CPU per GB differs 2-3x between the hosts sessions run on, for the same code: this
    # (machine.python_reference_us) says which host a figure comes from.
    host_reference = python_reference_us()
    print(f"brokers {flavor}; codec impl {codec_impl.IMPLEMENTATION}; records {args.records}; "
          f"buffer.memory "
          f"{args.buffer_memory}; partitions {args.partitions}; repeat {args.repeat}; "
          f"settings {args.set}; mirror settings {args.mirror_set}; mirror process "
          f"{args.process}; "
          f"load average {os.getloadavg()[0]:.1f}; host reference {host_reference:.0f} us")
    variants = [("new", None)] + ([("base", args.baseline)] if args.baseline else [])
    floor_binary = None
    if "floor" in phases:
        from request_floor import build_native_client  # beside this script

        floor_binary = build_native_client(stack.enter_context(tempfile.TemporaryDirectory()),
                                           "mirror_floor")
    print(f"{'code':4} {'codec':7} {'batch':>7} {'MB':>6} {'batches':>7} {'mirror':>7} {'fetch':>7} {'produce':>7} {'m/f':>5} "
          f"{'m/min':>5} {'CPU s/GB':>8} {'brokers s/GB (src+tgt)':>22} {'RSS MB':>7}  (MB/s)")
    try:
        for codec, batch_bytes in ((c, int(b)) for c in args.codecs.split(",")
                                   for b in args.batch_bytes.split(",")):
            records = _records_for(args.records, codec)
            topic = f"bench-{codec}-{batch_bytes}-{uuid.uuid4().hex[:6]}"
            w = Workload(topic=topic, records=records, partitions=args.partitions, codec=codec,
                         value_bytes=args.value_bytes, batch_bytes=batch_bytes, linger_ms=50)
            load({"bootstrap.servers": source}, w)
            ends = _source_ends(source, topic, records)
            total_bytes, total_batches = _bytes_of(source, topic)
            runs: dict[str, list] = {name: [] for name, _ in variants}
            # The order alternates per repeat: the first run after the load is the slowest
            # (the brokers are still flushing), and it must not always be the same code's.
            for rep, (name, pythonpath) in ((r, v) for r in range(args.repeat)
                                            for v in (variants if r % 2 == 0
                                                      else variants[::-1])):
                run = {"code": name, "pythonpath": pythonpath, "codec": codec, "topic": topic,
                       "records": records, "compressed_bytes": total_bytes,
                       "batch_bytes": batch_bytes, "value_bytes": args.value_bytes,
                       "batches": total_batches, "broker": flavor,
                       "buffer_memory": args.buffer_memory, "settings": args.set,
                       "mirror_settings": args.mirror_set, "repeat": rep,
                       "process": args.process,
                       "codec_impl": codec_impl.IMPLEMENTATION,
                       "load_average": os.getloadavg()[0],
                       "host_reference_us": host_reference}
                if "fetch" in phases and name == "new":
                    fo = fetch_only(source, topic, broker_pids)
                    run["fetch_only"] = fo
                    run["fetch_only_mb_s"] = fo["bytes"] / 1e6 / fo["wall_s"]
                if "produce" in phases:
                    ptopic = f"{topic}-p{rep}{name}"
                    create_topic({"bootstrap.servers": target},
                                 Workload(topic=ptopic, partitions=args.partitions))
                    po = produce_only(source, target, topic, ptopic, broker_pids, args.set,
                                      pythonpath)
                    run["produce_only"] = po
                    run["produce_only_mb_s"] = po["bytes"] / 1e6 / po["wall_s"]
                if "mirror" in phases:
                    prefix = f"m{rep}{name}"
                    create_topic({"bootstrap.servers": target},
                                 Workload(topic=f"{prefix}.{topic}",
                                          partitions=args.partitions))
                    spy = (os.path.join(args.py_spy, f"{codec}-{batch_bytes}-{name}-{rep}.txt")
                           if args.py_spy else None)
                    if args.process == "mirror":
                        mr = mirror_process_run(source, target, topic, prefix, ends,
                                                args.buffer_memory, broker_pids,
                                                args.set + args.mirror_set, pythonpath)
                    else:
                        mr = mirror_run(source, target, topic, prefix, ends,
                                        args.buffer_memory, broker_pids,
                                        args.set + args.mirror_set, spy, pythonpath,
                                        os.path.join(args.perf, f"{codec}-{batch_bytes}-{name}"
                                                     f"-{rep}.data") if args.perf else None)
                    run["mirror"] = mr
                    run["mirror_mb_s"] = total_bytes / 1e6 / mr["wall_s"]
                    run["cpu_s_per_gb"] = mr["cpu_s"] / (total_bytes / 1e9)
                if floor_binary is not None and name == "new":
                    ftopic = f"{topic}-f{rep}"
                    create_topic({"bootstrap.servers": target},
                                 Workload(topic=ftopic, partitions=args.partitions))
                    fl = floor_run(source, target, topic, ftopic, ends, args.buffer_memory,
                                   broker_pids, floor_binary, args.set + args.mirror_set)
                    if fl["bytes"] != total_bytes or fl["batches"] != total_batches:
                        raise RuntimeError(f"mirror_floor copied {fl['batches']} batches "
                                           f"({fl['bytes']} bytes) of {total_batches} "
                                           f"({total_bytes})")
                    run["floor"] = {**fl, "target_topic": ftopic}
                    run["floor_mb_s"] = total_bytes / 1e6 / fl["wall_s"]
                    run["floor_cpu_s_per_gb"] = fl["cpu_s"] / (total_bytes / 1e9)
                runs[name].append(run)
                with open(args.out, "a") as f:
                    f.write(json.dumps(run) + "\n")
            fetch_runs = runs["new"]
            for name, _ in variants:
                for r, fr in zip(runs[name], fetch_runs, strict=True):   # one fetch-only per rep
                    r.setdefault("fetch_only_mb_s", fr.get("fetch_only_mb_s"))
                _print_row(name, codec, batch_bytes, total_bytes, total_batches, runs[name])
    finally:
        stack.close()
    return 0


def _med(runs: list[dict], *keys: str) -> float:
    vals = []
    for r in runs:
        v = r
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else float("nan")


def _print_row(name: str, codec: str, batch_bytes: int, total_bytes: int, batches: int,
               runs: list[dict]) -> None:
    gb = total_bytes / 1e9
    m, f, p = (_med(runs, k) for k in ("mirror_mb_s", "fetch_only_mb_s", "produce_only_mb_s"))
    for r in runs:
        if "mirror" in r:
            r["_bsrc"], r["_btgt"] = (x / gb for x in r["mirror"]["broker_cpu_s"][:2]) \
                if len(r["mirror"]["broker_cpu_s"]) >= 2 else (float("nan"),) * 2
    bsrc, btgt = _med(runs, "_bsrc"), _med(runs, "_btgt")
    ceiling = min(x for x in (f, p) if x == x) if (f == f or p == p) else float("nan")
    print(f"{name:4} {codec:7} {batch_bytes:7} {total_bytes / 1e6:6.0f} {batches:7} {m:7.1f} {f:7.1f} {p:7.1f} {m / f:5.2f} "
          f"{m / ceiling:5.2f} {_med(runs, 'cpu_s_per_gb'):8.2f} {bsrc:10.2f} + {btgt:9.2f} "
          f"{_med(runs, 'mirror', 'peak_rss_bytes') / 1e6:7.0f}", flush=True)
    if any("floor" in r for r in runs):
        print(f"{'floor':4} {codec:7} {batch_bytes:7} {total_bytes / 1e6:6.0f} {batches:7} "
              f"{_med(runs, 'floor_mb_s'):7.1f} {'':7} {'':7} {'':5} {'':5} "
              f"{_med(runs, 'floor_cpu_s_per_gb'):8.2f}   (mirror_floor.c: no interpreter)",
              flush=True)


if __name__ == "__main__":
    from shallowmirror.bench.interrupts import run_script

    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    raise SystemExit(run_script(main))
