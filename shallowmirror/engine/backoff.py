"""Exponential backoff with jitter, between ``retry.backoff.ms`` and ``retry.backoff.max.ms``
(Kafka's client settings), for every retry the engine makes."""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with jitter between ``retry.backoff.ms`` and ``retry.backoff.max.ms``."""

    def __init__(self, first_ms: int, max_ms: int) -> None:
        self.first_ms, self.max_ms, self.attempts = first_ms, max_ms, 0

    def next_s(self) -> float:
        delay = min(self.max_ms, self.first_ms * (2 ** min(self.attempts, 20)))
        self.attempts += 1
        return delay * random.uniform(0.8, 1.2) / 1000

    def reset(self) -> None:
        self.attempts = 0
