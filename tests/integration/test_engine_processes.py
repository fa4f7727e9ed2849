"""Engine processes: kill -9 at random moments with restarts, two processes sharing one group
(split, failover, kills of either, a second process joining mid-run).

With exact resume from the target (the default) nothing is lost and nothing is duplicated on
Apache Kafka. tansu 0.6 keeps no offset-commit metadata (OffsetFetch answers it empty), so there
the engine says it starts at the committed offset and duplicates stay possible: the kill loops,
whose claim is 0 duplicates, run on Kafka only; on tansu the failover test shows no loss after a
kill -9 and that the fallback was logged."""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from engine_support import create_target, engine_process, group, load_topic, raw_batches
from test_mirror_cli import group_timings

from shallowmirror.testing.topics import group_offsets, read_topic, tally_copies

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _end_offsets(cluster, topic) -> dict[int, int]:
    return {p: (bs[-1].base_offset + bs[-1].record_count if bs else 0)
            for p, bs in raw_batches(cluster, topic).items()}


def _committed(cluster, g: str, topic: str, partitions) -> dict[int, int]:
    return group_offsets(cluster, g, topic, partitions)


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


def _target_size(cluster, topic: str, partitions: int = 8) -> int:
    """Records on the target (the sum of high watermarks; on tansu a little less: its 'latest'
    is the last batch's base + 1, which still grows with every batch)."""
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "size-probe"})
    try:
        for _ in range(50):
            try:
                return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=20)[1]
                           for p in range(partitions))
            except KafkaException:      # a just-created topic's leader is not known yet
                time.sleep(0.2)
        raise AssertionError(f"no watermarks for {topic} on {cluster.bootstrap}")
    finally:
        c.close()


def _wait_target_grew(cluster, topic: str, beyond: int, timeout_s: float = 60.0) -> int:
    """Wait until the target holds more than ``beyond`` records (batches are moving)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        size = _target_size(cluster, topic)
        if size > beyond:
            return size
        time.sleep(0.05)
    raise AssertionError(f"the target did not grow beyond {beyond} records in {timeout_s}s")


def _wait_moved_or_elapsed(cluster, topic: str, size: int, seconds: float) -> None:
    """Return once the target holds ``size`` records or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _target_size(cluster, topic) < size:
        time.sleep(0.01)


def _kill(proc) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()


def _committed_total(cluster, g: str, topic: str, partitions: int = 8) -> int:
    return sum(max(0, o) for o in _committed(cluster, g, topic, range(partitions)).values())


class _KeepProducing:
    """Write ``rounds`` more workloads to the source, one every ``pause_s``, in a thread: batches
    keep moving however fast the broker mirrors (tansu copies a small topic in a second)."""

    def __init__(self, cluster, topic: str, rounds: int, records: int, pause_s: float) -> None:
        self._stop = threading.Event()

        def run() -> None:
            for i in range(rounds):
                if self._stop.is_set():
                    return
                load_topic(cluster, topic, records, codec="lz4", partitions=8,
                           batch_bytes=16_000, create_topic=False, seed=100 + i)
                self._stop.wait(pause_s)

        self._thread = threading.Thread(target=run, name="keep-producing", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join(300)
        assert not self._thread.is_alive(), "the source producer did not finish"

    def stop(self) -> None:
        self._stop.set()
        self.join()


def _shared_topic(source_cluster, target_cluster, topic: str, records: int) -> tuple[str, dict]:
    """Load ``topic`` and create its target; (group, settings of engines sharing that group:
    small fetches so batches keep moving a while, 1 s commits)."""
    load_topic(source_cluster, topic, records, codec="lz4", partitions=8, batch_bytes=16_000)
    create_target(target_cluster, topic)
    g = group()
    return g, {"partition.assignment": "group", "group.id": g, **group_timings(source_cluster),
               "offset.commit.interval.ms": 1000, "buffer.memory": 65536,
               "fetch.max.bytes": 16384, "max.partition.fetch.bytes": 4096,
               "max.request.size": 65536, "fetch.max.wait.ms": 100}


def _stop_all(procs, producing: _KeepProducing) -> None:
    producing.stop()
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        proc.stdout.close()


def _expect_resume_mode(on_tansu: bool, log_text: str) -> None:
    """A process that took over committed partitions resumed exactly from the target (Kafka), or
    said it falls back to the committed offset (tansu keeps no commit metadata). Only what it
    logged from its last assignment on counts: a first start revoked before it had committed
    the target's end (both processes joining at once) leaves a bare start offset, whose next
    owner falls back harmlessly - nothing was mirrored from it yet."""
    log_text = log_text[log_text.rindex(" assigned "):]
    fell_back = "starting at the committed offset" in log_text
    if on_tansu:
        assert fell_back and "no target position in the commit metadata" in log_text
    else:
        assert not fell_back, "resume fell back to the committed offset on Kafka"


def _check_no_loss(source_cluster, target_cluster, topic) -> int:
    """Every source record on the target, in order once duplicates are removed; return the
    number of duplicates."""
    tally = tally_copies(read_topic(source_cluster.client_config(), topic),
                         read_topic(target_cluster.client_config(), topic))
    assert tally.lost == 0 and tally.order_kept, f"records lost or reordered: {tally}"
    assert tally.max_copies <= 11
    return tally.duplicates


@pytest.mark.needs_real_kafka("its claim is 0 duplicates, and tansu keeps no commit metadata "
                              "(resume falls back to at-least-once there); the fallback after "
                              "a kill -9 is shown on tansu by "
                              "test_two_processes_split_partitions_and_fail_over")
def test_kill_9_at_random_moments_loses_nothing(source_cluster, target_cluster, unique_topic,
                                                tmp_path: Path):
    """kill -9 x10 while batches move (each kill after the target grew under that process), in
    the default mode: 0 lost, order kept, and 0 duplicated."""
    topic = unique_topic("kill")
    load_topic(source_cluster, topic, 400_000, codec="lz4", partitions=8, batch_bytes=16_000)
    create_target(target_cluster, topic)
    g = group()
    settings = {"partition.assignment": "all", "group.id": g, "offset.commit.interval.ms": 500,
                "buffer.memory": 65536, "fetch.max.bytes": 16384,
                "max.partition.fetch.bytes": 4096, "max.request.size": 65536, "fetch.max.wait.ms": 100}
    rng = random.Random(20261121)
    ends = _end_offsets(source_cluster, topic)
    total = sum(ends.values())
    log = tmp_path / "engine.log"
    kills, progress = 0, []
    for _ in range(10):
        before = _target_size(target_cluster, topic)
        if before >= total or _committed_total(source_cluster, g, topic) >= total:
            break           # all copied: the last run below commits it
        proc = engine_process(source_cluster, target_cluster, [topic], settings, str(log))
        try:
            _wait_ready(proc)
            _wait_target_grew(target_cluster, topic, before)
            # Before or after the first periodic commit (offset.commit.interval.ms=500), or
            # once a random part of what is left has moved, whichever comes first: on a fast
            # host the throttled copy of all 400k records took less than the longest wait.
            _wait_moved_or_elapsed(target_cluster, topic,
                                   before + int(rng.uniform(0.05, 0.5) * (total - before)),
                                   rng.uniform(0.05, 1.0))
        finally:
            _kill(proc)
        kills += 1
        progress.append(_committed_total(source_cluster, g, topic))
    # The small fetches only make the kills land while batches move; the last run, which must
    # finish the copy exactly from where the kills left it, uses the defaults.
    finish = {k: v for k, v in settings.items() if k not in (
        "buffer.memory", "fetch.max.bytes", "max.partition.fetch.bytes", "max.request.size")}
    proc = engine_process(source_cluster, target_cluster, [topic], finish, str(log))
    try:
        _wait_ready(proc)
        _wait_committed(source_cluster, g, topic, _end_offsets(source_cluster, topic))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        proc.stdout.close()
    duplicates = _check_no_loss(source_cluster, target_cluster, topic)
    print(f"\ncommitted after each kill: {progress} (source: {total})")
    mid_run = sum(1 for p in progress if p < total)
    assert mid_run >= 8, f"only {mid_run} kills landed while batches moved"
    print(f"kill -9 x{kills}: no record lost, order kept; {duplicates} duplicate records")
    assert duplicates == 0, f"{duplicates} duplicates with resume.from.target=true"


@pytest.mark.tansu_workaround("tansu keeps no commit metadata: resume falls back there")
def test_two_processes_split_partitions_and_fail_over(source_cluster, target_cluster,
                                                      unique_topic, tmp_path: Path, on_tansu):
    """Two engines split the partitions; one is killed (-9) and the survivor takes its
    partitions over from their commits: nothing lost, and the resume mode is the one the broker
    allows (exact on Kafka; the at-least-once fallback, logged, on tansu)."""
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
        _expect_resume_mode(on_tansu, logs[1].read_text())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            proc.stdout.close()
    duplicates = _check_no_loss(source_cluster, target_cluster, topic)
    print(f"\ngroup failover: no record lost; {duplicates} duplicates")


@pytest.mark.needs_real_kafka("its claim is 0 duplicates, and tansu keeps no commit metadata "
                              "(resume falls back to at-least-once there); no loss when a "
                              "group member is killed is shown on tansu by "
                              "test_two_processes_split_partitions_and_fail_over")
def test_two_processes_in_one_group_with_kills_of_either(source_cluster, target_cluster,
                                                         unique_topic, tmp_path: Path):
    """Two engines share the partitions while the source keeps growing; one or the other is
    killed (-9) while batches move and started again, four times: 0 lost, order kept,
    0 duplicated."""
    topic = unique_topic("pair")
    g, settings = _shared_topic(source_cluster, target_cluster, topic, 20_000)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    rng = random.Random(7)
    procs = [engine_process(source_cluster, target_cluster, [topic], settings, str(log))
             for log in logs]
    # Production lasts until the kills are done (at most 40 rounds), however long restarts
    # take on a loaded machine: with a fixed 12 rounds, the whole source could be mirrored before
    # the last kill, whose wait for moving batches then waited for records that never came.
    producing = _KeepProducing(source_cluster, topic, rounds=40, records=4_000, pause_s=1.0)
    kills = 0
    try:
        for proc in procs:
            _wait_ready(proc)
        for _ in range(4):
            _wait_target_grew(target_cluster, topic, _target_size(target_cluster, topic))
            time.sleep(rng.uniform(0.05, 0.5))
            victim = rng.randrange(2)
            _kill(procs[victim])
            kills += 1
            procs[victim] = engine_process(source_cluster, target_cluster, [topic], settings,
                                           str(logs[victim]))
            _wait_ready(procs[victim])
        producing.stop()
        _wait_committed(source_cluster, g, topic, _end_offsets(source_cluster, topic))
    finally:
        _stop_all(procs, producing)
    duplicates = _check_no_loss(source_cluster, target_cluster, topic)
    print(f"\ntwo processes, kill -9 x{kills} of either: no record lost, order kept; "
          f"{duplicates} duplicates")
    assert duplicates == 0, f"{duplicates} duplicates with resume.from.target=true"


def test_rebalance_while_batches_are_in_flight(source_cluster, target_cluster, unique_topic,
                                               tmp_path: Path):
    """A second engine joins the group while the source keeps growing: the first one finishes
    (or abandons) what is in flight and commits with the target position, the second resumes
    from the target. 0 lost, order kept. Duplicates are possible only from batches abandoned at
    revocation (in flight longer than request.timeout.ms; the race rule: re-sent, never
    skipped), so any duplicate must come with that log line."""
    topic = unique_topic("join")
    g, settings = _shared_topic(source_cluster, target_cluster, topic, 10_000)
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    procs = [engine_process(source_cluster, target_cluster, [topic], settings, str(logs[0]))]
    producing = _KeepProducing(source_cluster, topic, rounds=8, records=4_000, pause_s=0.5)
    try:
        _wait_ready(procs[0])
        _wait_target_grew(target_cluster, topic, _target_size(target_cluster, topic) + 5000)
        procs.append(engine_process(source_cluster, target_cluster, [topic], settings,
                                    str(logs[1])))
        _wait_ready(procs[1])
        producing.join()
        _wait_committed(source_cluster, g, topic, _end_offsets(source_cluster, topic))
    finally:
        _stop_all(procs, producing)
    first = logs[0].read_text()
    assert re.search(r"revoked \d+ partitions", first), "no rebalance happened"
    assert re.search(r"group \S+ assigned \d+ partitions", logs[1].read_text())
    duplicates = _check_no_loss(source_cluster, target_cluster, topic)
    abandoned = sum(int(n) for n in re.findall(r"(\d+) batches abandoned on revocation", first))
    print(f"\nrebalance mid-run: no record lost, order kept; {duplicates} duplicates "
          f"({abandoned} batches abandoned at revocation)")
    if duplicates:
        assert abandoned, "duplicates without an abandoned in-flight batch"


@pytest.mark.needs_real_kafka("its claim is 0 duplicates, and tansu keeps no commit metadata "
                              "(resume falls back to at-least-once there)")
@pytest.mark.parametrize("bare_offset", [0, 1], ids=["batch-start", "inside-a-batch"])
def test_a_kill_after_a_fallback_to_a_bare_commit_copies_nothing_twice(
        source_cluster, target_cluster, unique_topic, tmp_path: Path, bare_offset: int):
    """The group holds a bare commit (an offset without a target position: a member revoked
    right after its assignment commits its start so). The next owner falls back to it and must
    anchor that start with the target's end at once: killed (-9) before any periodic commit, its
    successor then walks its copies instead of falling back again and copying them twice (in
    CI, two processes killed in turn piled up 11,616 duplicates this way). Inside a batch, the
    first engine forwards that batch's records from the committed offset re-packed, and the walk
    from the pair anchored there matches them record by record."""
    topic = unique_topic("bare")
    load_topic(source_cluster, topic, 8_000, codec="lz4", partitions=8, batch_bytes=16_000)
    create_target(target_cluster, topic)
    g = group()
    bare = Consumer({"bootstrap.servers": source_cluster.bootstrap, "group.id": g})
    try:
        bare.commit(offsets=[TopicPartition(topic, p, bare_offset) for p in range(8)],
                    asynchronous=False)
    finally:
        bare.close()
    ends = _end_offsets(source_cluster, topic)
    settings = {"partition.assignment": "all", "group.id": g, "fetch.max.wait.ms": 100,
                "offset.commit.interval.ms": 600_000}      # no periodic commit before the kill
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    first = engine_process(source_cluster, target_cluster, [topic], settings, str(logs[0]))
    try:
        _wait_ready(first)
        _wait_target_grew(target_cluster, topic, sum(ends.values()) - 8 * bare_offset - 1)
    finally:
        _kill(first)
    assert "no target position in the commit metadata" in logs[0].read_text()
    second = engine_process(source_cluster, target_cluster, [topic],
                            {**settings, "offset.commit.interval.ms": 500}, str(logs[1]))
    try:
        _wait_ready(second)
        _wait_committed(source_cluster, g, topic, ends)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
        second.stdout.close()
    log = logs[1].read_text()
    assert "starting at the committed offset" not in log, log[-3000:]
    assert "resumed from the target" in log, log[-3000:]
    source = {p: [r for r in records if r.offset >= bare_offset]
              for p, records in read_topic(source_cluster.client_config(), topic).items()}
    tally = tally_copies(source, read_topic(target_cluster.client_config(), topic))
    assert tally.lost == 0 and tally.order_kept and tally.duplicates == 0, tally
