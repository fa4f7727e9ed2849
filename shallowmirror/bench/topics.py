"""Create, delete and re-create topics with confluent-kafka's AdminClient.

The target is emptied between runs by deleting and re-creating its topics: DeleteRecords would be
cheaper but breaks the connection on tansu, and a fresh topic also drops any state a previous run
left (producer ids, offsets). Mirrored topics get ``compression.type=producer`` so the broker
stores what the mirror sends instead of recompressing it.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from shallowmirror.testing.topics import admin_errors

_UNKNOWN_TOPIC = 3
_TOPIC_EXISTS = 36


def admin(bootstrap: str) -> AdminClient:
    from shallowmirror.rdkafka_logs import with_log_config

    return AdminClient(with_log_config({"bootstrap.servers": bootstrap}))


def create(bootstrap: str, topic: str, partitions: int, *, timeout_s: float = 30.0) -> None:
    """Create ``topic``; wait until Metadata lists all its partitions."""
    client = admin(bootstrap)
    new = NewTopic(topic, num_partitions=partitions, replication_factor=-1,
                   config={"compression.type": "producer"})
    _raise_first(client.create_topics([new], request_timeout=timeout_s))
    _wait(client, topic, lambda meta: meta is not None and meta.error is None
          and len(meta.partitions) == partitions, timeout_s, "created")


def delete(bootstrap: str, topic: str, *, timeout_s: float = 30.0) -> None:
    """Delete ``topic`` if it exists; wait until Metadata no longer lists it."""
    client = admin(bootstrap)
    _raise_first(client.delete_topics([topic], request_timeout=timeout_s),
                 ignore=_UNKNOWN_TOPIC)
    # Listing all topics (not this one by name): tansu auto-creates a topic named in Metadata.
    _wait(client, None, lambda topics: topic not in topics, timeout_s, "deleted")


def recreate(bootstrap: str, topic: str, partitions: int, *, timeout_s: float = 30.0) -> None:
    """An empty ``topic`` with ``partitions`` partitions, whatever was there before."""
    delete(bootstrap, topic, timeout_s=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            create(bootstrap, topic, partitions, timeout_s=timeout_s)
            return
        except KafkaException as err:
            # Kafka deletes asynchronously: the name may still be taken for a moment.
            if err.args[0].code() != _TOPIC_EXISTS or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _raise_first(futures: dict, ignore: int | None = None) -> None:
    """Wait for an admin request's futures; raise the first error (but ``ignore``'s code), as
    a copy (``admin_errors`` says why: else an interrupted bench lingered on tansu's stop)."""
    for err in admin_errors(futures):
        if err is None or (ignore is not None and isinstance(err, KafkaException)
                           and err.args[0].code() == ignore):
            continue
        raise type(err)(*err.args)


def _wait(client: AdminClient, topic: str | None, done, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        md = client.list_topics(topic, timeout=timeout_s)
        subject = md.topics.get(topic) if topic is not None else md.topics
        if done(subject):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic} not {what} within {timeout_s:.0f}s")
        time.sleep(0.1)
