"""The byte budget: one limit for everything fetched but not yet acknowledged by the target.

Memory is charged per *fetch frame* (the whole response buffer), not per batch: batch views alias
the frame, so the frame stays alive until its last batch is acknowledged or dropped. A
``FrameLease`` counts the batches still holding a frame and gives the frame's bytes back when the
count reaches zero.

Fetchers call ``wait_room(n)`` before each Fetch (n: a quarter of the limit, at most
fetch.max.bytes) and then ask the broker for at most the bytes still free: it returns once the
bytes in use plus ``n`` fit the limit (or nothing is in use, so a single oversize fetch can never
deadlock). Peak memory held is therefore the limit plus what a broker returns beyond the asked
``max_bytes`` (Kafka: the first batch; tansu: ~5 MiB), per fetcher that passed the check at once
— the "configured budget plus a fixed base" the benchmarks measure.
"""

from __future__ import annotations

import asyncio


class ByteBudget:
    """Counts bytes in use against a limit; asyncio waiters wake when bytes are released."""

    def __init__(self, limit_bytes: int) -> None:
        assert limit_bytes > 0
        self.limit_bytes = limit_bytes
        self.in_use_bytes = 0
        self.peak_bytes = 0
        self._changed: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def has_room(self, n_bytes: int) -> bool:
        return self.in_use_bytes == 0 or self.in_use_bytes + n_bytes <= self.limit_bytes

    async def wait_room(self, n_bytes: int) -> None:
        """Wait until ``n_bytes`` more would fit (always true when nothing is in use)."""
        while not self.has_room(n_bytes):
            event = self._event()
            event.clear()
            await event.wait()

    def charge(self, n_bytes: int) -> None:
        assert n_bytes >= 0
        self.in_use_bytes += n_bytes
        self.peak_bytes = max(self.peak_bytes, self.in_use_bytes)

    def release(self, n_bytes: int) -> None:
        assert 0 <= n_bytes <= self.in_use_bytes, (
            f"releasing {n_bytes} bytes with only {self.in_use_bytes} in use")
        self.in_use_bytes -= n_bytes
        if self._changed is not None:
            self._changed.set()


class FrameLease:
    """One fetch frame's bytes, charged to the budget while any of its batches is held."""

    __slots__ = ("budget", "n_bytes", "holders", "_released")

    def __init__(self, budget: ByteBudget, n_bytes: int) -> None:
        self.budget = budget
        self.n_bytes = n_bytes
        self.holders = 1          # the fetcher itself, until it has handed out every batch
        self._released = False
        budget.charge(n_bytes)

    def hold(self, n: int = 1) -> None:
        """``n`` more batches hold the frame (one call for all the batches of a partition)."""
        assert not self._released, "frame lease used after release"
        self.holders += n

    def drop(self) -> None:
        assert self.holders > 0, "frame lease dropped more often than held"
        self.holders -= 1
        if self.holders == 0:
            self._released = True
            self.budget.release(self.n_bytes)

    @property
    def released(self) -> bool:
        return self._released
