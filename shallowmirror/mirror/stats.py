"""Per-partition counters every flow runner (shallow engine or deep path) reports the same way.

The status line and the Prometheus endpoint read ``FlowStats`` snapshots; rates come from the
difference of two snapshots, so runners only count (monotonic totals) and never compute rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PartitionStats:
    """Totals for one source partition of a flow. ``position`` is the next source offset to
    mirror (all below it are acknowledged by the target); -1 when unknown."""

    topic: str
    partition: int
    position: int = -1
    high_watermark: int = -1
    records: int = 0
    batches: int = 0
    bytes: int = 0
    errors: int = 0
    #: Latest end-to-end latency (fetch -> target ack) and age of the newest mirrored record.
    latency_ms: float | None = None
    record_age_ms: float | None = None
    #: Set when the partition is stopped by an error (nothing forwarded past ``position``).
    error: str | None = None

    @property
    def lag(self) -> int | None:
        """Records on the source not yet mirrored, or None while either end is unknown."""
        if self.position < 0 or self.high_watermark < 0:
            return None
        return max(0, self.high_watermark - self.position)


@dataclass
class FlowStats:
    """A snapshot of one flow."""

    flow: str
    mode: str
    partitions: dict[tuple[str, int], PartitionStats] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: Partitions stopped because another instance took them over (exactly-once fencing):
    #: shown, but not counted as stopped by an error (that instance mirrors them).
    taken_over: list[str] = field(default_factory=list)
    #: Latest end-to-end latency measured on mirrored MM2 heartbeats (None: none seen yet).
    heartbeat_latency_ms: float | None = None
    #: Records and bytes mirrored of partitions no runner owns now (revoked, topic deleted) and
    #: by runners replaced after a failure: ``records`` and ``bytes`` stay monotonic totals.
    released_records: int = 0
    released_bytes: int = 0

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions.values()) + self.released_records

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions.values()) + self.released_bytes

    @property
    def lag(self) -> int | None:
        """Lag summed over the partitions where it is known (see ``lag_unknown``)."""
        lags = [p.lag for p in self.partitions.values()]
        known = [x for x in lags if x is not None]
        return sum(known) if known else None

    @property
    def lag_unknown(self) -> int:
        """Partitions whose lag is not known yet: ``lag`` leaves them out, so it is a minimum."""
        return sum(1 for p in self.partitions.values() if p.lag is None)
