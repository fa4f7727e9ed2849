"""The deep path: a confluent-kafka consumer -> producer mirror that decompresses and recompresses.

For comparison with shallow mirroring and for what shallow cannot carry. It is deliberately
plain: one consumer in the flow's consumer group (partitions shared with other processes), one
idempotent producer per codec, records produced to the same partition number of the remote topic
with key, value, headers and timestamp unchanged. The codec is the target producer's
``compression.type`` if set, else the source topic's ``compression.type`` when it names a codec,
else lz4.

Invariants: per-partition order is kept (one idempotent producer per codec, a partition always
goes through the same one); a source offset is committed only after the target acknowledged it
and every record before it (delivery reports arrive in order per partition on an idempotent
producer). A failed delivery stops the runner with an error; a restart resumes from the last
commit, so nothing is lost (records after the commit may be written twice, as with MirrorMaker).

Out of scope: transactions / exactly-once, offset translation, CPU-optimal tuning (the benchmark
harness has its own deep modes).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from shallowmirror.codec.layout import CODEC_NAMES
from shallowmirror.engine.membership import fatal_group_error
from shallowmirror.errors import ShallowMirrorError
from shallowmirror.mirror.clients import build_client
from shallowmirror.mirror.stats import FlowStats, PartitionStats
from shallowmirror.mirror.topic_ids import Recreated, TopicIdWatch
from shallowmirror.net.cluster import RETRY_WARNING_INTERVAL_S
from shallowmirror.rdkafka_logs import ClientErrors

log = logging.getLogger(__name__)

CODECS = CODEC_NAMES
#: How long shutdown waits for the lag of partitions not fetched yet (see ``_learn_lag``).
LAG_WAIT_S = 2.0
#: While the source is known to be down: how often the deep loop asks it for metadata, and how
#: long it waits for the answer (the loop has nothing else to do meanwhile).
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 0.5
#: Engine keys that mean something else (or nothing) to librdkafka.
_NOT_FOR_LIBRDKAFKA = ("partition.assignment", "legacy.format", "log.append.time",
                       "crc.check", "metrics.file",
                       "metrics.interval.ms", "producer.id", "buffer.memory",
                       "offset.commit.interval.ms", "retry.backoff.max.ms", "max.request.size")


class DeliveryFailedError(ShallowMirrorError):
    """The target did not accept a record; the runner stops and resumes from its last commit."""


class TargetPartitionMissingError(DeliveryFailedError):
    """The target lacks the remote partition a record goes to (the remote topic was deleted, or
    the source topic grew): the flow repairs the remote topic before the runner restarts."""

    def __init__(self, message: str, target_partition: tuple[str, int]) -> None:
        super().__init__(message)
        self.target_partition = target_partition


#: librdkafka's answers for a topic or partition the target does not have.
_MISSING = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC,
                      KafkaError.UNKNOWN_TOPIC_OR_PART})


class DeepFlowRunner:
    """Mirror one flow's topics by consuming and producing records."""

    def __init__(self, *, flow: str, source_config: Mapping[str, Any],
                 target_config: Mapping[str, Any], settings: Mapping[str, Any],
                 topic_mapper: Callable[[str], str],
                 codec_for_topic: Callable[[str], str | None] | None = None,
                 metrics_sink: Any = None, source_alias: str = "source",
                 target_alias: str = "target"):
        self.flow = flow
        self.metrics_sink = metrics_sink
        self.source_alias, self.target_alias = source_alias, target_alias
        self._run_id = uuid.uuid4().hex[:16]
        self._emitted: dict[tuple[str, int], tuple[int, int]] = {}
        self.topic_mapper = topic_mapper
        self.codec_for_topic = codec_for_topic or (lambda topic: None)
        try:
            from shallowmirror.engine.config import resolve_settings

            # The engine's defaults (auto.offset.reset=earliest, ...), not librdkafka's (latest).
            settings = resolve_settings(settings, context=f"flow {flow}")
        except ImportError:  # pragma: no cover - the engine ships with the package
            settings = dict(settings)
        settings = {**settings, "group.id": settings.get("group.id") or
                    "shallowmirror-" + flow.replace("->", "-")}
        self._settings = settings
        self._commit_interval_s = float(settings.get("offset.commit.interval.ms", 5000)) / 1000
        self._metrics_interval_s = max(0.2, float(settings.get("metrics.interval.ms") or 1000)
                                       / 1000)
        self._source_config = self._consumer_config(source_config, settings)
        self._target_config = self._producer_config(target_config, settings)
        self._forced_codec = target_config.get("compression.type") or target_config.get(
            "compression.codec")
        self._topics: list[str] = []
        self._topics_changed = threading.Event()
        self._lock = threading.Lock()
        self._stats: dict[tuple[str, int], PartitionStats] = {}
        #: Per partition, the earliest (monotonic) time its cached high watermark can be from
        #: (``_update_watermarks``).
        self._watermark_as_of: dict[tuple[str, int], float] = {}
        #: librdkafka's cached watermarks carry no time. Its Fetch answers refresh them, at
        #: least every fetch.wait.max.ms while a partition is fetched; one read now is taken to
        #: be from no earlier than this many seconds ago.
        self._watermark_age_s = float(settings.get("fetch.max.wait.ms") or 500) / 1000 + 1.0
        self._delivered: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._assigned: set[tuple[str, int]] = set()
        #: Assigned partitions without a committed offset (they start at the log start).
        self._from_log_start: set[tuple[str, int]] = set()
        #: Offsets this runner committed for a topic that was then deleted and created again,
        #: of partitions not assigned here when that was seen (a revoke commits them; the next
        #: assignment must not start there).
        self._stale_commits: dict[tuple[str, int], int] = {}
        #: When (monotonic) each partition was last assigned with no committed offset.
        self._assigned_fresh: dict[tuple[str, int], float] = {}
        self._reset_earliest = settings.get("auto.offset.reset", "earliest") == "earliest"
        #: Where a partition with no valid offset starts, as a librdkafka logical offset and as
        #: the operator wrote it (the re-created topic restarts and their warnings).
        self._reset_start = OFFSET_BEGINNING if self._reset_earliest else OFFSET_END
        self._reset_name = "earliest" if self._reset_earliest else "latest"
        self._failure: BaseException | None = None
        #: librdkafka's client-level errors (a source or target broker down, refused, failing
        #: authentication): warned once a while, as the shallow path's connections say them.
        #: Without them a source that went away left the flow silent, its status saying lag 0.
        self._consumer_errors = ClientErrors(
            log, f"flow {flow}: deep consumer (cluster {source_alias})", RETRY_WARNING_INTERVAL_S)
        self._producer_errors = ClientErrors(
            log, f"flow {flow}: deep producer (cluster {target_alias})", RETRY_WARNING_INTERVAL_S)
        self._closing = False
        self._producers: dict[str, Producer] = {}
        self._topic_codec: dict[str, str] = {}

    # -- configuration -------------------------------------------------------------------------

    @staticmethod
    def _consumer_config(source: Mapping[str, Any], settings: Mapping[str, Any]) -> dict:
        conf = {k: v for k, v in source.items() if not k.startswith("compression.")}
        for key in ("group.id", "session.timeout.ms", "heartbeat.interval.ms", "isolation.level",
                    "auto.offset.reset", "fetch.max.bytes", "max.partition.fetch.bytes",
                    "fetch.min.bytes"):
            if settings.get(key) is not None:
                conf[key] = settings[key]
        if settings.get("fetch.max.wait.ms") is not None:
            conf["fetch.wait.max.ms"] = settings["fetch.max.wait.ms"]
        conf.update({"enable.auto.commit": False, "enable.auto.offset.store": False,
                     "enable.partition.eof": False,
                     # Partitions added to a source topic are assigned within the mirror's
                     # metadata.max.age.ms, not librdkafka's 5 minutes (as the engine's group).
                     "topic.metadata.refresh.interval.ms":
                         int(settings.get("metadata.max.age.ms") or 30000),
                     # The engine's membership uses roundrobin: shallow and deep processes
                     # may share one group (and a group switched between modes keeps working).
                     "partition.assignment.strategy": "roundrobin"})
        return {k: v for k, v in conf.items() if k not in _NOT_FOR_LIBRDKAFKA}

    @staticmethod
    def _producer_config(target: Mapping[str, Any], settings: Mapping[str, Any]) -> dict:
        conf = {k: v for k, v in target.items()
                if not k.startswith(("compression.", "group.", "session.", "auto.offset"))}
        conf.setdefault("linger.ms", 5)
        conf["enable.idempotence"] = True  # order and no duplicates within one run
        conf["acks"] = "all"
        # Topic sync creates remote topics (the source's partitions and configs): a Produce
        # to a deleted one must fail and be repaired, not make the broker create it with its
        # defaults (one partition, the broker's configs), as librdkafka's producer asks to.
        conf["allow.auto.create.topics"] = False
        if settings.get("max.request.size") is not None:
            conf["message.max.bytes"] = settings["max.request.size"]
        return {k: v for k, v in conf.items() if k not in _NOT_FOR_LIBRDKAFKA}

    def set_topics(self, topics: list[str]) -> None:
        """Source topics to mirror (their remote topics exist)."""
        with self._lock:
            if sorted(topics) != self._topics:
                self._topics = sorted(topics)
                self._topics_changed.set()

    # -- running ---------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Mirror until ``stop`` is set; then finish in-flight records and commit."""
        stop = stop or asyncio.Event()
        halt = threading.Event()
        worker = asyncio.get_running_loop().run_in_executor(None, self._loop, halt)
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({worker, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            halt.set()
            stopper.cancel()
            await asyncio.shield(worker)

    def _check_consumer_error(self, err: KafkaError) -> None:
        """A group error no retry can fix (e.g. a group id a KIP-848 group holds, which Kafka
        3.x refuses a classic JoinGroup for ever) stops the flow with what to do; librdkafka
        retries the rest, which are logged."""
        if err.code() == KafkaError._PARTITION_EOF:
            return
        refusal = fatal_group_error(err, self._settings["group.id"], self.source_alias,
                                    self._source_config)
        if refusal is not None:
            raise refusal
        log.warning("flow %s: consumer: %s", self.flow, err.str())

    def _producer(self, topic: str) -> Producer:
        codec = self._topic_codec.get(topic)
        if codec is None:
            # Pinned at first use: a partition must never move to another producer (order).
            codec = self._forced_codec or self.codec_for_topic(topic) or "lz4"
            if codec not in CODECS:
                codec = "lz4"
            self._topic_codec[topic] = codec
        producer = self._producers.get(codec)
        if producer is None:
            conf = {**self._target_config, "compression.type": codec,
                    "error_cb": self._producer_errors}
            producer = build_client(Producer, conf, what=f"flow {self.flow} deep producer")
            self._producers[codec] = producer
        return producer

    def _loop(self, halt: threading.Event) -> None:
        if self.metrics_sink is not None:  # the first CPU/RSS sample, before any work
            from shallowmirror.engine.metrics import process_record

            self.metrics_sink.emit(process_record(self._run_id, None))
        consumer = build_client(Consumer, {**self._source_config,
                                           "error_cb": self._consumer_errors},
                                what=f"flow {self.flow} deep consumer")
        self._closing = False
        self._assigned = set()  # a restarted loop is a new member: its assignment comes anew
        subscribed: list[str] = []
        last_commit = last_metrics = last_probe = time.monotonic()
        ids = self._topic_id_watch()
        recreated: dict[str, Recreated] = {}
        try:
            while not halt.is_set():
                if self._failure is not None:
                    raise self._failure
                if ids is not None:
                    recreated.update(ids.take_changes())
                    if recreated:
                        recreated = self._restart_recreated(consumer, recreated)
                if self._topics_changed.is_set():
                    with self._lock:
                        self._topics_changed.clear()
                        subscribed = list(self._topics)
                    if subscribed:
                        consumer.subscribe(subscribed, on_assign=self._on_assign,
                                           on_revoke=self._make_on_revoke(consumer))
                    else:
                        consumer.unsubscribe()
                if not subscribed:
                    halt.wait(0.2)
                    continue
                messages = consumer.consume(num_messages=5000, timeout=0.2)
                for msg in messages:
                    err = msg.error()
                    if err is not None:
                        self._check_consumer_error(err)
                        continue
                    self._forward(msg)
                for producer in self._producers.values():
                    producer.poll(0)
                self._update_watermarks(consumer)
                if time.monotonic() - last_probe >= PROBE_INTERVAL_S:
                    self._probe_source(consumer, subscribed[0])
                    last_probe = time.monotonic()
                if time.monotonic() - last_commit >= self._commit_interval_s:
                    self._commit(consumer)
                    last_commit = time.monotonic()
                if time.monotonic() - last_metrics >= self._metrics_interval_s:
                    self._emit_metrics()
                    last_metrics = time.monotonic()
        finally:
            try:
                self._flush_all()
                if self._failure is None:
                    self._commit(consumer, final=True)
                self._learn_lag(consumer)
                self._emit_metrics()
            finally:
                # Partitions given up by close() still count in the final lag (see on_revoke).
                self._closing = True
                if ids is not None:
                    ids.stop()
                consumer.close()
        if self._failure is not None:
            raise self._failure

    def _probe_source(self, consumer: Consumer, topic: str) -> None:
        """While the source is known to be down, ask it for one topic's metadata: its answer is
        the proof that it is back, which librdkafka never gives (nor does a group whose session
        outlived the outage, with nothing new to commit)."""
        if self._consumer_errors.down_for_s() is None:
            return
        try:
            consumer.list_topics(topic, timeout=PROBE_TIMEOUT_S)
        except KafkaException:
            return
        self._consumer_errors.reached()

    def _topic_id_watch(self) -> TopicIdWatch | None:
        """Topic ids of the subscribed topics, looked up every metadata.max.age.ms (librdkafka's
        consumer keeps none: see ``topic_ids``); None if the cluster answers no id lookup."""
        def topics() -> list[str]:
            with self._lock:
                return list(self._topics)

        interval_s = min(30.0, max(0.5, int(self._settings.get("metadata.max.age.ms")
                                            or 30000) / 1000))
        watch = TopicIdWatch(self._source_config, topics, interval_s=interval_s,
                             what=f"flow {self.flow} deep path")
        try:
            watch.start()
        except KafkaException as err:
            log.warning("flow %s: deep path cannot look up topic ids (%s): a source topic "
                        "deleted and created again will not be noticed", self.flow, err)
            return None
        return watch

    def _restart_recreated(self, consumer: Consumer, recreated: dict[str, Recreated]
                           ) -> dict[str, Recreated]:
        """Move the partitions of topics deleted and created again to the new topic's start
        (``auto.offset.reset``): the consumer would fetch on at the old topic's position and
        skip the new one's records below it. Not moved: a partition assigned afresh (no
        committed offset: Kafka deletes a deleted topic's) after the topic was seen gone, which
        already started there. Records of the new topic mirrored before this are mirrored again
        (at least once, as after a crash). Returns the topics not done yet (a partition not
        being fetched yet cannot be moved)."""
        self._flush_all()        # deliveries of the old topic land before its offsets go
        left: dict[str, Recreated] = {}
        for topic, change in recreated.items():
            keys = sorted(k for k in self._assigned if k[0] == topic
                          and not self._started_anew(k, change))
            try:
                for key in keys:
                    consumer.seek(TopicPartition(topic, key[1], self._reset_start))
            except KafkaException as err:
                log.debug("flow %s: %s not moved yet: %s", self.flow, topic, err)
                left[topic] = change
                continue
            with self._lock:
                for key in keys:
                    self._delivered.pop(key, None)
                    self._committed.pop(key, None)
                    self._partition(key).position = -1
                    self._from_log_start.add(key)
                elsewhere = {k for k in (*self._committed, *self._delivered)
                             if k[0] == topic and k not in self._assigned}
                for key in elsewhere:
                    committed = self._committed.pop(key, None)
                    self._delivered.pop(key, None)
                    if committed is not None:
                        self._stale_commits[key] = committed
            log.warning("flow %s: source topic %s was deleted and created again (topic id %s, "
                        "was %s): its offsets start anew, so the deep path restarts %s at "
                        "auto.offset.reset=%s instead of fetching on; the old topic's copies "
                        "stay on the target, before the new one's", self.flow, topic,
                        change.new, change.old,
                        ("partitions " + ", ".join(str(p) for _, p in keys)) if keys
                        else "none of its partitions (none assigned here, or assigned afresh)",
                        self._reset_name)
        return left

    def _started_anew(self, key: tuple[str, int], change: Recreated) -> bool:
        """Assigned with no committed offset after its topic was seen gone: it began at the new
        topic's start already."""
        assigned = self._assigned_fresh.get(key)
        return (change.missing_since is not None and assigned is not None
                and assigned > change.missing_since)

    def _forward(self, msg: Any) -> None:
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        key = (topic, partition)
        ts_type, ts = msg.timestamp()
        headers = msg.headers()
        value = msg.value()
        size = len(value or b"") + len(msg.key() or b"")

        remote = self.topic_mapper(topic)

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                if self._failure is None:
                    self._failure = self._refused(err, topic, partition, offset, remote)
                return
            self._producer_errors.reached()  # served after any error queued before the ack
            with self._lock:
                self._delivered[key] = offset + 1
                stats = self._partition(key)
                stats.position = offset + 1
                stats.records += 1
                stats.bytes += size
                if ts_type and ts > 0:
                    stats.record_age_ms = max(0.0, time.time() * 1000 - ts)

        producer = self._producer(topic)
        kwargs: dict[str, Any] = {"partition": partition, "key": msg.key(), "value": value,
                                  "on_delivery": delivered}
        if headers:
            kwargs["headers"] = headers
        if ts_type and ts >= 0:
            kwargs["timestamp"] = ts
        while True:
            try:
                producer.produce(remote, **kwargs)
                return
            except BufferError:
                producer.poll(0.1)  # queue full: let deliveries drain
            except KafkaException as err:
                raise self._refused(err.args[0], topic, partition, offset, remote) from err

    def _refused(self, err: KafkaError, topic: str, partition: int, offset: int,
                 remote: str) -> DeliveryFailedError:
        """The error that stops the runner for a record the target refused."""
        text = (f"flow {self.flow}: target refused a record of {topic}-{partition} at offset "
                f"{offset}: {err.str()}")
        if err.code() in _MISSING:
            return TargetPartitionMissingError(
                f"{text} (remote partition {remote}-{partition})", (remote, partition))
        return DeliveryFailedError(text)

    def _emit_metrics(self) -> None:
        """One ``flow`` record per partition that moved since the last one (metrics_schema);
        compressed sizes are unknown here (librdkafka batches on its own), so the bytes are
        uncompressed key + value bytes."""
        if self.metrics_sink is None:
            return
        from shallowmirror import metrics_schema as schema

        now = time.time()
        with self._lock:
            moved = [(k, p.records, p.bytes, p.lag) for k, p in self._stats.items()
                     if self._emitted.get(k, (0, 0))[0] != p.records]
        for key, records, nbytes, lag in moved:
            before = self._emitted.get(key, (0, 0))
            self._emitted[key] = (records, nbytes)
            self.metrics_sink.emit({
                "kind": schema.FLOW, "time": now, "run_id": self._run_id, "flow": self.flow,
                "source_cluster": self.source_alias, "target_cluster": self.target_alias,
                "topic": key[0], "partition": key[1], "target_topic": self.topic_mapper(key[0]),
                "mode": "deep", "codec": self._topic_codec.get(key[0]), "batches": None,
                "records": records - before[0], "compressed_bytes": None,
                "uncompressed_bytes": nbytes - before[1], "latency_ms": None,
                "latency_ms_max": None, "offset_lag": lag})
        # CPU and RSS of this process, as the shallow engine writes them: the report compares
        # the two paths' CPU per GB and memory from these.
        from shallowmirror.engine.metrics import process_record

        self.metrics_sink.emit(process_record(self._run_id, None))

    def _partition(self, key: tuple[str, int]) -> PartitionStats:
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = PartitionStats(*key)
        return stats

    def _update_watermarks(self, consumer: Consumer) -> None:
        """High watermarks as the last Fetch saw them (never ListOffsets: tansu's is wrong) and,
        while nothing is in flight, the consumer position (covers partitions already mirrored by
        an earlier run)."""
        assigned = [TopicPartition(*key) for key in self._assigned]
        idle = all(len(p) == 0 for p in self._producers.values())
        positions = {}
        if idle and assigned:
            try:
                positions = {(tp.topic, tp.partition): tp.offset
                             for tp in consumer.position(assigned) if tp.offset >= 0}
            except KafkaException:
                positions = {}
        for tp in assigned:
            key = (tp.topic, tp.partition)
            try:
                low, high = consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                low = high = None
            with self._lock:
                stats = self._partition(key)
                if high is not None and high >= 0:
                    stats.high_watermark = high
                    self._watermark_as_of[key] = time.monotonic() - self._watermark_age_s
                if stats.position < 0 and key in self._from_log_start and low is not None \
                        and low >= 0 and self._reset_earliest:
                    stats.position = low  # no committed offset: it starts at the log start
                if key in positions:
                    stats.position = max(stats.position, positions[key])

    def _learn_lag(self, consumer: Consumer, timeout_s: float = LAG_WAIT_S) -> None:
        """At shutdown, wait (briefly) until every assigned partition's lag is known: one
        stopped right after assignment may not have had its first Fetch answer yet (the
        consumer keeps fetching in the background). Those still unknown after ``timeout_s``
        are reported as unknown, never left out."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._update_watermarks(consumer)
            with self._lock:
                unknown = [k for k in self._assigned
                           if k not in self._stats or self._stats[k].lag is None]
            if not unknown or time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def _flush_all(self) -> None:
        for producer in self._producers.values():
            remaining = producer.flush(30)
            if remaining:
                log.error("flow %s: %d records not acknowledged by the target at shutdown; "
                          "their offsets are not committed", self.flow, remaining)

    def _commit(self, consumer: Consumer, only: set[tuple[str, int]] | None = None, *,
                final: bool = False) -> None:
        with self._lock:
            todo = {k: v for k, v in self._delivered.items()
                    if self._committed.get(k) != v and (only is None or k in only)}
        if not todo:
            return
        down_s = self._consumer_errors.down_for_s()
        if down_s is not None:
            # No commit reaches a cluster that is down, and librdkafka's answer to one (about
            # 7 s later) held this loop and then the shutdown. The next one after the cluster
            # answers again commits these; at shutdown they are mirrored again next start.
            if final:
                log.warning("flow %s: offsets of %d partitions not committed: cluster %s "
                            "unreachable for %.0f s; the next start mirrors again from the last "
                            "commit", self.flow, len(todo), self.source_alias, down_s)
            return
        try:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in todo.items()],
                            asynchronous=False)
        except KafkaException as err:
            log.warning("flow %s: offset commit failed (retried at the next commit): %s",
                        self.flow, err.args[0].str() if err.args else err)
            return
        self._consumer_errors.reached()  # the group coordinator answered just now
        self._committed.update(todo)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The group's coordinator has just answered the join: the source is reachable again
        # (else the status said "unreachable" for up to 15 s after records flowed again).
        self._consumer_errors.reached()
        self._assigned |= {(tp.topic, tp.partition) for tp in partitions}
        stale = self._note_start_positions(consumer, partitions)
        if stale:
            # Start these where a first start would, not at the old topic's committed offset.
            for tp in partitions:
                if (tp.topic, tp.partition) in stale:
                    tp.offset = self._reset_start
            consumer.assign(partitions)
            log.warning("flow %s: %s committed the old topic's offset before its topic was "
                        "created again: started at auto.offset.reset=%s instead", self.flow,
                        ", ".join(f"{t}-{p}" for t, p in sorted(stale)), self._reset_name)
        log.info("flow %s: deep path assigned %s", self.flow,
                 ", ".join(f"{tp.topic}-{tp.partition}" for tp in partitions) or "nothing")

    def _note_start_positions(self, consumer: Consumer, partitions: list[TopicPartition]
                              ) -> set[tuple[str, int]]:
        """Each assigned partition's committed offset as its position, so that its lag is known
        before its first record is delivered (else the flow's lag leaves it out). Returns the
        partitions whose committed offset is the one this runner committed for a topic since
        deleted and created again (``_stale_commits``): they must not start there."""
        try:
            committed = consumer.committed(partitions, timeout=10)
        except KafkaException as err:
            log.debug("flow %s: committed offsets unknown at assignment: %s", self.flow, err)
            return set()
        stale: set[tuple[str, int]] = set()
        with self._lock:
            for tp in committed:
                key = (tp.topic, tp.partition)
                if tp.offset < 0:
                    self._from_log_start.add(key)
                    self._assigned_fresh[key] = time.monotonic()
                elif self._stale_commits.pop(key, None) == tp.offset:
                    stale.add(key)
                    self._from_log_start.add(key)
                else:
                    stats = self._partition(key)
                    stats.position = max(stats.position, tp.offset)
                    self._assigned_fresh.pop(key, None)
        return stale

    def _make_on_revoke(self, consumer: Consumer) -> Callable:
        def on_revoke(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
            # Another member takes these over from our commit: flush and commit them first.
            self._flush_all()
            revoked = {(tp.topic, tp.partition) for tp in partitions}
            self._commit(consumer, revoked)
            if not self._closing:  # at shutdown they stay in the final lag
                self._assigned -= revoked
        return on_revoke

    # -- observing -------------------------------------------------------------------------------

    def stats(self) -> FlowStats:
        source_down = self._consumer_errors.down_for_s() is not None
        with self._lock:
            # A partition given up at shutdown keeps its position: its lag still counts.
            parts = {k: PartitionStats(**vars(v)) for k, v in self._stats.items()
                     if k in self._assigned or v.records or v.position >= 0}
            for key in self._assigned:
                parts.setdefault(key, PartitionStats(*key))
        if source_down:
            # The high watermarks are the last ones seen before the source went away: the lag
            # is not known (it said 0 for as long as the source was gone).
            for part in parts.values():
                part.high_watermark = -1
        return FlowStats(self.flow, "deep", parts)

    def unreachable(self) -> tuple[str, float] | None:
        """For the status line: the alias of the cluster whose brokers are all down and for how
        many seconds (None: neither cluster is known to be)."""
        for alias, errors in ((self.source_alias, self._consumer_errors),
                              (self.target_alias, self._producer_errors)):
            down_s = errors.down_for_s()
            if down_s is not None:
                return alias, down_s
        return None

    def caught_up(self, since: float | None = None) -> bool:
        """Every assigned partition mirrored up to its high watermark (at least one assigned);
        with ``since`` (``time.monotonic()``), a high watermark fetched no earlier than it."""
        with self._lock:
            if not self._assigned:
                return False
            for key in self._assigned:
                stats = self._stats.get(key)
                if stats is None or stats.high_watermark < 0:
                    return False
                if since is not None and self._watermark_as_of.get(key, float("-inf")) < since:
                    return False
                if stats.high_watermark > 0 and stats.position < stats.high_watermark:
                    return False
            return True

    async def wait_caught_up(self, timeout_s: float, *, since: float | None = None) -> bool:
        """``caught_up(since)`` within ``timeout_s`` (``since`` default: this call)."""
        since = time.monotonic() if since is None else since
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.caught_up(since):
                return True
            await asyncio.sleep(0.2)
        return self.caught_up(since)
