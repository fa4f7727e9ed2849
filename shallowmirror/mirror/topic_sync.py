"""Remote topics on the target: created, grown and configured like their source topics.

For one flow, ``TopicSync.refresh()`` lists the source topics the flow replicates, creates each
missing remote topic with the source's partition count and (filtered) configs plus
``compression.type=producer``, adds partitions when the source grew, and returns the topics that
are *ready*: their remote topic exists with at least the source's partitions. Only ready topics
are handed to the engine, so the engine never produces into a topic the broker would auto-create
with default settings.

A topic whose partition count cannot be matched (the target refuses CreatePartitions, e.g. tansu)
is reported once with a clear error and left out; the other topics keep going.

``sync_configs()`` copies source config changes with IncrementalAlterConfigs (SET for new or
changed values, DELETE for values this process set earlier that the source no longer has).

Blocking confluent-kafka admin calls: the process runs them in a worker thread.
Out of scope: ACL sync, topic deletion (a deleted source topic leaves its remote topic alone, as
in MM2).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from shallowmirror.engine.topic_names import unmatched_names
from shallowmirror.errors import ShallowMirrorError
from shallowmirror.mirror.config import FlowConfig
from shallowmirror.mirror.filters import FORCED_TOPIC_CONFIGS
from shallowmirror.net.probe import listener_hint

log = logging.getLogger(__name__)

#: Apache Kafka's DescribeConfigs lists every topic config (30+). A broker that answers with
#: fewer lists only the configs that were set, labelled DEFAULT_CONFIG (tansu 0.6): there every
#: entry counts as set.
SPARSE_DESCRIBE_LIMIT = 15
#: Longest wait for one Metadata answer while listing topics.
METADATA_WAIT_S = 5.0
#: How long a topic the target just said exists (TOPIC_ALREADY_EXISTS, or CreatePartitions
#: "already has N partitions") may be missing from, or short in, its Metadata answers: a
#: broker's metadata trails its controller by a few milliseconds after a create.
SETTLE_S = 2.0


class ClusterUnreachableError(ShallowMirrorError):
    """A cluster did not answer an admin request in time."""


@dataclass
class TopicState:
    """What the sync knows about one replicated topic."""

    source_topic: str
    remote_topic: str
    source_partitions: int
    remote_partitions: int = 0
    error: str | None = None
    #: Config keys this process SET on the remote topic (candidates for DELETE later).
    applied: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.error is None and self.remote_partitions >= self.source_partitions > 0


def explicit_configs(entries: dict[str, Any]) -> dict[str, str]:
    """The configs set on a topic (not defaults), from a DescribeConfigs answer."""
    values = {name: e for name, e in entries.items()
              if e.value is not None and not e.is_sensitive}
    if len(entries) < SPARSE_DESCRIBE_LIMIT and all(
            e.source == ConfigSource.DEFAULT_CONFIG.value for e in entries.values()):
        return {name: e.value for name, e in values.items() if not e.is_read_only}
    return {name: e.value for name, e in values.items()
            if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}


class TopicSync:
    """Keeps one flow's remote topics in step with the source."""

    def __init__(self, flow: FlowConfig, source_admin: Any, target_admin: Any, *,
                 timeout_s: float = 15.0):
        self.flow = flow
        self.source_admin = source_admin
        self.target_admin = target_admin
        self.timeout_s = timeout_s
        self.topics: dict[str, TopicState] = {}
        self._reported: dict[str, str] = {}
        self._literals_checked = False

    # -- listing -----------------------------------------------------------------------------

    def _list(self, admin: Any, alias: str) -> dict[str, int]:
        """Topic -> partition count, via Metadata for all topics (which never auto-creates)."""
        # A cluster answers Metadata in milliseconds once connected: a short wait tells an
        # unreachable one early (the caller retries with backoff; librdkafka keeps connecting).
        wait_s = min(self.timeout_s, METADATA_WAIT_S)
        try:
            md = admin.list_topics(timeout=wait_s)
        except KafkaException as err:
            config = self.flow.source_admin if alias == self.flow.source \
                else self.flow.target_admin
            hint = listener_hint(str(config.get("bootstrap.servers", "")),
                                 str(config.get("security.protocol", "PLAINTEXT")).upper())
            raise ClusterUnreachableError(
                f"cluster {alias} did not answer Metadata within {wait_s:.0f}s: "
                f"{err.args[0].str() if err.args else err}"
                + (f"; {hint}" if hint else "")) from err
        return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None
                or t.error.code() == KafkaError.NO_ERROR}

    def _settled_partitions(self, topic: str, at_least: int) -> int:
        """``topic``'s partition count on the target, listed again (for up to ``SETTLE_S``)
        while it is below ``at_least``: right after a create the listing can still say 0, and a
        count taken from it once sent CreatePartitions to a topic that had them all (refused:
        the topic was then not mirrored, and the process exited 1)."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            count = self._list(self.target_admin, self.flow.target).get(topic, 0)
            if count >= at_least or time.monotonic() >= deadline:
                return count
            time.sleep(0.1)

    def source_topics(self) -> dict[str, int]:
        """Source topics this flow replicates -> partition count."""
        listed = self._list(self.source_admin, self.flow.source)
        if not self._literals_checked:
            self._literals_checked = True
            for line in unmatched_names(self.flow.topic_filter.include, listed,
                                        self.flow.source):
                log.warning("flow %s: %s", self.flow.name, line)
        return {t: n for t, n in listed.items() if self.flow.should_replicate(t)}

    # -- refresh -----------------------------------------------------------------------------

    def refresh(self) -> list[str]:
        """Create/grow remote topics for every replicated source topic; the ready ones."""
        wanted = self.source_topics()
        remote = self._list(self.target_admin, self.flow.target)
        claimed: dict[str, str] = {}
        for topic, partitions in sorted(wanted.items()):
            state = self.topics.get(topic)
            if state is None:
                state = self.topics[topic] = TopicState(
                    topic, self.flow.remote_topic(topic), partitions)
            state.source_partitions = partitions
            # Errors are re-derived every refresh: partitions added by hand clear them.
            state.error = None
            other = claimed.setdefault(state.remote_topic, topic)
            if other != topic:
                self._fail(state, f"remote topic {state.remote_topic} on {self.flow.target} "
                                  f"would receive both {other} and {topic}: change the "
                                  "replication policy or the topic filters")
                continue
            had = state.remote_partitions
            state.remote_partitions = remote.get(state.remote_topic, 0)
            try:
                created = self._ensure(state)
                if had and created:
                    # Said once it is so: a listing that trailed this sync's own create (right
                    # after it re-created the topic) also said "missing", and the warning came
                    # twice for one deletion.
                    log.warning("flow %s: remote topic %s is gone from %s (deleted there?); "
                                "created it again: what was mirrored into it before is lost, "
                                "and mirroring goes on from the source offsets committed so "
                                "far", self.flow.name, state.remote_topic, self.flow.target)
            except ClusterUnreachableError:
                raise
            except Exception as err:  # noqa: BLE001 - one topic's trouble must not stop others
                self._fail(state, f"cannot prepare remote topic {state.remote_topic}: {err}")
        for gone in set(self.topics) - set(wanted):
            del self.topics[gone]
        return sorted(t for t, s in self.topics.items() if s.ready)

    def _ensure(self, state: TopicState) -> bool:
        """Create or grow ``state``'s remote topic as needed; whether this call created it."""
        created = state.remote_partitions == 0 and self._create(state)
        if state.remote_partitions < state.source_partitions:
            self._add_partitions(state)
        elif state.error is None and state.remote_partitions > state.source_partitions:
            self._report(state.source_topic, logging.WARNING,
                         f"remote topic {state.remote_topic} has {state.remote_partitions} "
                         f"partitions, source {state.source_partitions}: partitions "
                         f"{state.source_partitions}.. of the remote topic stay empty")
        if state.ready and state.error is None:
            self._reported.pop(state.source_topic, None)
        return created

    def _create(self, state: TopicState) -> bool:
        """Create the remote topic; False when the target says it exists already."""
        configs = self._desired_configs(state.source_topic)
        rf = int(self.flow.settings["replication.factor"])
        for attempt_configs in (configs, dict(FORCED_TOPIC_CONFIGS)):
            new = NewTopic(state.remote_topic, num_partitions=state.source_partitions,
                           replication_factor=rf, config=attempt_configs)
            future = self.target_admin.create_topics([new], request_timeout=self.timeout_s)[
                state.remote_topic]
            try:
                future.result(timeout=self.timeout_s)
            except KafkaException as err:
                kerr = err.args[0]
                if kerr.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    # Created first by another mirror process, or by this one a moment ago
                    # (a listing that trailed the create said it was missing): its count.
                    state.remote_partitions = self._settled_partitions(state.remote_topic, 1)
                    return False
                if kerr.code() in (KafkaError.INVALID_CONFIG, KafkaError.INVALID_REQUEST) \
                        and attempt_configs != FORCED_TOPIC_CONFIGS:
                    log.warning("flow %s: target refused configs %s for %s (%s); creating it "
                                "with compression.type=producer only", self.flow.name,
                                attempt_configs, state.remote_topic, kerr.str())
                    continue
                raise ShallowMirrorError(kerr.str()) from err
            state.remote_partitions = state.source_partitions
            state.applied = {k: v for k, v in attempt_configs.items()
                             if k not in FORCED_TOPIC_CONFIGS}
            log.info("flow %s: created %s on %s (%d partitions, configs %s)", self.flow.name,
                     state.remote_topic, self.flow.target, state.source_partitions,
                     attempt_configs)
            return True
        return False            # (the loop always returns or raises)

    def _add_partitions(self, state: TopicState) -> None:
        future = self.target_admin.create_partitions(
            [NewPartitions(state.remote_topic, state.source_partitions)],
            request_timeout=self.timeout_s)[state.remote_topic]
        try:
            future.result(timeout=self.timeout_s)
        except KafkaException as err:
            if err.args[0].code() == KafkaError.INVALID_PARTITIONS:
                # Kafka's "already has N partition(s)": the count asked from may have been a
                # listing that trailed a create. Other refusals (a broker without
                # CreatePartitions) are final: no wait, for each such topic of a refresh.
                state.remote_partitions = self._settled_partitions(state.remote_topic,
                                                                   state.source_partitions)
                if state.remote_partitions >= state.source_partitions:
                    return
            self._fail(state, f"source topic {state.source_topic} has "
                              f"{state.source_partitions} partitions but remote topic "
                              f"{state.remote_topic} on {self.flow.target} has "
                              f"{state.remote_partitions} and the target refused to add "
                              f"partitions ({err.args[0].str()}); this topic is not mirrored "
                              "until the partition counts match")
            return
        log.info("flow %s: %s grown to %d partitions", self.flow.name, state.remote_topic,
                 state.source_partitions)
        state.remote_partitions = state.source_partitions

    def _fail(self, state: TopicState, message: str) -> None:
        state.error = message
        self._report(state.source_topic, logging.ERROR, f"flow {self.flow.name}: {message}")

    def _report(self, topic: str, level: int, message: str) -> None:
        """Log once per distinct message per topic (refresh runs forever)."""
        if self._reported.get(topic) != message:
            self._reported[topic] = message
            log.log(level, "%s", message)

    def errors(self) -> dict[str, str]:
        """Topics left out and why."""
        return {t: s.error for t, s in self.topics.items() if s.error}

    # -- configs -----------------------------------------------------------------------------

    def describe(self, admin: Any, topic: str) -> dict[str, Any]:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        future = admin.describe_configs([resource], request_timeout=self.timeout_s)[resource]
        return future.result(timeout=self.timeout_s)

    def _desired_configs(self, source_topic: str) -> dict[str, str]:
        if not self.flow.settings["sync.topic.configs.enabled"]:
            return dict(FORCED_TOPIC_CONFIGS)
        source = explicit_configs(self.describe(self.source_admin, source_topic))
        return self.flow.config_filter.target_configs(source)

    def sync_configs(self) -> int:
        """Bring every ready remote topic's configs in line with its source; changes made."""
        changed = 0
        for state in list(self.topics.values()):
            if not state.ready:
                continue
            try:
                changed += self._sync_one(state)
            except KafkaException as err:
                self._report(state.source_topic, logging.WARNING,
                             f"flow {self.flow.name}: config sync of {state.remote_topic} "
                             f"failed: {err.args[0].str() if err.args else err}")
        return changed

    def _sync_one(self, state: TopicState) -> int:
        desired = self._desired_configs(state.source_topic)
        current = self.describe(self.target_admin, state.remote_topic)
        ops: list[ConfigEntry] = []
        for key, value in desired.items():
            entry = current.get(key)
            now = entry.value if entry is not None else None
            if key in FORCED_TOPIC_CONFIGS and now is None:
                continue  # a broker listing only set configs: absent means the default
            if now != value:
                ops.append(ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET))
        for key in set(state.applied) - set(desired):
            ops.append(ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE))
        if not ops:
            return 0
        resource = ConfigResource(ResourceType.TOPIC, state.remote_topic,
                                  incremental_configs=ops)
        future = self.target_admin.incremental_alter_configs(
            [resource], request_timeout=self.timeout_s)[resource]
        future.result(timeout=self.timeout_s)
        for op in ops:
            if op.incremental_operation == AlterConfigOpType.DELETE:
                state.applied.pop(op.name, None)
            elif op.name not in FORCED_TOPIC_CONFIGS:
                state.applied[op.name] = op.value
        if any(op.name in FORCED_TOPIC_CONFIGS for op in ops):
            log.warning("flow %s: set compression.type=producer on %s (any other value makes "
                        "the target broker recompress every mirrored batch)", self.flow.name,
                        state.remote_topic)
        log.info("flow %s: synced configs of %s: %s", self.flow.name, state.remote_topic,
                 ", ".join(f"{op.name}={'(deleted)' if op.value is None else op.value}"
                           for op in ops))
        return len(ops)
