"""Consumer groups on a cluster: list and filter them (MM2's ``groups``/``groups.exclude``),
read and write their committed offsets, and check that nobody is consuming (blocking calls,
confluent-kafka's AdminClient)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from shallowmirror.errors import ShallowMirrorError
from shallowmirror.mirror.clients import admin_client
from shallowmirror.mirror.filters import compile_pattern_list

#: COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR: a group
#: coordinator still loading or moving (a fresh cluster creating __consumer_offsets).
_COORDINATOR_CODES = frozenset({14, 15, 16})


def _transient(error) -> bool:
    return error is not None and (error.code() in _COORDINATOR_CODES or error.retriable())


def _retriable(err: KafkaException) -> bool:
    return _transient(err.args[0] if err.args else None)


class GroupError(ShallowMirrorError):
    """A consumer group could not be listed, read or written."""


@dataclass(frozen=True)
class GroupFilter:
    """MM2's DefaultGroupFilter: included by ``groups``, not excluded by ``groups.exclude``."""

    include: tuple[str, ...]
    exclude: tuple[str, ...]

    def wanted(self, group: str) -> bool:
        include = compile_pattern_list(self.include)
        exclude = compile_pattern_list(self.exclude)
        return (include is not None and include.fullmatch(group) is not None
                and (exclude is None or exclude.fullmatch(group) is None))


@dataclass(frozen=True)
class CommittedOffset:
    topic: str
    partition: int
    offset: int
    metadata: str


class Groups:
    """Group operations on one cluster."""

    def __init__(self, config: Mapping[str, Any], *, alias: str, timeout_s: float = 30.0):
        self.alias = alias
        self.timeout_s = timeout_s
        self.admin = admin_client(config, what=f"cluster {alias} admin")

    def _fail(self, what: str, err: Exception) -> GroupError:
        return GroupError(f"cluster {self.alias}: {what}: {err}")

    def list(self) -> list[str]:
        try:
            result = self.admin.list_consumer_groups(request_timeout=self.timeout_s).result()
        except KafkaException as err:
            raise self._fail("listing consumer groups failed", err) from err
        return sorted(g.group_id for g in result.valid)

    def committed(self, group: str) -> list[CommittedOffset]:
        """The group's committed offsets (partitions without one are left out)."""
        request = [ConsumerGroupTopicPartitions(group)]
        try:
            futures = self.admin.list_consumer_group_offsets(request,
                                                             request_timeout=self.timeout_s)
            answer = futures[group].result()
        except KafkaException as err:
            raise self._fail(f"reading the offsets of group {group!r} failed", err) from err
        return sorted((CommittedOffset(tp.topic, tp.partition, tp.offset, tp.metadata or "")
                       for tp in answer.topic_partitions or []
                       if tp.error is None and tp.offset >= 0),
                      key=lambda c: (c.topic, c.partition))

    def active_members(self, group: str) -> int:
        """Members currently in the group: 0 for an empty, dead or unknown group. A group in a
        stable or rebalancing state counts at least 1 (tansu lists no members)."""
        from confluent_kafka import ConsumerGroupState

        try:
            described = self.admin.describe_consumer_groups(
                [group], request_timeout=self.timeout_s)[group].result()
        except KafkaException as err:
            raise self._fail(f"describing group {group!r} failed", err) from err
        idle = (ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD, ConsumerGroupState.UNKNOWN)
        members = len(described.members or [])
        return max(members, 0 if described.state in idle else 1)

    def commit(self, group: str, offsets: Iterable[CommittedOffset]) -> None:
        """Write ``offsets`` as the group's committed offsets (the group must be empty)."""
        partitions = [TopicPartition(c.topic, c.partition, c.offset, metadata=c.metadata or "")
                      for c in offsets]
        if not partitions:
            return
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                answer = self.admin.alter_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group, partitions)],
                    request_timeout=self.timeout_s)[group].result()
            except KafkaException as err:
                if _retriable(err) and time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                raise self._fail(f"writing the offsets of group {group!r} failed", err) \
                    from err
            errors = [tp.error for tp in answer.topic_partitions if tp.error is not None]
            # A coordinator still loading or moving (a fresh cluster): ask again.
            if errors and all(_transient(e) for e in errors) and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            break
        failed = [f"{tp.topic}-{tp.partition}: {tp.error}" for tp in answer.topic_partitions
                  if tp.error is not None]
        if failed:
            raise GroupError(f"cluster {self.alias}: writing the offsets of group {group!r} "
                             f"failed for {', '.join(failed)}")
