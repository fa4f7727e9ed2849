"""Topic discovery: which source partitions the engine should own.

The topic set is a list of names, a regex (full match) or a predicate. ``TopicDiscovery.run``
reads the source cluster's metadata at start, every ``metadata.max.age.ms``, at once when the
topic set changes (``set_topics``, from any thread) and, after a failed attempt, with backoff;
between those it sleeps on an event, no polling. What it finds goes to the membership: the topic
names to subscribe to (``partition.assignment=group``) or every partition of them (``all``).
Internal topics and names starting with ``__`` are never mirrored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from shallowmirror.engine.runtime import Runtime
from shallowmirror.engine.topic_names import TopicMapperError, callable_name, closest_name
from shallowmirror.errors import ConnectionFailedError
from shallowmirror.net import Cluster

log = logging.getLogger(__name__)

TP = tuple[str, int]
TopicsSpec = Sequence[str] | str | Callable[[str], bool]


class Ownership(Protocol):
    """Where discovery hands what it found (``membership.Membership``)."""

    mode: str

    def set_topics(self, topics: Sequence[str]) -> None: ...

    def set_partitions(self, partitions: Sequence[TP]) -> None: ...


def topic_predicate(topics: TopicsSpec) -> tuple[Callable[[str], bool], list[str] | None]:
    """(predicate, explicit list or None) for a list of names, a regex string, or a callable."""
    if callable(topics):
        return _checked_predicate(topics), None
    if isinstance(topics, str):
        pattern = re.compile(topics)
        return (lambda name: pattern.fullmatch(name) is not None), None
    names = list(topics)
    wanted = set(names)
    return (lambda name: name in wanted), names


def _checked_predicate(predicate: Callable[[str], bool]) -> Callable[[str], bool]:
    """``predicate`` whose answer may not be a string: one returning "no" (truthy) mirrored
    every topic of the cluster (a ``re.match`` or None is taken as true or false). What it
    raises, or a string, is a ``TopicMapperError`` (the embedder's code: it ends the run naming
    the predicate and the topic)."""
    name = callable_name(predicate)

    def checked(topic: str) -> bool:
        try:
            answer = predicate(topic)
        except Exception as err:
            raise TopicMapperError(f"topics predicate {name} raised {type(err).__name__}: "
                                   f"{err} for source topic {topic}") from err
        if isinstance(answer, str | bytes):       # "no" is true; a match or None is fine
            raise TopicMapperError(f"topics predicate {name} returned {type(answer).__name__} "
                                   f"{answer!r} for source topic {topic}: it must return True "
                                   "or False (any non-empty string would count as True)")
        return bool(answer)

    return checked


class TopicDiscovery:
    """Finds the partitions of the topic set and tells the membership (see the module doc)."""

    def __init__(self, runtime: Runtime, topics: TopicsSpec, *, alias: str) -> None:
        self.runtime = runtime
        self.alias = alias
        self._wake: asyncio.Event | None = None
        self._subscribed: list[str] | None = None
        self._assigned: list[TP] | None = None
        self.set_topics(topics)

    @property
    def listed(self) -> list[str] | None:
        """The topic names when the set is a list (None: a regex or predicate)."""
        return self._names

    def set_topics(self, topics: TopicsSpec) -> None:
        """Change the topic set (list, regex or predicate); discovered again at once."""
        self._filter, self._names = topic_predicate(topics)
        self._missing_told = False
        self._changed = True
        self.runtime.wake_soon(self._wake)

    async def run(self, cluster: Cluster, ownership: Ownership) -> None:
        """The discovery loop (supervised; ends when the engine stops)."""
        self._wake = asyncio.Event()
        interval = self.runtime.settings["metadata.max.age.ms"] / 1000
        backoff = self.runtime.backoff()
        next_at = 0.0
        while not self.runtime.stopping:
            if self._changed or time.monotonic() >= next_at:
                self._changed = False
                try:
                    await self.discover(cluster, ownership)
                    backoff.reset()
                    next_at = time.monotonic() + interval
                except ConnectionFailedError as err:
                    self.runtime.note_unreachable(self.alias, err)
                    next_at = time.monotonic() + backoff.next_s()
            self._wake.clear()
            if self._changed:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, next_at - time.monotonic()))

    async def _tell_missing(self, cluster: Cluster, found: set[str]) -> None:
        """Warn once of each listed topic the source does not have, with the closest name it
        has: a misspelt name in a list was mirrored as nothing, and the run said caught up."""
        missing = [name for name in self._names or () if name not in found]
        if not missing:
            return
        try:
            every = (await cluster.refresh_metadata(None)).topics
        except ConnectionFailedError:
            every = {}
        for name in missing:
            close = closest_name(name, [t for t in every if not t.startswith("__")])
            log.warning("topic %s is not on cluster %s (it is mirrored once it is created)%s",
                        name, self.alias, f"; did you mean {close!r}?" if close else "")

    async def discover(self, cluster: Cluster, ownership: Ownership) -> None:
        """One Metadata request (the named topics, or all topics for a regex/predicate)."""
        meta = await cluster.refresh_metadata(self._names)
        names = sorted(name for name, tm in meta.topics.items()
                       if not tm.error_code and not tm.is_internal and not name.startswith("__")
                       and self._filter(name))
        if self._names and not self._missing_told:
            self._missing_told = True
            await self._tell_missing(cluster, set(names))
        if ownership.mode == "group":
            if names != self._subscribed:
                self._subscribed = names
                ownership.set_topics(names)
        else:
            wanted = sorted((t, p) for t in names for p in (cluster.partitions(t) or []))
            if wanted != self._assigned:
                self._assigned = wanted
                ownership.set_partitions(wanted)
