"""Example helper: two clusters to play with — the ones in SHALLOWMIRROR_SOURCE_BOOTSTRAP /
SHALLOWMIRROR_TARGET_BOOTSTRAP, else two embedded tansu brokers — and a few records to mirror."""

from __future__ import annotations

import contextlib

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from shallowmirror.testing import embedded


@contextlib.contextmanager
def two_clusters():
    external = embedded.external_from_env()
    if external is not None:
        yield external
        return
    with embedded.embedded_clusters("source", "target") as (source, target):
        yield source, target


def write_records(bootstrap: str, topic: str, n: int = 10_000, partitions: int = 4) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    with contextlib.suppress(Exception):
        admin.create_topics([NewTopic(topic, partitions, -1,
                                      config={"compression.type": "producer"})])[topic].result()
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd",
                         "linger.ms": 20})
    for i in range(n):
        producer.produce(topic, key=b"user-%d" % (i % 97), value=b'{"event": "click", "n": %d}' % i,
                         partition=i % partitions)
        if i % 5000 == 0:
            producer.poll(0)
    producer.flush(30)
