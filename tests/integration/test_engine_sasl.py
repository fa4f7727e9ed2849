"""SASL end to end with a Java ``sasl.jaas.config`` against real Apache Kafka (a SASL_PLAINTEXT
listener with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512): the engine's net layer, its group
membership and the admin that creates target topics all authenticate from the same keys an
operator copies from a Java client config; so does the whole `shallowmirror mirror` process.

Skipped, with the reason, where no Kafka distribution is found (KAFKA_HOME, else ../shared/kafka).
Bad SASL values are refused by `shallowmirror mirror --check`, naming the key (no broker)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from shallowmirror.engine import mirror, prefix_mapper
from shallowmirror.net.config import librdkafka_connection
from shallowmirror.testing import kafka
from shallowmirror.testing.embedded import BrokerStartError
from shallowmirror.testing.topics import assert_same_records, read_topic
from shallowmirror.testing.workload import Workload, load

pytestmark = pytest.mark.integration

USERS = {"alice": "alice-secret"}
MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
           "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
           "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
#: Apache Kafka refuses session.timeout.ms below its group.min.session.timeout.ms (6 s).
GROUP = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}
#: The Kafka 3.7 shared next to the project checkout, used when KAFKA_HOME is not set.
SHARED_KAFKA = Path(__file__).resolve().parents[3] / "shared" / "kafka"


@pytest.fixture(scope="module")
def sasl_kafka(broker_log_dir):
    """One Apache Kafka with a SASL listener for the module (plain listener for loading data)."""
    try:
        home = kafka.find_kafka_home(None if os.environ.get("KAFKA_HOME") or not SHARED_KAFKA.is_dir()
                                     else SHARED_KAFKA)
    except BrokerStartError as err:
        pytest.skip(f"no Apache Kafka distribution for the SASL tests: {err}")
    with kafka.start_kafka_cluster("sasl", kafka_home=home, log_dir=broker_log_dir,
                                   sasl_users=USERS,
                                   overrides={"group.initial.rebalance.delay.ms": "0"}) as cluster:
        yield cluster


def jaas_config(cluster, mechanism: str) -> dict[str, str]:
    """What an operator copies from a Java client: no sasl.username / sasl.password keys."""
    return {"bootstrap.servers": cluster.sasl_bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.jaas.config": f'{MODULES[mechanism]} required username="alice" '
                                f'password="{USERS["alice"]}";'}


@pytest.mark.parametrize("mechanism", sorted(MODULES))
def test_engine_mirrors_over_sasl_with_a_jaas_line(sasl_kafka, mechanism):
    topic = f"sasl-{mechanism.lower()}-{uuid.uuid4().hex[:8]}"
    load(sasl_kafka.client_config(), Workload(topic=topic, records=3000, partitions=3,
                                              codec="lz4", value_bytes=100))
    config = jaas_config(sasl_kafka, mechanism)
    # Group membership (librdkafka), target topic creation (librdkafka admin) and the raw
    # fetch/produce connections (net layer) all authenticate from the JAAS line.
    stats = mirror(config, config, [topic], topic_mapper=prefix_mapper("B"),
                   until_caught_up=True, timeout_s=120, source_alias="A", target_alias="B",
                   **{"partition.assignment": "group", "group.id": f"g-{topic}", **GROUP})
    assert stats.records == 3000 and not stats.stopped
    source = read_topic(sasl_kafka.client_config(), topic)
    target = read_topic(librdkafka_connection(config, "B"), f"B.{topic}")
    assert_same_records(source, target)


def _run_cli(*args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shallowmirror", *args], capture_output=True,
                          text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_mirror_process_over_scram_with_jaas_lines(sasl_kafka, tmp_path):
    topic = f"sasl-cli-{uuid.uuid4().hex[:8]}"
    load(sasl_kafka.client_config(), Workload(topic=topic, records=2000, partitions=2,
                                              codec="zstd", value_bytes=100))
    lines = ["clusters = A, B"]
    for alias in ("A", "B"):
        lines += [f"{alias}.{k} = {v}" for k, v in jaas_config(sasl_kafka,
                                                               "SCRAM-SHA-512").items()]
    lines += ["A->B.enabled = true", f"A->B.topics = {topic}", f"group.id = g-{topic}",
              "metadata.max.age.ms = 1000", *(f"{k} = {v}" for k, v in GROUP.items())]
    path = tmp_path / "mm2.properties"
    path.write_text("\n".join(lines) + "\n")
    result = _run_cli("mirror", str(path), "--exit-when-caught-up", "--caught-up-timeout", "120")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    assert_same_records(read_topic(sasl_kafka.client_config(), topic),
                        read_topic(sasl_kafka.client_config(), f"A.{topic}"))


@pytest.mark.parametrize(("keys", "named"), [
    ({"A.sasl.mechanism": "SCRAM-SHA-256",
      "A.sasl.jaas.config": f'{MODULES["PLAIN"]} required username="u" password="p";'},
     "sasl.jaas.config (cluster A)"),
    ({"A.sasl.mechanism": "GSSAPI"}, "sasl.mechanism (cluster A)"),
    ({"A.sasl.jaas.config": f'{MODULES["PLAIN"]} required;'}, "sasl.username/sasl.password"),
])
def test_check_refuses_bad_sasl_values_naming_the_key(tmp_path, keys, named):
    path = tmp_path / "mm2.properties"
    props = {"clusters": "A, B", "A.bootstrap.servers": "127.0.0.1:1",
             "B.bootstrap.servers": "127.0.0.1:2", "A->B.enabled": "true",
             "A.security.protocol": "SASL_PLAINTEXT", **keys}
    path.write_text("".join(f"{k} = {v}\n" for k, v in props.items()))
    result = _run_cli("mirror", str(path), "--check", timeout_s=60)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert named in result.stderr and "Traceback" not in result.stderr
