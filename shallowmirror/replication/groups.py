"""Consumer groups on a cluster: list and filter them (MM2's ``groups``/``groups.exclude``),
read and write their committed offsets, and check that nobody is consuming (blocking calls,
confluent-kafka's AdminClient)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from shallowmirror.errors import ShallowMirrorError
from shallowmirror.mirror.clients import admin_client
from shallowmirror.mirror.filters import compile_pattern_list
from shallowmirror.replication.admin_calls import (
    CoordinatorBusy,
    failure_message,
    retry_coordinator,
    transient,
)

T = TypeVar("T")


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
    """Group operations on one cluster. Each call is retried while the group coordinator is
    loading or moving (``admin_calls.retry_coordinator``), for at most ``timeout_s``."""

    def __init__(self, config: Mapping[str, Any], *, alias: str, timeout_s: float = 30.0):
        self.alias = alias
        self.timeout_s = timeout_s
        self.config = dict(config)
        self.admin = admin_client(config, what=f"cluster {alias} admin")

    def _fail(self, what: str, err: Exception) -> GroupError:
        return GroupError(failure_message(self.alias, self.config, what, err, self.timeout_s))

    def _call(self, what: str, call: Callable[[], T]) -> T:
        """``call()`` with coordinator retries; any failure becomes one ``GroupError``."""
        try:
            return retry_coordinator(call, timeout_s=self.timeout_s, what=what,
                                     fail=lambda message: GroupError(
                                         f"cluster {self.alias}: {message}"))
        except KafkaException as err:
            raise self._fail(what, err) from err

    def list(self) -> list[str]:
        def call() -> list[str]:
            result = self.admin.list_consumer_groups(request_timeout=self.timeout_s).result()
            return sorted(g.group_id for g in result.valid)

        return self._call("listing consumer groups", call)

    def committed(self, group: str) -> list[CommittedOffset]:
        """The group's committed offsets (partitions without one are left out)."""
        def call() -> list[CommittedOffset]:
            futures = self.admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group)], request_timeout=self.timeout_s)
            answer = futures[group].result()
            busy = [tp.error for tp in answer.topic_partitions or [] if transient(tp.error)]
            if busy:
                raise CoordinatorBusy(busy[0])
            return sorted((CommittedOffset(tp.topic, tp.partition, tp.offset, tp.metadata or "")
                           for tp in answer.topic_partitions or []
                           if tp.error is None and tp.offset >= 0),
                          key=lambda c: (c.topic, c.partition))

        return self._call(f"reading the offsets of group {group!r}", call)

    def active_members(self, group: str) -> int:
        """Members currently in the group: 0 for an empty, dead or unknown group. A group in a
        stable or rebalancing state counts at least 1 (tansu lists no members)."""
        from confluent_kafka import ConsumerGroupState

        idle = (ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD, ConsumerGroupState.UNKNOWN)

        def call() -> int:
            described = self.admin.describe_consumer_groups(
                [group], request_timeout=self.timeout_s)[group].result()
            members = len(described.members or [])
            return max(members, 0 if described.state in idle else 1)

        return self._call(f"describing group {group!r}", call)

    def commit(self, group: str, offsets: Iterable[CommittedOffset]) -> None:
        """Write ``offsets`` as the group's committed offsets (the group must be empty)."""
        partitions = [TopicPartition(c.topic, c.partition, c.offset, metadata=c.metadata or "")
                      for c in offsets]
        if not partitions:
            return

        def call() -> Any:
            answer = self.admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, partitions)],
                request_timeout=self.timeout_s)[group].result()
            errors = [tp.error for tp in answer.topic_partitions if tp.error is not None]
            # Every partition refused by a coordinator still loading or moving: ask again.
            if errors and all(transient(e) for e in errors):
                raise CoordinatorBusy(errors[0])
            return answer

        what = f"writing the offsets of group {group!r}"
        answer = self._call(what, call)
        failed = [f"{tp.topic}-{tp.partition}: {tp.error.name()}: {tp.error.str()}"
                  for tp in answer.topic_partitions if tp.error is not None]
        if failed:
            raise GroupError(f"cluster {self.alias}: {what} failed for {', '.join(failed)}")
