"""Run the benchmark: load each workload once, then run every mode, repeatedly, as its own process.

One run (``run_once``):
1. empty the target: delete and re-create the target topic and its latency companion;
2. start the mode's process (own session, so its whole tree can be signalled) and a sampler of its
   tree's CPU and RSS every ``sample_interval_s`` (``sampling``);
3. watch the target's high watermarks every ``poll_interval_s`` (``watermarks``) until they add up
   to the source's record count — *wall time* ends there, and the tree's CPU is read at that
   instant (a fresh sample), so idling afterwards is not charged to the mode;
4. latency phase: with the mirror caught up, send ``latency_probes`` probe records to the source's
   latency topic ~50 ms apart; a consumer on the target's copy notes when each arrives. One sample
   = arrival time seen by that consumer - send time written in the probe (both clocks are this
   machine's), i.e. produce + mirror + the watcher's own fetch wait (``fetch.wait.max.ms`` 10).
   The preloaded backlog cannot give latencies: its records were written before the mirror ran;
5. stop the process group (SIGTERM, then SIGKILL after ``stop_timeout_s``), reap it with
   ``wait4`` and write one ``bench_run`` record.

Ctrl-C (or SIGTERM) ends the bench within a second or so: the mode's process group (its own
session, so the terminal's SIGINT never reached it) is killed at once, and the run it cut short is
not recorded, failed or not: the embedded brokers are in the harness's process group and died of
the same Ctrl-C (``interrupts``). A run that outlives ``run_timeout_s`` is stopped and recorded as
timed out.

``mm2`` is MirrorMaker 2 from the Kafka distribution (``modes.mm2``): a JVM with no "ready" line,
so its start-up runs from launch to the first record seen on the target.

Clusters: the given ones (``source_bootstrap``/``target_bootstrap``), else two started by the
harness and stopped by pid at the end (also on Ctrl-C): embedded tansu by default, real Apache
Kafka with ``broker="kafka"`` or a ``kafka_home`` (``shallowmirror.testing.clusters``).

``fetch-only`` has no target: it reads the source to the end, reports the time it got there and
waits to be stopped; the tree's CPU is sampled when that "done" line arrives, as the other modes'
is at catch-up (its interpreter's teardown is not the reading's cost). Bytes moved are the
source's RecordBatch bytes (identical for every mode, so CPU per GB compares like with like);
uncompressed bytes are the record payloads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import psutil

from shallowmirror import __version__, codec
from shallowmirror.bench import load as loader
from shallowmirror.bench import machine, topics
from shallowmirror.bench.interrupts import StopSignalLog
from shallowmirror.bench.matrix import Workload
from shallowmirror.bench.modes import MODULES
from shallowmirror.bench.modes import external as external_mode
from shallowmirror.bench.modes import mm2 as mm2_mode
from shallowmirror.bench.modes import shallow as shallow_mode
from shallowmirror.bench.progress import ProgressBar
from shallowmirror.bench.sampling import ProcessTreeSampler, wait_rusage
from shallowmirror.bench.watermarks import HighWatermarks
from shallowmirror.errors import ShallowMirrorError
from shallowmirror.metrics_schema import BENCH_RUN, MODES, STDERR_TAIL
from shallowmirror.testing.embedded import pid_gone
from shallowmirror.testing.workload import plan_problem

log = logging.getLogger(__name__)

#: How ``_wait_caught_up`` ended.
CAUGHT_UP, EXITED, TIMED_OUT, BROKER_EXITED = "caught-up", "exited", "timed-out", "broker-exited"

LATENCY_METHOD = ("probe records sent to the source latency topic after catch-up; sample = "
                  "arrival seen by a target consumer - send time in the probe")


@dataclass
class BenchConfig:
    workloads: list[Workload]
    modes: list[str]
    repeats: int = 1
    source_bootstrap: str | None = None   # None: clusters started by the harness
    target_bootstrap: str | None = None
    external_cmd: str | None = None
    external_target_topic: str = "{topic}"
    fetch_impl: str = "engine"
    linger_ms: int = 5
    latency_probes: int = 20
    run_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0
    poll_interval_s: float = 0.05
    sample_interval_s: float = 0.1
    progress: bool | None = None          # None: only when stderr is a terminal
    python: str = sys.executable
    mode_args: dict[str, list[str]] = field(default_factory=dict)  # extra args per mode
    shallow_settings: list[str] = field(default_factory=list)  # KEY=VALUE engine settings
    broker: str | None = None             # started clusters: tansu | kafka (None: see flavor())
    kafka_home: str | None = None         # Kafka distribution (else $KAFKA_HOME)

    def flavor(self) -> str:
        """The clusters the harness starts: ``broker``, else kafka when ``kafka_home`` is given,
        else ``$SHALLOWMIRROR_BROKER``, else embedded tansu."""
        from shallowmirror.testing.clusters import broker_flavor

        return broker_flavor(self.broker or ("kafka" if self.kafka_home else None))

    def _kafka_problems(self) -> list[str]:
        from shallowmirror.testing.embedded import BrokerStartError
        from shallowmirror.testing.kafka import find_kafka_home

        try:
            flavor = "given" if self.source_bootstrap else self.flavor()
        except BrokerStartError as err:
            return [str(err)]
        found = []
        if "mm2" in self.modes and flavor == "tansu":
            found.append("mode mm2 runs MirrorMaker 2 between Apache Kafka clusters, not the "
                         "embedded tansu ones: add --kafka-home DIR (or --broker kafka with "
                         "KAFKA_HOME set)")
        elif "mm2" in self.modes or flavor == "kafka":
            try:
                mm2_mode.check_distribution(find_kafka_home(self.kafka_home))
            except (BrokerStartError, mm2_mode.Mm2Unavailable) as err:
                found.append(str(err))
        return found

    def problems(self) -> list[str]:
        """Everything wrong with the configuration, found before any broker starts."""
        found = [f"unknown mode {m!r} (known: {', '.join(MODES)})" for m in self.modes
                 if m not in MODES]
        found += [f"mode {m} is listed {self.modes.count(m)} times in --modes"
                  for m in dict.fromkeys(self.modes) if self.modes.count(m) > 1]
        if "external" in self.modes:
            if not self.external_cmd:
                found.append("mode external needs --external-cmd")
            else:
                found += external_mode.check_template(self.external_cmd)
        if bool(self.source_bootstrap) != bool(self.target_bootstrap):
            found.append("give both source and target bootstrap servers, or neither (embedded)")
        found += _address_problems("--source-bootstrap", self.source_bootstrap)
        found += _address_problems("--target-bootstrap", self.target_bootstrap)
        if self.repeats < 1:
            found.append("repeats must be >= 1")
        if self.latency_probes < 0:
            found.append(f"--latency-probes must be 0 (none) or more, got {self.latency_probes}")
        if not self.run_timeout_s > 0:
            found.append(f"--run-timeout must be more than 0 seconds, got "
                         f"{self.run_timeout_s:g}")
        if self.shallow_settings:
            if "shallow" not in self.modes:
                found.append("--shallow-setting applies to mode shallow, which --modes does not "
                             "run")
            found += shallow_mode.setting_problems(self.shallow_settings)
        if not self.workloads:
            found.append("no workloads")
        for records, value_bytes in sorted({(w.records, w.value_bytes) for w in self.workloads}):
            too_many = plan_problem(records, value_bytes)
            if too_many:
                found.append(f"--records {records:,}: {too_many}")
        return found + self._kafka_problems()


def _address_problems(option: str, bootstrap: str | None) -> list[str]:
    """Bad ``host:port`` entries of a bootstrap list (found before anything connects)."""
    from shallowmirror.net.config import parse_host_port

    found = []
    for entry in bootstrap.split(",") if bootstrap else ():
        try:
            parse_host_port(entry)
        except ValueError as err:
            found.append(f"{option}: {err}")
    return found


class BrokerGone(ShallowMirrorError):
    """A broker the bench started exited during the bench."""


@dataclass
class Clusters:
    source: str
    target: str
    embedded: bool                        # started (and stopped) by the harness
    #: alias -> broker pid, for embedded clusters (their CPU is reported per run).
    broker_pids: dict[str, int] = field(default_factory=dict)
    flavor: str = "given"                 # tansu | kafka | given
    #: Source and target are one cluster (the same address, or the same cluster id under
    #: two addresses): the mirrors write beside the source topic, never onto it.
    same: bool = False
    #: alias -> broker log, for embedded clusters (named when a broker dies).
    broker_logs: dict[str, str] = field(default_factory=dict)

    def gone(self) -> str | None:
        """What is wrong when an embedded cluster's broker has exited (killed, crashed, or
        stopped by a Ctrl-C sent to the bench's process group), else None."""
        for alias, pid in self.broker_pids.items():
            if pid_gone(pid):
                where = self.broker_logs.get(alias)
                return (f"the broker of the {alias} cluster the bench started (pid {pid}) "
                        f"exited" + (f"; its log: {where}" if where else ""))
        return None

    def broker_cpu(self) -> dict[str, float]:
        """alias -> cumulative user+sys CPU seconds of each embedded broker process."""
        out = {}
        for alias, pid in self.broker_pids.items():
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                out[alias] = times.user + times.system
        return out


@contextlib.contextmanager
def clusters_for(config: BenchConfig) -> Iterator[Clusters]:
    """The given clusters, or two started ones (tansu or Kafka) stopped by pid on exit."""
    if config.source_bootstrap:
        source, target = config.source_bootstrap, config.target_bootstrap or ""
        yield Clusters(source, target, False, same=source == target)
        return
    from shallowmirror.testing.clusters import started_clusters

    flavor = config.flavor()
    with started_clusters(flavor, "bench-source", "bench-target",
                          kafka_home=config.kafka_home) as (source, target):
        yield Clusters(source.bootstrap, target.bootstrap, True,
                       {"source": source.pid, "target": target.pid}, flavor,
                       broker_logs={"source": str(source.log_path),
                                    "target": str(target.log_path)})


def run_bench(config: BenchConfig, emit: Callable[[dict], None]) -> list[dict]:
    """Run the whole matrix; ``emit`` gets each ``bench_run`` record as soon as it exists."""
    problems = config.problems()
    if problems:
        raise ValueError("; ".join(problems))
    records: list[dict] = []
    with StopSignalLog() as stops, clusters_for(config) as clusters:
        try:
            _run_matrix(config, clusters, emit, records, stops)
        except Exception as err:
            # An error after a stop signal is that stop (the brokers it stopped, or the
            # interrupt itself disguised by a library): the bench ends as interrupted.
            interrupt = stops.interrupt()
            if interrupt is None:
                raise
            log.debug("after the stop signal", exc_info=err)
            traceback.clear_frames(err.__traceback__)  # its clients close before the brokers
            raise interrupt from None
    return records


def _run_matrix(config: BenchConfig, clusters: Clusters, emit: Callable[[dict], None],
                records: list[dict], stops: StopSignalLog) -> None:
    if not clusters.embedded:
        ids = topics.check_answers({"source": clusters.source, "target": clusters.target})
        if not clusters.same and ids.get("source") and ids["source"] == ids.get("target"):
            # Two addresses of one cluster (localhost and 127.0.0.1): each run re-creates its
            # target topic, which was then the source topic itself, emptied before it was read.
            clusters.same = True
            log.info("source %s and target %s are one cluster (id %s): the mirrors write to "
                     "<topic>.mirror beside the source topic", clusters.source,
                     clusters.target, ids["source"])
    session = uuid.uuid4().hex[:8]
    described = machine.describe()
    for workload in config.workloads:
        topic = f"bench-{workload.workload_id}-{session}"
        bar = ProgressBar(f"load {workload.workload_id}", workload.records,
                          enabled=config.progress)
        source = loader.load(clusters.source, topic, workload,
                             progress=lambda done, _total, bar=bar: bar.update(done))
        bar.close()
        log.info("loaded %s: %d records, %.1f MB compressed (%.2fx), %d batches, %.1fs",
                 topic, source.records, source.compressed_bytes / 1e6,
                 source.uncompressed_bytes / max(source.compressed_bytes, 1), source.batches,
                 source.load_s)
        # Modes interleave within each repeat so slow drift (page cache, broker heap) is
        # spread over all modes instead of favouring whichever ran first.
        for repeat in range(config.repeats):
            for mode in config.modes:
                record = run_once(config, clusters, workload, source, mode, repeat,
                                  machine_info=described, stops=stops)
                stops.check()   # a run a stop signal cut short is not a result
                emit(record)
                records.append(record)
                gone = clusters.gone()
                if gone is not None:     # every run after it would fail the same way
                    raise BrokerGone(f"{gone}: the bench stops ({len(records)} run(s) "
                                     "recorded, the last one failed)")


def run_once(config: BenchConfig, clusters: Clusters, workload: Workload,
             source: loader.LoadedSource, mode: str, repeat: int, *,
             machine_info: dict | None = None, stops: StopSignalLog | None = None) -> dict:
    """One mode, one repeat: returns the ``bench_run`` record (``ok`` false on failure).

    An error after a stop signal noted in ``stops`` is that stop: raised, not recorded."""
    run_id = f"{mode}-{workload.workload_id}-r{repeat}-{uuid.uuid4().hex[:6]}"
    record: dict = {
        "kind": BENCH_RUN, "run_id": run_id, "started_at": time.time(), "mode": mode,
        "repeat": repeat, "workload_id": workload.workload_id, "workload": workload.as_record(),
        "wall_s": None, "cpu_user_s": None, "cpu_sys_s": None, "peak_rss_bytes": None,
        "records": 0, "compressed_bytes": source.compressed_bytes,
        "uncompressed_bytes": source.uncompressed_bytes, "latency_ms_samples": [],
        "progress_samples": [], "rss_samples": [], "ok": False, "error": None,
        "machine": machine_info or machine.describe(), "version": __version__,
        "codec_impl": codec.IMPLEMENTATION,
        # Extra fields (readers ignore what they do not know):
        "source_records": source.records, "source_batches": source.batches,
        "embedded_clusters": clusters.embedded, "cpu_basis": None,
        "latency_method": LATENCY_METHOD, "exit_code": None, "command": None,
        "process_wall_s": None, "process_cpu_s": None, "startup_s": None, "startup_cpu_s": None,
        "broker_cpu_s": None,
    }
    try:
        _run(config, clusters, workload, source, mode, run_id, record, stops)
    except Exception as err:  # noqa: BLE001 - a failed run is a result, recorded with its cause
        if stops is not None:
            stops.check()
        log.warning("run %s failed: %s", run_id, err)
        record["ok"] = False
        record["error"] = record["error"] or f"{type(err).__name__}: {err}"
    return record


def _target_names(config: BenchConfig, clusters: Clusters, mode: str,
                  source: loader.LoadedSource) -> tuple[str, str]:
    if mode == "external":
        main = external_mode.target_topic_of(config.external_target_topic, source.topic)
        if "{" in config.external_target_topic:
            return main, external_mode.target_topic_of(config.external_target_topic,
                                                       source.latency_topic)
        return main, main + "-latency"
    if mode == "mm2":
        return mm2_mode.remote_topic(source.topic), mm2_mode.remote_topic(source.latency_topic)
    suffix = ".mirror" if clusters.same else ""
    return source.topic + suffix, source.latency_topic + suffix


def _command(config: BenchConfig, clusters: Clusters, workload: Workload,
             source: loader.LoadedSource, mode: str, run_id: str,
             target_topic: str, target_latency_topic: str) -> list[str]:
    if mode == "external":
        return external_mode.command(
            config.external_cmd or "", source=clusters.source, target=clusters.target,
            topic=source.topic, target_topic=target_topic, latency_topic=source.latency_topic,
            target_latency_topic=target_latency_topic, group=f"bench-{run_id}")
    cmd = [config.python, "-m", f"shallowmirror.bench.modes.{MODULES[mode]}",
           "--source", clusters.source, "--topic", source.topic,
           "--group", f"bench-{run_id}", "--codec", workload.codec,
           "--batch-bytes", str(workload.batch_bytes), "--linger-ms", str(config.linger_ms)]
    if mode == "fetch-only":
        cmd += ["--records", str(source.records), "--fetch-impl", config.fetch_impl]
    else:
        cmd += ["--target", clusters.target, "--topic", source.latency_topic,
                "--target-suffix", target_topic[len(source.topic):]]
    if mode == "shallow":
        cmd += [arg for setting in config.shallow_settings for arg in ("--setting", setting)]
    return cmd + list(config.mode_args.get(mode, ()))


def _run(config: BenchConfig, clusters: Clusters, workload: Workload,
         source: loader.LoadedSource, mode: str, run_id: str, record: dict,
         stops: StopSignalLog | None = None) -> None:
    mirrors = mode != "fetch-only"
    target_topic, target_latency_topic = _target_names(config, clusters, mode, source)
    record["target_topic"] = target_topic if mirrors else None
    if mirrors:
        topics.recreate(clusters.target, target_topic, workload.partitions)
        topics.recreate(clusters.target, target_latency_topic, 1)
    mm2_run = (mm2_mode.prepare(_kafka_home(config), source=clusters.source,
                                target=clusters.target,
                                topics=[source.topic, source.latency_topic],
                                codec=workload.codec, run_id=run_id)
               if mode == "mm2" else None)
    cmd = mm2_run.command if mm2_run else _command(config, clusters, workload, source, mode,
                                                    run_id, target_topic, target_latency_topic)
    record["command"] = cmd
    stderr_file = tempfile.TemporaryFile(prefix=f"bench-{mode}-")  # noqa: SIM115 - read after exit
    bar = ProgressBar(f"{mode:<17} {workload.codec:<6} r{repeat_of(record)}", source.records,
                      enabled=config.progress)
    watcher: HighWatermarks | _FirstRecord | None = None
    proc: subprocess.Popen | None = None
    sampler: ProcessTreeSampler | None = None
    done_lines: list[dict] = []
    ready: dict = {}
    total_cpu: tuple[float, float] | None = None
    outcome: str | None = None
    interrupted = False
    try:
        # Inside the try: a Ctrl-C while it asks Metadata must still remove MirrorMaker 2's
        # work folder.
        watcher = HighWatermarks(clusters.target, target_topic) if mirrors else None
        brokers_before = clusters.broker_cpu()
        record["started_at"] = time.time()
        t0 = time.monotonic()
        # MirrorMaker 2 logs to stdout: into its console file, not a pipe nobody parses.
        with open(mm2_run.console_path, "wb") if mm2_run else contextlib.nullcontext(
                subprocess.PIPE) as stdout:
            proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr_file,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env=mm2_run.env if mm2_run else None)
        sampler = ProcessTreeSampler(proc.pid, config.sample_interval_s).start()
        reader = threading.Thread(target=_read_events,
                                  args=(proc.stdout, done_lines, sampler, ready), daemon=True)
        if proc.stdout is not None:
            reader.start()
        if mm2_run is not None and watcher is not None:
            watcher = _FirstRecord(watcher, sampler, ready, record)
        outcome = _wait_caught_up(config, proc, watcher, source, record, t0, bar, done_lines,
                                  reader, ready, clusters.gone if clusters.embedded else None)
        if outcome == CAUGHT_UP:
            # The embedded brokers share this machine's CPUs with the mode: what they spent
            # from process start to catch-up tells whether the mode or a broker was the limit.
            after = clusters.broker_cpu()
            record["broker_cpu_s"] = {alias: round(after[alias] - brokers_before[alias], 3)
                                      for alias in after if alias in brokers_before} or None
            # The instant the last record is seen (fetch-only: its "done" line, after which it
            # waits to be stopped): CPU of the tree now, before any idling or teardown.
            if sampler.sample() is not None:
                total_cpu = sampler.cpu()
                record["cpu_basis"] = "tree-sampled-at-catch-up"
            if mirrors and config.latency_probes:
                record["latency_ms_samples"] = _measure_latency(
                    clusters, source.latency_topic, target_latency_topic, run_id,
                    config.latency_probes)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        bar.close()
        # A stop signal may also come out as another error (see ``interrupts``).
        interrupted = interrupted or (stops is not None and stops.received is not None)
        try:
            # Interrupted: killed at once. Its brokers may have died of the same Ctrl-C, and
            # a mode's clean shutdown (a final flush and commit) would wait for them in vain.
            exit_code, rusage = (_stop(proc, config.stop_timeout_s, at_once=interrupted)
                                 if proc else (None, None))
        except KeyboardInterrupt:
            interrupted = True       # during the stop: _stop killed the group before raising
            raise
        finally:
            if sampler is not None:
                sampler.stop()
            if watcher is not None:
                watcher.close()
            if interrupted:
                stderr_file.close()
            if interrupted and mm2_run is not None:
                mm2_run.remove()  # Ctrl-C: MirrorMaker 2 is stopped, its files explain nothing
            elif mm2_run is not None:
                _drop_mm2_topics(clusters, run_id)
    record["exit_code"] = exit_code
    samples = sampler.samples if sampler else []
    start = record["started_at"]
    record["rss_samples"] = [[round(s.time - start, 3), s.rss_bytes] for s in samples]
    # Sampled only: wait4's ru_maxrss is useless here, a child inherits the harness's RSS
    # high-water mark across fork + exec.
    record["peak_rss_bytes"] = (sampler.peak_rss_bytes if sampler else 0) or None
    if total_cpu is None and rusage is not None and record["process_wall_s"] is not None:
        _, user, system, _maxrss = rusage
        sampled_user, sampled_sys = sampler.cpu() if sampler else (0.0, 0.0)
        total_cpu = (max(user, sampled_user), max(system, sampled_sys))
        record["cpu_basis"] = "rusage-at-exit"
    _account(record, total_cpu, ready)
    problems = []
    told_exit = False
    if record["process_wall_s"] is None:
        problems.append(f"not all records arrived ({record['records']}/{source.records})")
        if outcome == TIMED_OUT:
            problems[-1] = (f"timed out after {config.run_timeout_s:g} s (--run-timeout): "
                            f"{problems[-1]}")
        elif outcome == BROKER_EXITED:
            problems[-1] = f"{clusters.gone()}: {problems[-1]}"
            told_exit = True        # stopped by the harness: its status says nothing
        elif outcome == EXITED:
            # Whatever the mode: the command ended before the records were all there, and how
            # it ended is the first thing to know (an external tool's status counts here).
            problems[-1] += f"; the mode's process exited first, with status {exit_code}"
            told_exit = True
    # Our own modes must shut down cleanly; an external tool may exit however it likes on SIGTERM,
    # and a JVM stopped by SIGTERM exits 143 after its shutdown hooks ran. A mode the timeout
    # stopped may die of that SIGTERM (still starting, no handler yet): no news.
    clean_exits = {"external": None, "mm2": (0, 143, None)}.get(mode, (0, None))
    if clean_exits is not None and outcome == TIMED_OUT:
        clean_exits = (*clean_exits, -signal.SIGTERM)
    if clean_exits is not None and exit_code not in clean_exits and not told_exit:
        problems.append(f"mode process exited with status {exit_code}")
    if problems:
        stderr_file.seek(0)
        tail = stderr_file.read()[-2000:].decode(errors="replace").strip()
        if mm2_run is not None:
            tail = (f"{tail}\n{mm2_run.log_tail()}".strip() +
                    f" (MirrorMaker 2 files kept in {mm2_run.work_dir})")
        record["error"] = "; ".join(problems) + (f"{STDERR_TAIL}{tail}" if tail else "")
    elif mm2_run is not None:
        mm2_run.remove()
    stderr_file.close()
    record["ok"] = not problems


def _drop_mm2_topics(clusters: Clusters, run_id: str) -> None:
    """Delete a finished MirrorMaker 2 run's internal topics (31 partitions per cluster and run
    at Connect's defaults), so later runs do not share the brokers with them."""
    for bootstrap in (clusters.source, clusters.target):
        for topic in mm2_mode.internal_topics(run_id).values():
            try:
                topics.delete(bootstrap, topic)
            except Exception as err:  # noqa: BLE001 - leftovers cost broker time, not results
                log.warning("could not delete MirrorMaker 2 topic %s on %s: %s", topic,
                            bootstrap, err)


def _kafka_home(config: BenchConfig) -> str:
    from shallowmirror.testing.kafka import find_kafka_home

    return str(find_kafka_home(config.kafka_home))


class _FirstRecord:
    """A target watcher that marks the mode "ready" when the first record lands on the target.

    For a mode that cannot say when it is ready (MirrorMaker 2's JVM), start-up is from launch
    to the first record: the tree's CPU is sampled at that instant, as at a "ready" line.
    ``startup_records`` says how many records that first look already found (charged to
    start-up time, though moved in steady state; at most one poll interval's worth)."""

    def __init__(self, watcher: HighWatermarks, sampler: ProcessTreeSampler, ready: dict,
                 record: dict) -> None:
        self.watcher, self.sampler, self.ready, self.record = watcher, sampler, ready, record

    def read(self) -> dict[int, int]:
        marks = self.watcher.read()
        if not self.ready and sum(marks.values()) > 0:
            self.sampler.sample()
            self.ready["cpu"] = self.sampler.cpu()
            self.ready["time"] = time.time()
            self.record["startup_records"] = sum(marks.values())
        return marks

    def close(self) -> None:
        self.watcher.close()


def _account(record: dict, total_cpu: tuple[float, float] | None, ready: dict) -> None:
    """Charge the mode from its "ready" event (imports done, clients built) to catch-up.

    Process start-up (Python imports, client construction: ~0.2-0.4 CPU s) is a fixed cost that
    does not grow with the data; it is kept apart in ``startup_s``/``startup_cpu_s`` so CPU per GB
    measures mirroring, and ``process_wall_s``/``process_cpu_s`` keep the whole-process numbers.
    A command without a "ready" event (external) is charged from process start."""
    if record["process_wall_s"] is None or total_cpu is None:
        return
    user, system = total_cpu
    record["process_cpu_s"] = user + system
    if ready and ready["time"] - record["started_at"] < record["process_wall_s"]:
        ready_user, ready_sys = ready["cpu"]
        record["startup_s"] = ready["time"] - record["started_at"]
        record["startup_cpu_s"] = ready_user + ready_sys
        record["wall_s"] = record["process_wall_s"] - record["startup_s"]
        record["cpu_user_s"], record["cpu_sys_s"] = user - ready_user, system - ready_sys
    else:
        record["wall_s"] = record["process_wall_s"]
        record["cpu_user_s"], record["cpu_sys_s"] = user, system


def repeat_of(record: dict) -> int:
    return int(record.get("repeat") or 0)


def _read_events(stream, out: list[dict], sampler: ProcessTreeSampler, ready: dict) -> None:
    """Collect the JSON event lines a mode prints; on "ready" sample the tree's CPU at once."""
    for line in stream:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("event") == "ready" and not ready:
                sampler.sample()
                ready["cpu"] = sampler.cpu()
                ready["time"] = float(event.get("time") or time.time())
            out.append(event)


def ready_s(record: dict, ready: dict) -> float | None:
    """Seconds from process start to the mode's "ready" event, once the reader has seen it."""
    at = ready.get("time")
    return None if at is None else max(0.0, at - record["started_at"])


def _wait_caught_up(config: BenchConfig, proc: subprocess.Popen, watcher: HighWatermarks | None,
                    source: loader.LoadedSource, record: dict, t0: float, bar: ProgressBar,
                    done_lines: list[dict], reader: threading.Thread,
                    ready: dict | None = None,
                    gone: Callable[[], str | None] | None = None) -> str:
    """Poll until every record is on the target (fetch-only: its "done" line): CAUGHT_UP;
    EXITED if the mode's process ended first, BROKER_EXITED if ``gone()`` says a broker the
    bench started did (the mode would wait out its reconnect deadline), TIMED_OUT after
    ``run_timeout_s``."""
    expected = source.records
    per_record = source.compressed_bytes / max(expected, 1)
    deadline = t0 + config.run_timeout_s
    while True:
        now = time.monotonic()
        if watcher is None:  # fetch-only: the mode says when it reached the end
            done = next((e for e in done_lines if e.get("event") == "done"), None)
            if done is not None:
                record["process_wall_s"] = done["time"] - record["started_at"]
                record["records"] = int(done.get("records", 0))
                record["fetch_impl"] = done.get("impl")
                record["progress_samples"].append(
                    [round(record["process_wall_s"], 3), record["records"],
                     int(done.get("bytes") or source.compressed_bytes)])
                bar.update(record["records"])
                return CAUGHT_UP
            if _exited(proc.pid):
                reader.join(1.0)
                if any(e.get("event") == "done" for e in done_lines):
                    continue
                return EXITED
        else:
            total = sum(watcher.read().values())
            seen = time.monotonic()
            record["records"] = total
            # Bytes on the target are estimated from records: deep modes re-batch, so the
            # source's bytes per record are the comparable unit.
            record["progress_samples"].append(
                [round(seen - t0, 3), total, int(total * per_record)])
            elapsed = seen - t0
            # The table's MB/s counts from the mode's "ready" event (start-up excluded): so does
            # the bar, or its last figure would disagree with the table.
            startup_s = ready_s(record, ready or {}) or 0.0
            bar.update(total, f"{total * per_record / 1e6 / max(elapsed - startup_s, 1e-9):7.1f}"
                              " MB/s compressed")
            if total >= expected:
                record["process_wall_s"] = elapsed
                if total > expected:
                    log.warning("%s: %d records on the target, %d expected (duplicates)",
                                record["run_id"], total, expected)
                return CAUGHT_UP
            if _exited(proc.pid):
                return EXITED
        if gone is not None and gone() is not None:
            return BROKER_EXITED
        if now > deadline:
            return TIMED_OUT
        time.sleep(config.poll_interval_s)


def _exited(pid: int) -> bool:
    """True once child ``pid`` has exited, without reaping it (``wait4`` must get its rusage;
    ``Popen.poll`` would reap it and lose that)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _measure_latency(clusters: Clusters, latency_topic: str, target_latency_topic: str,
                     run_id: str, probes: int, spacing_s: float = 0.05,
                     timeout_s: float = 10.0) -> list[float]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    from shallowmirror.mirror.clients import flush_sliced
    from shallowmirror.rdkafka_logs import with_log_config

    # librdkafka's log lines (a broker closing an idle connection...) go to logging, not stderr.
    consumer = producer = None
    samples: list[float] = []
    sent = 0
    finished = False
    try:
        # Built inside the try: Ctrl-C between the two must still close the first.
        consumer = Consumer(with_log_config({
            "bootstrap.servers": clusters.target, "group.id": f"probe-{run_id}",
            "enable.auto.commit": False, "fetch.wait.max.ms": 10, "fetch.error.backoff.ms": 10}))
        consumer.assign([TopicPartition(target_latency_topic, 0, OFFSET_BEGINNING)])
        producer = Producer(with_log_config({"bootstrap.servers": clusters.source,
                                             "linger.ms": 0}))
        # Warm-up probe, not counted: connections, metadata and the consumer's first fetch
        # position would otherwise land in the first sample.
        producer.produce(latency_topic, json.dumps({"run": run_id, "i": -1}).encode(),
                         partition=0)
        flush_sliced(producer, 5)
        deadline = time.monotonic() + timeout_s
        warm = False
        while not warm and time.monotonic() < deadline:
            msg = consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                with contextlib.suppress(ValueError, TypeError):
                    warm = json.loads(msg.value()) == {"run": run_id, "i": -1}
        if not warm:
            finished = True
            return samples  # the mirror does not carry the latency topic (an external tool)
        next_send = time.monotonic()
        deadline = time.monotonic() + timeout_s + probes * spacing_s
        while len(samples) < probes and time.monotonic() < deadline:
            if sent < probes and time.monotonic() >= next_send:
                producer.produce(latency_topic, json.dumps(
                    {"run": run_id, "i": sent, "sent": time.time()}).encode(), partition=0)
                producer.poll(0)
                sent += 1
                next_send += spacing_s
            msg = consumer.poll(0.005)
            if msg is None or msg.error() is not None:
                continue
            arrived = time.time()
            with contextlib.suppress(ValueError, TypeError, KeyError):
                probe = json.loads(msg.value())
                if probe.get("run") == run_id and probe["i"] >= 0:
                    samples.append(round((arrived - probe["sent"]) * 1000, 3))
        finished = True
    finally:
        if producer is not None:   # interrupted: its brokers may be gone, nothing is waited for
            flush_sliced(producer, 5 if finished else 0)
        if consumer is not None:
            consumer.close()
    return samples


def _stop(proc: subprocess.Popen, timeout_s: float, *, at_once: bool = False
          ) -> tuple[int | None, tuple | None]:
    """SIGTERM the mode's process group, SIGKILL if it lingers ``timeout_s`` (``at_once``: no
    SIGTERM, no wait); reap with wait4. Interrupted while waiting, it kills before raising."""
    usage = None
    try:
        if _exited(proc.pid):
            usage = wait_rusage(proc.pid, 0)
        elif not at_once:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            usage = wait_rusage(proc.pid, timeout_s)
    finally:
        if usage is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            usage = wait_rusage(proc.pid, 10.0)
        # Whatever outlived the group leader (an external tool's children) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if usage is not None:
        proc.returncode = usage[0]
    if proc.stdout is not None:
        proc.stdout.close()
    return (usage[0] if usage else None), usage
