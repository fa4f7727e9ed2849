"""``group.protocol=auto`` (the default): KIP-848's consumer group protocol where the source
cluster serves it for the group, the classic protocol otherwise, chosen at the first heartbeat.

Why: with the consumer protocol the broker assigns at the member's first heartbeat, so a new
group starts mirroring in well under a second; a classic group's first JoinGroup is held for the
broker's ``group.initial.rebalance.delay.ms`` (3 s by default). Which protocol a cluster serves
is only known by asking: Kafka 3.7 lists ConsumerGroupHeartbeat in ApiVersions even with the
protocol off and answers UNSUPPORTED_VERSION; tansu does not list it.

So ``AutoMembership`` starts as a ``ConsumerGroupMembership`` and, when its first heartbeat is
refused (``ConsumerProtocolRefused`` before any heartbeat was accepted), closes it and goes on as
a classic ``Membership`` with the same arguments:

    consumer protocol: heartbeat (epoch 0) --accepted--> stays; assigned at once
                                            --refused---> classic: JoinGroup/SyncGroup
    refused = no ConsumerGroupHeartbeat API, UNSUPPORTED_VERSION (Kafka < 4.0 with its default
              config, tansu), or GROUP_ID_NOT_FOUND (a classic group holds the group id: an
              earlier classic run's commits, MirrorMaker, classic members running now; Kafka 3.7
              cannot move a group between the protocols, so the group keeps the one it has)

Invariant: nothing is owned before the switch (the refusal comes before the coordinator ever
assigned this member anything), so the switch commits and revokes nothing. A refusal after a
heartbeat was accepted, and every other group error, stops the engine as with an explicit
protocol. Out of scope: switching back later (a group once joined keeps its protocol).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shallowmirror.engine.consumer_group import ConsumerGroupMembership, ConsumerProtocolRefused
from shallowmirror.engine.membership import Membership

log = logging.getLogger(__name__)

TP = tuple[str, int]


class AutoMembership:
    """Membership's interface over a consumer-protocol member that may become a classic one
    (module docstring). Attributes it does not hold itself (``assigned``, ``last_error``, the
    start-up times) are the current member's."""

    def __init__(self, source_config: Mapping[str, Any], *, loop: asyncio.AbstractEventLoop,
                 on_failed: Callable[[BaseException], None] | None = None,
                 consumer_factory: Callable[..., Any] = ConsumerGroupMembership,
                 classic_factory: Callable[..., Any] = Membership, **arguments: Any) -> None:
        assert arguments["mode"] == "group", "a group protocol is chosen for group mode only"
        self.group_id: str = arguments["group_id"]
        self.source_alias: str = arguments.get("source_alias", "source")
        self.mode = "group"
        self._loop = loop
        self._on_failed = on_failed
        self._make_classic = lambda: classic_factory(source_config, loop=loop,
                                                     on_failed=on_failed, **arguments)
        #: "consumer" until a refusal made it "classic".
        self.protocol = "consumer"
        self.current: Any = consumer_factory(source_config, loop=loop,
                                             on_failed=self._consumer_failed, **arguments)
        self._topics: list[str] = []
        self._switch: asyncio.Task | None = None
        self._closing = False
        self._closed_in_switch = False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "current":
            raise AttributeError(name)
        return getattr(self.current, name)

    # ---- Membership's interface ----
    def start(self, topics: Sequence[str]) -> None:
        self._topics = list(topics)
        self.current.start(topics)

    def set_topics(self, topics: Sequence[str]) -> None:
        """Subscribe to these topics (a member being replaced is started with the latest)."""
        self._topics = list(topics)
        self.current.set_topics(topics)

    def set_partitions(self, partitions: Sequence[TP]) -> None:
        raise AssertionError("partition.assignment=all does not use a group protocol")

    def commit(self, offsets: Mapping[TP, int]) -> concurrent.futures.Future:
        """Commit through the current member (before a switch it owns nothing: a no-op)."""
        return self.current.commit(offsets)

    async def close(self, final_offsets: Mapping[TP, int]) -> None:
        """Close the current member, after a switch under way has finished."""
        self._closing = True
        if self._switch is not None:
            with contextlib.suppress(BaseException):
                await self._switch
        if not self._closed_in_switch:
            await self.current.close(final_offsets)

    @property
    def ended(self) -> bool:
        switching = self._switch is not None and not self._switch.done()
        return not switching and self.current.ended

    # ---- the choice ----
    def _consumer_failed(self, err: BaseException) -> None:
        """The consumer-protocol member stopped with ``err`` (on the loop): a refusal before it
        joined switches to the classic protocol; anything else is the engine's error."""
        if isinstance(err, ConsumerProtocolRefused) and err.before_join and not self._closing \
                and self._switch is None:
            self._switch = self._loop.create_task(self._to_classic(err),
                                                  name=f"membership-{self.group_id}-classic")
            return
        if self._on_failed is None:
            raise err
        self._on_failed(err)

    async def _to_classic(self, refusal: ConsumerProtocolRefused) -> None:
        refused = self.current
        with contextlib.suppress(Exception):        # it owns nothing: closing commits nothing
            await refused.close({})
        if self._closing:
            self._closed_in_switch = True
            return
        classic = self._make_classic()
        classic.subscribed_at = refused.subscribed_at     # the start-up timeline's first mark
        log.info("group %s on source cluster %s: the consumer group protocol (KIP-848) is not "
                 "available for it (%s); sharing partitions through the classic protocol",
                 self.group_id, self.source_alias, _reason(refusal))
        self.current = classic
        self.protocol = "classic"
        classic.start(self._topics)


def _reason(refusal: ConsumerProtocolRefused) -> str:
    """The short reason of a refusal for the log line (its own text tells a user of an
    explicit group.protocol=consumer what to do, which does not apply here)."""
    if refusal.classic_group:
        return "a classic group holds the group id"
    return "the cluster does not serve it"
