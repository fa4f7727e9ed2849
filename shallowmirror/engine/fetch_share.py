"""How one Fetch request divides its bytes between the partitions it asks for.

Kafka fills a response in request order (in a fetch session: the session's order, where it
moves every partition that returned records to the back), each partition up to the limit the
request gives it. One limit serves every partition of a request: with a session a changed
limit must be sent again for every partition the session holds, so it should change seldom.

The limit is ``fetch.max.bytes`` shared between the partitions that returned records lately
(``Sharers``), not between all those asked: beside 10,000 idle partitions an equal share of
16 MiB is below the 1 MiB floor, and the 8 busy ones got half of what they got alone, so the
mirror made twice the Fetches, each of which costs the broker a walk over its whole session.
"""

from __future__ import annotations

from collections.abc import Hashable

#: A partition's share of a Fetch is never cut below this (Kafka's default max.message.bytes):
#: a share smaller than the partition's batches would return it only partial batches.
MIN_FAIR_PARTITION_BYTES = 1 << 20

#: A partition shares the Fetch's bytes for this long after it last returned records.
ACTIVE_WINDOW_S = 5.0
#: How often the partitions not seen within the window are dropped (a walk over those seen).
PRUNE_EVERY_S = 1.0


def fair_partition_bytes(max_bytes: int, partitions: int, partition_max_bytes: int) -> int:
    """Bytes asked per partition: an equal share of ``max_bytes`` between ``partitions`` (at
    least 1 MiB), at most ``max.partition.fetch.bytes``. Kafka fills a response in request
    order, so a share of the whole request per partition (16 MiB / 4 MiB) returned data for
    only the first four of eight partitions, and produce requests then carried half the
    partitions they could."""
    share = max(MIN_FAIR_PARTITION_BYTES, max_bytes // max(1, partitions))
    return max(1, min(partition_max_bytes, max_bytes, share))


def _power_of_two_above(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class Sharers:
    """How many partitions a Fetch's bytes are shared between: those that returned records
    within ``ACTIVE_WINDOW_S``, rounded up to a power of two. The count follows a growing set
    at once and a shrinking one only once it is a quarter of the count, and stays put while
    nothing returns records; so traffic that comes and goes does not change the limit (and
    make a session resend every partition) on every other Fetch. Before anything returned
    records, every partition asked shares."""

    def __init__(self) -> None:
        self.seen: dict[Hashable, float] = {}
        self.count = 0
        self._pruned_at = 0.0

    def returned_records(self, tp: Hashable, now: float) -> None:
        self.seen[tp] = now

    def forget(self, tp: Hashable) -> None:
        self.seen.pop(tp, None)

    def of(self, asked: int, now: float) -> int:
        """The count for a Fetch asking for ``asked`` partitions at ``now`` (monotonic s)."""
        seen = self.seen
        if now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = now
            cutoff = now - ACTIVE_WINDOW_S
            for tp in [tp for tp, at in seen.items() if at < cutoff]:
                del seen[tp]
        active = len(seen)
        if not self.count:
            self.count = _power_of_two_above(active or asked)
        elif active and (active > self.count or active <= self.count // 4):
            self.count = _power_of_two_above(active)
        return self.count
