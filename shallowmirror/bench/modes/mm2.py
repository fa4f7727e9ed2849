"""The ``mm2`` mode: Apache Kafka's MirrorMaker 2 in dedicated mode, as a measured peer.

The harness runs ``bin/connect-mirror-maker.sh`` from the same distribution as the brokers
(``KAFKA_HOME``) with a generated ``mm2.properties``: clusters ``A`` (source) and ``B``
(target), only the flow ``A->B``, the workload topic and its latency companion, the target
producer's ``compression.type`` set to the workload's codec (``B.producer.compression.type``:
MirrorMaker 2 strips the ``B.`` prefix into the ``A->B`` worker's ``producer.*`` settings, the
producer that writes the replicated records) and replication factor 1 for its internal topics
(single-broker clusters). Everything else is MirrorMaker 2's default, heap included. Records
land in the remote topic ``A.<topic>`` (the default replication policy).

Each run gets its own work folder (properties, ``LOG_DIR``, ``java.io.tmpdir``), its own worker
group and its own internal offset/config/status topics, so a repeat starts from offset 0 as a
fresh MirrorMaker 2 would. The JVM prints no "ready" line: its start-up is from launch to the
first record seen on the target, and steady state from there to the last record.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE_ALIAS, TARGET_ALIAS = "A", "B"
SCRIPT = "bin/connect-mirror-maker.sh"
#: Internal topics MirrorMaker 2 creates; replication factor 1 on a single-broker cluster.
_REPLICATION_FACTOR_KEYS = (
    "replication.factor", "checkpoints.topic.replication.factor",
    "heartbeats.topic.replication.factor", "offset-syncs.topic.replication.factor",
    "offset.storage.replication.factor", "status.storage.replication.factor",
    "config.storage.replication.factor",
)


class Mm2Unavailable(Exception):
    """MirrorMaker 2 cannot run here (no Kafka distribution, or not Kafka clusters)."""


@dataclass
class Mm2Run:
    """One MirrorMaker 2 process's files: the command, its environment and its work folder."""

    command: list[str]
    env: dict[str, str]
    work_dir: Path

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "logs"

    @property
    def console_path(self) -> Path:
        return self.work_dir / "console.log"

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the console output (where the JVM reports fatal errors)."""
        try:
            return self.console_path.read_text(errors="replace")[-chars:].strip()
        except OSError:
            return ""

    def remove(self) -> None:
        shutil.rmtree(self.work_dir, ignore_errors=True)


def remote_topic(topic: str) -> str:
    """Where MirrorMaker 2's default replication policy writes ``topic``: ``A.<topic>``."""
    return f"{SOURCE_ALIAS}.{topic}"


def _topic_pattern(topic: str) -> str:
    """An exact-match regex for a topic name, safe in a .properties value (no backslashes)."""
    return "".join(f"[{c}]" if c == "." else c for c in topic)


def internal_topics(run_id: str) -> dict[str, str]:
    """The run's own Connect internal topics (setting -> name), created on both clusters (one
    herder per direction) and deleted by the harness after the run."""
    suffix = run_id.replace(".", "-")
    return {"offset.storage.topic": f"mm2-offsets-{suffix}",
            "config.storage.topic": f"mm2-configs-{suffix}",
            "status.storage.topic": f"mm2-status-{suffix}"}


def properties(source: str, target: str, topics: list[str], codec: str, run_id: str) -> str:
    """The mm2.properties text for one run."""
    suffix = run_id.replace(".", "-")
    props: dict[str, str] = {
        "clusters": f"{SOURCE_ALIAS}, {TARGET_ALIAS}",
        f"{SOURCE_ALIAS}.bootstrap.servers": source,
        f"{TARGET_ALIAS}.bootstrap.servers": target,
        f"{SOURCE_ALIAS}->{TARGET_ALIAS}.enabled": "true",
        f"{SOURCE_ALIAS}->{TARGET_ALIAS}.topics": ",".join(map(_topic_pattern, topics)),
        f"{TARGET_ALIAS}.producer.compression.type": codec,
        # A fresh MirrorMaker 2 per run: its own worker groups and internal topics, so nothing
        # (committed source offsets above all) carries over from an earlier run.
        f"{SOURCE_ALIAS}.group.id": f"mm2-{suffix}-{SOURCE_ALIAS}",
        f"{TARGET_ALIAS}.group.id": f"mm2-{suffix}-{TARGET_ALIAS}",
        **internal_topics(run_id),
    }
    props.update(dict.fromkeys(_REPLICATION_FACTOR_KEYS, "1"))
    return "".join(f"{key} = {value}\n" for key, value in props.items())


def check_distribution(kafka_home: str | os.PathLike) -> Path:
    """The MirrorMaker 2 script of ``kafka_home``; Mm2Unavailable naming what is missing."""
    script = Path(kafka_home) / SCRIPT
    if not script.is_file():
        raise Mm2Unavailable(f"{script} not found: mode mm2 needs a Kafka distribution with "
                             "MirrorMaker 2 (KAFKA_HOME or --kafka-home)")
    return script


def prepare(kafka_home: str | os.PathLike, *, source: str, target: str, topics: list[str],
            codec: str, run_id: str, parent: str | os.PathLike | None = None) -> Mm2Run:
    """Write the run's properties into a fresh work folder; return how to launch it."""
    script = check_distribution(kafka_home)
    work_dir = Path(tempfile.mkdtemp(prefix=f"mm2-{run_id}-", dir=parent))
    (work_dir / "logs").mkdir()
    (work_dir / "tmp").mkdir()
    props = work_dir / "mm2.properties"
    props.write_text(properties(source, target, topics, codec, run_id))
    env = dict(os.environ)
    env["LOG_DIR"] = str(work_dir / "logs")
    env["KAFKA_OPTS"] = f"{env.get('KAFKA_OPTS', '')} -Djava.io.tmpdir={work_dir / 'tmp'}".strip()
    # Settings meant for another JVM (a JMX port, a debug agent) must not reach this one.
    for var in ("JMX_PORT", "KAFKA_DEBUG"):
        env.pop(var, None)
    return Mm2Run([str(script), str(props)], env, work_dir)
