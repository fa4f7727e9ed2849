"""Group offset sync and reverse checkpointing against real brokers, A<->B, no CLI in between:
a group stopped on A finds its offsets on B (sync.group.offsets.enabled), consumes there, and
finds its B progress back on A (reverse.checkpointing.enabled): A->B->A with 0 records re-read and
0 skipped on every partition (gaps from transaction markers and aborted transactions included).

Truth is the mirrored records themselves (``test_offset_translation.mirrored_pairs``).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import NewTopic
from engine_support import raw_batches
from test_mirror_cli import Background, group_timings, mm2_properties, wait_for
from test_offset_translation import (
    expected_position,
    java_translate_offsets,
    records_from,
    wait_mirrored,
)

from shallowmirror.mirror.clients import admin_client
from shallowmirror.mirror.config import load_mm2
from shallowmirror.replication.checkpoints import checkpoints_topic, read_checkpoints
from shallowmirror.replication.groups import CommittedOffset, Groups
from shallowmirror.testing.workload import Workload, load

pytestmark = pytest.mark.integration

FAST_GROUPS = {"emit.checkpoints.interval.seconds": "1", "refresh.groups.interval.seconds": "1",
               "sync.group.offsets.enabled": "true", "sync.group.offsets.interval.seconds": "1",
               "isolation.level": "read_committed"}


def expected_back(pairs: list[tuple[int, int]], target_position: int) -> int:
    """Source position of target ``target_position``: the first mirrored record at or after it
    (past the last one: the source offset after it)."""
    for source_offset, target_offset in pairs:
        if target_offset >= target_position:
            return source_offset
    return pairs[-1][0] + 1


def commit(cluster_config, alias: str, group: str, offsets: list[CommittedOffset]) -> None:
    """Commit as a consumer would (``Groups`` waits out a fresh Kafka's NOT_COORDINATOR)."""
    Groups(cluster_config, alias=alias).commit(group, offsets)


def committed(cluster_config, alias: str, group: str) -> dict[tuple[str, int], int]:
    return {(c.topic, c.partition): c.offset
            for c in Groups(cluster_config, alias=alias).committed(group)}


def test_failover_by_group_sync_and_failback_by_reverse_checkpoints_are_exact(
        source_cluster, target_cluster, tmp_path, unique_topic):
    topic = unique_topic("orders")
    load(source_cluster, Workload(topic, records=4_500, partitions=3, value_bytes=60, keys=0,
                                  headers=0, transactional=True, transaction_records=250,
                                  abort_every=3, linger_ms=5))
    controls = {p: [b.base_offset for b in bs if b.is_control]
                for p, bs in raw_batches(source_cluster, topic).items()}
    stopped = {0: controls[0][len(controls[0]) // 2], 1: 1_234, 2: 0}
    group = f"billing-{uuid.uuid4().hex[:8]}"
    a_config, b_config = source_cluster.client_config(), target_cluster.client_config()
    commit(a_config, "A", group, [CommittedOffset(topic, p, o, f"meta-{p}")
                                  for p, o in stopped.items()])

    props = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                           **FAST_GROUPS, **{"A->B.enabled": "true", "B->A.enabled": "true",
                                             "reverse.checkpointing.enabled": "true"},
                           topics=topic, groups=group)
    forward, back = load_mm2(props).flows
    assert (forward.name, back.name) == ("A->B", "B->A")
    remote = forward.remote_topic(topic)
    mirror = Background("mirror", str(props), log_path=tmp_path / "mirror.log")
    try:
        pairs = wait_mirrored(source_cluster, topic, target_cluster, remote, mirror)
        # Failover: group sync put the group on B exactly where it stopped on A.
        on_b = {(remote, p): expected_position(pairs[p], o) for p, o in stopped.items()}
        wait_for(lambda: committed(b_config, "B", group) == on_b, 60, f"group on B at {on_b}",
                 mirror)
        assert records_from(target_cluster, remote, {p: o for (_, p), o in on_b.items()},
                            "read_uncommitted") == \
            records_from(source_cluster, topic, stopped, "read_committed")

        # The group consumes on B (partition 2 to the end) and stops; the mirror keeps running.
        moved = {p: min(o + 777, pairs[p][-1][1] + 1) for (_, p), o in on_b.items()}
        moved[2] = pairs[2][-1][1] + 1
        commit(b_config, "B", group, [CommittedOffset(remote, p, o, "")
                                      for p, o in moved.items()])
        # Failback: reverse checkpoints + group sync of B->A put it on A where it stopped on B.
        on_a = {(topic, p): expected_back(pairs[p], o) for p, o in moved.items()}
        wait_for(lambda: committed(a_config, "A", group) == on_a, 60, f"group on A at {on_a}",
                 mirror)
        reverse = read_checkpoints(back.target_admin, checkpoints_topic(back), alias="A",
                                   group=group, timeout_s=10)
        assert {k: (c.upstream_offset, c.downstream_offset) for k, c in reverse.items()} == \
            {(topic, p): (moved[p], o) for (_, p), o in on_a.items()}
        # Forward sync never pulled the group on B back behind what it consumed there.
        assert committed(b_config, "B", group) == {(remote, p): o for p, o in moved.items()}
    finally:
        assert mirror.terminate() == 0, mirror.log()[-3000:]
    assert records_from(source_cluster, topic, {p: o for (_, p), o in on_a.items()},
                        "read_committed") == \
        records_from(target_cluster, remote, moved, "read_uncommitted")
    # MM2's own RemoteClusterUtils.translateOffsets, asked on A about "remote cluster" B,
    # reads the reverse checkpoints: the same offsets (skipped where java is absent).
    assert java_translate_offsets(tmp_path, source_cluster.bootstrap, "B", group) == on_a


class ActiveConsumer:
    """A consumer in ``group`` on ``cluster`` that keeps polling (an active member) until
    ``close``; it commits nothing."""

    def __init__(self, cluster, group: str, topic: str, timings: dict[str, str]) -> None:
        self.consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                                  "enable.auto.commit": False, "auto.offset.reset": "latest",
                                  "topic.metadata.refresh.interval.ms": 1000, **timings})
        self.consumer.subscribe([topic])
        self.assigned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.consumer.poll(0.2)
            self.assigned = self.assigned or bool(self.consumer.assignment())

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def test_an_active_group_is_logged_once_and_left_alone_until_it_is_idle(
        source_cluster, target_cluster, tmp_path, unique_topic):
    topic = unique_topic("events")
    load(source_cluster, Workload(topic, records=600, partitions=2, value_bytes=40))
    group = f"live-{uuid.uuid4().hex[:8]}"
    a_config, b_config = source_cluster.client_config(), target_cluster.client_config()
    commit(a_config, "A", group, [CommittedOffset(topic, p, 100 + p, "") for p in range(2)])
    props = mm2_properties(tmp_path / "mm2.properties", source_cluster, target_cluster,
                           **FAST_GROUPS, **{"A->B.enabled": "true"}, topics=topic,
                           groups=group)
    remote = load_mm2(props).flows[0].remote_topic(topic)
    # The group is live on B before the mirror starts (the remote topic is created for it).
    admin = admin_client(b_config, what="test")
    admin.create_topics([NewTopic(remote, 2, -1, config={"compression.type": "producer"})]
                        )[remote].result(30)
    live = ActiveConsumer(target_cluster, group, remote, group_timings(target_cluster))
    mirror = None
    try:
        wait_for(lambda: live.assigned, 60, "the live consumer to join its group")
        mirror = Background("mirror", str(props), log_path=tmp_path / "mirror.log")
        wait_for(lambda: "has active members" in mirror.log(), 60, "the active group notice",
                 mirror)
        time.sleep(3.5)             # three more sync rounds (1 s): still one notice, no write
        assert mirror.log().count(f"group {group!r} has active members") == 1
        assert committed(b_config, "B", group) == {}
        live.close()
        wait_for(lambda: committed(b_config, "B", group) == {(remote, 0): 100, (remote, 1): 101},
                 60, "the offsets once the group is idle", mirror)
    finally:
        live.close()
        if mirror is not None:
            assert mirror.terminate() == 0, mirror.log()[-3000:]


@pytest.mark.needs_real_kafka("tansu's group coordinator answers at once; a fresh Kafka cluster "
                              "answers NOT_COORDINATOR while it creates __consumer_offsets")
def test_group_calls_wait_out_the_coordinator_of_a_fresh_cluster(start_broker, unique_topic):
    """The first group requests to a cluster that just started (offset sync, checkpoints and the
    offsets CLI make them) succeed instead of failing until the next interval."""
    fresh = start_broker("fresh")
    groups = Groups(fresh.client_config(), alias="F")
    group, topic = f"g-{uuid.uuid4().hex[:8]}", unique_topic("fresh")
    assert groups.active_members(group) == 0        # the first request: NOT_COORDINATOR on Kafka
    assert groups.committed(group) == []
    load(fresh, Workload(topic, records=10, partitions=1))
    groups.commit(group, [CommittedOffset(topic, 0, 5, "meta")])
    assert groups.committed(group) == [CommittedOffset(topic, 0, 5, "meta")]
