"""One Kafka cluster as the mirror sees it: bootstrap, a metadata cache, one connection per broker.

Contract
--------
- ``start()`` reaches a bootstrap server (retrying with backoff up to ``reconnect.deadline.ms``)
  and loads brokers and the cluster id.
- ``refresh_metadata(topics)`` asks one broker for those topics (``None``: every topic) with
  ``allow_auto_topic_creation=False`` and merges the answer into the cache; concurrent refreshes
  that one in-flight request already covers wait for it instead of sending another — so after a
  leader change, many partitions calling ``refresh_metadata([topic])`` cost one request.
- ``partitions`` / ``leader`` read the cache (no I/O). A topic the broker reported with an error
  (e.g. UNKNOWN_TOPIC_OR_PARTITION) has ``partitions() is None`` and ``topic_error()`` says why:
  the caller decides whether that is fatal.
- ``connection(node_id)`` returns the live connection to a broker or opens one, retrying with
  exponential backoff (``reconnect.backoff.ms`` doubling up to ``reconnect.backoff.max.ms``, ±20 %
  jitter) until ``reconnect.deadline.ms``, then raises ``ConnectionFailedError`` naming the alias,
  the address and what was tried. Authentication failures are not retried.
- Leader change: the caller sees NOT_LEADER_OR_FOLLOWER (or a lost connection), calls
  ``refresh_metadata([topic])`` and then ``leader_connection`` again; connections to brokers that
  stay in the cluster are kept.
- Metadata older than ``metadata.max.age.ms`` is refreshed in the background for the topics already
  cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka import errors as Errors
from kafka.protocol.metadata import MetadataRequest

from shallowmirror.errors import BrokerError, ConnectionFailedError, ReconnectDeadlineError, Where
from shallowmirror.net.config import ClientSettings, client_settings
from shallowmirror.net.connection import AuthenticationFailedError, BrokerConnection
from shallowmirror.net.protocol import versions

log = logging.getLogger(__name__)

#: An unreachable broker is retried about once a second: it is a warning at most this often
#: per connection attempt loop (the rest go to debug), so an outage is a line every 10 s.
RETRY_WARNING_INTERVAL_S = 10.0



@dataclass(frozen=True)
class BrokerMetadata:
    node_id: int
    host: str
    port: int
    rack: str | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class PartitionMetadata:
    partition: int
    leader: int | None          # None while the partition has no leader (leader_id -1)
    leader_epoch: int           # -1 when the broker's Metadata version has none
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error_code: int


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    error_code: int
    partitions: Mapping[int, PartitionMetadata]
    is_internal: bool = False
    #: The topic's id (Metadata v10+; None before, or for a topic the broker does not know):
    #: a topic deleted and created again under the same name gets a new one.
    topic_id: str | None = None

    def error(self, cluster: str | None = None) -> BrokerError | None:
        """The topic-level error as a BrokerError, or None."""
        if not self.error_code:
            return None
        return BrokerError(self.error_code, Where(cluster=cluster, topic=self.name))


@dataclass
class Metadata:
    """A snapshot of what one cluster told us: brokers, controller, cluster id, topics."""

    cluster_id: str | None = None
    controller_id: int | None = None
    brokers: dict[int, BrokerMetadata] = field(default_factory=dict)
    topics: dict[str, TopicMetadata] = field(default_factory=dict)


def _topic_id(topic: Any) -> str | None:
    """A Metadata answer's topic id as text; None before v10 and for the all-zero id."""
    tid = getattr(topic, "topic_id", None)
    if tid is None or not getattr(tid, "int", tid):
        return None
    return str(tid)


def _metadata_request(version: int, topics: list[str] | None) -> Any:
    wanted = None if topics is None else [
        MetadataRequest.MetadataRequestTopic(name=name) for name in topics]
    return MetadataRequest(topics=wanted, allow_auto_topic_creation=False, version=version)


class Cluster:
    """Bootstrap, metadata cache and one connection per broker for the cluster named ``alias``."""

    def __init__(self, config: Mapping[str, Any], alias: str):
        self.alias = alias
        self.settings: ClientSettings = client_settings(config, alias)
        self.metadata = Metadata()
        self._connections: dict[int, BrokerConnection] = {}
        self._connecting: dict[int, asyncio.Task] = {}
        #: Extra connections to one broker, by (node id, lane >= 1): see ``connection``.
        self._lanes: dict[tuple[int, int], BrokerConnection] = {}
        self._lanes_connecting: dict[tuple[int, int], asyncio.Task] = {}
        self._bootstrap: BrokerConnection | None = None
        self._refreshing: dict[frozenset[str] | None, asyncio.Task] = {}
        self._refreshed_at = 0.0
        self._refresher: asyncio.Task | None = None
        self._closed = False
        #: ``time.monotonic()`` of the first failed round of connection attempts since the last
        #: successful one (None: none failed since; see ``unreachable_for_s``).
        self._failing_since: float | None = None
        #: The last id seen of every topic (kept while a topic is missing from an answer, so a
        #: deleted topic that comes back is recognised as a new one).
        self._topic_ids: dict[str, str] = {}
        #: Called with (topic, old id, new id) when a topic's id changes: it was deleted and
        #: created again between two answers (``metadata`` is already the new one).
        self.topic_recreated_listeners: list[Callable[[str, str, str], None]] = []
        #: Called after every Metadata answer is applied (leaders may have moved).
        self.metadata_listeners: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return (f"<Cluster {self.alias} id={self.cluster_id} brokers={len(self.metadata.brokers)} "
                f"connections={sum(c.connected for c in self._connections.values())}>")

    @property
    def cluster_id(self) -> str | None:
        return self.metadata.cluster_id

    @property
    def brokers(self) -> dict[int, BrokerMetadata]:
        return self.metadata.brokers

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Reach the cluster and load brokers and cluster id; start the periodic refresh."""
        await self.refresh_metadata([])
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh_periodically(),
                                                  name=f"metadata-refresh-{self.alias}")

    async def close(self) -> None:
        """Close every connection and stop the background refresh."""
        self._closed = True
        tasks = [t for t in (self._refresher, *self._connecting.values(),
                             *self._lanes_connecting.values(),
                             *self._refreshing.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._refresher = None
        conns = [*self._connections.values(), *self._lanes.values()]
        if self._bootstrap is not None:
            conns.append(self._bootstrap)
        self._connections.clear()
        self._lanes.clear()
        self._bootstrap = None
        for conn in conns:
            await conn.close()

    async def __aenter__(self) -> Cluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- metadata ------------------------------------------------------------------------------
    async def refresh_metadata(self, topics: list[str] | None = None) -> Metadata:
        """Fetch metadata for ``topics`` (None: all topics, [] : brokers only) into the cache."""
        key = None if topics is None else frozenset(topics)
        for pending_key, task in self._refreshing.items():
            if pending_key is None or (key is not None and key <= pending_key):
                await asyncio.shield(task)
                return self.metadata
        task = asyncio.create_task(self._fetch_metadata(topics))
        self._refreshing[key] = task
        task.add_done_callback(lambda _t: self._refreshing.pop(key, None))
        await asyncio.shield(task)
        return self.metadata

    async def _fetch_metadata(self, topics: list[str] | None) -> None:
        conn = await self.any_connection()
        version = conn.api_version(MetadataRequest.API_KEY, versions(MetadataRequest.API_KEY))
        try:
            response = await conn.request(_metadata_request(version, topics))
        except ConnectionFailedError:
            # The one broker we asked went away: ask another (or bootstrap) once.
            conn = await self.any_connection()
            response = await conn.request(_metadata_request(version, topics))
        self._merge(response, topics)

    def _merge(self, response: Any, topics: list[str] | None) -> None:
        brokers = {b.node_id: BrokerMetadata(b.node_id, b.host, b.port, b.rack)
                   for b in response.brokers}
        parsed: dict[str, TopicMetadata] = {}
        for topic in response.topics:
            partitions = {}
            for p in topic.partitions:
                leader = p.leader_id if p.leader_id >= 0 else None
                partitions[p.partition_index] = PartitionMetadata(
                    p.partition_index, leader, getattr(p, "leader_epoch", -1),
                    tuple(p.replica_nodes), tuple(p.isr_nodes), p.error_code)
            parsed[topic.name] = TopicMetadata(topic.name, topic.error_code, partitions,
                                               bool(getattr(topic, "is_internal", False)),
                                               _topic_id(topic))
        old = self.metadata
        merged_topics = parsed if topics is None else {**old.topics, **parsed}
        controller = getattr(response, "controller_id", -1)
        self.metadata = Metadata(
            cluster_id=getattr(response, "cluster_id", None) or old.cluster_id,
            controller_id=controller if controller is not None and controller >= 0 else None,
            brokers=brokers or old.brokers,
            topics=merged_topics,
        )
        self._refreshed_at = time.monotonic()
        self._forget_moved_brokers(brokers)
        self._adopt_bootstrap()
        self._note_topic_ids(parsed.values())
        for listener in self.metadata_listeners:
            listener()

    def _note_topic_ids(self, topics: Iterable[TopicMetadata]) -> None:
        """Remember each topic's id; tell the listeners of every one that changed."""
        changed = []
        for meta in topics:
            if meta.topic_id is None:
                continue
            old = self._topic_ids.get(meta.name)
            self._topic_ids[meta.name] = meta.topic_id
            if old is not None and old != meta.topic_id:
                changed.append((meta.name, old, meta.topic_id))
        for name, old, new in changed:
            log.debug("cluster %s: topic %s has a new topic id %s (was %s): deleted and "
                      "created again", self.alias, name, new, old)
            for listener in self.topic_recreated_listeners:
                listener(name, old, new)

    def topic_id(self, topic: str) -> str | None:
        """The id the last answer that knew ``topic`` gave it (None: no id known)."""
        return self._topic_ids.get(topic)

    def _forget_moved_brokers(self, brokers: Mapping[int, BrokerMetadata]) -> None:
        """Drop connections to brokers that left or changed address."""
        if not brokers:
            return
        for node_id, conn in list(self._connections.items()):
            broker = brokers.get(node_id)
            if broker is None or (broker.host, broker.port) != (conn.host, conn.port):
                log.info("cluster %s: broker %d %s, closing its connection", self.alias, node_id,
                         "left the cluster" if broker is None else f"moved to {broker.address}")
                del self._connections[node_id]
                asyncio.ensure_future(conn.close())
        for key, conn in list(self._lanes.items()):
            broker = brokers.get(key[0])
            if broker is None or (broker.host, broker.port) != (conn.host, conn.port):
                del self._lanes[key]
                asyncio.ensure_future(conn.close())

    def _adopt_bootstrap(self) -> None:
        """Keep the bootstrap connection as the connection of the broker it turned out to be."""
        conn = self._bootstrap
        if conn is None:
            return
        for broker in self.metadata.brokers.values():
            if (broker.host, broker.port) == (conn.host, conn.port):
                self._bootstrap = None
                if conn.connected and broker.node_id not in self._connections:
                    conn.node_id = broker.node_id
                    self._connections[broker.node_id] = conn
                else:
                    asyncio.ensure_future(conn.close())
                return

    async def _refresh_periodically(self) -> None:
        max_age_s = self.settings.metadata_max_age_ms / 1000
        while not self._closed:
            await asyncio.sleep(max(0.0, self._refreshed_at + max_age_s - time.monotonic()))
            if time.monotonic() - self._refreshed_at < max_age_s:
                continue  # someone refreshed meanwhile
            try:
                await self.refresh_metadata(sorted(self.metadata.topics))
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("cluster %s: periodic metadata refresh failed: %s", self.alias, err)
                self._refreshed_at = time.monotonic()  # retry after another max age

    def partitions(self, topic: str) -> list[int] | None:
        """Partition ids of ``topic`` in order, or None if unknown or reported with an error."""
        meta = self.metadata.topics.get(topic)
        if meta is None or meta.error_code:
            return None
        return sorted(meta.partitions)

    def leader(self, topic: str, partition: int) -> int | None:
        """Node id of the partition's leader, or None when unknown or leaderless."""
        meta = self.metadata.topics.get(topic)
        if meta is None:
            return None
        part = meta.partitions.get(partition)
        return part.leader if part is not None else None

    def topic_error(self, topic: str) -> BrokerError | None:
        """The error the broker reported for ``topic`` at the last refresh, if any."""
        meta = self.metadata.topics.get(topic)
        return meta.error(self.alias) if meta is not None else None

    # -- connections ---------------------------------------------------------------------------
    async def leader_connection(self, topic: str, partition: int) -> BrokerConnection:
        """The connection to the partition's leader; refreshes the topic once if unknown."""
        node_id = self.leader(topic, partition)
        if node_id is None:
            await self.refresh_metadata([topic])
            node_id = self.leader(topic, partition)
        if node_id is None:
            meta = self.metadata.topics.get(topic)
            if meta is not None and meta.error_code:
                code = meta.error_code
            elif partition in (self.partitions(topic) or ()):
                code = Errors.LeaderNotAvailableError.errno
            else:
                code = Errors.UnknownTopicOrPartitionError.errno
            raise BrokerError(code, Where(cluster=self.alias, topic=topic, partition=partition))
        return await self.connection(node_id)

    async def any_connection(self) -> BrokerConnection:
        """Some live connection (the least loaded), else a new one to a known broker or
        bootstrap server."""
        live = [c for c in self._connections.values() if c.connected]
        if live:
            return min(live, key=lambda c: c.in_flight)
        if self._bootstrap is not None and self._bootstrap.connected:
            return self._bootstrap
        if self.metadata.brokers:
            node_ids = list(self.metadata.brokers)
            random.shuffle(node_ids)
            try:
                return await self.connection(node_ids[0])
            except AuthenticationFailedError:
                raise
            except ConnectionFailedError as err:
                log.warning("cluster %s: %s; falling back to bootstrap servers", self.alias,
                            err.reason)
        return await self._connect_bootstrap()

    async def connection(self, node_id: int, lane: int = 0) -> BrokerConnection:
        """The live connection to broker ``node_id``, opening one (with backoff) if needed.

        ``lane`` >= 1 names a further connection to the same broker, used by nothing else: a
        stock broker handles one request per connection at a time, so requests that should be
        worked on at once need connections of their own (the produce side pins each target
        partition to one lane, which keeps its order)."""
        if self._closed:
            raise ConnectionFailedError("cluster is closed", Where(cluster=self.alias))
        if lane:
            return await self._lane_connection(node_id, lane)
        conn = self._connections.get(node_id)
        if conn is not None and conn.connected:
            return conn
        return await _shared_attempt(self._connecting, node_id,
                                     lambda: self._connect_node(node_id),
                                     f"connect-{self.alias}-{node_id}")

    def live_connection(self, node_id: int, lane: int = 0) -> BrokerConnection | None:
        """What ``connection(node_id, lane)`` would return without waiting, if the connection is
        open; None when it would have to connect (or the cluster is closed)."""
        if self._closed:
            return None
        conn = self._lanes.get((node_id, lane)) if lane else self._connections.get(node_id)
        return conn if conn is not None and conn.connected else None

    async def _lane_connection(self, node_id: int, lane: int) -> BrokerConnection:
        key = (node_id, lane)
        conn = self._lanes.get(key)
        if conn is not None and conn.connected:
            return conn
        return await _shared_attempt(self._lanes_connecting, key, lambda: self._connect_lane(key),
                                     f"connect-{self.alias}-{node_id}-{lane}")

    async def _connect_lane(self, key: tuple[int, int]) -> BrokerConnection:
        conn = await self._connect_with_backoff([lambda: self._broker_address(key[0])], key[0])
        old = self._lanes.get(key)
        if old is not None and old is not conn:
            await old.close()
        self._lanes[key] = conn
        return conn

    def _broker_address(self, node_id: int) -> tuple[str, int]:
        broker = self.metadata.brokers.get(node_id)
        if broker is None:
            known = ", ".join(f"{b.node_id}={b.address}"
                              for b in self.metadata.brokers.values()) or "none"
            raise ConnectionFailedError(
                f"broker {node_id} is not in the cluster's metadata (known brokers: {known})",
                Where(cluster=self.alias))
        return broker.host, broker.port

    async def _connect_node(self, node_id: int) -> BrokerConnection:
        conn = await self._connect_with_backoff([lambda: self._broker_address(node_id)], node_id)
        old = self._connections.get(node_id)
        if old is not None and old is not conn:
            await old.close()
        self._connections[node_id] = conn
        return conn

    async def _connect_bootstrap(self) -> BrokerConnection:
        servers = self.settings.bootstrap_servers
        targets = [lambda hp=hp: hp for hp in servers]
        conn = await self._connect_with_backoff(targets, -1)
        self._bootstrap = conn
        return conn

    async def _connect_with_backoff(self, targets: list, node_id: int) -> BrokerConnection:
        """Try each target in turn, round after round, backing off between rounds."""
        settings = self.settings
        started = time.monotonic()
        deadline = started + settings.reconnect_deadline_ms / 1000
        backoff_ms = float(settings.reconnect_backoff_ms)
        attempts = 0
        warned_at = -RETRY_WARNING_INTERVAL_S
        tried: dict[str, str] = {}
        while True:
            for target in targets:
                host, port = target()
                conn = BrokerConnection(host, port, settings, node_id)
                attempts += 1
                try:
                    await conn.connect()
                except AuthenticationFailedError:
                    raise
                except ConnectionFailedError as err:
                    tried[conn.address] = getattr(err, "detail", err.reason)
                    continue
                if attempts > 1:
                    log.info("cluster %s: reached %s after %d attempts", self.alias,
                             conn.address, attempts)
                self._failing_since = None
                return conn
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
            reasons = "; ".join(f"{address} ({reason})" for address, reason in tried.items())
            if now >= deadline:
                raise ReconnectDeadlineError(
                    f"cannot reach {reasons}: gave up after {attempts} attempts over "
                    f"{now - started:.1f}s (reconnect.deadline.ms={settings.reconnect_deadline_ms}"
                    f", security.protocol={settings.security_protocol})",
                    Where(cluster=self.alias))
            delay_s = min(backoff_ms * random.uniform(0.8, 1.2) / 1000, deadline - now)
            if now - warned_at >= RETRY_WARNING_INTERVAL_S:
                warned_at = now
                so_far = (f" ({attempts} attempts over {now - started:.0f}s so far)"
                          if attempts > len(targets) else "")
                log.warning("cluster %s: cannot reach %s; retrying in %.2gs%s", self.alias,
                            reasons, delay_s, so_far)
            else:
                log.debug("cluster %s: cannot reach %s; retrying in %.1fs", self.alias, reasons,
                          delay_s)
            await asyncio.sleep(delay_s)
            backoff_ms = min(backoff_ms * 2, float(settings.reconnect_backoff_max_ms))

    def unreachable_for_s(self) -> float | None:
        """Seconds the cluster has been out of reach: connection attempts failing since then,
        none succeeding, and no connection open (one broker down of several is not this).
        None when it is not known to be (for the status line)."""
        since = self._failing_since
        if since is None or any(True for _ in self.live_connections()):
            return None
        return time.monotonic() - since

    def live_connections(self) -> Iterable[BrokerConnection]:
        """Connections currently open (for metrics and shutdown)."""
        return [c for c in (*self._connections.values(), *self._lanes.values()) if c.connected]


def _shared_attempt(pending: dict[Any, asyncio.Task], key: Any,
                    connect: Callable[[], Coroutine[Any, Any, BrokerConnection]],
                    name: str) -> asyncio.Future[BrokerConnection]:
    """The connection attempt in flight for ``key`` in ``pending``, started (as task ``name``)
    if there is none, so concurrent callers share one attempt; it leaves ``pending`` when done.
    Shielded: one caller giving up must not abort the attempt others are waiting on."""
    task = pending.get(key)
    if task is None:
        task = asyncio.create_task(connect(), name=name)
        pending[key] = task
        task.add_done_callback(lambda _t: pending.pop(key, None))
    return asyncio.shield(task)
