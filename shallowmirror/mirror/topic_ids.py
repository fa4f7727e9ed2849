"""Topic ids of a source cluster's topics, watched from a thread: a topic deleted and created
again under the same name between two looks gets a new id.

The deep path needs this: librdkafka's consumer (2.16) keeps no topic ids, so after a quick
re-creation it fetches on at the old topic's position and the new topic's records below it are
never mirrored. The engine's own metadata carries ids (``Cluster.topic_recreated_listeners``);
this is the same check for a confluent-kafka consumer, through ``AdminClient.describe_topics``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection

from shallowmirror.mirror.clients import admin_client, connection_keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recreated:
    """A topic found with a new id: ``old`` and ``new`` ids, and when (``time.monotonic()``) a
    look first found it missing in between (None: deleted and created again between looks)."""

    old: str
    new: str
    missing_since: float | None


class TopicIdWatch:
    """Look up the ids of ``topics()`` every ``interval_s`` seconds; collect the topics whose id
    changed since the last look that found them. A topic not found (deleted, not yet created
    again) keeps its last id, so its re-creation is still seen however long it was gone."""

    def __init__(self, config: Mapping[str, Any], topics: Callable[[], list[str]], *,
                 interval_s: float, what: str) -> None:
        self._config = connection_keys(config)
        self._topics = topics
        self._interval_s = interval_s
        self._what = what
        self._ids: dict[str, str] = {}
        self._missing_since: dict[str, float] = {}
        self._changed: dict[str, Recreated] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Look from a daemon thread: at once (an id first seen later cannot show a
        re-creation before it), then every ``interval_s``; never blocking the caller on a
        cluster that does not answer."""
        admin = admin_client(self._config, what=f"{self._what} topic ids")
        self._thread = threading.Thread(target=self._run, args=(admin,), daemon=True,
                                        name=f"{self._what} topic ids")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)     # a daemon: a look stuck on a dead cluster ends with us

    def topic_id(self, topic: str) -> str | None:
        """The id the last look that found ``topic`` saw (None: not found yet)."""
        with self._lock:
            return self._ids.get(topic)

    def take_changes(self) -> dict[str, Recreated]:
        """Topics re-created since the last call."""
        with self._lock:
            changed, self._changed = self._changed, {}
        return changed

    def _run(self, admin: Any) -> None:
        self.look(admin)
        while not self._stop.wait(self._interval_s):
            self.look(admin)

    def look(self, admin: Any) -> None:
        """One DescribeTopics round; an unreachable cluster or a missing topic changes nothing."""
        topics = self._topics()
        if not topics:
            return
        try:
            futures = admin.describe_topics(TopicCollection(topics), request_timeout=10)
        except KafkaException as err:
            log.debug("%s: topic ids not looked up: %s", self._what, err)
            return
        for topic, future in futures.items():
            try:
                topic_id = str(future.result().topic_id)
            except KafkaException as err:   # deleted (not yet created again), unreachable ...
                log.debug("%s: no id for topic %s: %s", self._what, topic, err)
                if _missing(err):
                    with self._lock:
                        if topic in self._ids:
                            self._missing_since.setdefault(topic, time.monotonic())
                continue
            with self._lock:
                old = self._ids.get(topic)
                self._ids[topic] = topic_id
                missing_since = self._missing_since.pop(topic, None)
                if old is not None and old != topic_id:
                    earlier = self._changed.get(topic)
                    self._changed[topic] = Recreated(
                        earlier.old if earlier else old, topic_id,
                        earlier.missing_since if earlier else missing_since)


def _missing(err: KafkaException) -> bool:
    error = err.args[0] if err.args else None
    return getattr(error, "code", lambda: None)() == KafkaError.UNKNOWN_TOPIC_OR_PART
