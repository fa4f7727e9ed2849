"""Read whole topics back with confluent-kafka and compare two topics record by record.

``read_topic`` reads every partition from the beginning to its end using ``assign`` (never
``subscribe``: tansu holds JoinGroup for ``session.timeout.ms/2``). The end is the high watermark a
*Fetch* response reports, which librdkafka signals as partition EOF — not ListOffsets "latest",
which tansu gets wrong, and which ``get_watermark_offsets(cached=False)`` would send. EOF also
handles transactional topics, where the high watermark counts control markers and, for
``read_committed``, the end is the last stable offset. Records produced while reading may or may
not be included.

``compare_topics`` checks, per partition and in order: key, value, headers, timestamp and timestamp
type (offsets only on request: a mirror that drops transaction markers shifts them). It resyncs
after a missing, extra or swapped record so one slip reports one difference, not a flood.

Out of scope: consumer groups, raw RecordBatch bytes (the codec tests fetch those themselves).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from shallowmirror.errors import ShallowMirrorError

#: confluent-kafka's timestamp types (``msg.timestamp()[0]``).
TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2

Headers = tuple[tuple[str, bytes | None], ...]


class Record(NamedTuple):
    """One record as written or read back. ``offset`` is -1 where unknown.

    A NamedTuple, not a dataclass: loads build hundreds of thousands of these."""

    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int
    timestamp_type: int = TIMESTAMP_CREATE_TIME
    offset: int = -1


#: What a topic holds: partition -> records in offset order.
TopicRecords = Mapping[int, Sequence[Record]]

#: Fields compared by default (offset is opt-in).
DEFAULT_FIELDS: tuple[str, ...] = ("key", "value", "headers", "timestamp_ms", "timestamp_type")


class TopicReadError(ShallowMirrorError):
    """A topic could not be read completely."""


def client_config(cluster_or_config: Any) -> dict[str, Any]:
    """A librdkafka config from a bootstrap string, a config mapping, or a cluster object."""
    if isinstance(cluster_or_config, str):
        return {"bootstrap.servers": cluster_or_config}
    if isinstance(cluster_or_config, Mapping):
        return dict(cluster_or_config)
    if hasattr(cluster_or_config, "client_config"):
        return dict(cluster_or_config.client_config())
    raise TypeError(f"expected a bootstrap string, a config dict or a cluster, got {cluster_or_config!r}")


def admin_errors(futures: dict) -> list[BaseException | None]:
    """Wait for an AdminClient request's futures; each one's error (None: it succeeded).

    Read with ``exception()``, not ``result()``, and the dict emptied: an error raised from its
    future would put the caller's frame in the traceback the future keeps, a cycle that keeps
    the AdminClient (its threads and broker connections) alive until the garbage collector runs.
    tansu waits 5 s for connected clients when it is stopped. Raise a copy
    (``type(err)(*err.args)``) rather than the error itself, for the same reason."""
    errors = [future.exception() for future in futures.values()]
    futures.clear()
    return errors


def wait_for_partitions(admin: Any, topic: str, partitions: int, timeout_s: float = 15) -> bool:
    """Poll Metadata (confluent-kafka ``AdminClient``) until ``topic`` has ``partitions`` partitions,
    each with a leader. Kafka publishes a created or widened topic to its metadata cache a little
    after the admin call returns; a test that reads Metadata at once can see the old state."""
    deadline = time.monotonic() + timeout_s
    while True:
        meta = admin.list_topics(topic, timeout=10).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions \
                and all(p.leader >= 0 for p in meta.partitions.values()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def group_offsets(cluster_or_config: Any, group_id: str, topic: str, partitions: Iterable[int],
                  **consumer_config: Any) -> dict[int, int]:
    """``group_id``'s committed offsets of ``topic``'s ``partitions`` (negative: none), read with
    the engine's own retry of a coordinator that is still loading or moved."""
    from confluent_kafka import Consumer

    from shallowmirror.engine.membership import committed_with_retries

    consumer = Consumer({**client_config(cluster_or_config), "group.id": group_id,
                         "enable.auto.commit": False, **consumer_config})
    try:
        found = committed_with_retries(consumer, [(topic, p) for p in partitions],
                                       deadline_s=60, where=f"test group {group_id}")
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()


def _headers(raw: Iterable[tuple[str, bytes | None]] | None) -> Headers:
    return tuple(raw) if raw else ()


def read_topic(
    cluster_or_config: Any,
    topic: str,
    *,
    partitions: Iterable[int] | None = None,
    isolation_level: str = "read_committed",
    timeout_s: float = 60.0,
) -> dict[int, list[Record]]:
    """Every record of ``topic`` (or of the given partitions), per partition in offset order.

    Reads up to the high watermark found when the read starts; records produced later may or may
    not be included. Raises ``TopicReadError`` if the topic is unknown or the end is not reached
    within ``timeout_s``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    if isolation_level not in ("read_committed", "read_uncommitted"):
        raise ValueError(f"isolation_level must be read_committed or read_uncommitted, not {isolation_level!r}")
    config = client_config(cluster_or_config)
    config.update({
        # assign() needs no group, but librdkafka insists on a group.id; never commit.
        "group.id": f"shallowmirror-reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "isolation.level": isolation_level,
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "fetch.wait.max.ms": 100,
    })
    deadline = time.monotonic() + timeout_s
    consumer = Consumer(config)
    try:
        if partitions is None:
            metadata = consumer.list_topics(topic, timeout=max(1.0, deadline - time.monotonic()))
            tmeta = metadata.topics.get(topic)
            if tmeta is None or tmeta.error is not None or not tmeta.partitions:
                raise TopicReadError(f"topic {topic!r} not found: {tmeta.error if tmeta else 'no metadata'}")
            partitions = sorted(tmeta.partitions)
        result: dict[int, list[Record]] = {p: [] for p in partitions}
        # No ListOffsets (tansu's "latest" is the last batch's base offset + 1): start at the
        # beginning and let librdkafka say when a fetch reached the high watermark (or, for
        # read_committed, the last stable offset) — partition EOF. Empty partitions report it too.
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in result])
        pending = set(result)
        while pending:
            if time.monotonic() > deadline:
                progress = ", ".join(
                    f"{p} ({len(result[p])} records read)" for p in sorted(pending))
                raise TopicReadError(
                    f"reading {topic!r} ({isolation_level}) did not reach the end within "
                    f"{timeout_s:.0f}s; unfinished partitions: {progress}")
            for msg in consumer.consume(num_messages=10_000, timeout=0.2):
                err = msg.error()
                p = msg.partition()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(p)
                        continue
                    raise TopicReadError(f"reading {topic}-{p}: {err}")
                if p not in result:
                    continue
                ts_type, ts = msg.timestamp()
                result[p].append(Record(msg.key(), msg.value(), _headers(msg.headers()), ts,
                                        ts_type, msg.offset()))
        return result
    finally:
        consumer.close()


@dataclass(frozen=True)
class Difference:
    """One way two topics differ. ``field`` is a record field name, or ``missing`` (expected but
    not there), ``extra`` (there but not expected), or ``order`` (two records swapped)."""

    topic: str
    partition: int
    index: int
    field: str
    expected: Any
    actual: Any
    expected_offset: int = -1
    actual_offset: int = -1
    #: For ``missing``/``extra``: how many consecutive records (the first one is shown).
    count: int = 1

    def __str__(self) -> str:
        where = f"{self.topic}-{self.partition}" if self.topic else f"partition {self.partition}"
        offsets = ""
        if self.expected_offset >= 0 or self.actual_offset >= 0:
            offsets = f" (offset {_off(self.expected_offset)} -> {_off(self.actual_offset)})"
        head = f"{where} record #{self.index}{offsets}"
        if self.field == "missing":
            what = "record" if self.count == 1 else f"{self.count} records, the first"
            return f"{head}: missing {what}: {_short(self.expected)}"
        if self.field == "extra":
            what = "record" if self.count == 1 else f"{self.count} records, the first"
            return f"{head}: unexpected extra {what}: {_short(self.actual)}"
        if self.field == "order":
            return f"{head}: reordered, expected {_short(self.expected)} got {_short(self.actual)}"
        return f"{head}: {self.field} differs: expected {_short(self.expected)}, actual {_short(self.actual)}"


def _off(offset: int) -> str:
    return str(offset) if offset >= 0 else "?"


def _short(value: Any, limit: int = 100) -> str:
    if isinstance(value, Record):
        value = f"key={value.key!r} value={value.value!r}"
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compare_topics(
    expected: TopicRecords,
    actual: TopicRecords,
    *,
    topic: str = "",
    fields: Sequence[str] = DEFAULT_FIELDS,
    check_offsets: bool = False,
    max_differences: int = 50,
) -> list[Difference]:
    """Differences between two topics' records, first ones first (at most ``max_differences``).

    Partitions absent on one side count as empty. An empty list means identical."""
    fields = tuple(fields) + (("offset",) if check_offsets and "offset" not in fields else ())
    diffs: list[Difference] = []
    for p in sorted(set(expected) | set(actual)):
        _compare_partition(topic, p, list(expected.get(p, ())), list(actual.get(p, ())),
                           fields, diffs, max_differences)
        if len(diffs) >= max_differences:
            break
    return diffs[:max_differences]


#: How far ahead to look for a record after a mismatch, to recognise a block of missing or extra
#: records (an aborted transaction's worth) as one difference.
_RESYNC_WINDOW = 5_000


def _compare_partition(topic: str, p: int, exp: list[Record], act: list[Record],
                       fields: tuple[str, ...], diffs: list[Difference], limit: int) -> None:
    def same(a: Record, b: Record) -> bool:
        return all(getattr(a, f) == getattr(b, f) for f in fields)

    def find(record: Record, records: list[Record], start: int) -> int:
        for k in range(start, min(len(records), start + _RESYNC_WINDOW)):
            if same(record, records[k]):
                return k
        return -1

    def add(index: int, field: str, e: Any, a: Any, eo: int = -1, ao: int = -1,
            count: int = 1) -> None:
        diffs.append(Difference(topic, p, index, field, e, a, eo, ao, count))

    i = j = 0
    while i < len(exp) and j < len(act) and len(diffs) < limit:
        e, a = exp[i], act[j]
        if same(e, a):
            i, j = i + 1, j + 1
            continue
        if i + 1 < len(exp) and j + 1 < len(act) and same(e, act[j + 1]) and same(exp[i + 1], a):
            add(i, "order", e, a, e.offset, a.offset)
            i, j = i + 2, j + 2
            continue
        # Resync: is e further on in actual (extra records here), or a further on in expected
        # (records missing here)? Take the shorter gap; if neither, the record itself changed.
        extra_to, missing_to = find(e, act, j + 1), find(a, exp, i + 1)
        if extra_to >= 0 and (missing_to < 0 or extra_to - j <= missing_to - i):
            add(i, "extra", None, a, -1, a.offset, count=extra_to - j)
            j = extra_to
        elif missing_to >= 0:
            add(i, "missing", e, None, e.offset, -1, count=missing_to - i)
            i = missing_to
        else:
            for f in fields:
                if getattr(e, f) != getattr(a, f):
                    add(i, f, getattr(e, f), getattr(a, f), e.offset, a.offset)
            i, j = i + 1, j + 1
    if i < len(exp) and len(diffs) < limit:
        add(i, "missing", exp[i], None, exp[i].offset, -1, count=len(exp) - i)
    if j < len(act) and len(diffs) < limit:
        add(i, "extra", None, act[j], -1, act[j].offset, count=len(act) - j)


def format_differences(diffs: Sequence[Difference], expected: TopicRecords,
                       actual: TopicRecords, *, shown: int = 10) -> str:
    """A readable report: per-partition counts, then the first differences."""
    counts = ", ".join(
        f"{p}: {len(expected.get(p, ()))} expected / {len(actual.get(p, ()))} actual"
        for p in sorted(set(expected) | set(actual)))
    lines = [f"topics differ ({len(diffs)}{'+' if len(diffs) >= 50 else ''} differences; "
             f"records per partition {counts}):"]
    lines += [f"  {d}" for d in diffs[:shown]]
    if len(diffs) > shown:
        lines.append(f"  ... and {len(diffs) - shown} more")
    return "\n".join(lines)


def assert_same_records(expected: TopicRecords, actual: TopicRecords, **kwargs: Any) -> None:
    """Raise AssertionError with a readable report unless both topics hold the same records."""
    diffs = compare_topics(expected, actual, **kwargs)
    if diffs:
        raise AssertionError(format_differences(diffs, expected, actual))


def assert_matches_load(result: Any, actual: TopicRecords, *,
                        isolation_level: str = "read_committed", **kwargs: Any) -> None:
    """Assert a read-back topic holds exactly what a ``LoadResult`` says was written: only the
    committed records for ``read_committed``, all data records in offset order otherwise."""
    kwargs.setdefault("topic", result.topic)
    assert_same_records(result.records(isolation_level), actual, **kwargs)


@dataclass
class CopyTally:
    """A mirrored topic against its source, per partition: records (key, value, timestamp)
    missing on the target, repeated on the target, and whether the first copies keep the
    source's order."""

    records: int = 0
    lost: int = 0
    duplicates: int = 0
    order_kept: bool = True
    #: Most copies of any one record in a partition.
    max_copies: int = 0


def tally_copies(source: TopicRecords, target: TopicRecords) -> CopyTally:
    """Compare ``target`` with ``source`` record by record, duplicates removed (first copy)."""
    from collections import Counter

    tally = CopyTally()
    for p, records in source.items():
        want = [(r.key, r.value, r.timestamp_ms) for r in records]
        got = [(r.key, r.value, r.timestamp_ms) for r in target.get(p, [])]
        first = list(dict.fromkeys(got))
        tally.records += len(want)
        tally.duplicates += len(got) - len(first)
        tally.lost += sum((Counter(want) - Counter(first)).values())
        tally.order_kept &= first == want
        tally.max_copies = max(tally.max_copies, max(Counter(got).values(), default=0))
    return tally
