# cython: language_level=3
"""Fetch responses in, Produce requests out: the message half of the codec (native build).

Same contract, results and error messages as the pure-Python twin
``shallowmirror.codec.messages`` (the wire layout of every field per version is drawn there);
the differential and fuzz tests hold the two to each other, error string for error string.

Safety: the extension is compiled with ``boundscheck=False``, so every read below goes through
``_Reader.need``/``uvarint``, which compare against the end of the frame before touching a byte;
every length read from the wire is checked against the bytes left before it is used, and array
counts too (each element takes at least one byte), so no count can make a loop run past the frame.

Wire layout (summary; see the twin for the table)
  Fetch response v4..v12: correlation_id i32 [tags v12] throttle_time_ms i32
    [error_code i16, session_id i32 v7+] responses[topic, partitions[partition_index i32,
    error_code i16, high_watermark i64, last_stable_offset i64, log_start_offset i64 v5+,
    aborted_transactions?[producer_id i64, first_offset i64], preferred_read_replica i32 v11+,
    records? BYTES]]
  Produce request v3..v9: size i32, api_key i16, api_version i16, correlation_id i32,
    client_id? STRING(i16) [tags v9], transactional_id? STRING, acks i16, timeout_ms i32,
    topic_data[name, partition_data[index i32, records BYTES]]
  Produce response v3..v9: correlation_id i32 [tags v9] responses[name, partition_responses[
    index i32, error_code i16, base_offset i64, log_append_time_ms i64, log_start_offset i64 v5+,
    record_errors[batch_index i32, message? STRING] v8+, error_message? STRING v8+]]
    throttle_time_ms i32
  Flexible versions (Fetch v12, Produce v9) use compact (uvarint length+1) strings, bytes and
  arrays and end every struct with tagged fields.
"""

cimport cython
from cpython.buffer cimport (
    PyBUF_SIMPLE,
    PyBuffer_IsContiguous,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.bytearray cimport (
    PyByteArray_CheckExact,
    PyByteArray_FromStringAndSize,
    PyByteArray_GET_SIZE,
)
from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_CheckExact,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.list cimport PyList_CheckExact, PyList_GET_ITEM
from cpython.long cimport (
    PyLong_AsLongLong,
    PyLong_AsLongLongAndOverflow,
    PyLong_CheckExact,
    PyLong_FromLongLong,
)
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport Py_TYPE, PyObject, PyTypeObject
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.memoryview cimport PyMemoryView_Check, PyMemoryView_GET_BUFFER
from cpython.tuple cimport PyTuple_CheckExact
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

import struct

from shallowmirror.errors import CorruptDataError, Where

FETCH_VERSIONS = (4, 12)
PRODUCE_VERSIONS = (3, 9)
FETCH_FIRST_FLEXIBLE = 12
PRODUCE_FIRST_FLEXIBLE = 9
PRODUCE_API_KEY = 0

cdef int64_t _INT32_MAX = 2147483647
_I32 = struct.Struct(">i")


# --------------------------------------------------------------------------------------------
# Result objects: cdef classes with the twin's names, attributes, equality and repr.
# --------------------------------------------------------------------------------------------

cdef inline object _eq(object self, object other, tuple names):
    if type(other).__name__ != type(self).__name__:
        return NotImplemented
    for name in names:
        if getattr(self, name) != getattr(other, name):
            return False
    return True


cdef inline str _repr(object self, tuple names):
    inner = ", ".join([f"{name}={getattr(self, name)!r}" for name in names])
    return f"{type(self).__name__}({inner})"


cdef tuple _FETCH_PARTITION_FIELDS = (
    "partition", "error_code", "high_watermark", "last_stable_offset", "log_start_offset",
    "aborted_transactions", "preferred_read_replica", "records")
cdef tuple _FETCH_TOPIC_FIELDS = ("topic", "partitions")
cdef tuple _FETCH_RESPONSE_FIELDS = (
    "correlation_id", "throttle_time_ms", "error_code", "session_id", "topics")
cdef tuple _PRODUCE_PARTITION_FIELDS = (
    "partition", "error_code", "base_offset", "log_append_time_ms", "log_start_offset",
    "record_errors", "error_message")
cdef tuple _PRODUCE_RESPONSE_FIELDS = ("correlation_id", "throttle_time_ms", "topics")


@cython.final
cdef class FetchPartition:
    """One partition of a Fetch response; ``records`` is a view into the frame (or None)."""

    cdef public int32_t partition
    cdef public int16_t error_code
    cdef public int64_t high_watermark
    cdef public int64_t last_stable_offset
    cdef public int64_t log_start_offset
    cdef public list aborted_transactions
    cdef public int32_t preferred_read_replica
    cdef public object records

    _fields = _FETCH_PARTITION_FIELDS

    def __init__(self, partition, error_code, high_watermark, last_stable_offset,
                 log_start_offset, aborted_transactions, preferred_read_replica, records):
        self.partition = partition
        self.error_code = error_code
        self.high_watermark = high_watermark
        self.last_stable_offset = last_stable_offset
        self.log_start_offset = log_start_offset
        self.aborted_transactions = aborted_transactions
        self.preferred_read_replica = preferred_read_replica
        self.records = records

    def __eq__(self, other):
        return _eq(self, other, _FETCH_PARTITION_FIELDS)

    def __repr__(self):
        return _repr(self, _FETCH_PARTITION_FIELDS)


@cython.final
cdef class FetchTopic:
    """One topic of a Fetch response."""

    cdef public str topic
    cdef public list partitions

    _fields = _FETCH_TOPIC_FIELDS

    def __init__(self, topic, partitions):
        self.topic = topic
        self.partitions = partitions

    def __eq__(self, other):
        return _eq(self, other, _FETCH_TOPIC_FIELDS)

    def __repr__(self):
        return _repr(self, _FETCH_TOPIC_FIELDS)


@cython.final
cdef class FetchResponse:
    """A decoded Fetch response (v4..v12)."""

    cdef public int32_t correlation_id
    cdef public int32_t throttle_time_ms
    cdef public int16_t error_code
    cdef public int32_t session_id
    cdef public list topics

    _fields = _FETCH_RESPONSE_FIELDS

    def __init__(self, correlation_id, throttle_time_ms, error_code, session_id, topics):
        self.correlation_id = correlation_id
        self.throttle_time_ms = throttle_time_ms
        self.error_code = error_code
        self.session_id = session_id
        self.topics = topics

    def __eq__(self, other):
        return _eq(self, other, _FETCH_RESPONSE_FIELDS)

    def __repr__(self):
        return _repr(self, _FETCH_RESPONSE_FIELDS)


@cython.final
cdef class ProducePartitionResponse:
    """One partition of a Produce response: where the target put the batch, or why not."""

    cdef public int32_t partition
    cdef public int16_t error_code
    cdef public int64_t base_offset
    cdef public int64_t log_append_time_ms
    cdef public int64_t log_start_offset
    cdef public list record_errors
    cdef public object error_message

    _fields = _PRODUCE_PARTITION_FIELDS

    def __init__(self, partition, error_code, base_offset, log_append_time_ms,
                 log_start_offset, record_errors, error_message):
        self.partition = partition
        self.error_code = error_code
        self.base_offset = base_offset
        self.log_append_time_ms = log_append_time_ms
        self.log_start_offset = log_start_offset
        self.record_errors = record_errors
        self.error_message = error_message

    def __eq__(self, other):
        return _eq(self, other, _PRODUCE_PARTITION_FIELDS)

    def __repr__(self):
        return _repr(self, _PRODUCE_PARTITION_FIELDS)


# ---- the loops' view of an answer (native/_fields.pxi) -------------------------------------

include "_fields.pxi"


cdef int _answer_fields(object part, AnswerFields *out) noexcept:
    """``AnswerFields`` of ``part`` if it is a ProducePartitionResponse of this module (1),
    else 0."""
    if type(part) is not ProducePartitionResponse:
        return 0
    cdef ProducePartitionResponse p = <ProducePartitionResponse>part
    out.base_offset = p.base_offset
    out.partition = p.partition
    out.error_code = p.error_code
    return 1


#: ``_answer_fields`` for the engine's native loops (``shallowmirror.engine._cloops``).
ANSWER_FIELDS = PyCapsule_New(<void *>_answer_fields, ANSWER_FIELDS_CAPSULE, NULL)


@cython.final
cdef class ProduceResponse:
    """A decoded Produce response (v3..v9); ``topics`` is [(topic, [partition responses])]."""

    cdef public int32_t correlation_id
    cdef public int32_t throttle_time_ms
    cdef public list topics

    _fields = _PRODUCE_RESPONSE_FIELDS

    def __init__(self, correlation_id, throttle_time_ms, topics):
        self.correlation_id = correlation_id
        self.throttle_time_ms = throttle_time_ms
        self.topics = topics

    def __eq__(self, other):
        return _eq(self, other, _PRODUCE_RESPONSE_FIELDS)

    def __repr__(self):
        return _repr(self, _PRODUCE_RESPONSE_FIELDS)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------

@cython.final
cdef class _Reader:
    """Cursor over a frame. Every accessor checks the bytes left before it reads one."""

    cdef const uint8_t* buf
    cdef Py_ssize_t end
    cdef Py_ssize_t pos
    cdef bint flexible
    cdef str label
    cdef object topic
    cdef object partition
    cdef object view          # the frame as a memoryview: records are slices of it

    cdef int fail(self, str reason, Py_ssize_t position) except -1:
        raise CorruptDataError(f"{self.label}: {reason}",
                               Where(topic=self.topic, partition=self.partition,
                                     position=position))

    cdef inline Py_ssize_t need(self, Py_ssize_t n, str field) except -1:
        cdef Py_ssize_t pos = self.pos
        cdef Py_ssize_t left = self.end - pos
        if left < n:
            self.fail(f"truncated {field} (needs {n} bytes, {left} left)", pos)
        self.pos = pos + n
        return pos

    cdef inline int16_t i16(self, str field) except? -1:
        cdef const uint8_t* p = self.buf + self.need(2, field)
        return <int16_t>(<uint16_t>((<uint16_t>p[0] << 8) | p[1]))

    cdef inline int32_t i32(self, str field) except? -1:
        cdef const uint8_t* p = self.buf + self.need(4, field)
        return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16)
                         | (<uint32_t>p[2] << 8) | <uint32_t>p[3])

    cdef inline int64_t i64(self, str field) except? -1:
        cdef const uint8_t* p = self.buf + self.need(8, field)
        cdef uint64_t v = 0
        cdef int i
        for i in range(8):
            v = (v << 8) | p[i]
        return <int64_t>v

    cdef int64_t uvarint(self, str field) except -1:
        """Unsigned varint that must fit in 32 bits (Kafka's compact lengths and tags)."""
        cdef Py_ssize_t start = self.pos
        cdef Py_ssize_t pos = start
        cdef uint32_t value = 0
        cdef int shift = 0
        cdef uint8_t b
        while True:
            if pos >= self.end:
                self.fail(f"truncated {field} (unsigned varint)", start)
            b = self.buf[pos]
            pos += 1
            if shift == 28 and b > 0x0F:
                self.fail(f"{field}: unsigned varint does not fit in 32 bits", start)
            value |= (<uint32_t>(b & 0x7F)) << shift
            if not (b & 0x80):
                break
            shift += 7
        self.pos = pos
        return value

    cdef int64_t length(self, str field, bint nullable, bint wide) except -2:
        """A string/bytes/array length, -1 for null; wide: int32 (else int16) when not
        flexible."""
        cdef Py_ssize_t start = self.pos
        cdef int64_t n
        if self.flexible:
            n = self.uvarint(field) - 1
        elif wide:
            n = self.i32(field)
        else:
            n = self.i16(field)
        if n < -1 or (n == -1 and not nullable):
            self.fail(f"{field} length {n} is invalid", start)
        return n

    cdef int64_t count(self, str field, bint nullable) except -2:
        """An array count, checked against the bytes left (every element takes one at least)."""
        cdef Py_ssize_t start = self.pos
        cdef int64_t n = self.length(field, nullable, True)
        cdef Py_ssize_t left = self.end - self.pos
        if n > left:
            self.fail(f"{field} count {n} exceeds the {left} bytes left", start)
        return n

    cdef Py_ssize_t span(self, str field, bint nullable, bint wide, Py_ssize_t* start) except -2:
        """Read a length and step over that many bytes; returns where they begin, -1 for null.
        ``start`` receives the position of the length field."""
        start[0] = self.pos
        cdef int64_t n = self.length(field, nullable, wide)
        if n < 0:
            return -1
        cdef Py_ssize_t pos = self.pos
        cdef Py_ssize_t left = self.end - pos
        if n > left:
            self.fail(f"{field} length {n} exceeds the {left} bytes left", start[0])
        self.pos = pos + <Py_ssize_t>n
        return pos

    cdef object string(self, str field, bint nullable):
        cdef Py_ssize_t start
        cdef Py_ssize_t pos = self.span(field, nullable, False, &start)
        if pos < 0:
            return None
        try:
            return PyUnicode_DecodeUTF8(<const char*>(self.buf + pos), self.pos - pos, NULL)
        except UnicodeDecodeError as err:
            self.fail(f"{field} is not valid UTF-8", start)

    cdef object records(self, str field):
        cdef Py_ssize_t start
        cdef Py_ssize_t pos = self.span(field, True, True, &start)
        if pos < 0:
            return None
        return self.view[pos:self.pos]

    cdef int tagged_fields(self, str field) except -1:
        """Skip a TAGGED_FIELDS section (flexible versions only); nothing in them is needed."""
        if not self.flexible:
            return 0
        cdef Py_ssize_t start = self.pos
        cdef int64_t n = self.uvarint(field)
        cdef Py_ssize_t left = self.end - self.pos
        cdef int64_t i, size
        if n > left:
            self.fail(f"{field} count {n} exceeds the {left} bytes left", start)
        for i in range(n):
            self.uvarint(field)
            start = self.pos
            size = self.uvarint(field)
            left = self.end - self.pos
            if size > left:
                self.fail(f"{field} length {size} exceeds the {left} bytes left", start)
            self.pos += <Py_ssize_t>size
        return 0

    cdef int finish(self) except -1:
        cdef Py_ssize_t left = self.end - self.pos
        if left:
            self.topic = None
            self.partition = None
            self.fail(f"{left} trailing bytes after the response", self.pos)
        return 0


cdef object _as_view(object frame):
    """A flat unsigned-byte view of ``frame`` without copying it."""
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    if not view.c_contiguous:
        raise ValueError("frame must be a contiguous buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


cdef int _check_version(str api, object version, tuple bounds) except -1:
    if not isinstance(version, int) or not bounds[0] <= version <= bounds[1]:
        raise ValueError(f"{api} version {version!r} is not supported "
                         f"(supported: {bounds[0]}..{bounds[1]})")
    return 0


cdef _Reader _reader(object view, Py_buffer* pybuf, str label, bint flexible):
    cdef _Reader r = _Reader.__new__(_Reader)
    r.view = view
    r.buf = <const uint8_t*>pybuf.buf
    r.end = pybuf.len
    r.pos = 0
    r.label = label
    r.flexible = flexible
    r.topic = None
    r.partition = None
    return r


def decode_fetch_response(frame, version):
    """Decode a Fetch response frame (after the size prefix, from the correlation id), v4..v12."""
    _check_version("fetch response", version, FETCH_VERSIONS)
    cdef int v = version
    view = _as_view(frame)
    cdef Py_buffer pybuf
    PyObject_GetBuffer(view, &pybuf, PyBUF_SIMPLE)
    try:
        return _decode_fetch(_reader(view, &pybuf, f"fetch response v{v}",
                                     v >= FETCH_FIRST_FLEXIBLE), v)
    finally:
        PyBuffer_Release(&pybuf)


cdef FetchResponse _decode_fetch(_Reader r, int version):
    cdef FetchResponse resp = FetchResponse.__new__(FetchResponse)
    cdef FetchTopic topic
    cdef FetchPartition part
    cdef int64_t n_topics, n_parts, n_aborted, t, p, a
    cdef Py_ssize_t pos
    cdef const uint8_t* q
    cdef uint64_t producer_id, first_offset
    cdef int i
    cdef list topics = []
    cdef list partitions, aborted

    resp.correlation_id = r.i32("correlation_id")
    r.tagged_fields("header tagged fields")
    resp.throttle_time_ms = r.i32("throttle_time_ms")
    if version >= 7:
        resp.error_code = r.i16("error_code")
        resp.session_id = r.i32("session_id")
    else:
        resp.error_code = 0
        resp.session_id = 0
    n_topics = r.count("responses", False)
    for t in range(n_topics):
        r.topic = None
        r.partition = None
        topic = FetchTopic.__new__(FetchTopic)
        topic.topic = r.string("topic", False)
        r.topic = topic.topic
        partitions = []
        n_parts = r.count("partitions", False)
        for p in range(n_parts):
            r.partition = None
            part = FetchPartition.__new__(FetchPartition)
            part.partition = r.i32("partition_index")
            r.partition = part.partition
            part.error_code = r.i16("error_code")
            part.high_watermark = r.i64("high_watermark")
            part.last_stable_offset = r.i64("last_stable_offset")
            part.log_start_offset = r.i64("log_start_offset") if version >= 5 else -1
            aborted = []
            n_aborted = r.count("aborted_transactions", True)
            for a in range(n_aborted):
                q = r.buf + r.need(16, "aborted_transaction")
                producer_id = 0
                first_offset = 0
                for i in range(8):
                    producer_id = (producer_id << 8) | q[i]
                    first_offset = (first_offset << 8) | q[8 + i]
                aborted.append((<int64_t>producer_id, <int64_t>first_offset))
                r.tagged_fields("aborted_transaction tagged fields")
            part.aborted_transactions = aborted
            part.preferred_read_replica = (r.i32("preferred_read_replica")
                                           if version >= 11 else -1)
            part.records = r.records("records")
            r.tagged_fields("partition tagged fields")
            partitions.append(part)
        r.partition = None
        r.tagged_fields("topic tagged fields")
        topic.partitions = partitions
        topics.append(topic)
    r.topic = None
    r.tagged_fields("response tagged fields")
    r.finish()
    resp.topics = topics
    return resp


def receive_buffer(Py_ssize_t size):
    """Native ``receive_buffer``: the bytearray is allocated, not zeroed. A Fetch response of
    several megabytes is received over all of it before it is read, so the twin's memset is
    pure cost (a few percent of a mirror's CPU: the memory is touched once more per frame)."""
    if size < 0:
        raise ValueError(f"receive buffer size must be >= 0, got {size}")
    return PyByteArray_FromStringAndSize(NULL, size)


def decode_produce_response(frame, version):
    """Decode a Produce response frame (after the size prefix), v3..v9."""
    return (<ProduceAnswer>decode_produce_answer(frame, version)).response()


def decode_produce_answer(frame, version):
    """A Produce response frame (v3..v9) read into C arrays (``ProduceAnswer``): checked as
    ``decode_produce_response`` checks it, same errors; its partitions become objects only
    when ``topics`` is read."""
    _check_version("produce response", version, PRODUCE_VERSIONS)
    cdef int v = version
    view = _as_view(frame)
    cdef Py_buffer pybuf
    PyObject_GetBuffer(view, &pybuf, PyBUF_SIMPLE)
    try:
        return _read_produce(_reader(view, &pybuf, f"produce response v{v}",
                                     v >= PRODUCE_FIRST_FLEXIBLE), v)
    finally:
        PyBuffer_Release(&pybuf)


cdef struct _AnswerRow:
    Py_ssize_t topic                  # index into the answer's topic names
    int32_t partition
    int16_t error_code
    int64_t base_offset
    int64_t log_append_time_ms
    int64_t log_start_offset


# Not tracked by the cyclic collector: it holds topic names and error texts only.
@cython.no_gc
@cython.final
@cython.auto_pickle(False)
cdef class ProduceAnswer:
    """A Produce response read into C arrays. The engine's settle loop reads each partition's
    fields from them (``ANSWER_PARTS``), without an object per partition and its fields' ints;
    ``topics`` (and ``response()``) make the objects ``decode_produce_response`` returns, once,
    for what the loop leaves to Python (errors, a large answer)."""

    cdef readonly int32_t correlation_id
    cdef readonly int32_t throttle_time_ms
    cdef list _names
    cdef _AnswerRow *_rows
    cdef Py_ssize_t _count
    cdef Py_ssize_t _room
    cdef dict _extras                 # row -> (record_errors, error_message), when either is set
    cdef ProduceResponse _response

    def __dealloc__(self):
        PyMem_Free(self._rows)

    cdef _AnswerRow *_next_row(self) except NULL:
        cdef Py_ssize_t room
        cdef _AnswerRow *grown
        if self._count == self._room:
            room = 8 if self._room == 0 else 2 * self._room
            grown = <_AnswerRow *>PyMem_Realloc(self._rows, room * sizeof(_AnswerRow))
            if grown == NULL:
                raise MemoryError()
            self._rows = grown
            self._room = room
        self._count += 1
        return &self._rows[self._count - 1]

    cpdef ProduceResponse response(self):
        """The answer as ``decode_produce_response`` returns it (made once)."""
        cdef Py_ssize_t i
        cdef _AnswerRow *row
        cdef list partitions = [[] for _ in self._names]
        cdef object extra
        if self._response is not None:
            return self._response
        for i in range(self._count):
            row = &self._rows[i]
            extra = None if self._extras is None else self._extras.get(i)
            part = ProducePartitionResponse.__new__(ProducePartitionResponse)
            part.partition = row.partition
            part.error_code = row.error_code
            part.base_offset = row.base_offset
            part.log_append_time_ms = row.log_append_time_ms
            part.log_start_offset = row.log_start_offset
            part.record_errors = [] if extra is None else (<tuple>extra)[0]
            part.error_message = None if extra is None else (<tuple>extra)[1]
            (<list>partitions[row.topic]).append(part)
        self._response = ProduceResponse(self.correlation_id, self.throttle_time_ms,
                                         list(zip(self._names, partitions)))
        return self._response

    @property
    def topics(self):
        return self.response().topics

    def __repr__(self):
        return (f"ProduceAnswer(correlation_id={self.correlation_id}, {self._count} "
                f"partitions)")


cdef ProduceAnswer _read_produce(_Reader r, int version):
    cdef ProduceAnswer answer = ProduceAnswer.__new__(ProduceAnswer)
    cdef _AnswerRow *row
    cdef int64_t n_topics, n_parts, n_errors, t, p, e
    cdef int32_t batch_index
    cdef list record_errors
    answer._names = []
    answer.correlation_id = r.i32("correlation_id")
    r.tagged_fields("header tagged fields")
    n_topics = r.count("responses", False)
    for t in range(n_topics):
        r.topic = None
        r.partition = None
        name = r.string("name", False)
        r.topic = name
        answer._names.append(name)
        n_parts = r.count("partition_responses", False)
        for p in range(n_parts):
            r.partition = None
            row = answer._next_row()
            row.topic = t
            row.partition = r.i32("index")
            r.partition = row.partition
            row.error_code = r.i16("error_code")
            row.base_offset = r.i64("base_offset")
            row.log_append_time_ms = r.i64("log_append_time_ms")
            row.log_start_offset = r.i64("log_start_offset") if version >= 5 else -1
            if version >= 8:
                record_errors = None
                n_errors = r.count("record_errors", False)
                for e in range(n_errors):
                    batch_index = r.i32("batch_index")
                    message = r.string("batch_index_error_message", True)
                    r.tagged_fields("record_error tagged fields")
                    if record_errors is None:
                        record_errors = []
                    record_errors.append((batch_index, message))
                error_message = r.string("error_message", True)
                if record_errors is not None or error_message is not None:
                    if answer._extras is None:
                        answer._extras = {}
                    answer._extras[answer._count - 1] = (
                        [] if record_errors is None else record_errors, error_message)
            r.tagged_fields("partition tagged fields")
        r.partition = None
        r.tagged_fields("topic tagged fields")
    r.topic = None
    answer.throttle_time_ms = r.i32("throttle_time_ms")
    r.tagged_fields("response tagged fields")
    r.finish()
    return answer


cdef Py_ssize_t _answer_parts(object answer, AnswerPart *out, Py_ssize_t room) noexcept:
    if type(answer) is not ProduceAnswer:
        return -1
    cdef ProduceAnswer a = <ProduceAnswer>answer
    cdef Py_ssize_t i
    cdef _AnswerRow *row
    if a._count > room:
        return -2
    for i in range(a._count):
        row = &a._rows[i]
        out[i].topic = <void *>PyList_GET_ITEM(a._names, row.topic)
        out[i].fields.partition = row.partition
        out[i].fields.error_code = row.error_code
        out[i].fields.base_offset = row.base_offset
    return a._count


#: ``_answer_parts`` for the engine's native loops (``shallowmirror.engine._cloops``).
ANSWER_PARTS = PyCapsule_New(<void *>_answer_parts, ANSWER_PARTS_CAPSULE, NULL)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

@cython.final
cdef class _Writer:
    """A growable C buffer for the small header chunks between batch pieces."""

    cdef char* data
    cdef Py_ssize_t size
    cdef Py_ssize_t cap

    def __cinit__(self):
        self.cap = 256
        self.size = 0
        self.data = <char*>malloc(self.cap)
        if self.data == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.data)

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t want = self.size + n
        cdef Py_ssize_t cap = self.cap
        cdef char* grown
        if want <= cap:
            return 0
        while cap < want:
            cap *= 2
        grown = <char*>realloc(self.data, cap)
        if grown == NULL:
            raise MemoryError()
        self.data = grown
        self.cap = cap
        return 0

    cdef inline int byte(self, uint8_t b) except -1:
        self.reserve(1)
        self.data[self.size] = <char>b
        self.size += 1
        return 0

    cdef int i16(self, int16_t v) except -1:
        self.reserve(2)
        cdef uint16_t u = <uint16_t>v
        self.data[self.size] = <char>(u >> 8)
        self.data[self.size + 1] = <char>(u & 0xFF)
        self.size += 2
        return 0

    cdef int i32(self, int32_t v) except -1:
        self.reserve(4)
        cdef uint32_t u = <uint32_t>v
        cdef int i
        for i in range(4):
            self.data[self.size + i] = <char>((u >> (24 - 8 * i)) & 0xFF)
        self.size += 4
        return 0

    cdef int uvarint(self, uint64_t v) except -1:
        self.reserve(10)
        while v > 0x7F:
            self.data[self.size] = <char>((v & 0x7F) | 0x80)
            self.size += 1
            v >>= 7
        self.data[self.size] = <char>v
        self.size += 1
        return 0

    cdef int raw(self, const char* p, Py_ssize_t n) except -1:
        self.reserve(n)
        memcpy(self.data + self.size, p, n)
        self.size += n
        return 0

    cdef int string(self, object value, str name, bint compact, bint nullable) except -1:
        cdef bytes data
        if value is None:
            if not nullable:
                raise ValueError(f"{name} must not be None")
            if compact:
                self.byte(0)
            else:
                self.i16(-1)
            return 0
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        data = (<str>value).encode("utf-8")
        if len(data) > 0x7FFF:
            raise ValueError(f"{name} is longer than 32767 bytes")
        if compact:
            self.uvarint(len(data) + 1)
        else:
            self.i16(<int16_t>len(data))
        self.raw(data, len(data))
        return 0

    cdef int array(self, Py_ssize_t n, bint compact) except -1:
        if compact:
            self.uvarint(n + 1)
        else:
            self.i32(<int32_t>n)
        return 0

    cdef bytes take(self):
        cdef bytes chunk = PyBytes_FromStringAndSize(self.data, self.size)
        self.size = 0
        return chunk


cdef object _check_int(str name, object value, int bits):
    cdef int overflow = 0
    cdef long long v
    cdef long long limit = (<long long>1) << (bits - 1)
    if PyLong_CheckExact(value):        # the usual case, compared in C
        v = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow and -limit <= v < limit:
            return value
    elif isinstance(value, int) and -limit <= value < limit:
        return value
    raise ValueError(f"{name} {value!r} is not an int{bits}")


cdef Py_ssize_t _nbytes(object piece) except -1:
    """Byte length of one batch piece; it must be a contiguous bytes-like object."""
    cdef Py_buffer b
    cdef Py_ssize_t n
    if PyBytes_CheckExact(piece):
        return PyBytes_GET_SIZE(piece)
    if PyByteArray_CheckExact(piece):
        return PyByteArray_GET_SIZE(piece)
    if PyMemoryView_Check(piece) and PyBuffer_IsContiguous(PyMemoryView_GET_BUFFER(piece), b'C'):
        return PyMemoryView_GET_BUFFER(piece).len
    try:
        PyObject_GetBuffer(piece, &b, PyBUF_SIMPLE)
    except TypeError:
        raise TypeError(f"batch pieces must be bytes-like objects, got {type(piece).__name__} "
                        "(pass each batch as a sequence of buffers)") from None
    except BufferError:
        raise ValueError("batch pieces must be contiguous buffers") from None
    n = b.len
    PyBuffer_Release(&b)
    return n


cdef int _produce_head(_Writer w, object version, object correlation_id, object client_id,
                       object transactional_id, object acks, object timeout_ms,
                       Py_ssize_t topics, bint flexible) except -1:
    """A Produce request's header and fields up to its topics array's length (arguments
    checked by the caller)."""
    w.i16(PRODUCE_API_KEY)
    w.i16(<int16_t>version)
    w.i32(<int32_t>correlation_id)
    # The request header keeps an int16-length client_id even in flexible versions (header v2).
    w.string(client_id, "client_id", False, True)
    if flexible:
        w.byte(0)
    w.string(transactional_id, "transactional_id", flexible, True)
    w.i16(<int16_t>acks)
    w.i32(<int32_t>timeout_ms)
    w.array(topics, flexible)
    return 0


def encode_produce_request(*, version, correlation_id, client_id, transactional_id, acks,
                           timeout_ms, topics, allow_multiple_batches=False):
    """A framed Produce request (v3..v9) as a list of buffers for ``socket.sendmsg``.

    ``topics`` is ``[(topic, [(partition, [batch, ...]), ...]), ...]`` where each batch is a
    sequence of buffer pieces; the pieces appear in the output as the very same objects. The
    first buffer starts with the int32 size prefix.
    """
    _check_version("produce request", version, PRODUCE_VERSIONS)
    cdef bint flexible = version >= PRODUCE_FIRST_FLEXIBLE
    cdef bint allow_many = bool(allow_multiple_batches)
    _check_int("correlation_id", correlation_id, 32)
    _check_int("acks", acks, 16)
    _check_int("timeout_ms", timeout_ms, 32)
    cdef _Writer w = _Writer()
    cdef list out = [None]     # the first chunk gets its size prefix once the total is known
    cdef dict seen = {}        # topic -> its partitions so far (a topic may come twice)
    cdef set seen_partitions
    cdef int64_t total = 0
    cdef int64_t size
    cdef Py_ssize_t n_batches
    cdef bytes chunk
    _produce_head(w, version, correlation_id, client_id, transactional_id, acks, timeout_ms,
                  len(topics), flexible)
    for topic, partitions in topics:
        w.string(topic, "topic", flexible, False)
        w.array(len(partitions), flexible)
        seen_partitions = seen.get(topic)
        if seen_partitions is None:
            seen_partitions = seen[topic] = set()
        for partition, batches in partitions:
            _check_int("partition", partition, 32)
            if partition in seen_partitions:
                raise ValueError(f"partition {topic}-{partition} is listed twice in one "
                                 "Produce request")
            seen_partitions.add(partition)
            n_batches = len(batches)
            if n_batches == 0:
                raise ValueError(f"partition {topic}-{partition} has no batch to produce")
            if n_batches > 1 and not allow_many:
                raise ValueError(
                    f"partition {topic}-{partition} has {n_batches} batches: stock Kafka "
                    "accepts exactly one RecordBatch per partition in Produce v3+ "
                    "(pass allow_multiple_batches=True only for brokers that accept KIP-712)")
            for batch in batches:
                if not (PyList_CheckExact(batch) or PyTuple_CheckExact(batch)):
                    # A batch given as another iterable is read twice below: read it once here.
                    batches = [b if PyList_CheckExact(b) or PyTuple_CheckExact(b) else tuple(b)
                               for b in batches]
                    break
            size = 0
            for batch in batches:
                for piece in batch:
                    size += _nbytes(piece)
            if size > _INT32_MAX:
                raise ValueError(f"partition {topic}-{partition}: {size} bytes of records "
                                 "exceed the int32 size field")
            w.i32(<int32_t>partition)
            if flexible:
                w.uvarint(<uint64_t>size + 1)
            else:
                w.i32(<int32_t>size)
            chunk = w.take()
            if out[0] is None:
                out[0] = chunk
            else:
                out.append(chunk)
            total += PyBytes_GET_SIZE(chunk) + size
            for batch in batches:
                out.extend(batch)
            if flexible:
                w.byte(0)      # partition tagged fields
        if flexible:
            w.byte(0)          # topic tagged fields
    if flexible:
        w.byte(0)              # request tagged fields
    if w.size:
        chunk = w.take()
        if out[0] is None:
            out[0] = chunk
        else:
            out.append(chunk)
        total += PyBytes_GET_SIZE(chunk)
    if total > _INT32_MAX:
        raise ValueError(f"produce request of {total} bytes exceeds the int32 size prefix")
    out[0] = _I32.pack(total) + out[0]
    return out


def join_request(buffers):
    """The request as one bytes object (for transports without scatter/gather, and tests)."""
    return b"".join(buffers)


cdef inline int64_t _uvarint_len(uint64_t value) noexcept:
    cdef int64_t n = 1
    while value > 0x7F:
        value >>= 7
        n += 1
    return n


def produce_response_min_bytes(int version, topics):
    """The smallest Produce response (v3..v9) the request built from ``topics`` can get, on the
    wire with its size prefix; see the twin. Computed here because the engine asks once per
    request (a connection that wakes once per several answers needs it for SO_RCVLOWAT)."""
    cdef bint flexible = version >= PRODUCE_FIRST_FLEXIBLE
    cdef int64_t per_partition = 4 + 2 + 8 + 8 + (8 if version >= 5 else 0)
    cdef int64_t size, name, count
    cdef Py_ssize_t utf8_len
    if version >= 8:
        per_partition += 2 if flexible else 4 + 2   # record_errors [] and a null error_message
    if flexible:
        per_partition += 1                          # tagged fields
    size = 4 + 4 + (1 if flexible else 0)           # size, correlation id, header tags
    for entry in topics:
        topic, partitions = entry
        PyUnicode_AsUTF8AndSize(topic, &utf8_len)    # no copy: a str keeps its UTF-8 form
        name = utf8_len
        count = len(partitions)
        if flexible:
            size += _uvarint_len(name + 1) + name + _uvarint_len(count + 1) + 1
        else:
            size += 2 + name + 4
        size += count * per_partition
    size += _uvarint_len(len(topics) + 1) if flexible else 4  # the topics array's length
    return size + 4 + (1 if flexible else 0)                  # throttle_time_ms, tags


# ---- a request written from its stamped batches ----------------------------------------------
# The engine sends one Produce request per ~8 small batches. Built by ``encode_produce_request``
# a request is a list of ~3 Python objects per batch (its stamped header bytes, a memoryview of
# the rest, the framing chunk), each made, referenced and freed once per send; here every byte
# that is not a batch body (framing and the stamped headers) goes into one bytes object and the
# bodies stay pointers into the fetched frames (native/_csend.pyx writes them with one writev).

include "_slots.pxi"

cdef enum:
    P_STAMP_GENERATION, P_VIEW, P_PRODUCER_ID, P_PRODUCER_EPOCH, P_BASE_SEQUENCE
cdef _Layout _PICKED = _Layout(("stamp_generation", "view", "producer_id", "producer_epoch",
                                "base_sequence"), False)

cdef stamp_into_fn _stamp_into = NULL

cdef enum:
    HEADER_BYTES = 61             # a v2 batch's header, up to its records


cdef int _load_stamp() except -1:
    global _stamp_into
    if _stamp_into == NULL:
        from shallowmirror.codec import _crecords
        _stamp_into = <stamp_into_fn>PyCapsule_GetPointer(_crecords.STAMP_INTO,
                                                          STAMP_INTO_CAPSULE)
    return 0


# Not tracked by the cyclic collector: it refers to the batch views only (which refer to their
# fetched bytes), never to anything that could refer back to a request.
@cython.no_gc
@cython.final
@cython.auto_pickle(False)
cdef class ProduceRequest:
    """A framed Produce request as buffer pieces: framing and stamped headers in one bytes
    object, batch bodies as pointers into their views' bytes (held here while it lives).
    A sequence of buffers for anything that wants them; ``native/_csend.pyx`` reads the
    pieces' pointers instead (``REQUEST_PIECES``)."""

    cdef bytes _small
    cdef list _views             # the batches' views, in piece order: their bodies' owners
    cdef Piece *_pieces
    cdef Py_ssize_t _count
    cdef readonly Py_ssize_t nbytes

    def __dealloc__(self):
        PyMem_Free(self._pieces)

    def __len__(self):
        return self._count

    def __getitem__(self, Py_ssize_t i):
        cdef Py_ssize_t start
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError("ProduceRequest piece index out of range")
        if i % 2 == 0:                 # framing (and the next batch's header)
            start = self._pieces[i].base - PyBytes_AS_STRING(self._small)
            return memoryview(self._small)[start:start + self._pieces[i].size]
        return self._views[i // 2].buffer[HEADER_BYTES:]

    def join(self):
        """The whole request as one bytes object."""
        cdef bytes out = PyBytes_FromStringAndSize(NULL, self.nbytes)
        cdef char *p = PyBytes_AS_STRING(out)
        cdef Py_ssize_t i
        for i in range(self._count):
            memcpy(p, self._pieces[i].base, self._pieces[i].size)
            p += self._pieces[i].size
        return out

    def tail(self, Py_ssize_t offset):
        """The request's bytes from ``offset`` on (what a partial write left)."""
        if not 0 <= offset <= self.nbytes:
            raise ValueError(f"offset {offset} is outside the request's {self.nbytes} bytes")
        return self.join()[offset:]

    def __repr__(self):
        return (f"ProduceRequest({len(self._views)} batches, {self._count} pieces, "
                f"{self.nbytes} bytes)")


cdef Py_ssize_t _request_pieces(object request, Py_ssize_t first, Piece *out,
                                Py_ssize_t room) noexcept:
    if type(request) is not ProduceRequest:
        return -1
    cdef ProduceRequest r = <ProduceRequest>request
    cdef Py_ssize_t n = r._count - first
    if n > room:
        n = room
    if n <= 0:
        return 0
    memcpy(out, r._pieces + first, n * sizeof(Piece))
    return n


#: ``_request_pieces`` for the connection's writer (``shallowmirror.net._csend``).
REQUEST_PIECES = PyCapsule_New(<void *>_request_pieces, REQUEST_PIECES_CAPSULE, NULL)


def encode_produce_batches(picks, *, version, correlation_id, client_id, transactional_id,
                           acks, timeout_ms, bint clear_log_append_time=False):
    """(request, the fewest bytes its answer can have) for one request's stamped picks; same
    request bytes, checks and errors as the twin (``encode_produce_request`` of the picks
    grouped by topic, each header rewritten from the batch's stamp)."""
    _check_version("produce request", version, PRODUCE_VERSIONS)
    _check_int("correlation_id", correlation_id, 32)
    _check_int("acks", acks, 16)
    _check_int("timeout_ms", timeout_ms, 32)
    _load_stamp()
    cdef bint flexible = version >= PRODUCE_FIRST_FLEXIBLE
    cdef list items = picks if type(picks) is list else list(picks)
    cdef Py_ssize_t n = len(items), i, j, k, at, end, piece, group
    cdef ProduceRequest req = ProduceRequest.__new__(ProduceRequest)
    req._views = []
    req._pieces = <Piece *>PyMem_Malloc((2 * n + 1) * sizeof(Piece))
    # Per batch, in pick order: its stamped header (copied into the framing below), its body,
    # and where its framing ends.
    cdef unsigned char *headers = <unsigned char *>PyMem_Malloc(n * HEADER_BYTES + 1)
    cdef Piece *bodies = <Piece *>PyMem_Malloc((n + 1) * sizeof(Piece))
    cdef Py_ssize_t *order = <Py_ssize_t *>PyMem_Malloc((n + 1) * sizeof(Py_ssize_t))
    cdef Py_ssize_t *ends = <Py_ssize_t *>PyMem_Malloc((n + 1) * sizeof(Py_ssize_t))
    cdef int32_t *numbers = <int32_t *>PyMem_Malloc((n + 1) * sizeof(int32_t))
    cdef const unsigned char *body
    cdef Py_ssize_t body_size
    cdef dict by_topic = {}          # topic -> its picks' indexes, topics in first-pick order
    cdef list partitions = [None] * n
    cdef list views = [None] * n
    cdef list indexes
    cdef set seen
    cdef bint fast
    cdef _Writer w
    cdef int64_t total, batch_bytes = 0
    cdef const char *small
    try:
        if (req._pieces == NULL or headers == NULL or bodies == NULL or order == NULL
                or ends == NULL or numbers == NULL):
            raise MemoryError()
        for i in range(n):
            key, batch = items[i]
            topic, partition = key
            fast = _check(_PICKED, batch)
            if _read(_PICKED, batch, fast, P_STAMP_GENERATION) < 0:
                raise ValueError(f"batch {batch!r} is not stamped (stamp_batches first)")
            view = _read(_PICKED, batch, fast, P_VIEW)
            _stamp_into(view, _read(_PICKED, batch, fast, P_PRODUCER_ID),
                        _read(_PICKED, batch, fast, P_PRODUCER_EPOCH),
                        _read(_PICKED, batch, fast, P_BASE_SEQUENCE), clear_log_append_time,
                        headers + i * HEADER_BYTES, &body, &body_size)
            bodies[i].base = <const char *>body
            bodies[i].size = body_size
            batch_bytes += body_size
            views[i] = view
            partitions[i] = partition
            found = by_topic.get(topic)
            if found is None:
                by_topic[topic] = [i]
            else:
                (<list>found).append(i)
        w = _Writer()
        w.i32(0)                     # the size prefix, once the total is known
        _produce_head(w, version, correlation_id, client_id, transactional_id, acks,
                      timeout_ms, len(by_topic), flexible)
        j = 0
        for topic, found in by_topic.items():
            indexes = <list>found
            w.string(topic, "topic", flexible, False)
            w.array(len(indexes), flexible)
            seen = set() if len(indexes) > 16 else None
            group = j
            for k in indexes:
                partition = partitions[k]
                _check_int("partition", partition, 32)
                numbers[j] = <int32_t>partition
                if seen is not None:
                    if partition in seen:
                        _listed_twice(topic, partition)
                    seen.add(partition)
                else:
                    for at in range(group, j):
                        if numbers[at] == numbers[j]:
                            _listed_twice(topic, partition)
                body_size = bodies[k].size + HEADER_BYTES
                w.i32(numbers[j])
                if flexible:
                    w.uvarint(<uint64_t>body_size + 1)
                else:
                    w.i32(<int32_t>body_size)
                w.raw(<const char *>headers + k * HEADER_BYTES, HEADER_BYTES)
                order[j] = k
                ends[j] = w.size
                j += 1
                if flexible:
                    w.byte(0)        # partition tagged fields
            if flexible:
                w.byte(0)            # topic tagged fields
        if flexible:
            w.byte(0)                # request tagged fields
        total = w.size - 4 + batch_bytes
        if total > _INT32_MAX:
            raise ValueError(f"produce request of {total} bytes exceeds the int32 size prefix")
        w.data[0] = <char>((total >> 24) & 0xFF)
        w.data[1] = <char>((total >> 16) & 0xFF)
        w.data[2] = <char>((total >> 8) & 0xFF)
        w.data[3] = <char>(total & 0xFF)
        req._small = w.take()
        req.nbytes = <Py_ssize_t>(total + 4)
        # In request order: framing up to a batch's body, the body, ..., the last framing.
        small = PyBytes_AS_STRING(req._small)
        at = 0
        piece = 0
        for j in range(n):
            k = order[j]
            end = ends[j]
            req._pieces[piece].base = small + at
            req._pieces[piece].size = end - at
            req._pieces[piece + 1] = bodies[k]
            req._views.append(views[k])
            piece += 2
            at = end
        req._pieces[piece].base = small + at
        req._pieces[piece].size = PyBytes_GET_SIZE(req._small) - at
        piece += 1
        if req._pieces[piece - 1].size == 0 and piece > 1:
            piece -= 1               # nothing after the last body (not flexible)
        req._count = piece
    finally:
        PyMem_Free(headers)
        PyMem_Free(bodies)
        PyMem_Free(order)
        PyMem_Free(ends)
        PyMem_Free(numbers)
    return req, produce_response_min_bytes(<int>version, by_topic.items())


cdef int _listed_twice(object topic, object partition) except -1:
    raise ValueError(f"partition {topic}-{partition} is listed twice in one Produce request")
