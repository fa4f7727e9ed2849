"""Create, delete and re-create topics with confluent-kafka's AdminClient.

The target is emptied between runs by deleting and re-creating its topics: DeleteRecords would be
cheaper but breaks the connection on tansu, and a fresh topic also drops any state a previous run
left (producer ids, offsets). Mirrored topics get ``compression.type=producer`` so the broker
stores what the mirror sends instead of recompressing it.

Metadata is asked in calls of at most ``METADATA_SLICE_S`` (``mirror.clients.list_topics``):
librdkafka holds the calling thread for a whole call, so Python runs no signal handler until it
returns, and Ctrl-C (which stops the embedded brokers too, leaving nothing to answer) waited out
whole 30 s timeouts. ``check_answers`` tells whether clusters given to the bench answer at all,
before anything is loaded.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from shallowmirror.errors import ShallowMirrorError
from shallowmirror.mirror.clients import METADATA_SLICE_S, list_topics
from shallowmirror.testing.topics import admin_errors

_UNKNOWN_TOPIC = 3
_TOPIC_EXISTS = 36
#: How long a cluster given to the bench has to answer its first Metadata request.
ANSWER_TIMEOUT_S = 10.0


class ClusterUnreachable(ShallowMirrorError):
    """A cluster given to the bench does not answer Metadata."""


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


def check_answers(clusters: dict[str, str], timeout_s: float | None = None
                  ) -> dict[str, str | None]:
    """Each cluster's id (role -> bootstrap given, role -> id returned; None: it gives none),
    or ``ClusterUnreachable`` naming every cluster that does not answer Metadata within
    ``timeout_s`` (default ``ANSWER_TIMEOUT_S``); all are asked at once, so the wait is
    ``timeout_s`` at most."""
    timeout_s = ANSWER_TIMEOUT_S if timeout_s is None else timeout_s
    clients = {role: admin(bootstrap) for role, bootstrap in clusters.items()}
    errors: dict[str, str] = dict.fromkeys(clients, "no answer")
    ids: dict[str, str | None] = {}
    deadline = time.monotonic() + timeout_s
    while clients and time.monotonic() < deadline:
        for role, client in list(clients.items()):
            try:
                md = client.list_topics(timeout=max(min(METADATA_SLICE_S / len(clusters),
                                                        deadline - time.monotonic()), 0.01))
                ids[role] = md.cluster_id or None
                del clients[role]
            except KafkaException as err:
                errors[role] = err.args[0].str()
    if clients:
        question = ("is it running, and is that its address?" if len(clients) == 1 else
                    "are they running, and are those their addresses?")
        raise ClusterUnreachable("; ".join(
            f"the {role} cluster at {clusters[role]} did not answer within {timeout_s:g}s "
            f"({errors[role]})" for role in clients) + f"; {question}")
    return ids


def _wait(client: AdminClient, topic: str | None, done, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        md = list_topics(client, topic, timeout_s=timeout_s)
        subject = md.topics.get(topic) if topic is not None else md.topics
        if done(subject):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic} not {what} within {timeout_s:.0f}s")
        time.sleep(0.1)
