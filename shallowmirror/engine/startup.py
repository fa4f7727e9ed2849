"""Where an engine's start-up time goes: one timestamp per phase, from ``run`` to the first
record acknowledged by the target.

Phases, in the order they normally happen (each recorded once, the first time it is reached)::

    source metadata   the source cluster answered (bootstrap, ApiVersions, Metadata)
    target metadata   the target cluster answered
    producer id       the mirror's producer identity (InitProducerId) is known
    subscribed        the membership was told the topics (group) or partitions (all)
    assigned          the group handed out partitions (JoinGroup + SyncGroup), or ``all`` took them
    offsets fetched   the committed offsets of the assignment are known (OffsetFetch)
    positions known   every start position is known (ListOffsets for partitions without one)
    target read       resume.from.target read the target's tail (engine.resume), when it runs
    first fetch       the first Fetch response carrying records arrived
    first record      the target acknowledged the first batch (the end of start-up)

The timeline only records; it changes nothing. ``EngineStats.startup`` exposes it and the engine
logs it once, when the first record lands, so an operator sees which phase took the time (on
Kafka a new group's first join waits ``group.initial.rebalance.delay.ms``, 3 s by default).
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

PHASES = ("source metadata", "target metadata", "producer id", "subscribed", "assigned",
          "offsets fetched", "positions known", "target read", "first fetch", "first record")


class StartupTimeline:
    """Seconds from the engine's start to each phase (see the module docstring)."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self.started_at = clock()
        self._at: dict[str, float] = {}
        #: Whether "first record" was reached: an attribute, read once per acknowledged batch.
        self.done = False

    def mark(self, phase: str, at: float | None = None) -> None:
        """Record ``phase`` (once: later calls keep the first time). ``at``: a ``clock()``
        value taken elsewhere (e.g. in the membership thread)."""
        assert phase in PHASES, phase
        if phase in self._at:
            return
        self._at[phase] = (self._clock() if at is None else at) - self.started_at
        if phase == "first record":
            self.done = True
            log.info("start-up: first record on the target %.2f s after start (%s)",
                     self._at[phase], self.text())

    def seconds(self) -> dict[str, float]:
        """Phase -> seconds since start, in phase order, for the phases reached so far."""
        return {p: round(self._at[p], 4) for p in PHASES if p in self._at}

    def text(self) -> str:
        """``phase +delta`` for each phase reached: how long each one took after the previous."""
        parts, last = [], 0.0
        for phase, at in self.seconds().items():
            parts.append(f"{phase} +{max(0.0, at - last):.2f}s")
            last = max(last, at)
        return ", ".join(parts)

