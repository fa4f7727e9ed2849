"""Fetch responses in, Produce requests out: the message half of the codec (pure-Python twin).

Contract (``shallowmirror.codec.contract``): ``decode_fetch_response`` hands out each partition's
record set as a ``memoryview`` slice of the response frame (never a copy);
``encode_produce_request`` returns a list of buffers whose batch pieces are the caller's own
objects (never copied) and refuses two batches for one partition unless KIP-712's opt-in is given,
because stock brokers reject them (``ProduceRequest.validateRecords``). Malformed frames raise
``CorruptDataError`` naming the topic/partition (when known) and the byte position of the field
that could not be read; the native build (``native/_cmessages.pyx``) raises the very same errors.

Out of scope: the records themselves (``records`` module), sockets, and every other API
(kafka-python's protocol classes encode those).

Wire layout (big-endian; from Kafka's FetchResponse/ProduceRequest/ProduceResponse.json)
--------------------------------------------------------------------------------------
Non-flexible: STRING = int16 length + UTF-8 (-1 null); BYTES = int32 length (-1 null);
ARRAY = int32 count (-1 null). Flexible (Fetch v12, Produce v9): COMPACT_STRING/BYTES/ARRAY =
unsigned varint of length + 1 (0 null); every struct, including each array element, ends with
TAGGED_FIELDS = uvarint count, then count x (uvarint tag, uvarint size, size bytes).

Fetch response v4..v12 (frame = bytes after the int32 size prefix)
  correlation_id           int32         response header v0; v12: header v1 (+ TAGGED_FIELDS)
  throttle_time_ms         int32
  error_code               int16         v7+ (else 0)
  session_id               int32         v7+ (else 0)
  responses                ARRAY
    topic                  STRING
    partitions             ARRAY
      partition_index      int32
      error_code           int16
      high_watermark       int64
      last_stable_offset   int64
      log_start_offset     int64         v5+ (else -1)
      aborted_transactions nullable ARRAY of (producer_id int64, first_offset int64)
      preferred_read_replica int32       v11+ (else -1)
      records              nullable BYTES   -> memoryview slice of the frame
      TAGGED_FIELDS        v12: 0 diverging_epoch, 1 current_leader, 2 snapshot_id (skipped)

Produce request v3..v9 (what ``encode_produce_request`` emits)
  size                     int32         bytes after this field
  api_key=0 int16, api_version int16, correlation_id int32,
  client_id                nullable STRING, int16 length even in v9 (request header v1/v2)
  TAGGED_FIELDS            v9 (request header v2)
  transactional_id         nullable STRING
  acks int16, timeout_ms int32
  topic_data               ARRAY
    name                   STRING
    partition_data         ARRAY
      index                int32
      records              BYTES: length = sum of the batch pieces, then the pieces themselves

Produce response v3..v9
  correlation_id           int32         v9: response header v1 (+ TAGGED_FIELDS)
  responses                ARRAY
    name                   STRING
    partition_responses    ARRAY
      index int32, error_code int16, base_offset int64, log_append_time_ms int64
      log_start_offset     int64         v5+ (else -1)
      record_errors        ARRAY of (batch_index int32, batch_index_error_message nullable STRING) v8+
      error_message        nullable STRING   v8+
  throttle_time_ms         int32
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence, Sized
from typing import Any

from shallowmirror.codec.records import rewrite_for_produce
from shallowmirror.errors import CorruptDataError, Where

FETCH_VERSIONS = (4, 12)
PRODUCE_VERSIONS = (3, 9)
FETCH_FIRST_FLEXIBLE = 12
PRODUCE_FIRST_FLEXIBLE = 9
PRODUCE_API_KEY = 0

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I64I64 = struct.Struct(">qq")
_HEAD = struct.Struct(">hhi")        # api_key, api_version, correlation_id
_ACKS_TIMEOUT = struct.Struct(">hi")
_INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------------------------
# Result objects: plain slotted classes; the native build has cdef classes with the same names,
# attributes and equality, so ``twin_result == native_result`` compares values.
# --------------------------------------------------------------------------------------------

class _Struct:
    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        # Equal across implementations: same class name and same field values.
        if type(other).__name__ != type(self).__name__:
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._fields)

    __hash__ = None  # type: ignore[assignment]  # mutable value objects

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"


class FetchPartition(_Struct):
    """One partition of a Fetch response; ``records`` is a view into the frame (or None)."""

    _fields = ("partition", "error_code", "high_watermark", "last_stable_offset",
               "log_start_offset", "aborted_transactions", "preferred_read_replica", "records")
    __slots__ = _fields

    def __init__(self, partition: int, error_code: int, high_watermark: int,
                 last_stable_offset: int, log_start_offset: int,
                 aborted_transactions: list, preferred_read_replica: int,
                 records: memoryview | None):
        self.partition = partition
        self.error_code = error_code
        self.high_watermark = high_watermark
        self.last_stable_offset = last_stable_offset
        self.log_start_offset = log_start_offset
        self.aborted_transactions = aborted_transactions
        self.preferred_read_replica = preferred_read_replica
        self.records = records


class FetchTopic(_Struct):
    """One topic of a Fetch response."""

    _fields = ("topic", "partitions")
    __slots__ = _fields

    def __init__(self, topic: str, partitions: list):
        self.topic = topic
        self.partitions = partitions


class FetchResponse(_Struct):
    """A decoded Fetch response (v4..v12)."""

    _fields = ("correlation_id", "throttle_time_ms", "error_code", "session_id", "topics")
    __slots__ = _fields

    def __init__(self, correlation_id: int, throttle_time_ms: int, error_code: int,
                 session_id: int, topics: list):
        self.correlation_id = correlation_id
        self.throttle_time_ms = throttle_time_ms
        self.error_code = error_code
        self.session_id = session_id
        self.topics = topics


class ProducePartitionResponse(_Struct):
    """One partition of a Produce response: where the target put the batch, or why not."""

    _fields = ("partition", "error_code", "base_offset", "log_append_time_ms",
               "log_start_offset", "record_errors", "error_message")
    __slots__ = _fields

    def __init__(self, partition: int, error_code: int, base_offset: int,
                 log_append_time_ms: int, log_start_offset: int, record_errors: list,
                 error_message: str | None):
        self.partition = partition
        self.error_code = error_code
        self.base_offset = base_offset
        self.log_append_time_ms = log_append_time_ms
        self.log_start_offset = log_start_offset
        self.record_errors = record_errors
        self.error_message = error_message


class ProduceResponse(_Struct):
    """A decoded Produce response (v3..v9); ``topics`` is [(topic, [partition responses])]."""

    _fields = ("correlation_id", "throttle_time_ms", "topics")
    __slots__ = _fields

    def __init__(self, correlation_id: int, throttle_time_ms: int, topics: list):
        self.correlation_id = correlation_id
        self.throttle_time_ms = throttle_time_ms
        self.topics = topics


# --------------------------------------------------------------------------------------------
# Reading. Every error names the position where the offending field (or its length) starts;
# the native reader uses the same messages so the two can be compared error for error.
# --------------------------------------------------------------------------------------------

class _Reader:
    __slots__ = ("buf", "end", "pos", "label", "topic", "partition", "flexible")

    def __init__(self, buf: memoryview, label: str, flexible: bool):
        self.buf = buf
        self.end = len(buf)
        self.pos = 0
        self.label = label
        self.flexible = flexible
        self.topic: str | None = None
        self.partition: int | None = None

    def error(self, reason: str, position: int) -> CorruptDataError:
        return CorruptDataError(f"{self.label}: {reason}",
                                Where(topic=self.topic, partition=self.partition,
                                      position=position))

    def _need(self, n: int, field: str) -> int:
        pos = self.pos
        left = self.end - pos
        if left < n:
            raise self.error(f"truncated {field} (needs {n} bytes, {left} left)", pos)
        self.pos = pos + n
        return pos

    def int16(self, field: str) -> int:
        return _I16.unpack_from(self.buf, self._need(2, field))[0]

    def int32(self, field: str) -> int:
        return _I32.unpack_from(self.buf, self._need(4, field))[0]

    def int64(self, field: str) -> int:
        return _I64.unpack_from(self.buf, self._need(8, field))[0]

    def uvarint(self, field: str) -> int:
        """Unsigned varint that must fit in 32 bits (Kafka's compact lengths and tags)."""
        start = pos = self.pos
        end = self.end
        buf = self.buf
        value = 0
        shift = 0
        while True:
            if pos >= end:
                raise self.error(f"truncated {field} (unsigned varint)", start)
            b = buf[pos]
            pos += 1
            if shift == 28 and b > 0x0F:
                raise self.error(f"{field}: unsigned varint does not fit in 32 bits", start)
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
        self.pos = pos
        return value

    def length(self, field: str, nullable: bool, wide: bool) -> int:
        """A string/bytes/array length: -1 for null. ``wide`` selects int32 over int16 when not
        flexible. Checks nothing about the bytes that follow."""
        start = self.pos
        if self.flexible:
            n = self.uvarint(field) - 1
        elif wide:
            n = self.int32(field)
        else:
            n = self.int16(field)
        if n < -1 or (n == -1 and not nullable):
            raise self.error(f"{field} length {n} is invalid", start)
        return n

    def count(self, field: str, nullable: bool = False) -> int:
        """An array count, checked against the bytes left (every element takes at least one)."""
        start = self.pos
        n = self.length(field, nullable, True)
        left = self.end - self.pos
        if n > left:
            raise self.error(f"{field} count {n} exceeds the {left} bytes left", start)
        return n

    def _span(self, field: str, nullable: bool, wide: bool) -> tuple[int, int]:
        start = self.pos
        n = self.length(field, nullable, wide)
        if n < 0:
            return -1, -1
        pos = self.pos
        left = self.end - pos
        if n > left:
            raise self.error(f"{field} length {n} exceeds the {left} bytes left", start)
        self.pos = pos + n
        return start, pos

    def string(self, field: str, nullable: bool = False) -> str | None:
        start, pos = self._span(field, nullable, False)
        if start < 0:
            return None
        try:
            return str(self.buf[pos:self.pos], "utf-8")
        except UnicodeDecodeError as err:
            raise self.error(f"{field} is not valid UTF-8", start) from err

    def records(self, field: str) -> memoryview | None:
        start, pos = self._span(field, True, True)
        if start < 0:
            return None
        return self.buf[pos:self.pos]

    def tagged_fields(self, field: str) -> None:
        """Skip a TAGGED_FIELDS section (flexible versions only); nothing in them is needed."""
        if not self.flexible:
            return
        start = self.pos
        n = self.uvarint(field)
        left = self.end - self.pos
        if n > left:
            raise self.error(f"{field} count {n} exceeds the {left} bytes left", start)
        for _ in range(n):
            self.uvarint(field)
            start = self.pos
            size = self.uvarint(field)
            left = self.end - self.pos
            if size > left:
                raise self.error(f"{field} length {size} exceeds the {left} bytes left", start)
            self.pos += size

    def finish(self) -> None:
        left = self.end - self.pos
        if left:
            self.topic = self.partition = None
            raise self.error(f"{left} trailing bytes after the response", self.pos)


def _as_view(frame) -> memoryview:
    """A flat unsigned-byte view of ``frame`` without copying it."""
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    if not view.c_contiguous:
        raise ValueError("frame must be a contiguous buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _check_version(api: str, version: int, bounds: tuple[int, int]) -> None:
    if not isinstance(version, int) or not bounds[0] <= version <= bounds[1]:
        raise ValueError(f"{api} version {version!r} is not supported "
                         f"(supported: {bounds[0]}..{bounds[1]})")


def decode_fetch_response(frame, version: int) -> FetchResponse:
    """Decode a Fetch response frame (after the size prefix, from the correlation id), v4..v12."""
    _check_version("fetch response", version, FETCH_VERSIONS)
    r = _Reader(_as_view(frame), f"fetch response v{version}", version >= FETCH_FIRST_FLEXIBLE)
    correlation_id = r.int32("correlation_id")
    r.tagged_fields("header tagged fields")
    throttle_time_ms = r.int32("throttle_time_ms")
    if version >= 7:
        error_code = r.int16("error_code")
        session_id = r.int32("session_id")
    else:
        error_code = session_id = 0
    topics = []
    for _ in range(r.count("responses")):
        r.topic = r.partition = None
        topic = r.string("topic")
        r.topic = topic
        partitions = []
        for _ in range(r.count("partitions")):
            r.partition = None
            index = r.int32("partition_index")
            r.partition = index
            error = r.int16("error_code")
            high_watermark = r.int64("high_watermark")
            last_stable_offset = r.int64("last_stable_offset")
            log_start_offset = r.int64("log_start_offset") if version >= 5 else -1
            aborted = []
            n = r.count("aborted_transactions", nullable=True)
            for _ in range(n):
                pos = r._need(16, "aborted_transaction")
                aborted.append(_I64I64.unpack_from(r.buf, pos))
                r.tagged_fields("aborted_transaction tagged fields")
            replica = r.int32("preferred_read_replica") if version >= 11 else -1
            records = r.records("records")
            r.tagged_fields("partition tagged fields")
            partitions.append(FetchPartition(index, error, high_watermark, last_stable_offset,
                                             log_start_offset, aborted, replica, records))
        r.partition = None
        r.tagged_fields("topic tagged fields")
        topics.append(FetchTopic(topic, partitions))
    r.topic = None
    r.tagged_fields("response tagged fields")
    r.finish()
    return FetchResponse(correlation_id, throttle_time_ms, error_code, session_id, topics)


def receive_buffer(size: int) -> bytearray:
    """A bytearray of ``size`` bytes for one response frame (contract: contents unspecified;
    here zeroed, as Python can only make it)."""
    size = operator.index(size)
    if size < 0:
        raise ValueError(f"receive buffer size must be >= 0, got {size}")
    return bytearray(size)


def decode_produce_response(frame, version: int) -> ProduceResponse:
    """Decode a Produce response frame (after the size prefix), v3..v9."""
    _check_version("produce response", version, PRODUCE_VERSIONS)
    r = _Reader(_as_view(frame), f"produce response v{version}",
                version >= PRODUCE_FIRST_FLEXIBLE)
    correlation_id = r.int32("correlation_id")
    r.tagged_fields("header tagged fields")
    topics = []
    for _ in range(r.count("responses")):
        r.topic = r.partition = None
        topic = r.string("name")
        r.topic = topic
        partitions = []
        for _ in range(r.count("partition_responses")):
            r.partition = None
            index = r.int32("index")
            r.partition = index
            error = r.int16("error_code")
            base_offset = r.int64("base_offset")
            log_append_time_ms = r.int64("log_append_time_ms")
            log_start_offset = r.int64("log_start_offset") if version >= 5 else -1
            record_errors = []
            message = None
            if version >= 8:
                for _ in range(r.count("record_errors")):
                    batch_index = r.int32("batch_index")
                    batch_message = r.string("batch_index_error_message", nullable=True)
                    r.tagged_fields("record_error tagged fields")
                    record_errors.append((batch_index, batch_message))
                message = r.string("error_message", nullable=True)
            r.tagged_fields("partition tagged fields")
            partitions.append(ProducePartitionResponse(index, error, base_offset,
                                                       log_append_time_ms, log_start_offset,
                                                       record_errors, message))
        r.partition = None
        r.tagged_fields("topic tagged fields")
        topics.append((topic, partitions))
    r.topic = None
    throttle_time_ms = r.int32("throttle_time_ms")
    r.tagged_fields("response tagged fields")
    r.finish()
    return ProduceResponse(correlation_id, throttle_time_ms, topics)


def decode_produce_answer(frame, version: int) -> ProduceResponse:
    """``decode_produce_response`` (contract.Codec.decode_produce_answer: the native build reads
    the partitions into C arrays; here the decoded objects are the answer)."""
    return decode_produce_response(frame, version)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

def produce_response_min_bytes(version: int, topics: Sequence[tuple[str, Sized]]) -> int:
    """The smallest Produce response (v3..v9) the request built from ``topics`` (as given to
    ``encode_produce_request``; only each topic's name and number of partitions are read) can
    get, on the wire with its 4-byte size prefix: every partition answered with no error
    message, no record errors, no tagged fields. A real answer is never shorter (errors only
    add text), which is what ``BrokerConnection.coalesce_answers`` relies on."""
    flexible = version >= PRODUCE_FIRST_FLEXIBLE
    per_partition = 4 + 2 + 8 + 8 + (8 if version >= 5 else 0)   # index .. log_start_offset
    if version >= 8:
        per_partition += 2 if flexible else 4 + 2   # record_errors [] and a null error_message
    if flexible:
        per_partition += 1                          # tagged fields
    size = 4 + 4 + (1 if flexible else 0)           # size, correlation id, header tags
    for topic, partitions in topics:
        name = len(topic.encode())
        count = len(partitions)
        if flexible:
            size += _uvarint_len(name + 1) + name + _uvarint_len(count + 1) + 1
        else:
            size += 2 + name + 4
        size += count * per_partition
    size += _uvarint_len(len(topics) + 1) if flexible else 4  # the topics array's length
    return size + 4 + (1 if flexible else 0)                  # throttle_time_ms, tags


def _uvarint_len(value: int) -> int:
    n = 1
    while value > 0x7F:
        value >>= 7
        n += 1
    return n


def uvarint(value: int) -> bytes:
    """An unsigned varint (flexible-version lengths; the base of record-level zigzag varints)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _check_int(name: str, value: int, bits: int) -> int:
    limit = 1 << (bits - 1)
    if not isinstance(value, int) or not -limit <= value < limit:
        raise ValueError(f"{name} {value!r} is not an int{bits}")
    return value


def _string(value: str | None, name: str, compact: bool, nullable: bool) -> bytes:
    if value is None:
        if not nullable:
            raise ValueError(f"{name} must not be None")
        return b"\x00" if compact else b"\xff\xff"
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    data = value.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"{name} is longer than 32767 bytes")
    return uvarint(len(data) + 1) + data if compact else _I16.pack(len(data)) + data


def _array(n: int, compact: bool) -> bytes:
    return uvarint(n + 1) if compact else _I32.pack(n)


def _nbytes(piece) -> int:
    """Byte length of one batch piece; it must be a contiguous bytes-like object."""
    if type(piece) is bytes:
        return len(piece)
    try:
        view = memoryview(piece)
    except TypeError:
        raise TypeError(f"batch pieces must be bytes-like objects, got {type(piece).__name__} "
                        "(pass each batch as a sequence of buffers)") from None
    if not view.c_contiguous:
        raise ValueError("batch pieces must be contiguous buffers")
    return view.nbytes


def encode_produce_request(*, version: int, correlation_id: int, client_id: str | None,
                           transactional_id: str | None, acks: int, timeout_ms: int,
                           topics: Sequence, allow_multiple_batches: bool = False) -> list:
    """A framed Produce request (v3..v9) as a list of buffers for ``socket.sendmsg``.

    ``topics`` is ``[(topic, [(partition, [batch, ...]), ...]), ...]`` where each batch is a
    sequence of buffer pieces; the pieces appear in the output as the very same objects. The
    first buffer starts with the int32 size prefix.
    """
    _check_version("produce request", version, PRODUCE_VERSIONS)
    flexible = version >= PRODUCE_FIRST_FLEXIBLE
    allow_multiple_batches = bool(allow_multiple_batches)   # read here, as the native build
    _check_int("correlation_id", correlation_id, 32)
    _check_int("acks", acks, 16)
    _check_int("timeout_ms", timeout_ms, 32)
    head = bytearray(_HEAD.pack(PRODUCE_API_KEY, version, correlation_id))
    # The request header keeps an int16-length client_id even in flexible versions (header v2).
    head += _string(client_id, "client_id", False, True)
    if flexible:
        head.append(0)
    head += _string(transactional_id, "transactional_id", flexible, True)
    head += _ACKS_TIMEOUT.pack(acks, timeout_ms)
    head += _array(len(topics), flexible)
    out: list = [None]   # the first chunk gets its size prefix once the total is known
    total = 0
    seen: set = set()
    for topic, partitions in topics:
        head += _string(topic, "topic", flexible, False)
        head += _array(len(partitions), flexible)
        for partition, batches in partitions:
            _check_int("partition", partition, 32)
            if (topic, partition) in seen:
                raise ValueError(f"partition {topic}-{partition} is listed twice in one "
                                 "Produce request")
            seen.add((topic, partition))
            n_batches = len(batches)
            if n_batches == 0:
                raise ValueError(f"partition {topic}-{partition} has no batch to produce")
            if n_batches > 1 and not allow_multiple_batches:
                raise ValueError(
                    f"partition {topic}-{partition} has {len(batches)} batches: stock Kafka "
                    "accepts exactly one RecordBatch per partition in Produce v3+ "
                    "(pass allow_multiple_batches=True only for brokers that accept KIP-712)")
            size = 0
            pieces = []
            for batch in batches:
                for piece in batch:
                    size += _nbytes(piece)
                    pieces.append(piece)
            if size > _INT32_MAX:
                raise ValueError(f"partition {topic}-{partition}: {size} bytes of records "
                                 "exceed the int32 size field")
            head += _I32.pack(partition)
            head += uvarint(size + 1) if flexible else _I32.pack(size)
            chunk = bytes(head)
            if out[0] is None:
                out[0] = chunk
            else:
                out.append(chunk)
            total += len(chunk) + size
            out.extend(pieces)
            head = bytearray(b"\x00") if flexible else bytearray()   # partition tagged fields
        if flexible:
            head.append(0)   # topic tagged fields
    if flexible:
        head.append(0)       # request tagged fields
    if head:
        chunk = bytes(head)
        if out[0] is None:
            out[0] = chunk
        else:
            out.append(chunk)
        total += len(chunk)
    if total > _INT32_MAX:
        raise ValueError(f"produce request of {total} bytes exceeds the int32 size prefix")
    out[0] = _I32.pack(total) + out[0]
    return out


def encode_produce_batches(picks: Sequence[tuple[tuple[str, int], Any]], *, version: int,
                           correlation_id: int, client_id: str | None,
                           transactional_id: str | None, acks: int, timeout_ms: int,
                           clear_log_append_time: bool = False) -> tuple[list, int]:
    """(request buffers, the fewest bytes its answer can have) for one request's stamped picks
    (contract.Codec.encode_produce_batches): each header rewritten from the batch's stamp, the
    picks grouped by topic in pick order, then ``encode_produce_request``."""
    _check_version("produce request", version, PRODUCE_VERSIONS)
    _check_int("correlation_id", correlation_id, 32)
    _check_int("acks", acks, 16)
    _check_int("timeout_ms", timeout_ms, 32)
    clear_log_append_time = bool(clear_log_append_time)
    by_topic: dict[str, list] = {}
    for (topic, partition), batch in picks:
        if batch.stamp_generation < 0:
            raise ValueError(f"batch {batch!r} is not stamped (stamp_batches first)")
        pieces = rewrite_for_produce(
            batch.view, producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence, clear_log_append_time=clear_log_append_time)
        found = by_topic.get(topic)
        if found is None:
            by_topic[topic] = [(partition, (pieces,))]
        else:
            found.append((partition, (pieces,)))
    topics = list(by_topic.items())
    buffers = encode_produce_request(
        version=version, correlation_id=correlation_id, client_id=client_id,
        transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms, topics=topics)
    return buffers, produce_response_min_bytes(version, topics)


def join_request(buffers: Sequence) -> bytes:
    """The request as one bytes object (for transports without scatter/gather, and tests)."""
    return b"".join(buffers)
