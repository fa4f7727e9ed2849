"""Engine processes: kill -9 at random moments with restarts (no loss, bounded duplicates), and two
processes sharing one group (split, then failover with no loss)."""

from __future__ import annotations

import random
import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from engine_support import create_target, engine_process, group, load_topic, raw_batches

from shallowmirror.testing.topics import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _end_offsets(cluster, topic) -> dict[int, int]:
    return {p: (bs[-1].base_offset + bs[-1].record_count if bs else 0)
            for p, bs in raw_batches(cluster, topic).items()}


def _committed(cluster, g: str, topic: str, partitions) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": g})
    try:
        got = c.committed([TopicPartition(topic, p) for p in partitions], timeout=20)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


def _wait_committed(cluster, g, topic, ends, timeout_s=120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _committed(cluster, g, topic, ends) == ends:
            return
        time.sleep(0.5)
    raise AssertionError(f"group {g} did not commit {ends}: {_committed(cluster, g, topic, ends)}")


def _wait_ready(proc) -> None:
    line = proc.stdout.readline().decode()
    assert line.startswith("engine ready"), f"engine process said {line!r}"


def _check_no_loss(source_cluster, target_cluster, topic) -> int:
    """Every source record on the target, in order once duplicates are removed; return the
    number of duplicates."""
    source = read_topic(source_cluster.client_config(), topic)
    target = read_topic(target_cluster.client_config(), topic)
    duplicates = 0
    for p, src in source.items():
        key = [(r.key, r.value, r.timestamp_ms) for r in src]
        got = [(r.key, r.value, r.timestamp_ms) for r in target.get(p, [])]
        seen, dedup = set(), []
        for item in got:
            if item in seen:
                duplicates += 1
                continue
            seen.add(item)
            dedup.append(item)
        assert dedup == key, f"partition {p}: records lost or reordered"
        assert max(Counter(got).values(), default=1) <= 11
    return duplicates


def test_kill_9_at_random_moments_loses_nothing(source_cluster, target_cluster, unique_topic,
                                                tmp_path: Path):
    topic = unique_topic("kill")
    load_topic(source_cluster, topic, 200_000, codec="lz4", partitions=8, batch_bytes=16_000)
    create_target(target_cluster, topic)
    g = group()
    settings = {"partition.assignment": "all", "group.id": g, "offset.commit.interval.ms": 100,
                "buffer.memory": 65536, "fetch.max.bytes": 16384,
                "max.partition.fetch.bytes": 4096, "max.request.size": 65536, "fetch.max.wait.ms": 100}
    rng = random.Random(20261121)
    ends = _end_offsets(source_cluster, topic)
    total = sum(ends.values())
    kills, progress = 0, []
    for _ in range(10):
        proc = engine_process(source_cluster, target_cluster, [topic], settings,
                              str(tmp_path / "engine.log"))
        try:
            _wait_ready(proc)
            time.sleep(rng.uniform(0.05, 0.5))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            proc.stdout.close()
        kills += 1
        committed = _committed(source_cluster, g, topic, ends)
        progress.append(sum(max(0, o) for o in committed.values()))
    proc = engine_process(source_cluster, target_cluster, [topic], settings,
                          str(tmp_path / "engine.log"))
    try:
        _wait_ready(proc)
        _wait_committed(source_cluster, g, topic, _end_offsets(source_cluster, topic))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        proc.stdout.close()
    duplicates = _check_no_loss(source_cluster, target_cluster, topic)
    print(f"\ncommitted after each kill: {progress} of {total}")
    assert sum(1 for p in progress if p < total) >= 5, "most kills should land mid-run"
    print(f"kill -9 x{kills}: no record lost; {duplicates} duplicate records "
          f"(re-sent from the unacknowledged window after each kill)")


def test_two_processes_split_partitions_and_fail_over(source_cluster, target_cluster,
                                                      unique_topic, tmp_path: Path):
    topic = unique_topic("group")
    load_topic(source_cluster, topic, 20_000, codec="zstd", partitions=8)
    create_target(target_cluster, topic)
    g = group()
    settings = {"partition.assignment": "group", "group.id": g, "session.timeout.ms": 6000,
                "offset.commit.interval.ms": 200, "fetch.max.wait.ms": 100}
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [engine_process(source_cluster, target_cluster, [topic], settings, str(log))
             for log in logs]
    try:
        for proc in procs:
            _wait_ready(proc)
        deadline = time.monotonic() + 60
        split = None
        while time.monotonic() < deadline:
            last = []
            for log in logs:
                found = re.findall(r"group \S+ assigned (\d+) partitions", log.read_text())
                last.append(int(found[-1]) if found else 0)
            if last == [4, 4]:
                split = last
                break
            time.sleep(0.3)
        assert split == [4, 4], f"partitions not split between the two engines: {last}"
        _wait_committed(source_cluster, g, topic, _end_offsets(source_cluster, topic))
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        load_topic(source_cluster, topic, 10_000, codec="zstd", partitions=8,
                   create_topic=False, seed=3)
        _wait_committed(source_cluster, g, topic, _end_offsets(source_cluster, topic))
        found = re.findall(r"group \S+ assigned (\d+) partitions", logs[1].read_text())
        assert found and int(found[-1]) == 8, "survivor did not take over every partition"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            proc.stdout.close()
    duplicates = _check_no_loss(source_cluster, target_cluster, topic)
    print(f"\ngroup failover: no record lost; {duplicates} duplicates")
