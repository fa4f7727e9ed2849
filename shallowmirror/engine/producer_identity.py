"""The mirror's producer identity on the target: producer id, epoch and per-partition sequences.

The sequences of every forwarded batch are kept here, in one place (the sink stamps a request's
batches with them in one ``codec.stamp_batches`` call), so an exactly-once (transactional) mirror
can replace this class with one that also carries a transactional id and begins/commits
transactions around what it stamps.

Idempotent mode (default): the target assigns ``producer_id``/``producer_epoch`` through
InitProducerId; each target partition's next sequence starts at 0 and grows by the batch's record
count (wrapping at 2**31 like Kafka's producer). A batch keeps its stamped header for life: a retry
resends the *same bytes with the same sequence*, which is what lets the broker discard duplicates.
A sequence or fencing error calls ``reset``: a new epoch (or id), all sequences back to 0, and
every unacknowledged batch re-stamped (``generation`` tells stale stamps apart).

Plain mode: ``-1/-1/-1`` on every batch, nothing tracked.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from shallowmirror.codec.layout import take_sequence

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

#: (current producer id, current epoch) -> (new id, new epoch); the network call is injected.
InitProducerIdCall = Callable[[int, int], Awaitable[tuple[int, int]]]


class Stamp(NamedTuple):
    """What goes into a batch header: producer id, epoch, base sequence (and the generation).
    Immutable; a tuple because one is made per forwarded batch (half a frozen dataclass's cost)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    generation: int


class ProducerIdentity:
    """Producer id/epoch and the next sequence per target partition."""

    transactional_id: str | None = None      # a transactional subclass sets it

    def __init__(self, *, idempotent: bool, init_call: InitProducerIdCall | None = None,
                 fixed_producer_id: int = -1) -> None:
        self.idempotent = idempotent
        self._init_call = init_call
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.generation = 0
        self._fixed = fixed_producer_id
        self._next_sequence: dict[tuple[str, int], int] = {}

    @property
    def ready(self) -> bool:
        return not self.idempotent or self.producer_id >= 0

    async def init(self) -> None:
        """Get a producer id and epoch from the target (idempotent mode only)."""
        if not self.idempotent:
            return
        if self._fixed >= 0:
            self.producer_id, self.producer_epoch = self._fixed, 0
        else:
            assert self._init_call is not None, "idempotent mode needs an InitProducerId call"
            self.producer_id, self.producer_epoch = await self._init_call(
                self.producer_id, self.producer_epoch)
        self._next_sequence.clear()
        self.generation += 1
        log.info("producer identity: id %d epoch %d (generation %d)",
                 self.producer_id, self.producer_epoch, self.generation)

    async def reset(self, reason: str) -> None:
        """Start over after a sequence or fencing error: new epoch/id, sequences from 0. The
        caller re-stamps every batch whose stamp has an older generation."""
        log.warning("resetting producer identity (id %d epoch %d): %s",
                    self.producer_id, self.producer_epoch, reason)
        await self.init()

    def stamp(self, topic: str, partition: int, record_count: int) -> Stamp:
        """The header fields for the next batch of ``topic``/``partition``; advances the sequence."""
        if not self.idempotent:
            return Stamp(NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE, self.generation)
        assert self.producer_id >= 0, "stamp() before init()"
        assert record_count > 0, "an idempotent batch needs at least one record"
        base = take_sequence(self._next_sequence, (topic, partition), record_count)
        return Stamp(self.producer_id, self.producer_epoch, base, self.generation)

    def sequences(self) -> dict[tuple[str, int], int] | None:
        """The next sequence per target partition, for ``codec.stamp_batches`` to read and
        advance (None when not idempotent: no sequences)."""
        if not self.idempotent:
            return None
        assert self.producer_id >= 0, "stamp() before init()"
        return self._next_sequence

    def next_sequence(self, topic: str, partition: int) -> int:
        return self._next_sequence.get((topic, partition), 0)

    def forget_partition(self, topic: str, partition: int) -> None:
        """Drop a partition's sequence (a fresh epoch is needed before writing it again)."""
        self._next_sequence.pop((topic, partition), None)
