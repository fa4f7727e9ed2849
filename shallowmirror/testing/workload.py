"""Load a source topic with realistic, deterministic data through confluent-kafka.

A ``Workload`` describes what to write (record count, value size, key cardinality, headers,
partitions, codec, producer batching, idempotent or transactional producer with a plan of committed
and aborted transactions); ``load`` creates the topic (``compression.type=producer`` so the broker
keeps the producer's batches as they are), produces, and returns a ``LoadResult``: per partition the
ordered committed records (with the offsets the broker assigned) and the aborted ones separately,
plus byte counts. Everything but timestamps follows from ``seed``. Timestamps are the wall clock
at the moment each record is produced (so ``record-age-ms`` on the target means something, and a
long load never runs past a broker's limit on future timestamps), or, with ``timestamp_ms``,
start there and advance 1 ms per record (reproducible bytes for tests).

Values are JSON-like click events padded with a note drawn from a pool of phrases: repetition like
real event streams, so they compress roughly 3x with lz4/snappy and 5-8x with zstd/gzip.

Records are given an explicit partition (crc32 of the key, or round robin without keys), so where a
record lands does not depend on librdkafka's partitioner.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
import zlib
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shallowmirror.codec.layout import CODEC_NAMES
from shallowmirror.errors import ConfigError, ShallowMirrorError
from shallowmirror.mirror.clients import flush_sliced
from shallowmirror.rdkafka_logs import with_log_config
from shallowmirror.testing.topics import (
    TIMESTAMP_CREATE_TIME,
    Record,
    admin_errors,
    client_config,
)

CODECS = CODEC_NAMES

_EVENTS = ["page_view", "click", "add_to_cart", "purchase", "search", "login", "logout", "scroll"]
_PAGES = ["/", "/home", "/products", "/products/item", "/cart", "/checkout", "/search",
          "/account", "/help"]
_COUNTRIES = ["DE", "FR", "US", "GB", "NL", "IN", "BR", "JP", "ES", "IT"]
_DEVICES = ["mobile", "desktop", "tablet"]
_BROWSERS = ["firefox", "chrome", "safari", "edge"]
_WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "kafka", "mirror", "batch", "record",
          "offset", "topic", "partition", "broker", "leader", "replica", "stream", "event", "order",
          "user", "cart", "price", "item", "session", "search", "result"]
_HEAD = ('{"event_id":%d,"type":"%s","user":"%s","page":"%s","country":"%s","device":"%s",'
         '"browser":"%s","amount":%d,"note":"')
# Pool sizes measured against librdkafka batches of 300-byte values: lz4 ~3.0x, snappy ~3.2x,
# zstd ~6x, gzip ~7.5x. Smaller pools compress better; per-record random fields cap lz4.
_USERS, _SENTENCES, _NOTES, _TRACES = 20_000, 32, 128, 64


class LoadError(ShallowMirrorError):
    """The loader could not create the topic or write every record."""


@dataclass(frozen=True)
class Workload:
    """What to write. ``keys`` is the key cardinality (0: null keys); ``headers`` is per record.

    Transactions (``transactional=True``) hold ``transaction_records`` records each; which are
    aborted comes from ``transaction_plan`` (one bool per transaction, True = commit; records
    beyond the plan go in committed transactions) or else ``abort_every`` (every Nth aborted)."""

    topic: str
    records: int = 10_000
    value_bytes: int = 300
    keys: int = 1_000
    headers: int = 2
    partitions: int = 3
    codec: str = "lz4"
    batch_bytes: int = 1_000_000
    linger_ms: int = 20
    idempotent: bool = False
    transactional: bool = False
    transaction_records: int = 1_000
    abort_every: int = 0
    transaction_plan: tuple[bool, ...] | None = None
    seed: int = 0
    timestamp_ms: int | None = None
    replication_factor: int = -1
    topic_config: Mapping[str, str] = field(default_factory=dict)
    create_topic: bool = True
    producer_config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if self.codec not in CODECS:
            problems.append(f"codec {self.codec!r} is not one of {', '.join(CODECS)}")
        for name in ("records", "keys", "headers"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.partitions < 1:
            problems.append(f"partitions must be >= 1, got {self.partitions}")
        if self.value_bytes < 0:
            problems.append(f"value_bytes must be >= 0, got {self.value_bytes}")
        if self.transaction_records < 1:
            problems.append("transaction_records must be >= 1")
        if (self.abort_every or self.transaction_plan is not None) and not self.transactional:
            problems.append("abort_every / transaction_plan need transactional=True")
        if self.abort_every < 0:
            problems.append("abort_every must be >= 0")
        if problems:
            raise ConfigError(problems)

    def transaction_outcomes(self) -> list[bool]:
        """One entry per transaction, True = commit (empty if not transactional)."""
        if not self.transactional:
            return []
        count = -(-self.records // self.transaction_records)
        plan = list(self.transaction_plan or ())
        outcomes = []
        for t in range(count):
            if t < len(plan):
                outcomes.append(bool(plan[t]))
            elif self.transaction_plan is None and self.abort_every:
                outcomes.append((t + 1) % self.abort_every != 0)
            else:
                outcomes.append(True)
        return outcomes


@dataclass
class LoadResult:
    """What ``load`` wrote. ``committed``/``aborted``: partition -> records in offset order.

    ``uncompressed_bytes`` counts key + value + header bytes of every record written;
    ``compressed_bytes`` is the sum of the RecordBatch sizes librdkafka produced (from its
    statistics; None if they did not arrive), i.e. what sits on the broker and crosses the wire."""

    topic: str
    workload: Workload
    committed: dict[int, list[Record]]
    aborted: dict[int, list[Record]]
    uncompressed_bytes: int
    compressed_bytes: int | None
    batches: int | None
    elapsed_s: float

    @property
    def record_count(self) -> int:
        """Records written, aborted ones included."""
        return sum(map(len, self.committed.values())) + sum(map(len, self.aborted.values()))

    @property
    def committed_count(self) -> int:
        return sum(map(len, self.committed.values()))

    @property
    def compression_ratio(self) -> float | None:
        if not self.compressed_bytes:
            return None
        return self.uncompressed_bytes / self.compressed_bytes

    def records(self, isolation_level: str = "read_committed") -> dict[int, list[Record]]:
        """What a reader should see: committed records only, or every data record by offset."""
        if isolation_level == "read_committed":
            return self.committed
        merged = {}
        for p in sorted(set(self.committed) | set(self.aborted)):
            merged[p] = sorted([*self.committed.get(p, ()), *self.aborted.get(p, ())],
                               key=lambda r: r.offset)
        return merged


@dataclass
class _Plan:
    """A workload's records as columns, in produce order (columns are cheaper than 200k objects)."""

    partitions: list[int]
    keys: list[bytes | None]
    values: list[bytes]
    headers: list[tuple[tuple[str, bytes], ...]]
    base_timestamp_ms: int
    uncompressed_bytes: int
    #: Wall-clock create times, filled in as records are produced (None: base + index).
    timestamps: array | None = None

    def __len__(self) -> int:
        return len(self.values)

    def timestamp(self, i: int) -> int:
        return self.timestamps[i] if self.timestamps is not None else self.base_timestamp_ms + i

    def record(self, i: int, offset: int = -1) -> Record:
        return Record(self.keys[i], self.values[i], self.headers[i], self.timestamp(i),
                      TIMESTAMP_CREATE_TIME, offset)


#: Memory a planned record holds beyond its value's bytes (the value's bytes object, its key,
#: headers and list slots), measured with tracemalloc at 100k records: about value + 300 bytes.
PLAN_BYTES_PER_RECORD = 320


def plan_problem(records: int, value_bytes: int) -> str | None:
    """Why ``records`` records of ``value_bytes`` cannot be loaded here, or None: the records
    are made in memory before they are sent (so a rerun writes the same ones), and a count
    past what memory holds failed deep inside (``OverflowError``) or swapped for minutes."""
    need = records * (value_bytes + PLAN_BYTES_PER_RECORD)
    available = _available_memory_bytes()
    if available is None or need <= available:
        return None
    return (f"{records:,} records of {value_bytes:,} bytes need about {need / 2**30:,.1f} GiB of "
            f"memory (the records are made before they are sent), and "
            f"{available / 2**30:,.1f} GiB is available here")


def _available_memory_bytes() -> int | None:
    """MemAvailable (Linux), else all physical memory, else None (unknown: not checked)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _pick(rnd: random.Random, pool: list, n: int) -> list:
    """n deterministic picks from pool; much faster than ``Random.choices`` (one call per pick),
    at the price of a negligible modulo bias."""
    indexes = array("I", rnd.randbytes(4 * n))
    size = len(pool)
    return [pool[i % size] for i in indexes]


def _plan(w: Workload) -> _Plan:
    n = w.records
    rnd = random.Random(w.seed)
    sentences = [" ".join(rnd.choices(_WORDS, k=6)) for _ in range(_SENTENCES)]
    note_len = max(w.value_bytes, 16)
    notes = [". ".join(rnd.choices(sentences, k=note_len // 30 + 2)) for _ in range(_NOTES)]
    users = [f'user-{u:05d}","session":"{rnd.getrandbits(32):08x}' for u in range(_USERS)]
    rows = zip(range(n), _pick(rnd, _EVENTS, n), _pick(rnd, users, n), _pick(rnd, _PAGES, n),
               _pick(rnd, _COUNTRIES, n), _pick(rnd, _DEVICES, n), _pick(rnd, _BROWSERS, n),
               _pick(rnd, list(range(1000)), n), strict=True)
    budget = w.value_bytes - 2
    # The note is cut so every value is exactly value_bytes long (when value_bytes allows).
    values = [(h + note[: max(budget - len(h), 0)] + '"}').encode()
              for h, note in zip((_HEAD % row for row in rows), _pick(rnd, notes, n), strict=True)]
    if any(len(v) > w.value_bytes for v in values):  # too small for the event: cut it
        values = [v[: w.value_bytes] for v in values]

    keys: list[bytes | None]
    if w.keys:
        key_pool = [b"user-%06d" % k for k in range(w.keys)]
        keys = _pick(rnd, key_pool, n)
        key_partition = {k: zlib.crc32(k) % w.partitions for k in key_pool}
        partitions = [key_partition[k] for k in keys]
        key_bytes = sum(map(len, keys))
    else:
        keys = [None] * n
        partitions = [i % w.partitions for i in range(n)]
        key_bytes = 0
    headers, header_bytes = _headers(w.headers, n, rnd)
    base_ts = w.timestamp_ms if w.timestamp_ms is not None else int(time.time() * 1000)
    return _Plan(partitions, keys, values, headers, base_ts,
                 key_bytes + sum(map(len, values)) + header_bytes)


def _stamp_with_clock(plan: _Plan) -> None:
    """Make ``_produce_range`` stamp each record with the wall clock when it is produced."""
    plan.timestamps = array("q", bytes(8 * len(plan)))


def generate(workload: Workload) -> list[tuple[int, Record]]:
    """The (partition, record) pairs a workload writes, in produce order (offsets unknown)."""
    plan = _plan(workload)
    return [(plan.partitions[i], plan.record(i)) for i in range(len(plan))]


def _headers(count: int, n: int, rnd: random.Random) -> tuple[list[tuple], int]:
    """Per-record header tuples and their total key + value bytes."""
    if count == 0:
        return [()] * n, 0
    traces = [f"{rnd.getrandbits(64):016x}".encode() for _ in range(_TRACES)]
    columns: list[list[tuple[str, bytes]]] = []
    for h in range(count):
        if h == 0:
            columns.append([("trace-id", t) for t in _pick(rnd, traces, n)])
        elif h == 1:
            columns.append([("seq", b"%d" % i) for i in range(n)])
        elif h == 2:
            columns.append([("origin", b"shallowmirror-load")] * n)
        else:
            columns.append([(f"x-attr-{h}", b"v%d" % (i % 7)) for i in range(n)])
    size = sum(len(k) + len(v) for column in columns for k, v in column)
    return [tuple(row) for row in zip(*columns, strict=True)], size


def create_topic(cluster_or_config: Any, workload: Workload, timeout_s: float = 30.0) -> None:
    """Create the workload's topic with ``compression.type=producer`` and wait until its
    partitions have leaders."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(with_log_config(client_config(cluster_or_config)))
    config = {"compression.type": "producer", **dict(workload.topic_config)}
    new = NewTopic(workload.topic, workload.partitions, workload.replication_factor, config=config)
    future = admin.create_topics([new], operation_timeout=timeout_s)[workload.topic]
    try:
        future.result(timeout_s)
    except KafkaException as err:
        raise LoadError(f"cannot create topic {workload.topic!r}: {err.args[0]}") from err
    except TimeoutError as err:  # its text is empty
        raise LoadError(f"cannot create topic {workload.topic!r}: the cluster did not answer "
                        f"within {timeout_s:.0f}s") from err
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            # In short calls: librdkafka holds the thread (and Ctrl-C) for a whole call.
            tmeta = admin.list_topics(workload.topic, timeout=1.0).topics.get(workload.topic)
        except KafkaException:
            tmeta = None        # not answering this second: asked again until the deadline
        if (tmeta is not None and tmeta.error is None
                and len(tmeta.partitions) >= workload.partitions
                and all(pm.leader >= 0 for pm in tmeta.partitions.values())
                and _partitions_answer(admin, workload.topic, workload.partitions)):
            return
        if time.monotonic() > deadline:
            raise LoadError(f"topic {workload.topic!r} has no leaders after {timeout_s:.0f}s")
        time.sleep(0.1)


def _partitions_answer(admin: Any, topic: str, partitions: int) -> bool:
    """Every partition answers ListOffsets on its leader. Metadata names a leader a moment
    before that broker hosts the partition (Kafka 3.7 updates its metadata cache first): a
    Produce sent in that moment fails, and a producer without idempotence retries it behind
    later batches, out of order."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.earliest()
                                  for p in range(partitions)}, request_timeout=10)
    errors = admin_errors(futures)
    for err in errors:
        if err is not None and not isinstance(err, KafkaException):
            raise type(err)(*err.args)
    return not any(errors)


def _producer_config(base: Mapping[str, Any], w: Workload) -> dict[str, Any]:
    """The workload's librdkafka producer settings (callbacks are the caller's)."""
    return {
        **with_log_config(base),
        "compression.type": w.codec,
        "linger.ms": w.linger_ms,
        "batch.size": w.batch_bytes,
        "batch.num.messages": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 2 * 1024 * 1024,
        "message.max.bytes": max(1_000_000, w.batch_bytes + 65536),
        "statistics.interval.ms": 200,
        "enable.idempotence": w.idempotent or w.transactional,
        **dict(w.producer_config),
    }


def load(
    cluster_or_config: Any,
    workload: Workload,
    *,
    progress: Callable[[int, int], None] | None = None,
    timeout_s: float = 120.0,
) -> LoadResult:
    """Create the topic (unless ``workload.create_topic`` is False), write the workload, and
    return what was written. ``progress(done, total)`` is called now and then."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    w = workload
    base = client_config(cluster_or_config)
    if w.create_topic:
        # A configuration librdkafka refuses raises here, before there is a topic to leave
        # behind. Not the producer that writes: that one is made after the topic and the plan,
        # as it always was (made right after the topic, on Kafka 3.7 its first sends met a
        # partition not ready yet and were retried out of order, so the delivery reports no
        # longer matched the plan).
        Producer(_producer_config(base, w)).flush(0)
        create_topic(base, w)
    plan = _plan(w)
    if w.timestamp_ms is None:
        _stamp_with_clock(plan)
    total = len(plan)

    stats: list[dict] = []
    errors: list[str] = []
    # partition -> offsets from delivery reports, in produce order.
    offsets: dict[int, list[int]] = {p: [] for p in range(w.partitions)}

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        # librdkafka delivers reports per partition in produce order, so the nth report of a
        # partition belongs to its nth produced record.
        if err is not None:
            if len(errors) < 10:
                errors.append(f"{msg.topic()}-{msg.partition()}: {err}")
            offsets[msg.partition()].append(-1)
        else:
            offsets[msg.partition()].append(msg.offset())

    config = {
        **_producer_config(base, w),
        "stats_cb": lambda s: stats.append(json.loads(s)),
        "on_delivery": on_delivery,
    }
    if w.transactional:
        config["transactional.id"] = f"shallowmirror-load-{w.topic}-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    producer = Producer(config)
    outcomes = w.transaction_outcomes()
    aborted_flags = [False] * total  # per record, in produce order
    completed = False
    try:
        if w.transactional:
            producer.init_transactions(timeout_s)
        chunk = w.transaction_records if w.transactional else max(total, 1)
        for t, start in enumerate(range(0, total, chunk)):
            end = min(start + chunk, total)
            if w.transactional:
                producer.begin_transaction()
            _produce_range(producer, w.topic, plan, start, end, progress)
            # Flush before ending a transaction: aborting with records still queued would purge
            # them, and tests want aborted records really on the broker.
            _flush(producer, timeout_s)
            if w.transactional:
                if outcomes[t]:
                    producer.commit_transaction(timeout_s)
                else:
                    producer.abort_transaction(timeout_s)
                    aborted_flags[start:end] = [True] * (end - start)
        _flush(producer, timeout_s)
        elapsed = time.monotonic() - started
        compressed, batches = _batch_bytes_from_stats(producer, stats, w.topic, total)
        completed = True
    except KafkaException as err:
        raise LoadError(f"loading {w.topic!r} failed: {err.args[0]}") from err
    finally:
        if not completed:
            # Failed or interrupted: what is still queued is dropped, not waited for. Ctrl-C
            # may have stopped the brokers too, and raised in a callback (stats_cb) it comes
            # out of librdkafka as another error (a SystemError), so any error counts.
            producer.purge()
        flush_sliced(producer, 5 if completed else 0)
    if progress:
        progress(total, total)
    if errors:
        raise LoadError(f"{len(errors)}+ records of {w.topic!r} were not delivered: {errors}")
    return _result(w, plan, offsets, aborted_flags, compressed, batches, elapsed)


def _produce_range(producer: Any, topic: str, plan: _Plan, start: int, end: int,
                   progress: Callable[[int, int], None] | None) -> None:
    produce, poll = producer.produce, producer.poll
    keys, values, headers, partitions = plan.keys, plan.values, plan.headers, plan.partitions
    stamps = plan.timestamps
    now_ms = int(time.time() * 1000)
    for i in range(start, end):
        h = headers[i]
        if stamps is not None:
            if i % 1000 == 0:  # the clock, read once per thousand records
                now_ms = int(time.time() * 1000)
            stamps[i] = now_ms
        while True:
            try:
                # confluent-kafka wants headers as a list (or dict), not a tuple.
                produce(topic, values[i], keys[i], partition=partitions[i],
                        timestamp=plan.timestamp(i), headers=list(h) if h else None)
                break
            except BufferError:
                poll(0.05)  # local queue full: let delivery reports drain it
        # Poll rarely: every poll is a trip into librdkafka; delivery callbacks batch up.
        if i % 20_000 == 19_999:
            poll(0)
            if progress:
                progress(i + 1, len(plan))


def _flush(producer: Any, timeout_s: float) -> None:
    remaining = flush_sliced(producer, timeout_s)
    if remaining:
        raise LoadError(f"{remaining} records still undelivered after {timeout_s:.0f}s")


def _batch_bytes_from_stats(producer: Any, stats: list[dict], topic: str,
                            expected: int) -> tuple[int | None, int | None]:
    """Sum of batch sizes from librdkafka's statistics. Its ``batchsize`` window is reset at every
    emission, so summing all emissions up to one that has seen every record gives the total."""
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        producer.poll(0.05)
        if stats:
            parts = stats[-1].get("topics", {}).get(topic, {}).get("partitions", {})
            sent = sum(pm.get("txmsgs", 0) for key, pm in parts.items() if key != "-1")
            if sent >= expected:
                windows = [s.get("topics", {}).get(topic, {}).get("batchsize", {}) for s in stats]
                return sum(x.get("sum", 0) for x in windows), sum(x.get("cnt", 0) for x in windows)
    return None, None


def _result(w: Workload, plan: _Plan, offsets: dict[int, list[int]], aborted_flags: list[bool],
            compressed: int | None, batches: int | None, elapsed: float) -> LoadResult:
    indexes: dict[int, list[int]] = {p: [] for p in offsets}
    for i, p in enumerate(plan.partitions):
        indexes[p].append(i)
    committed: dict[int, list[Record]] = {}
    aborted: dict[int, list[Record]] = {}
    for p, idx in indexes.items():
        offs = offsets[p]
        if len(offs) != len(idx):
            raise LoadError(f"{w.topic}-{p}: {len(idx)} records produced but "
                            f"{len(offs)} delivery reports")
        if any(a >= b for a, b in zip(offs, offs[1:], strict=False)):  # never seen; keep the broker's order
            order = sorted(range(len(idx)), key=offs.__getitem__)
            idx, offs = [idx[k] for k in order], [offs[k] for k in order]
        committed[p] = [plan.record(i, o) for i, o in zip(idx, offs, strict=True)
                        if not aborted_flags[i]]
        aborted[p] = [plan.record(i, o) for i, o in zip(idx, offs, strict=True)
                      if aborted_flags[i]]
    return LoadResult(w.topic, w, committed, aborted, plan.uncompressed_bytes, compressed,
                      batches, elapsed)
