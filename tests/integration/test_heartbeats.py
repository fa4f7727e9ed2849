"""Heartbeats (emit.heartbeats.enabled): written where MM2 3.7 writes them, in MM2's encoding,
replicated along the flows, read by MM2's own Java ``RemoteClusterUtils``; the flow's status line
reports the end-to-end latency measured on them.

Private clusters: heartbeats land in the fixed topic ``heartbeats``, and every flow replicates
it (heartbeats.replication.enabled), so heartbeats in the shared session clusters would be
mirrored by every later test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_mirror_cli import FAST, Background, group_timings, wait_for

from shallowmirror.replication.mm2_records import Heartbeat
from shallowmirror.testing.topics import read_topic

pytestmark = pytest.mark.integration

JAVA_PROBE = """
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.connect.mirror.*;

public class HeartbeatProbe {
    public static void main(String[] args) throws Exception {
        Map<String, Object> props = new HashMap<>();
        props.put("bootstrap.servers", args[0]);
        System.out.println("upstream=" + new TreeSet<>(RemoteClusterUtils.upstreamClusters(props)));
        System.out.println("hops=" + RemoteClusterUtils.replicationHops(props, args[1]));
        System.out.println("hops-unknown=" + RemoteClusterUtils.replicationHops(props, "nowhere"));
        Map<String, Object> c = new HashMap<>(props);
        c.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        c.put("value.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
            TopicPartition tp = new TopicPartition("heartbeats", 0);
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            long end = consumer.endOffsets(List.of(tp)).get(tp);
            Set<String> seen = new TreeSet<>();
            while (consumer.position(tp) < end) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofSeconds(1))) {
                    Heartbeat hb = Heartbeat.deserializeRecord(r);
                    seen.add(hb.sourceClusterAlias() + "->" + hb.targetClusterAlias()
                             + (hb.timestamp() == r.timestamp() ? "" : " (timestamp differs)"));
                }
            }
            System.out.println("heartbeats=" + seen);
        }
    }
}
"""


def _java_classpath() -> str | None:
    """Compile-time classpath: MM2's client jar and kafka-clients from KAFKA_HOME."""
    home = os.environ.get("KAFKA_HOME")
    if not home or shutil.which("javac") is None or shutil.which("java") is None:
        return None
    jars = [p for p in (Path(home) / "libs").glob("*.jar")
            if p.name.startswith(("connect-mirror-client-", "kafka-clients-"))]
    return os.pathsep.join(str(j) for j in jars) if len(jars) == 2 else None


def _run_java_probe(tmp_path: Path, bootstrap: str, upstream: str) -> dict[str, str]:
    classpath = _java_classpath()
    if classpath is None:
        pytest.skip("needs java, javac and KAFKA_HOME (connect-mirror-client and kafka-clients "
                    "jars) to run MM2's RemoteClusterUtils")
    source = tmp_path / "HeartbeatProbe.java"
    source.write_text(JAVA_PROBE)
    subprocess.run(["javac", "-cp", classpath, "-d", str(tmp_path), str(source)], check=True,
                   capture_output=True, timeout=120)
    # At run time kafka-clients needs its dependencies too (slf4j, opentelemetry, ...).
    runtime = os.pathsep.join([classpath, str(Path(os.environ["KAFKA_HOME"]) / "libs" / "*"),
                               str(tmp_path)])
    result = subprocess.run(["java", "-cp", runtime,
                             "HeartbeatProbe", bootstrap, upstream],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def _beats(cluster, topic: str) -> set[tuple[str, str]]:
    try:
        records = read_topic(cluster, topic, timeout_s=10)
    except Exception:  # noqa: BLE001 - not there yet
        return set()
    beats = set()
    for record in records.get(0, []):
        beat = Heartbeat.decode(record.key, record.value)
        assert beat.timestamp_ms == record.timestamp_ms, "record timestamp is the heartbeat's"
        beats.add((beat.source_alias, beat.target_alias))
    return beats


def _topics(cluster) -> set[str]:
    from shallowmirror.mirror.clients import admin_client

    admin = admin_client({"bootstrap.servers": cluster.bootstrap}, what="test")
    return set(admin.list_topics(timeout=10).topics)


def test_heartbeats_follow_mm2_and_feed_remote_cluster_utils(start_broker, tmp_path):
    a, b = start_broker("hbA"), start_broker("hbB")
    config = tmp_path / "mm2.properties"
    keys = {**FAST, **group_timings(a), "clusters": "A, B",
            "A.bootstrap.servers": a.bootstrap, "B.bootstrap.servers": b.bootstrap,
            "A->B.enabled": "true", "B->A.enabled": "true", "topics": "nothing-else",
            "emit.heartbeats.enabled": "true", "emit.heartbeats.interval.seconds": "0.2",
            "refresh.topics.interval.seconds": "1", "status.interval.seconds": "1",
            "emit.checkpoints.enabled": "false", "emit.offset-syncs.enabled": "false",
            "metrics.file": str(tmp_path / "metrics.jsonl")}
    config.write_text("".join(f"{k} = {v}\n" for k, v in keys.items()))
    mirror = Background("mirror", str(config), log_path=tmp_path / "mirror.log")
    try:
        # Each cluster gets its own heartbeats (MM2's pair S->T writes on T) and the other's,
        # mirrored under the remote name; nothing loops back (no A.B.heartbeats / B.A.heartbeats).
        wait_for(lambda: _beats(b, "heartbeats") == {("A", "B")}
                 and _beats(b, "A.heartbeats") == {("B", "A")}
                 and _beats(a, "heartbeats") == {("B", "A")}
                 and _beats(a, "B.heartbeats") == {("A", "B")}, 60, "heartbeats on both", mirror)
        wait_for(lambda: "heartbeat latency" in mirror.log(), 30, "a latency on the status line",
                 mirror)
        assert not {"B.A.heartbeats", "A.B.heartbeats"} & (_topics(a) | _topics(b))
        on_b = _run_java_probe(tmp_path, b.bootstrap, "A")
        assert mirror.terminate() == 0, mirror.log()[-3000:]
    finally:
        mirror.stop()
    assert on_b == {"upstream": "[A]", "hops": "1", "hops-unknown": "-1",
                    "heartbeats": "[A->B]"}, on_b
    # The metrics file has the latency of each heartbeat each flow mirrored.
    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    beats = [e for e in events if e["kind"] == "heartbeat"]
    assert {(e["flow"], e["heartbeat"]) for e in beats} == {("A->B", "B->A"), ("B->A", "A->B")}
    assert all(e["latency_ms"] >= 0 and e["time"] >= e["heartbeat_time"] for e in beats)
