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


class AckTally:
    """One source partition's acknowledged batches since the last flow record: what the record
    sums. The engine's native acknowledgement loop adds to it at its slots
    (``native/_cloops.pyx``; the partition's ``ack_tally``), ``FlowRecorder.batch_acked`` for
    the batches that loop hands back. ``codecs`` is a bit mask of compression codes."""

    __slots__ = ("target_topic", "codecs", "batches", "records", "compressed_bytes",
                 "latency_sum_ms", "latency_max_ms", "offset_lag")

    def __init__(self, target_topic: str) -> None:
        self.target_topic = target_topic
        self.reset()

    def reset(self) -> None:
        self.codecs = 0
        self.batches = self.records = self.compressed_bytes = 0
        self.latency_sum_ms = self.latency_max_ms = 0.0
        self.offset_lag: int | None = None

    def add(self, compression: int, records: int, compressed_bytes: int, latency_ms: float,
            offset_lag: int | None) -> None:
        self.codecs |= 1 << compression
        self.batches += 1
        self.records += records
        self.compressed_bytes += compressed_bytes
        self.latency_sum_ms += latency_ms
        self.latency_max_ms = max(self.latency_max_ms, latency_ms)
        self.offset_lag = offset_lag

    @property
    def codec(self) -> str:
        """The codec's name, or "mixed" for several."""
        codes = [code for code in range(8) if self.codecs >> code & 1]
        return COMPRESSION_NAMES.get(codes[0], "mixed") if len(codes) == 1 else "mixed"


class FlowRecorder:
    """Turns acknowledged batches into "flow" records, per batch or per interval aggregate."""

    def __init__(self, sink: MetricsSink, *, run_id: str, flow: str, source_cluster: str,
                 target_cluster: str, interval_s: float, mode: str = "shallow") -> None:
        self.sink = sink
        self.base = {"run_id": run_id, "flow": flow, "source_cluster": source_cluster,
                     "target_cluster": target_cluster, "mode": mode}
        self.interval_s = interval_s
        #: Kept across flushes (reset in place): the engine's partitions hold them.
        self._tallies: dict[tuple[str, int], AckTally] = {}
        self._last_flush = time.monotonic()

    @property
    def per_interval(self) -> bool:
        """Whether batches are summed per interval (else one record per batch): then the
        engine's native loop may add to the tallies itself."""
        return self.interval_s > 0

    def tally(self, topic: str, partition: int, target_topic: str) -> AckTally:
        """The tally of source partition ``topic``/``partition`` (its records name
        ``target_topic``, the topic its first batch went to: a flow's mapping is fixed)."""
        tally = self._tallies.get((topic, partition))
        if tally is None:
            tally = self._tallies[(topic, partition)] = AckTally(target_topic)
        return tally

    def batch_acked(self, topic: str, partition: int, target_topic: str, *, compression: int,
                    records: int, compressed_bytes: int, latency_ms: float,
                    offset_lag: int | None) -> None:
        self.tally(topic, partition, target_topic).add(
            compression, records, compressed_bytes, latency_ms, offset_lag)
        if self.interval_s <= 0:
            self.flush()

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        now = time.time()
        for (topic, partition), tally in self._tallies.items():
            if not tally.batches:
                continue
            self.sink.emit({
                "kind": schema.FLOW, "time": now, **self.base, "topic": topic,
                "partition": partition, "target_topic": tally.target_topic,
                "codec": tally.codec, "batches": tally.batches, "records": tally.records,
                "compressed_bytes": tally.compressed_bytes, "uncompressed_bytes": None,
                "latency_ms": tally.latency_sum_ms / tally.batches,
                "latency_ms_max": tally.latency_max_ms, "offset_lag": tally.offset_lag,
            })
            tally.reset()
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

    @property
    def tallied(self) -> bool:
        """Whether the engine's native acknowledgement loop may add to the partitions' tallies
        itself: records go somewhere, summed per interval."""
        return self.recording and self.flows.per_interval

    def tally_of(self, batch: Any) -> AckTally:
        """The tally of ``batch``'s source partition (for its ``ack_tally``)."""
        return self.flows.tally(batch.topic, batch.partition, batch.target_topic or batch.topic)

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
