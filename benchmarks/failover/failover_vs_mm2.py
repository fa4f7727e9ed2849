"""Failover of a consumer group from cluster A to cluster B: records re-read (or skipped) after
resuming on B at the translated offsets, shallowmirror's checkpoints beside MirrorMaker 2's.

Scenario (two Apache Kafka clusters from KAFKA_HOME, started here and stopped at the end): a
topic of 3 partitions x 20,000 records written in transactions of 250 records, every third
aborted (control batches and aborted ranges: offset gaps). Group ``billing`` stopped part-way
(its committed offsets on A). shallowmirror mirrors A->B and checkpoints (interval 1 s);
MirrorMaker 2 3.7 (``connect-mirror-maker.sh``) mirrors the same topic under the alias ``M``
(remote topic ``M.<topic>``, checkpoints ``M.checkpoints.internal``) with checkpoints at 1 s.
Both are read with MM2's own ``RemoteClusterUtils.translateOffsets``; the group then reads each
copy from there to the end and the result is compared with what it had left to read on A.

    KAFKA_HOME=/path/to/kafka python benchmarks/failover/failover_vs_mm2.py

Prints one line per partition and system: re-read, skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from test_offset_translation import java_translate_offsets  # noqa: E402

from shallowmirror.bench.modes import mm2 as mm2_mode  # noqa: E402
from shallowmirror.replication.groups import CommittedOffset, Groups  # noqa: E402
from shallowmirror.testing.kafka import kafka_clusters  # noqa: E402
from shallowmirror.testing.topics import read_topic  # noqa: E402
from shallowmirror.testing.workload import Workload, load  # noqa: E402

RECORDS_PER_PARTITION = 20_000
STOPPED = {0: 5_643 * 2, 1: 7_001, 2: 13_337}


def left_to_read(cluster, topic: str, positions: dict[int, int], isolation: str):
    found = read_topic(cluster, topic, isolation_level=isolation)
    return {p: [(r.key, r.value) for r in records if r.offset >= positions.get(p, 0)]
            for p, records in found.items()}


def compare(on_b: list, on_a: list) -> tuple[int, int]:
    """(re-read, skipped) of a consumer reading ``on_b`` when ``on_a`` was left to read."""
    if len(on_b) >= len(on_a) and on_b[len(on_b) - len(on_a):] == on_a:
        return len(on_b) - len(on_a), 0
    if on_a[len(on_a) - len(on_b):] == on_b:
        return 0, len(on_a) - len(on_b)
    raise AssertionError("the copy differs from the source beyond re-reads and skips")


def wait_checkpoints(tmp: Path, bootstrap: str, alias: str, group: str, count: int,
                     timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = java_translate_offsets(tmp, bootstrap, alias, group)
        if len(found) >= count:
            return found
        time.sleep(2)
    raise TimeoutError(f"no checkpoints of {group} from {alias} within {timeout_s:.0f}s")


def mm2_properties(source: str, target: str, topic: str, group: str, run_id: str) -> str:
    """MirrorMaker 2 with source alias M (so its copy, M.<topic>, sits beside ours on B)."""
    props = {"clusters": "M, B", "M.bootstrap.servers": source, "B.bootstrap.servers": target,
             "M->B.enabled": "true", "M->B.topics": topic, "M->B.groups": group,
             "M.consumer.isolation.level": "read_committed",
             "emit.checkpoints.interval.seconds": "1", "refresh.groups.interval.seconds": "1",
             "M.group.id": f"mm2-{run_id}-M", "B.group.id": f"mm2-{run_id}-B",
             **mm2_mode.internal_topics(run_id)}
    props.update(dict.fromkeys(mm2_mode._REPLICATION_FACTOR_KEYS, "1"))
    return "".join(f"{k} = {v}\n" for k, v in props.items())


def run_mm2(kafka_home: str, tmp: Path, source: str, target: str, topic: str,
            group: str) -> dict:
    """Run MirrorMaker 2 until its checkpoints of ``group`` settle; MM2's translated offsets."""
    run = mm2_mode.prepare(kafka_home, source=source, target=target, topics=[topic],
                           codec="lz4", run_id=f"failover-{group}")
    Path(run.command[1]).write_text(mm2_properties(source, target, topic, group,
                                                   f"failover-{group}"))
    with open(run.console_path, "w") as console:
        mm2 = subprocess.Popen(run.command, env=run.env, stdout=console,
                               stderr=subprocess.STDOUT)
        try:
            wait_checkpoints(tmp, target, "M", group, 3)
            time.sleep(10)
            return java_translate_offsets(tmp, target, "M", group)
        finally:
            mm2.terminate()
            mm2.wait(60)
            run.remove()


def main() -> int:
    kafka_home = os.environ.get("KAFKA_HOME")
    if not kafka_home:
        print("set KAFKA_HOME to an Apache Kafka 3.7 distribution", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="failover-"))
    with kafka_clusters("A", "B") as (a, b):
        topic = "orders"
        load(a, Workload(topic, records=3 * RECORDS_PER_PARTITION, partitions=3,
                         value_bytes=100, keys=0, headers=0, transactional=True,
                         transaction_records=250, abort_every=3, linger_ms=5))
        group = f"billing-{uuid.uuid4().hex[:6]}"
        Groups(a.client_config(), alias="A").commit(
            group, [CommittedOffset(topic, p, o, "") for p, o in STOPPED.items()])
        on_a = left_to_read(a, topic, STOPPED, "read_committed")

        props = tmp / "mm2.properties"
        props.write_text("\n".join([
            "clusters = A, B", f"A.bootstrap.servers = {a.bootstrap}",
            f"B.bootstrap.servers = {b.bootstrap}", "A->B.enabled = true",
            f"topics = {topic}", f"groups = {group}", "isolation.level = read_committed",
            "emit.checkpoints.interval.seconds = 1", "refresh.groups.interval.seconds = 1",
            "partition.assignment = all"]) + "\n")
        with open(tmp / "ours.log", "w") as log:
            ours = subprocess.Popen([sys.executable, "-m", "shallowmirror", "mirror",
                                     str(props)], stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_checkpoints(tmp, b.bootstrap, "A", group, 3)
                time.sleep(5)      # the last checkpoints of a caught-up mirror
                ours_offsets = java_translate_offsets(tmp, b.bootstrap, "A", group)
            finally:
                ours.terminate()
                ours.wait(60)
        theirs = run_mm2(kafka_home, tmp, a.bootstrap, b.bootstrap, topic, group)
        for name, remote, offsets in (("shallowmirror", f"A.{topic}", ours_offsets),
                                      ("MirrorMaker 2", f"M.{topic}", theirs)):
            positions = {p: o for (t, p), o in offsets.items() if t == remote}
            on_b = left_to_read(b, remote, positions, "read_uncommitted")
            for p in sorted(on_a):
                reread, skipped = compare(on_b[p], on_a[p])
                print(f"{name:14} partition {p}: stopped at {STOPPED[p]:>6} on A, resumes at "
                      f"{positions.get(p)} on B: re-read {reread:,}, skipped {skipped:,} "
                      f"(of {RECORDS_PER_PARTITION:,})")
    return 0


if __name__ == "__main__":
    from shallowmirror.bench.interrupts import run_script

    raise SystemExit(run_script(main))
