"""MM2's internal topics on a cluster: create them (one partition, compacted, as MM2 creates
them), read one from the beginning to its end, write records to it.

Reading stops at the end the broker reports in the Fetch response (librdkafka's partition EOF),
not at ListOffsets "latest" (tansu answers that inside the last batch). Everything here blocks:
callers run it in a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from shallowmirror.errors import ShallowMirrorError
from shallowmirror.mirror.clients import (
    admin_client,
    build_client,
    connection_keys,
    flush_sliced,
    list_topics,
)
from shallowmirror.rdkafka_logs import ClientErrors
from shallowmirror.replication.admin_calls import describe, failure_message

log = logging.getLogger(__name__)

#: Internal topics are small and must keep every distinct key: compacted, one partition (MM2).
INTERNAL_TOPIC_CONFIG = {"cleanup.policy": "compact"}
#: ``TopicWriter.flush`` gives up on a cluster whose brokers have all been down this long
#: (librdkafka's word, nothing delivered since), checked between its flush slices.
GIVE_UP_DOWN_S = 1.0


class InternalTopicError(ShallowMirrorError):
    """An internal topic could not be created, read or written."""


def ensure_topic(config: Mapping[str, Any], topic: str, *, alias: str,
                 replication_factor: int = -1, timeout_s: float = 30.0) -> bool:
    """Create ``topic`` (one partition, compacted) unless it exists; True if created."""
    admin = admin_client(connection_keys(config), what=f"cluster {alias} admin")
    try:
        listed = list_topics(admin, timeout_s=timeout_s)
    except KafkaException as err:
        raise InternalTopicError(failure_message(alias, config, "listing topics", err,
                                                 timeout_s)) from err
    if topic in listed.topics and not listed.topics[topic].error:
        return False
    new = NewTopic(topic, num_partitions=1, replication_factor=replication_factor,
                   config=dict(INTERNAL_TOPIC_CONFIG))
    try:
        admin.create_topics([new], request_timeout=timeout_s)[topic].result(timeout=timeout_s)
    except KafkaException as err:
        if err.args and getattr(err.args[0], "code", lambda: None)() \
                == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise InternalTopicError(failure_message(alias, config, f"creating topic {topic}", err,
                                                 timeout_s)) from err
    log.info("cluster %s: created %s (compacted, 1 partition)", alias, topic)
    return True


def read_topic(config: Mapping[str, Any], topic: str, *, alias: str,
               timeout_s: float = 30.0) -> list[tuple[bytes | None, bytes | None]]:
    """Every (key, value) of partition 0 of ``topic`` in log order; [] if it does not exist."""
    conf = {**connection_keys(config), "group.id": "shallowmirror-internal-reader",
            "enable.auto.commit": False, "enable.partition.eof": True,
            "isolation.level": "read_uncommitted", "auto.offset.reset": "earliest"}
    consumer = build_client(Consumer, conf, what=f"cluster {alias} reader of {topic}")
    try:
        try:
            listed = list_topics(consumer, topic, timeout_s=timeout_s)
        except KafkaException as err:
            raise InternalTopicError(failure_message(alias, config, f"reading {topic}", err,
                                                     timeout_s)) from err
        meta = listed.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return []
        consumer.assign([TopicPartition(topic, 0, -2)])       # OFFSET_BEGINNING
        records: list[tuple[bytes | None, bytes | None]] = []
        idle = 0.0
        while True:
            message = consumer.poll(0.5)
            if message is None:
                idle += 0.5
                if idle >= timeout_s:
                    raise InternalTopicError(f"cluster {alias}: reading {topic} got no end of "
                                             f"partition within {timeout_s:.0f}s")
                continue
            idle = 0.0
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return records
                raise InternalTopicError(f"cluster {alias}: reading {topic} failed: "
                                         f"{describe(error)}")
            records.append((message.key(), message.value()))
    finally:
        consumer.close()


class TopicWriter:
    """An idempotent producer for one internal topic (records stay in order)."""

    def __init__(self, config: Mapping[str, Any], topic: str, *, alias: str) -> None:
        self.topic, self.alias = topic, alias
        self.failed: str | None = None
        what = f"cluster {alias} writer of {topic}"
        # Whether its cluster is gone (librdkafka's error_cb; a delivery says it is back). The
        # engine and the cluster already warn about a lost cluster: debug lines only here.
        self._errors = ClientErrors(log, what, interval_s=60.0, level=logging.DEBUG)
        conf = {**connection_keys(config), "enable.idempotence": True, "acks": "all",
                "linger.ms": 5, "compression.type": "none", "error_cb": self._errors}
        self._producer = build_client(Producer, conf, what=what)

    def _delivered(self, err, _message) -> None:
        if err is None:
            self._errors.reached()
        elif self.failed is None:
            self.failed = f"cluster {self.alias}: writing {self.topic} failed: {err}"
            log.error("%s", self.failed)

    def down_for_s(self) -> float | None:
        """Seconds every broker of the cluster has been down (``ClientErrors.down_for_s``), or
        None when it is not known to be."""
        return self._errors.down_for_s()

    def write(self, key: bytes, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(self.topic, value=value, key=key, partition=0,
                                       on_delivery=self._delivered)
                break
            except BufferError:
                self._producer.poll(0.1)
        self._producer.poll(0)

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait for every record written so far, up to ``timeout_s``; returns how many are still
        undelivered. Stops waiting once every broker of the cluster has been down for
        ``GIVE_UP_DOWN_S``: a shutdown then ends at once instead of waiting the whole timeout for
        a cluster that is gone (what it could not write is the caller's to report)."""
        return flush_sliced(self._producer, timeout_s, give_up=self._gone)

    def _gone(self) -> bool:
        down_s = self.down_for_s()
        return down_s is not None and down_s >= GIVE_UP_DOWN_S
