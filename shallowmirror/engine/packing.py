"""Which batches go into the next Produce request to one target broker (pure planning).

Stock brokers accept exactly one RecordBatch per partition per Produce request, so throughput
comes from packing many partitions into one request and keeping several requests in flight. The
planner takes the *head* batch of every partition queue that may send now (fewer than
``per_partition_in_flight`` batches of it outstanding, not blocked by a retry), in the order the
caller keeps (the sink's: least recently sent first, so no partition is always last), until
``max_request_bytes`` is reached. A head batch that alone exceeds the limit is reported, never sent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

#: Request bytes besides the batches: header, client id, transactional id, acks, timeout, arrays.
REQUEST_OVERHEAD_BYTES = 128
#: Per partition (index + records length) and per topic (name length + array count) overhead.
PARTITION_OVERHEAD_BYTES = 8

K = TypeVar("K", bound=Hashable)
B = TypeVar("B")


def topic_overhead_bytes(topic: str) -> int:
    return 2 + len(topic.encode()) + 4


@dataclass
class Plan(Generic[K, B]):
    """The batches of one request (one per partition key, in planning order), and head batches
    that can never fit."""

    picks: list[tuple[K, B]] = field(default_factory=list)
    too_large: list[tuple[K, B]] = field(default_factory=list)
    request_bytes: int = REQUEST_OVERHEAD_BYTES


def plan_request(queues: Mapping[K, deque[B]], order: Sequence[K], *, size_of: Callable[[B], int],
                 topic_of: Callable[[K], str], can_send: Callable[[K], bool],
                 max_request_bytes: int) -> Plan[K, B]:
    """Pick at most one head batch per partition, in ``order``, while the request fits.

    ``order`` is the order the caller maintains (each key at most once, so no partition is
    picked twice, which stock brokers would reject; every key with a queued batch)."""
    picks: list[tuple[K, B]] = []
    too_large: list[tuple[K, B]] = []
    request_bytes = REQUEST_OVERHEAD_BYTES
    topics_seen: set[str] = set()
    for key in order:
        queue = queues.get(key)
        if not queue or not can_send(key):
            continue
        batch = queue[0]
        topic = topic_of(key)
        extra = size_of(batch) + PARTITION_OVERHEAD_BYTES
        if topic not in topics_seen:
            extra += topic_overhead_bytes(topic)
        if REQUEST_OVERHEAD_BYTES + extra > max_request_bytes:
            too_large.append((key, batch))
            continue
        if request_bytes + extra > max_request_bytes:
            continue        # a smaller head further on may still fit
        picks.append((key, batch))
        request_bytes += extra
        topics_seen.add(topic)
    assert request_bytes <= max_request_bytes or not picks
    return Plan(picks, too_large, request_bytes)


class Rotation(Generic[K]):
    """A fair order over a changing set of keys: each call starts one key later (the fetch
    loop's order over its partitions)."""

    def __init__(self) -> None:
        self._keys: list[K] = []
        self._members: set[K] = set()
        self._start = 0

    def add(self, key: K) -> None:
        if key not in self._members:
            self._members.add(key)
            self._keys.append(key)

    def remove(self, key: K) -> None:
        if key in self._members:
            self._members.discard(key)
            self._keys.remove(key)

    def __contains__(self, key: object) -> bool:
        return key in self._members

    def __len__(self) -> int:
        return len(self._keys)

    def next_order(self) -> list[K]:
        if not self._keys:
            return []
        start = self._start % len(self._keys)
        self._start = start + 1
        return self._keys[start:] + self._keys[:start]
