"""Structured log fields, status lines, the exit summary and the Prometheus collector."""

import json
import logging

from shallowmirror.mirror.logs import ContextFilter, JsonFormatter
from shallowmirror.mirror.prometheus import MirrorCollector
from shallowmirror.mirror.stats import FlowStats, PartitionStats
from shallowmirror.mirror.status import LatencyObserver, StatusReporter, lag_text, summarize


def _record(message: str) -> logging.LogRecord:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, message, (), None)
    ContextFilter().filter(record)
    return record


def test_log_records_get_flow_topic_partition_fields():
    r = _record("flow us-west->us-east: created us-west.orders")
    assert (r.flow, r.topic, r.partition) == ("us-west->us-east", None, None)
    r = _record("cluster A, topic-partition my-orders-12: stopped")
    assert (r.flow, r.topic, r.partition) == (None, "my-orders", 12)
    entry = json.loads(JsonFormatter().format(_record("flow A->B: x topic-partition t-0")))
    assert entry["flow"] == "A->B" and entry["topic"] == "t" and entry["partition"] == 0
    assert entry["level"] == "INFO" and entry["message"].startswith("flow A->B")


def _snap(records: int, nbytes: int, position: int = 90, hw: int = 100) -> FlowStats:
    return FlowStats("A->B", "shallow", {
        ("orders", 0): PartitionStats("orders", 0, position, hw, records, 1, nbytes),
        ("orders", 1): PartitionStats("orders", 1, -1, -1, 0, 0, 0, error="stopped: CRC")})


def test_status_line_rates_and_lag(monkeypatch):
    clock = iter([100.0, 102.0])
    monkeypatch.setattr("shallowmirror.mirror.status.time.monotonic", lambda: next(clock))
    reporter = StatusReporter()
    reporter.lines([_snap(0, 0)])
    snap = _snap(20_000, 4_000_000)
    snap.errors.append("orders-1: stopped: CRC")
    (line,) = reporter.lines([snap])
    # One partition's lag is not known: the sum of the others is a minimum, and says so.
    assert line.startswith("status A->B shallow: 2.0 MB/s, 10,000 records/s, lag at least 10 "
                           "records (1 partition not measured yet), 1 topic/2 partitions")
    assert "1 error(s): orders-1: stopped: CRC" in line


def test_counts_of_one_are_singular():
    summary = summarize([_snap(1, 2_000_000)], wall_s=2.0, cpu_s=0.5, caught_up=True)
    assert summary.text().startswith("mirrored 1 record, ")
    assert ", 1 topic, lag " in summary.text()
    assert lag_text(1, 0) == "1 record" and lag_text(0, 0) == "0 records"


def test_summary_text():
    summary = summarize([_snap(5000, 2_000_000)], wall_s=2.0, cpu_s=0.5, caught_up=True)
    assert summary.records == 5000 and summary.mb_per_s == 1.0
    assert summary.text().startswith("mirrored 5,000 records, 2.0 MB in 2.0 s (1.0 MB/s), "
                                     "CPU 0.5 s — caught up")
    assert json.dumps(summary.as_dict())
    # The start-up (group join) is not mirroring time.
    joined = summarize([_snap(5000, 2_000_000)], wall_s=3.0, cpu_s=0.5, caught_up=True,
                       startup_s=1.0)
    assert joined.text().startswith("mirrored 5,000 records, 2.0 MB in 3.0 s (1.0 MB/s, after "
                                    "1.0 s of start-up), CPU 0.5 s — caught up")
    # Caught up only where it could go on: a stopped partition is said on the first line.
    stopped = _snap(5000, 2_000_000)
    stopped.errors.append("orders-1: stopped: CRC")
    lines = summarize([stopped], wall_s=2.0, cpu_s=0.5, caught_up=True).text().splitlines()
    assert lines[0].endswith("CPU 0.5 s — caught up, except 1 stopped (below)"), lines
    assert lines[1].endswith(" on what is mirrored (1 stopped, below)"), lines
    assert lines[-1] == "    error: orders-1: stopped: CRC", lines


def test_a_partition_taken_over_is_shown_but_not_stopped():
    """Fenced by another instance (exactly-once): listed apart, not counted as stopped, so it
    does not make the exit status 1."""
    snap = _snap(5000, 2_000_000)
    snap.taken_over.append("orders-1: another mirror instance took source partition orders-1")
    summary = summarize([snap], wall_s=2.0, cpu_s=0.5, caught_up=True)
    lines = summary.text().splitlines()
    assert summary.stopped == 0 and lines[0].endswith("— caught up"), lines
    assert lines[-1] == ("    taken over: orders-1: another mirror instance took source "
                         "partition orders-1"), lines


def test_prometheus_collector_uses_mm2_names():
    observer = LatencyObserver()
    observer.emit({"kind": "flow", "flow": "A->B", "topic": "orders", "partition": 0,
                   "latency_ms": 12.5})
    collector = MirrorCollector(lambda: [_snap(7, 700)], lambda: observer.latency_ms)
    families = {f.name: f for f in collector.collect()}
    assert set(families) >= {"shallowmirror_record_count", "shallowmirror_byte_count",
                             "shallowmirror_byte_rate", "shallowmirror_replication_latency_ms",
                             "shallowmirror_record_age_ms", "shallowmirror_offset_lag"}

    def value(name, partition="0"):
        (sample,) = [s for s in families[name].samples
                     if s.labels.get("partition") == partition and not s.name.endswith(
                         "_created")]
        return sample.value, sample.labels

    count, labels = value("shallowmirror_record_count")
    assert count == 7 and labels == {"source": "A", "target": "B", "topic": "orders",
                                     "partition": "0"}
    assert value("shallowmirror_replication_latency_ms")[0] == 12.5
    assert value("shallowmirror_offset_lag")[0] == 10
    assert value("shallowmirror_partition_stopped", "1")[0] == 1


def test_heartbeat_latency_on_the_status_line_and_in_prometheus():
    snap = _snap(7, 700)
    assert "heartbeat latency" not in StatusReporter().lines([snap])[0]
    snap.heartbeat_latency_ms = 42.0
    assert ", 7 records mirrored, heartbeat latency 42 ms" in StatusReporter().lines([snap])[0]
    families = {f.name: f for f in MirrorCollector(lambda: [snap]).collect()}
    (sample,) = families["shallowmirror_heartbeat_latency_ms"].samples
    assert (sample.value, sample.labels) == (42.0, {"source": "A", "target": "B"})
