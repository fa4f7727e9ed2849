"""Metrics events to a pluggable sink: "flow" records per batch or per interval, "process" records.

The record layouts are ``shallowmirror.metrics_schema`` (the reports read them). A sink is anything
with ``emit(record: dict)`` and ``close()``; ``JsonLinesMetricsSink`` writes one JSON object per
line. ``FlowRecorder`` aggregates acknowledged batches per (topic, partition) over
``metrics.interval.ms`` (0: one record per batch); ``process_record`` samples CPU and RSS;
``EngineMetrics`` is one engine's set of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol, runtime_checkable

import psutil

from shallowmirror import metrics_schema as schema
from shallowmirror.codec.layout import COMPRESSION_NAMES
from shallowmirror.engine.budget import ByteBudget


@runtime_checkable
class MetricsSink(Protocol):
    """Receives metrics records (dicts following ``metrics_schema``)."""

    def emit(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class NullMetricsSink:
    """Discards everything."""

    def emit(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class ListMetricsSink:
    """Keeps records in memory (tests, embedded programs)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def emit(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def close(self) -> None:
        pass


class JsonLinesMetricsSink:
    """Appends one JSON object per line to a file; flushed per record so a crash loses little."""

    def __init__(self, path: str | os.PathLike | IO[str]) -> None:
        self._lock = threading.Lock()
        if hasattr(path, "write"):
            self._file: IO[str] = path            # type: ignore[assignment]
            self._owned = False
        else:
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._owned = True

    def emit(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._owned and not self._file.closed:
                self._file.close()


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def process_record(run_id: str, budget_bytes_in_use: int | None,
                   proc: psutil.Process | None = None) -> dict[str, Any]:
    """A "process" record for this process (children included in the CPU times)."""
    proc = proc or psutil.Process()
    cpu = proc.cpu_times()
    return {
        "kind": schema.PROCESS, "time": time.time(), "run_id": run_id, "pid": proc.pid,
        "cpu_user_s": cpu.user + cpu.children_user, "cpu_sys_s": cpu.system + cpu.children_system,
        "rss_bytes": proc.memory_info().rss, "budget_bytes_in_use": budget_bytes_in_use,
    }


@dataclass
class _Aggregate:
    target_topic: str
    codecs: set
    batches: int = 0
    records: int = 0
    compressed_bytes: int = 0
    latency_sum_ms: float = 0.0
    latency_max_ms: float = 0.0
    offset_lag: int | None = None


class FlowRecorder:
    """Turns acknowledged batches into "flow" records, per batch or per interval aggregate."""

    def __init__(self, sink: MetricsSink, *, run_id: str, flow: str, source_cluster: str,
                 target_cluster: str, interval_s: float, mode: str = "shallow") -> None:
        self.sink = sink
        self.base = {"run_id": run_id, "flow": flow, "source_cluster": source_cluster,
                     "target_cluster": target_cluster, "mode": mode}
        self.interval_s = interval_s
        self._pending: dict[tuple[str, int], _Aggregate] = {}
        self._last_flush = time.monotonic()

    def batch_acked(self, topic: str, partition: int, target_topic: str, *, compression: int,
                    records: int, compressed_bytes: int, latency_ms: float,
                    offset_lag: int | None) -> None:
        key = (topic, partition)
        agg = self._pending.get(key)
        if agg is None:
            agg = self._pending[key] = _Aggregate(target_topic, set())
        agg.codecs.add(compression)
        agg.batches += 1
        agg.records += records
        agg.compressed_bytes += compressed_bytes
        agg.latency_sum_ms += latency_ms
        agg.latency_max_ms = max(agg.latency_max_ms, latency_ms)
        agg.offset_lag = offset_lag
        if self.interval_s <= 0:
            self.flush()

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        now = time.time()
        for (topic, partition), agg in self._pending.items():
            codec = (COMPRESSION_NAMES.get(next(iter(agg.codecs)), "mixed")
                     if len(agg.codecs) == 1 else "mixed")
            self.sink.emit({
                "kind": schema.FLOW, "time": now, **self.base, "topic": topic,
                "partition": partition, "target_topic": agg.target_topic, "codec": codec,
                "batches": agg.batches, "records": agg.records,
                "compressed_bytes": agg.compressed_bytes, "uncompressed_bytes": None,
                "latency_ms": agg.latency_sum_ms / agg.batches,
                "latency_ms_max": agg.latency_max_ms, "offset_lag": agg.offset_lag,
            })
        self._pending.clear()
        self._last_flush = time.monotonic()


class EngineMetrics:
    """One engine's metrics: its flow records (per partition and interval) and process records
    (CPU, RSS, budget in use), written to ``sink`` - or to ``metrics.file`` when no sink is given
    (then this object owns the file and closes it)."""

    def __init__(self, settings: Mapping[str, Any], sink: MetricsSink | None, *, flow: str,
                 source_alias: str, target_alias: str, budget: ByteBudget) -> None:
        self.run_id = new_run_id()
        self.owns_sink = sink is None and bool(settings["metrics.file"])
        if self.owns_sink:
            sink = JsonLinesMetricsSink(settings["metrics.file"])
        self.sink: MetricsSink = sink or NullMetricsSink()
        #: False when records go nowhere: the per-batch bookkeeping is skipped altogether.
        self.recording = not isinstance(self.sink, NullMetricsSink)
        self.budget = budget
        self.interval_s = max(0.2, settings["metrics.interval.ms"] / 1000)
        self.flows = FlowRecorder(
            self.sink, run_id=self.run_id, flow=flow, source_cluster=source_alias,
            target_cluster=target_alias, interval_s=settings["metrics.interval.ms"] / 1000)

    async def run(self, stopping: Callable[[], bool]) -> None:
        """Flush flow records and write a process record every interval (supervised loop)."""
        while not stopping():
            await asyncio.sleep(self.interval_s)
            self.flows.maybe_flush()
            if not isinstance(self.sink, NullMetricsSink):
                self.sink.emit(process_record(self.run_id, self.budget.in_use_bytes))

    def batch_acked(self, batch: Any, sp: Any) -> None:
        """One acknowledged ``FetchedBatch`` of source partition ``sp`` (its lag after it)."""
        lag = None if sp.high_watermark < 0 else max(0, sp.high_watermark - sp.offsets.committed)
        self.flows.batch_acked(
            batch.topic, batch.partition, batch.target_topic or batch.topic,
            compression=batch.compression, records=batch.record_count,
            compressed_bytes=batch.size,
            latency_ms=(time.monotonic() - batch.fetched_at) * 1000, offset_lag=lag)

    def close(self) -> None:
        """Flush what is left, write the last process record, close an owned file."""
        self.flows.flush()
        with contextlib.suppress(Exception):
            self.sink.emit(process_record(self.run_id, self.budget.in_use_bytes))
        if self.owns_sink:
            self.sink.close()
