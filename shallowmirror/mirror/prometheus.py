"""Optional Prometheus endpoint with MirrorMaker 2's metric names where they exist.

MM2 (MirrorSourceConnector, per target/topic/partition) -> here (labels source, target, topic,
partition; Prometheus forbids ``-`` so it becomes ``_``):

    record-count            shallowmirror_record_count_total      counter
    byte-count              shallowmirror_byte_count_total        counter
    byte-rate               shallowmirror_byte_rate               gauge, bytes/s since last scrape
    replication-latency-ms  shallowmirror_replication_latency_ms  gauge, latest fetch -> target ack
    record-age-ms           shallowmirror_record_age_ms           gauge, deep path only (the
                                                                  shallow path never decodes
                                                                  record timestamps)
    (none)                  shallowmirror_offset_lag              gauge, source HW - mirrored
    (none)                  shallowmirror_partition_stopped       gauge, 1 when stopped by error
    (none)                  shallowmirror_heartbeat_latency_ms    gauge per flow (labels source,
                                                                  target): heartbeat written on
                                                                  the source -> read on the
                                                                  target (emit.heartbeats.enabled)

Values are read from the flows at scrape time; nothing is pushed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from shallowmirror.errors import ConfigError
from shallowmirror.mirror.stats import FlowStats

log = logging.getLogger(__name__)

LABELS = ["source", "target", "topic", "partition"]


class MirrorCollector:
    """A prometheus-client collector over ``snapshots()`` and the latency observer."""

    def __init__(self, snapshots: Callable[[], Sequence[FlowStats]],
                 latency_ms: Callable[[], dict] | None = None):
        self.snapshots = snapshots
        self.latency_ms = latency_ms or (lambda: {})
        self._last: dict[tuple, tuple[float, int]] = {}

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        records = CounterMetricFamily("shallowmirror_record_count",
                                      "Records mirrored (MM2 record-count)", labels=LABELS)
        nbytes = CounterMetricFamily("shallowmirror_byte_count",
                                     "Bytes mirrored, as stored (MM2 byte-count)", labels=LABELS)
        rate = GaugeMetricFamily("shallowmirror_byte_rate",
                                 "Bytes/s since the previous scrape (MM2 byte-rate)",
                                 labels=LABELS)
        latency = GaugeMetricFamily("shallowmirror_replication_latency_ms",
                                    "Latest fetch-to-ack latency (MM2 replication-latency-ms)",
                                    labels=LABELS)
        age = GaugeMetricFamily("shallowmirror_record_age_ms",
                                "Age of the newest mirrored record (MM2 record-age-ms)",
                                labels=LABELS)
        lag = GaugeMetricFamily("shallowmirror_offset_lag",
                                "Source high watermark minus mirrored position", labels=LABELS)
        stopped = GaugeMetricFamily("shallowmirror_partition_stopped",
                                    "1 when the partition is stopped by an error",
                                    labels=LABELS)
        heartbeat = GaugeMetricFamily("shallowmirror_heartbeat_latency_ms",
                                      "Latest end-to-end latency of a mirrored MM2 heartbeat",
                                      labels=["source", "target"])
        now = time.monotonic()
        latencies = self.latency_ms()
        for snap in self.snapshots():
            source, _, target = snap.flow.partition("->")
            if snap.heartbeat_latency_ms is not None:
                heartbeat.add_metric([source, target], snap.heartbeat_latency_ms)
            for (topic, partition), p in snap.partitions.items():
                labels = [source, target, topic, str(partition)]
                records.add_metric(labels, p.records)
                nbytes.add_metric(labels, p.bytes)
                key = (snap.flow, topic, partition)
                prev = self._last.get(key)
                if prev is not None and now > prev[0]:
                    rate.add_metric(labels, max(0.0, (p.bytes - prev[1]) / (now - prev[0])))
                self._last[key] = (now, p.bytes)
                value = latencies.get(key, p.latency_ms)
                if value is not None:
                    latency.add_metric(labels, value)
                if p.record_age_ms is not None:
                    age.add_metric(labels, p.record_age_ms)
                if p.lag is not None:
                    lag.add_metric(labels, p.lag)
                stopped.add_metric(labels, 1 if p.error else 0)
        yield from (records, nbytes, rate, latency, age, lag, stopped, heartbeat)


def start_endpoint(port: int, collector: MirrorCollector, addr: str = "0.0.0.0") -> Any:
    """Serve /metrics on ``port`` in a daemon thread; the server object (``.shutdown()``)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as err:
        raise ConfigError("prometheus.port needs prometheus-client: "
                          "pip install 'shallowmirror[prometheus]'") from err
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        result = start_http_server(port, addr=addr, registry=registry)
    except OSError as err:
        raise ConfigError(f"prometheus.port {port}: cannot listen ({err.strerror})") from err
    log.info("Prometheus metrics on http://%s:%d/metrics", addr, port)
    return result[0] if isinstance(result, tuple) else result
