"""Heartbeats, as MirrorMaker 2 3.7 emits them, and the replication latency they measure.

Where MM2 3.7 writes them (``MirrorMakerConfig.clusterPairs``, ``MirrorHeartbeatTask``): every
ordered pair of clusters (S, T) gets a heartbeat emitter unless ``emit.heartbeats.enabled`` is
false for it (``S->T.emit.heartbeats.enabled`` over the top-level key), *whether or not the flow
S->T is enabled*. The emitter of (S, T) writes ``Heartbeat(S, T, now)`` every
``emit.heartbeats.interval.seconds`` to partition 0 of the topic ``heartbeats`` on cluster T
(created with one partition, compacted, as MM2's ``createSinglePartitionCompactedTopic``), with
the record timestamp equal to the heartbeat's. So for an enabled flow A->B::

    emitter (A, B)  -> B: heartbeats          "A->B is alive" (read on B)
    emitter (B, A)  -> A: heartbeats          (the pair B->A need not be enabled)
    flow A->B copies A's heartbeats -> B: A.heartbeats      (heartbeats.replication.enabled)

and MM2's ``RemoteClusterUtils.upstreamClusters`` on B finds A in ``A.heartbeats``;
``replicationHops(B, A)`` is 1. shallowmirror emits only between clusters that take part in an
enabled flow (MM2 also writes to listed clusters no flow touches).

Latency: each enabled flow A->B reads the heartbeats it mirrors (``A.heartbeats`` on B) as a
consumer of B would; ``now - heartbeat.timestamp`` is the end-to-end latency from the moment a
heartbeat was written on A to the moment it can be read on B (emit + mirror + fetch). The latest
value goes to the status line, Prometheus (``shallowmirror_heartbeat_latency_ms``), the log
(DEBUG) and, with ``metrics.file``, one ``heartbeat`` record per heartbeat.

Out of scope: emitting when heartbeats of a pair are written by someone else (MM2 itself); both
may run, heartbeats are idempotent facts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shallowmirror.errors import ShallowMirrorError
from shallowmirror.metrics_schema import HEARTBEAT
from shallowmirror.replication.mm2_records import HEARTBEATS_TOPIC, Heartbeat, MM2RecordError
from shallowmirror.settings import Setting, SettingsTable

log = logging.getLogger(__name__)

HEARTBEAT_SETTINGS = [
    Setting("emit.heartbeats.enabled", "bool", False,
            "Emit MM2 heartbeats: for every ordered pair of clusters of the enabled flows "
            "(S, T), `Heartbeat(S, T, now)` to the topic `heartbeats` on T, whether or not S->T "
            "is enabled (as MM2 3.7), so MM2's `RemoteClusterUtils.upstreamClusters` / "
            "`replicationHops` work and each flow reports its end-to-end latency. MM2's default "
            "is true; shallowmirror's is false on purpose: emitting writes to every cluster of "
            "an enabled flow, the source too (`heartbeats` on A for the pair (B, A)), so a "
            "one-way mirror would need topic-create and write rights on its source and would "
            "create and mirror topics (`heartbeats`, `A.heartbeats`) nobody asked for. Set it to "
            "true when replacing an MM2 whose heartbeats something reads (`RemoteClusterUtils`, "
            "heartbeat monitoring). Per pair: `S->T.emit.heartbeats.enabled`.", scope="flow"),
    Setting("emit.heartbeats.interval.seconds", "float", 1.0,
            "How often each pair emits a heartbeat (MM2's default: 1 s).", scope="flow",
            minimum=0.01),
    Setting("heartbeats.topic.replication.factor", "int", -1,
            "Replication factor of the `heartbeats` topic when it is created (one partition, "
            "compacted); -1 takes the broker's default (MM2's default is 3).", scope="flow",
            minimum=-1),
]

#: Keys this module implements (they leave the mirror's "accepted and ignored" list).
HEARTBEAT_KEYS = frozenset(s.name for s in HEARTBEAT_SETTINGS)
_TABLE = SettingsTable(title="heartbeats", settings=list(HEARTBEAT_SETTINGS))


class HeartbeatError(ShallowMirrorError):
    """Heartbeats could not be written to or read from a cluster."""


@dataclass(frozen=True)
class HeartbeatPair:
    """One emitter: ``Heartbeat(source, target)`` to ``heartbeats`` on cluster ``target``."""

    source: str
    target: str
    interval_s: float
    replication_factor: int
    #: Client config (connection keys) of the target cluster.
    target_config: Mapping[str, str] = field(compare=False)

    @property
    def name(self) -> str:
        return f"{self.source}->{self.target}"


def heartbeat_pairs(aliases: Iterable[str], top: Mapping[str, str],
                    per_flow: Mapping[tuple[str, str], Mapping[str, str]],
                    target_config: Callable[[str, str], Mapping[str, str]],
                    ) -> tuple[list[HeartbeatPair], list[str]]:
    """The emitters among ``aliases`` (the clusters of the enabled flows) and the problems of
    their settings (``S->T.<key>`` over ``<key>``, as MM2's ``clusterPairs``)."""
    pairs: list[HeartbeatPair] = []
    problems: list[str] = []
    ordered = list(dict.fromkeys(aliases))
    for source in ordered:
        for target in ordered:
            if source == target:
                continue
            raw = {k: v for k, v in top.items() if k in HEARTBEAT_KEYS}
            raw.update({k: v for k, v in per_flow.get((source, target), {}).items()
                        if k in HEARTBEAT_KEYS})
            try:
                values = _TABLE.resolve(raw, context=f"{source}->{target}", warn_unknown=False)
            except ShallowMirrorError as err:
                problems.extend(p for p in getattr(err, "problems", [str(err)])
                                if p not in problems)
                continue
            if values["emit.heartbeats.enabled"]:
                pairs.append(HeartbeatPair(source, target,
                                           values["emit.heartbeats.interval.seconds"],
                                           values["heartbeats.topic.replication.factor"],
                                           dict(target_config(source, target))))
    return pairs, problems


# ---------------------------------------------------------------------------------------------
# Emitting


def _connection_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("bootstrap.servers", "security.protocol", "ssl.", "sasl.", "client.dns.lookup",
            "socket.", "reconnect.", "request.timeout.ms", "retry.backoff.ms",
            "connections.max.idle.ms", "metadata.max.age.ms", "client.id")
    return {k: v for k, v in config.items() if k.startswith(keep)}


def ensure_heartbeats_topic(config: Mapping[str, Any], *, alias: str,
                            replication_factor: int = -1, timeout_s: float = 15.0) -> bool:
    """Create ``heartbeats`` on cluster ``alias`` (1 partition, compacted) unless it exists;
    True when created. Blocking."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    from shallowmirror.mirror.clients import admin_client, list_topics

    admin = admin_client(_connection_keys(config), what=f"cluster {alias} admin (heartbeats)")
    try:
        listed = list_topics(admin, timeout_s=timeout_s)
    except KafkaException as err:
        raise HeartbeatError(f"cluster {alias}: cannot list topics: {err}") from err
    existing = listed.topics.get(HEARTBEATS_TOPIC)
    if existing is not None and existing.error is None:
        return False
    new = NewTopic(HEARTBEATS_TOPIC, num_partitions=1, replication_factor=replication_factor,
                   config={"cleanup.policy": "compact"})
    try:
        admin.create_topics([new], request_timeout=timeout_s)[HEARTBEATS_TOPIC].result(
            timeout=timeout_s)
    except KafkaException as err:
        error = err.args[0] if err.args else None
        if getattr(error, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise HeartbeatError(f"cluster {alias}: cannot create topic {HEARTBEATS_TOPIC}: "
                             f"{err}") from err
    log.info("cluster %s: created %s (compacted, 1 partition)", alias, HEARTBEATS_TOPIC)
    return True


class HeartbeatEmitter:
    """Writes ``Heartbeat(source, target, now)`` to ``heartbeats`` on the target every
    interval. A target that cannot be reached is warned about once and tried again every
    interval; it never stops the mirror."""

    def __init__(self, pair: HeartbeatPair,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000), *,
                 timeout_s: float = 15.0) -> None:
        self.pair = pair
        self.clock_ms = clock_ms
        self.timeout_s = timeout_s
        self.emitted = 0
        self.delivered = 0
        self.failing: str | None = None
        self._producer: Any = None
        self._opening = threading.Lock()

    def _open(self) -> None:
        from confluent_kafka import Producer

        from shallowmirror.mirror.clients import build_client

        ensure_heartbeats_topic(self.pair.target_config, alias=self.pair.target,
                                replication_factor=self.pair.replication_factor,
                                timeout_s=self.timeout_s)
        conf = {**_connection_keys(self.pair.target_config), "acks": "all",
                "linger.ms": 0, "compression.type": "none", "message.timeout.ms": 30000}
        conf.setdefault("client.id", f"shallowmirror-heartbeats-{self.pair.source}-"
                                     f"{self.pair.target}")
        self._producer = build_client(Producer, conf,
                                      what=f"cluster {self.pair.target} heartbeat writer")

    def _delivered(self, err: Any, _message: Any) -> None:
        if err is None:
            self.delivered += 1
            if self.failing is not None:
                log.info("heartbeats %s: cluster %s accepts heartbeats again", self.pair.name,
                         self.pair.target)
            self.failing = None
        else:
            self._note_failure(f"cluster {self.pair.target}: writing {HEARTBEATS_TOPIC} failed: "
                               f"{err}")

    def _why(self, err: Exception) -> str:
        """The error, naming the target cluster once."""
        return str(err) if isinstance(err, HeartbeatError) \
            else f"cluster {self.pair.target}: {type(err).__name__}: {err}"

    def _note_failure(self, why: str) -> None:
        if self.failing is None:
            log.warning("heartbeats %s: %s; trying again every %gs", self.pair.name, why,
                        self.pair.interval_s)
        self.failing = why

    def open(self) -> None:
        """Create the topic and the writer unless done (blocking: call in a thread)."""
        with self._opening:
            if self._producer is None:
                self._open()

    async def prepare(self) -> None:
        """``open`` now, so the topic exists before flows list their source's topics; a
        failure is reported once and retried by ``run``."""
        try:
            await asyncio.to_thread(self.open)
        except Exception as err:  # noqa: BLE001 - run() tries again every interval
            self._note_failure(self._why(err))

    def emit_once(self) -> None:
        """Open the writer if needed and queue one heartbeat (blocking: call in a thread)."""
        self.open()
        now_ms = self.clock_ms()
        beat = Heartbeat(self.pair.source, self.pair.target, now_ms)
        self._producer.produce(HEARTBEATS_TOPIC, key=beat.key(), value=beat.value(), partition=0,
                               timestamp=now_ms, on_delivery=self._delivered)
        self.emitted += 1
        self._producer.poll(0)

    async def run(self, stop: asyncio.Event) -> None:
        """Emit until ``stop``; then deliver what is queued (bounded)."""
        try:
            while not stop.is_set():
                try:
                    await asyncio.to_thread(self.emit_once)
                except Exception as err:  # noqa: BLE001 - reported once; next interval retries
                    self._note_failure(self._why(err))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.pair.interval_s)
        finally:
            if self._producer is not None:
                await asyncio.to_thread(self._producer.flush, 5.0)


# ---------------------------------------------------------------------------------------------
# Latency


@dataclass
class HeartbeatLatency:
    """The latest end-to-end latency of one flow, from the heartbeats it mirrored."""

    flow: str
    remote_topic: str
    latency_ms: float | None = None
    #: The heartbeat the latency was measured on (its emitter pair) and how many were seen.
    last_pair: str | None = None
    seen: int = 0

    def observe(self, beat: Heartbeat, now_ms: int) -> float:
        self.latency_ms = float(max(0, now_ms - beat.timestamp_ms))
        self.last_pair = f"{beat.source_alias}->{beat.target_alias}"
        self.seen += 1
        return self.latency_ms


class HeartbeatLatencyMonitor:
    """Reads ``<source>.heartbeats`` on a flow's target from its end, in a daemon thread, and
    keeps ``latency`` current. Undecodable records are logged once and skipped."""

    POLL_S = 0.2

    def __init__(self, flow: str, remote_topic: str, target_config: Mapping[str, Any], *,
                 alias: str, metrics_sink: Any = None) -> None:
        self.latency = HeartbeatLatency(flow, remote_topic)
        #: Gets one ``heartbeat`` record per heartbeat read (metrics_schema.py), if set.
        self.metrics_sink = metrics_sink
        self.target_config = dict(target_config)
        self.alias = alias
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bad_logged = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"heartbeats-{self.latency.flow}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        from shallowmirror.mirror.clients import build_client

        conf = {**_connection_keys(self.target_config),
                "group.id": f"shallowmirror-heartbeat-latency-{self.latency.flow}",
                "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                "auto.offset.reset": "latest"}
        return build_client(Consumer, conf, what=f"cluster {self.alias} heartbeat reader")

    def _run(self) -> None:
        from confluent_kafka import OFFSET_END, TopicPartition

        topic = self.latency.remote_topic
        consumer = None
        try:
            consumer = self._consumer()
            while not self._stop.is_set():          # wait for the flow to create the topic
                meta = consumer.list_topics(topic, timeout=5).topics.get(topic)
                if meta is not None and meta.error is None and meta.partitions:
                    break
                self._stop.wait(1.0)
            consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
            while not self._stop.is_set():
                message = consumer.poll(self.POLL_S)
                if message is None or message.error() is not None:
                    continue
                self._observe(message.key(), message.value())
        except Exception as err:  # noqa: BLE001 - latency reporting never stops the mirror
            log.warning("flow %s: heartbeat latency not measured: %s", self.latency.flow, err)
        finally:
            if consumer is not None:
                with contextlib.suppress(Exception):
                    consumer.close()

    def _observe(self, key: bytes | None, value: bytes | None) -> None:
        try:
            beat = Heartbeat.decode(key, value)
        except MM2RecordError as err:
            if not self._bad_logged:
                self._bad_logged = True
                log.warning("flow %s: %s holds a record that is not an MM2 heartbeat (%s); "
                            "skipped", self.latency.flow, self.latency.remote_topic, err)
            return
        now_ms = int(time.time() * 1000)
        latency = self.latency.observe(beat, now_ms)
        if self.metrics_sink is not None:
            source, _, target = self.latency.flow.partition("->")
            self.metrics_sink.emit({
                "kind": HEARTBEAT, "time": now_ms / 1000, "flow": self.latency.flow,
                "source_cluster": source, "target_cluster": target,
                "heartbeat": self.latency.last_pair, "heartbeat_time": beat.timestamp_ms / 1000,
                "latency_ms": latency})
        log.debug("flow %s: heartbeat %s latency %.0f ms", self.latency.flow,
                  self.latency.last_pair, latency)
