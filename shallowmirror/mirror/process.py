"""The running mirror process: every flow, signals, status line, metrics, exit.

Lifecycle::

    start flows (each: topic sync + runners)   status line every status.interval.seconds
    SIGTERM/SIGINT -> stop: runners finish in-flight batches and commit, flows end, exit 0
    second signal  -> exit at once (offsets of in-flight batches are not committed)
    --exit-when-caught-up -> stop once every flow mirrored its topics to their high watermarks
    a flow failing with abort.on.send.failure -> stop everything, exit 1

The process writes one summary at exit (records, MB, MB/s, CPU), on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shallowmirror.engine.process_tuning import tune_for_mirroring
from shallowmirror.mirror.config import MirrorConfig
from shallowmirror.mirror.flows import FlowFailedError, FlowRunner
from shallowmirror.mirror.stats import FlowStats
from shallowmirror.mirror.status import (
    LatencyObserver,
    StatusReporter,
    Summary,
    cpu_seconds,
    summarize,
)
from shallowmirror.output_paths import file_problem

log = logging.getLogger(__name__)
status_log = logging.getLogger("shallowmirror.status")


@dataclass
class ProcessOptions:
    """Run-time options from the command line (they override the config file)."""

    exit_when_caught_up: bool = False
    caught_up_timeout_s: float | None = None
    status_interval_s: float | None = None
    prometheus_port: int | None = None
    metrics_file: str | None = None
    summary_json: str | None = None


class MirrorProcess:
    """All flows of one configuration in one asyncio loop."""

    def __init__(self, config: MirrorConfig, options: ProcessOptions | None = None):
        self.config = config
        self.options = options or ProcessOptions()
        p = config.process
        self.status_interval_s = self.options.status_interval_s \
            if self.options.status_interval_s is not None else p.get("status.interval.seconds",
                                                                     30.0)
        self.prometheus_port = self.options.prometheus_port \
            if self.options.prometheus_port is not None else p.get("prometheus.port")
        self.metrics_file = self.options.metrics_file or p.get("metrics.file")
        self.stop = asyncio.Event()
        self.flows: list[FlowRunner] = []
        self.caught_up = False
        self.exit_code = 0
        self._signals = 0
        self.observer = LatencyObserver()

    # -- helpers ---------------------------------------------------------------------------------

    def snapshots(self) -> list[FlowStats]:
        out = []
        for flow in self.flows:
            try:
                out.append(flow.stats())
            except Exception as err:  # noqa: BLE001 - observing must never break the mirror
                log.debug("stats of %s failed: %s", flow.name, err)
        return out

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            log.info("%s received: stopping — finishing in-flight batches and committing "
                     "offsets (send it again to exit at once)", name)
            self.stop.set()
        else:
            log.warning("%s received again: exiting now; offsets of in-flight batches are not "
                        "committed (they will be mirrored again)", name)
            os._exit(130)

    def _open_sink(self) -> None:
        if not self.metrics_file:
            return
        try:
            from shallowmirror.engine.metrics import JsonLinesMetricsSink
        except ImportError:  # pragma: no cover
            from shallowmirror.engine import JsonLinesMetricsSink
        from shallowmirror.errors import ConfigError

        problem = file_problem(self.metrics_file, "metrics.file", make_parent=True)
        if problem:
            raise ConfigError(problem)
        self.observer.inner = JsonLinesMetricsSink(self.metrics_file)
        log.info("metrics events appended to %s", self.metrics_file)

    def _check_summary_path(self) -> None:
        """--summary-json is written at exit: find out now, not after the run, that it cannot
        be (the file is created empty here)."""
        path = self.options.summary_json
        problem = path and file_problem(path, "--summary-json", make_parent=True)
        if problem:
            from shallowmirror.errors import ConfigError

            raise ConfigError(problem)

    # -- loops -----------------------------------------------------------------------------------

    async def _status_loop(self) -> None:
        reporter = StatusReporter()
        reporter.lines(self.snapshots())  # the baseline for the first rates
        while not self.stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.status_interval_s)
            if self.stop.is_set():
                return
            states = {f.name: f.waiting_for() or f.state for f in self.flows}
            snapshots = self.snapshots()
            for snap, line in zip(snapshots, reporter.lines(snapshots, states), strict=True):
                status_log.info("%s", line, extra={"flow": snap.flow})

    async def _caught_up_loop(self) -> None:
        started = time.monotonic()
        timeout = self.options.caught_up_timeout_s
        while not self.stop.is_set():
            empty = [reason for f in self.flows if (reason := f.nothing_to_mirror())]
            if empty:
                for reason in empty:
                    log.error("%s; stopping, not caught up", reason)
                self.exit_code = 1
                self.stop.set()
                return
            checks = [await f.caught_up(started) for f in self.flows]
            if self.flows and all(checks):
                self.caught_up = True
                log.info("all flows caught up: stopping")
                self.stop.set()
                return
            if timeout is not None and time.monotonic() - started > timeout:
                lagging = [f.name for f, ok in zip(self.flows, checks, strict=True) if not ok]
                log.error("not caught up within %gs (flows %s): stopping", timeout,
                          ", ".join(lagging))
                self.exit_code = 1
                self.stop.set()
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.5)

    async def _run_flow(self, flow: FlowRunner) -> None:
        try:
            await flow.run(self.stop)
        except FlowFailedError as err:
            log.error("%s; stopping the process", err)
            self.exit_code = 1
            self.stop.set()
        except Exception as err:
            log.exception("flow %s stopped unexpectedly: %s", flow.name, err)
            self.exit_code = 1
            self.stop.set()

    async def _start_heartbeats(self) -> list[asyncio.Task]:
        """One emitter task per heartbeat pair (they stop with the process). Their topics are
        created first (for at most 10 s), so that the flows' first topic listing sees them."""
        from shallowmirror.replication.heartbeats import HeartbeatEmitter

        emitters = [HeartbeatEmitter(pair) for pair in self.config.heartbeat_pairs]
        if not emitters:
            return []
        log.info("heartbeats: emitting %s", ", ".join(
            f"{p.name} to cluster {p.target}" for p in self.config.heartbeat_pairs))
        await asyncio.wait([asyncio.create_task(e.prepare()) for e in emitters], timeout=10)
        return [asyncio.create_task(e.run(self.stop)) for e in emitters]

    # -- main ------------------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until stopped; the process exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._on_signal, sig)
        started, cpu0 = time.monotonic(), cpu_seconds()
        self._open_sink()
        self._check_summary_path()
        self.flows = [FlowRunner(f, metrics_sink=self.observer) for f in self.config.flows]
        server = None
        if self.prometheus_port is not None:
            from shallowmirror.mirror.prometheus import MirrorCollector, start_endpoint

            server = start_endpoint(int(self.prometheus_port),
                                    MirrorCollector(self.snapshots,
                                                    lambda: self.observer.latency_ms))
        log.info("shallowmirror: flows %s", ", ".join(
            f"{f.name} ({'shallow' if f.shallow else 'deep'})" for f in self.config.flows))
        helpers = await self._start_heartbeats()
        if self.status_interval_s and self.status_interval_s > 0:
            helpers.append(asyncio.create_task(self._status_loop()))
        if self.options.exit_when_caught_up:
            helpers.append(asyncio.create_task(self._caught_up_loop()))
        try:
            await asyncio.gather(*(self._run_flow(f) for f in self.flows))
        finally:
            self.stop.set()
            for task in helpers:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            if server is not None:
                with contextlib.suppress(Exception):
                    server.shutdown()
            with contextlib.suppress(Exception):
                self.observer.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)
        if any(f.unclean for f in self.flows):
            self.exit_code = self.exit_code or 1
        for flow in self.flows:
            if flow.never_started:
                # Stopped (a signal, most often) before the flow could start: not a success.
                log.error("flow %s: stopped before it could start, %s; nothing was mirrored",
                          flow.name, flow.never_started)
                self.exit_code = self.exit_code or 1
            elif (joining := flow.stopped_before_mirroring()) is not None:
                # A normal phase, not a failure (the exit status stays), but say why nothing
                # was mirrored: the summary alone read like a run that found nothing to do.
                log.warning("flow %s: stopped %s; nothing was mirrored yet", flow.name, joining)
        mirroring = [f.mirroring_since for f in self.flows if f.mirroring_since is not None]
        summary = summarize(self.snapshots(), wall_s=time.monotonic() - started,
                            cpu_s=cpu_seconds() - cpu0, caught_up=self.caught_up,
                            startup_s=min(mirroring) - started if mirroring else None)
        if summary.stopped:
            # What stopped with an error was not mirrored, whether the rest caught up or a
            # signal ended the run: a service manager must see the run as failed, not clean.
            ending = "caught up" if summary.caught_up else "stopped"
            log.error("%s except %d stopped %s (errors above and in the summary): their "
                      "records past the position shown were not mirrored; exiting with status 1",
                      ending, summary.stopped,
                      "partition or topic" if summary.stopped == 1 else "partitions or topics")
            self.exit_code = self.exit_code or 1
        self._report(summary)
        return self.exit_code

    def _report(self, summary: Summary) -> None:
        print(summary.text(), flush=True)
        if self.options.summary_json:
            try:
                Path(self.options.summary_json).write_text(
                    json.dumps(summary.as_dict(), indent=2))
            except OSError as err:    # it was writable at start: say so, keep the exit status
                log.error("--summary-json %s: cannot write the summary (%s)",
                          self.options.summary_json, err.strerror or err)


def run_process(config: MirrorConfig, options: ProcessOptions | None = None) -> int:
    """Run a mirror process to completion (blocking)."""
    tune_for_mirroring()
    process: dict[str, Any] = {}

    async def main() -> int:
        process["p"] = MirrorProcess(config, options)
        return await process["p"].run()

    return asyncio.run(main())
