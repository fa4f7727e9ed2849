"""The periodic status line, the latency observer on the metrics stream, and the exit summary.

Status line, one per flow, rates over the last interval::

    status A->B shallow: 48.2 MB/s, 251,300 records/s, lag 12,000 records, 3 topics/9 partitions
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shallowmirror.mirror.stats import FlowStats

_MB = 1_000_000


class LatencyObserver:
    """A metrics sink wrapper: forwards every record and remembers the latest replication
    latency per (flow, topic, partition) from the engine's ``flow`` records."""

    def __init__(self, inner: Any = None):
        self.inner = inner
        self.latency_ms: dict[tuple[str, str, int], float] = {}
        # Deep runners emit from their worker threads: one line at a time into the file.
        self._lock = threading.Lock()

    def emit(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "flow" and record.get("latency_ms") is not None:
            key = (record.get("flow"), record.get("topic"), record.get("partition"))
            self.latency_ms[key] = float(record["latency_ms"])  # type: ignore[index]
        if self.inner is not None:
            with self._lock:
                self.inner.emit(record)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


@dataclass
class _Mark:
    time: float
    records: int
    bytes: int


class StatusReporter:
    """Turns successive ``FlowStats`` snapshots into status lines."""

    def __init__(self) -> None:
        self._last: dict[str, _Mark] = {}

    def lines(self, snapshots: Sequence[FlowStats], states: dict[str, str] | None = None
              ) -> list[str]:
        now = time.monotonic()
        out = []
        for snap in snapshots:
            last = self._last.get(snap.flow)
            self._last[snap.flow] = _Mark(now, snap.records, snap.bytes)
            if last is None or now <= last.time:
                mbps = rps = 0.0
            else:
                dt = now - last.time
                mbps = (snap.bytes - last.bytes) / dt / _MB
                rps = (snap.records - last.records) / dt
            topics = {t for t, _p in snap.partitions}
            state = (states or {}).get(snap.flow, "")
            line = (f"status {snap.flow} {snap.mode}: {mbps:.1f} MB/s, {rps:,.0f} records/s, "
                    f"lag {lag_text(snap.lag, snap.lag_unknown)}, "
                    f"{counted(len(topics), 'topic')}/{counted(len(snap.partitions), 'partition')}, "
                    f"{counted(snap.records, 'record')} mirrored")
            if snap.heartbeat_latency_ms is not None:
                line += f", heartbeat latency {snap.heartbeat_latency_ms:,.0f} ms"
            if state and state != "running":
                line += f" [{state}]"
            if snap.errors:
                line += f"; {len(snap.errors)} error(s): " + "; ".join(snap.errors[:3])
            out.append(line)
        return out


def lag_text(lag: int | None, unknown: int) -> str:
    """``12,000 records``, ``at least 12,000 records (2 partitions not measured yet)`` or
    ``unknown``: a partial sum is never shown as if it were the whole lag."""
    if lag is None:
        return "unknown"
    if unknown:
        return (f"at least {counted(lag, 'record')} ({counted(unknown, 'partition')} not "
                "measured yet)")
    return counted(lag, "record")


def counted(n: int, noun: str) -> str:
    """``1 topic``, ``3 topics``, ``12,000 records``."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def cpu_seconds() -> float:
    """User + system CPU of this process and its reaped children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass
class Summary:
    """What a run did, printed at exit (and written as JSON on request)."""

    flows: dict[str, dict[str, Any]]
    records: int
    bytes: int
    wall_s: float
    cpu_s: float
    caught_up: bool
    #: Seconds from start until the first partitions were mirrored (connect, group join).
    startup_s: float | None = None

    @property
    def mb_per_s(self) -> float:
        """MB/s while mirroring: the start-up (group join) is not mirroring time."""
        busy_s = self.wall_s - (self.startup_s or 0.0)
        return self.bytes / _MB / busy_s if busy_s > 0 else 0.0

    def text(self) -> str:
        startup = (f", after {self.startup_s:.1f} s of start-up"
                   if self.startup_s is not None else "")
        lines = [f"mirrored {counted(self.records, 'record')}, {self.bytes / _MB:.1f} MB in "
                 f"{self.wall_s:.1f} s ({self.mb_per_s:.1f} MB/s{startup}), CPU "
                 f"{self.cpu_s:.1f} s" + self._caught_up_text()]
        for name, f in self.flows.items():
            # The shallow path counts batch bytes as stored; the deep path key + value bytes.
            kind = "compressed" if f["mode"] == "shallow" else "uncompressed"
            lag = lag_text(f["lag"], f["lag_unknown"])
            if f["errors"]:
                # What stopped is not in it: "lag 0" beside a topic never mirrored misled.
                lag += f" on what is mirrored ({len(f['errors'])} stopped, below)"
            lines.append(f"  {name} ({f['mode']}): {counted(f['records'], 'record')}, "
                         f"{f['bytes'] / _MB:.1f} MB {kind}, {counted(f['topics'], 'topic')}, lag "
                         f"{lag}")
            lines += [f"    error: {e}" for e in f["errors"]]
            lines += [f"    taken over: {e}" for e in f["taken_over"]]
        return "\n".join(lines)

    @property
    def stopped(self) -> int:
        """Partitions and topics stopped by an error (their records were not mirrored)."""
        return sum(len(f["errors"]) for f in self.flows.values())

    def _caught_up_text(self) -> str:
        if not self.caught_up:
            return ""
        stopped = self.stopped
        return f" — caught up, except {stopped} stopped (below)" if stopped else " — caught up"

    def as_dict(self) -> dict[str, Any]:
        return {"flows": self.flows, "records": self.records, "bytes": self.bytes,
                "wall_s": self.wall_s, "cpu_s": self.cpu_s, "mb_per_s": self.mb_per_s,
                "startup_s": self.startup_s, "caught_up": self.caught_up}


def summarize(snapshots: Sequence[FlowStats], *, wall_s: float, cpu_s: float,
              caught_up: bool, startup_s: float | None = None) -> Summary:
    flows = {s.flow: {"mode": s.mode, "records": s.records, "bytes": s.bytes, "lag": s.lag,
                      "lag_unknown": s.lag_unknown, "topics": len({t for t, _p in s.partitions}),
                      "errors": list(s.errors), "taken_over": list(s.taken_over)}
             for s in snapshots}
    return Summary(flows, sum(s.records for s in snapshots), sum(s.bytes for s in snapshots),
                   wall_s, cpu_s, caught_up, startup_s)
