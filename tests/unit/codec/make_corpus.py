"""Regenerate the corpus of real broker-stored batches under tests/unit/codec/data/.

Why: the differential tests need batches written by real clients (librdkafka via confluent-kafka,
and kafka-python's producer) and stored by a real Kafka-protocol broker, but unit tests must run
without a broker. This script starts an embedded tansu broker, produces small topics for every
codec (none, gzip, snappy, lz4, zstd) in three modes (plain, idempotent, transactional with a
committed and an aborted transaction, so control batches are included), fetches each partition's
raw record set with kafka-python's FetchRequest over a plain socket, and saves the bytes as
``<client>-<codec>-<mode>.bin``. ``index.json`` lists the files with their record counts.

Run: ``.venv/bin/python tests/unit/codec/make_corpus.py`` (about a minute). The tansu process is
stopped by pid at the end, also on error.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchRequest, FetchResponse

from shallowmirror.testing.embedded import start_cluster

DATA = Path(__file__).parent / "data"
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
MODES = ("plain", "idempotent", "transactional")
RECORDS_PER_TXN = 6


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def fetch_raw(port: int, topic: str, version: int = 4) -> tuple[bytes, list]:
    """The raw record set of partition 0 from offset 0, read_uncommitted (control batches too)."""
    request = FetchRequest(
        replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=4 << 20, isolation_level=0,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=0,
                                                   partition_max_bytes=4 << 20)])],
        version=version)
    request.with_header(correlation_id=1, client_id="shallowmirror-corpus")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request.encode(header=True, framed=True))
        size = struct.unpack(">i", _recv_exact(sock, 4))[0]
        frame = _recv_exact(sock, size)
    response = FetchResponse.decode(frame, version=version, header=True)
    partition = response.responses[0].partitions[0]
    if partition.error_code:
        raise RuntimeError(f"fetch {topic}: error code {partition.error_code}")
    aborted = [(a.producer_id, a.first_offset) for a in (partition.aborted_transactions or [])]
    return bytes(partition.records or b""), aborted


def _value(i: int) -> bytes:
    # Compressible but not trivial: codecs produce distinct, realistic payloads.
    return (f"record-{i:05d} " * 8).encode() + bytes(range(i % 50))


def produce_librdkafka(bootstrap: str, topic: str, codec: str, mode: str) -> int:
    """Produce with confluent-kafka; returns the number of data records sent."""
    config = {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 50,
              "batch.num.messages": 7}
    if mode in ("idempotent", "transactional"):
        config["enable.idempotence"] = True
    if mode == "transactional":
        config["transactional.id"] = f"corpus-{topic}"
    producer = Producer(config)
    headers = [("trace", b"abc"), ("empty", b""), ("null", None)]
    sent = 0
    if mode == "transactional":
        producer.init_transactions(30)
        for outcome in ("commit", "abort", "commit"):
            producer.begin_transaction()
            for _ in range(RECORDS_PER_TXN):
                producer.produce(topic, key=f"k{sent}".encode(), value=_value(sent),
                                 headers=headers, partition=0)
                sent += 1
            if outcome == "commit":
                producer.commit_transaction(30)
            else:
                producer.flush(30)
                producer.abort_transaction(30)
    else:
        for _ in range(20):
            key = None if sent % 5 == 0 else f"k{sent}".encode()
            producer.produce(topic, key=key, value=_value(sent), headers=headers if sent % 2
                             else None, partition=0, timestamp=1_700_000_000_000 + sent)
            sent += 1
            if sent % 7 == 0:
                producer.flush(30)
        if producer.flush(30):
            raise RuntimeError(f"{topic}: messages left unsent")
    return sent


def produce_kafka_python(bootstrap: str, topic: str, codec: str, mode: str) -> int:
    """Produce with kafka-python's KafkaProducer; returns the number of data records sent."""
    from kafka import KafkaProducer

    import shallowmirror.codec.deep  # noqa: F401 - installs snappy for kafka-python

    config = {"bootstrap_servers": bootstrap,
              "compression_type": None if codec == "none" else codec,
              "linger_ms": 20, "batch_size": 1024}
    if mode in ("idempotent", "transactional"):
        config["enable_idempotence"] = True
    if mode == "transactional":
        config["transactional_id"] = f"corpus-{topic}"
    producer = KafkaProducer(**config)
    sent = 0
    try:
        if mode == "transactional":
            producer.init_transactions()
            for outcome in ("commit", "abort", "commit"):
                producer.begin_transaction()
                for _ in range(RECORDS_PER_TXN):
                    producer.send(topic, key=f"k{sent}".encode(), value=_value(sent),
                                  headers=[("h", b"v")], partition=0)
                    sent += 1
                producer.flush()
                if outcome == "commit":
                    producer.commit_transaction()
                else:
                    producer.abort_transaction()
        else:
            for _ in range(20):
                producer.send(topic, key=f"k{sent}".encode() if sent % 3 else None,
                              value=_value(sent), headers=[("h", b"v")] if sent % 2 else [],
                              partition=0, timestamp_ms=1_700_000_000_000 + sent)
                sent += 1
                if sent % 7 == 0:
                    producer.flush()
            producer.flush()
    finally:
        producer.close(timeout=10)
    return sent


def main() -> int:
    DATA.mkdir(parents=True, exist_ok=True)
    index = {}
    cluster = start_cluster("corpus")
    try:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        producers = {"librdkafka": produce_librdkafka, "kafka-python": produce_kafka_python}
        topics = [f"{client}-{codec}-{mode}" for client in producers for codec in CODECS
                  for mode in MODES]
        for future in admin.create_topics(
                [NewTopic(t, num_partitions=1, replication_factor=1) for t in topics]).values():
            future.result(30)
        for topic in topics:
            client, codec, mode = topic.split("-", 1)[0], *topic.rsplit("-", 2)[-2:]
            if client == "kafka":
                client = "kafka-python"
            try:
                sent = producers[client](cluster.bootstrap, topic, codec, mode)
            except Exception as err:  # noqa: BLE001 - report and keep the rest of the corpus
                print(f"skip {topic}: {err!r}", file=sys.stderr)
                continue
            records, aborted = fetch_raw(cluster.port, topic)
            (DATA / f"{topic}.bin").write_bytes(records)
            index[topic] = {"client": client, "codec": codec, "mode": mode, "sent": sent,
                            "bytes": len(records), "aborted_transactions": aborted}
            print(f"{topic}: {sent} records, {len(records)} bytes", flush=True)
    finally:
        cluster.stop()
    (DATA / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
