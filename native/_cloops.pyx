# cython: language_level=3
"""The engine's per-batch loops, native build of ``shallowmirror.engine.loops``.

Same contract and same results as the twin on the same objects (see its docstring; the
differential tests run both). The objects stay the engine's own Python classes, so nothing
changes for the Python code around them (Python 3.11 reads their ``__slots__`` with specialised
instructions, faster than any extension type's getters). What makes this build faster is how it
reaches their fields: a generic attribute access from C costs ~140 instructions (type lookup,
descriptor call) and a write ~200, and these loops make ~40 of them per forwarded batch. So each
class's slot offsets are read once from its member descriptors (``PyMemberDef.offset``, public
C API) and fields are then read and written at those offsets, a few instructions each, after an
exact type check per object (``native/_slots.pxi``; another class, even a subclass, is looked
up and cached the same way; a class without those slots is a TypeError). The usual
acknowledgement also applies the offsets entry inline: the usual cases of ``PartitionOffsets.ack`` and ``OffsetMap.add_row``
(the oldest entry acknowledged, a batch extending the map's last row) and of
``FrameLease.drop`` (another holder left), calling the methods for anything else.
"""

cimport cython
from cpython.dict cimport PyDict_GetItemWithError
from cpython.long cimport PyLong_AsLongLong, PyLong_FromLongLong
from cpython.object cimport Py_TYPE, PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.pycapsule cimport PyCapsule_GetPointer
from cpython.tuple cimport PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int16_t, int32_t, int64_t

import asyncio
from time import monotonic

from shallowmirror.codec.layout import COMPRESSION_MASK as _COMPRESSION_MASK
from shallowmirror.codec.layout import TRANSACTIONAL_MASK as _TRANSACTIONAL_MASK
from shallowmirror.engine.hooks import RunPoint as _RUN_POINT
from shallowmirror.engine.loops import DUPLICATE_SEQUENCE_NUMBER as _DUPLICATE_SEQUENCE_NUMBER
from shallowmirror.engine.loops import answer_by_partition as _answer_by_partition
from shallowmirror.engine.packing import PARTITION_OVERHEAD_BYTES, REQUEST_OVERHEAD_BYTES

cdef extern from "Python.h":
    object PyType_GenericAlloc(PyTypeObject *type, Py_ssize_t nitems)

cdef int DUPLICATE_SEQUENCE_NUMBER = _DUPLICATE_SEQUENCE_NUMBER
cdef int TRANSACTIONAL_MASK = _TRANSACTIONAL_MASK
cdef int COMPRESSION_MASK = _COMPRESSION_MASK
cdef int64_t _PARTITION_OVERHEAD = PARTITION_OVERHEAD_BYTES
cdef int64_t _REQUEST_OVERHEAD = REQUEST_OVERHEAD_BYTES


cdef inline int64_t topic_overhead_bytes(str topic) except -1:
    """``packing.topic_overhead_bytes`` without a Python call: name length (its UTF-8 bytes,
    which a str keeps once asked) and partition array count."""
    cdef Py_ssize_t size
    PyUnicode_AsUTF8AndSize(topic, &size)
    return 2 + size + 4


# ---- slot access (native/_slots.pxi) ------------------------------------------------------

include "_slots.pxi"


# ---- the codec's fields (native/_fields.pxi) ----------------------------------------------

include "_fields.pxi"

cdef view_fields_fn _view_fields = NULL
cdef answer_fields_fn _answer_fields = NULL
cdef answer_parts_fn _answer_parts = NULL
try:            # built together with this module; without them the fields are read by name
    from shallowmirror.codec import _cmessages as _native_messages
    from shallowmirror.codec import _crecords as _native_records
    _view_fields = <view_fields_fn>PyCapsule_GetPointer(_native_records.VIEW_FIELDS,
                                                        VIEW_FIELDS_CAPSULE)
    _answer_fields = <answer_fields_fn>PyCapsule_GetPointer(_native_messages.ANSWER_FIELDS,
                                                            ANSWER_FIELDS_CAPSULE)
    _answer_parts = <answer_parts_fn>PyCapsule_GetPointer(_native_messages.ANSWER_PARTS,
                                                          ANSWER_PARTS_CAPSULE)
except ImportError:
    pass


# FetchedBatch fields
cdef enum:
    B_ABANDONED, B_SIZE, B_ATTEMPTS, B_HEADER, B_REST, B_STAMP_GENERATION, B_PRODUCER_ID,
    B_PRODUCER_EPOCH, B_TOPIC, B_PARTITION, B_ACKED, B_START, B_DONE, B_FUTURE, B_CALLBACKS,
    B_LEASE, B_VIEW, B_RECORD_COUNT, B_TARGET_BASE, B_IS_GAP, B_SOURCE_BASE, B_END,
    B_NEXT_OFFSET, B_TARGET_TOPIC, B_TARGET_PARTITION, B_ENQUEUE_NO, B_RECORD_OFFSETS,
    B_COMPRESSION, B_FETCHED_AT, B_OFFSETS
cdef _Layout _BATCH = _Layout((
    "abandoned", "size", "attempts", "header", "rest", "stamp_generation", "producer_id",
    "producer_epoch", "topic", "partition", "acked", "start", "done", "_future", "_callbacks",
    "lease", "view", "record_count", "target_base", "is_gap", "source_base", "end",
    "next_offset", "target_topic", "target_partition", "enqueue_no", "record_offsets",
    "compression", "fetched_at", "offsets"))

# TargetPartitionQueue fields
cdef enum:
    Q_QUEUE, Q_FAILED, Q_IN_FLIGHT, Q_CONN, Q_ACKED_PRODUCER_ID, Q_ACKED_PRODUCER_EPOCH,
    Q_BLOCKED_UNTIL, Q_UNKNOWN_ATTEMPTS
cdef _Layout _QUEUE = _Layout((
    "queue", "failed", "in_flight", "conn", "acked_producer_id", "acked_producer_epoch",
    "blocked_until", "unknown_attempts"))

# SourcePartition, PartitionOffsets, OffsetMap and FrameLease fields
cdef enum:
    S_OFFSETS, S_RECORDS, S_BATCHES, S_BYTES, S_ACK_RUN, S_ACK_TALLY, S_HIGH_WATERMARK
cdef _Layout _PARTITION = _Layout(("offsets", "records", "batches", "bytes", "ack_run",
                                   "ack_tally", "high_watermark"))
cdef enum:
    O_ENTRIES, O_COMMITTED, O_OFFSET_MAP, O_END
cdef _Layout _OFFSETS = _Layout(("_entries", "_committed", "offset_map", "_end"))
cdef enum:
    M_COUNTS, M_NEXT_SOURCE, M_NEXT_TARGET
cdef _Layout _MAP = _Layout(("_counts", "_next_source", "_next_target"))
cdef enum:
    L_HOLDERS
cdef _Layout _LEASE = _Layout(("holders",))
# hooks.AckRun fields (a subclass's: the offset syncs' PartitionSyncs)
cdef enum:
    R_RUN_UPSTREAM, R_RUN_DOWNSTREAM, R_END, R_MOVED
cdef _Layout _RUN = _Layout(("run_upstream", "run_downstream", "end", "moved"))
# metrics.AckTally fields
cdef enum:
    T_CODECS, T_BATCHES, T_RECORDS, T_COMPRESSED_BYTES, T_LATENCY_SUM_MS, T_LATENCY_MAX_MS,
    T_OFFSET_LAG
cdef _Layout _TALLY = _Layout(("codecs", "batches", "records", "compressed_bytes",
                               "latency_sum_ms", "latency_max_ms", "offset_lag"))


# ---- making the batches of a fetched partition ------------------------------------------------

# Every field FetchedBatch.__init__ sets, for making one without calling it (the differential
# test compares every slot of the batches both builds make).
cdef enum:
    N_TOPIC, N_PARTITION, N_VIEW, N_LEASE, N_FETCHED_AT, N_RECORD_COUNT, N_SIZE, N_COMPRESSION,
    N_SOURCE_BASE, N_NEXT_OFFSET, N_REBUILT, N_HIGH_WATERMARK, N_TARGET_TOPIC,
    N_TARGET_PARTITION, N_HEADER, N_REST, N_ATTEMPTS, N_ENQUEUE_NO, N_RECORD_OFFSETS, N_DONE,
    N_ABANDONED, N_CALLBACKS, N_FUTURE, N_START, N_END, N_ACKED, N_TARGET_BASE, N_IS_GAP,
    N_STAMP_GENERATION, N_OFFSETS
cdef _Layout _NEW = _Layout((
    "topic", "partition", "view", "lease", "fetched_at", "record_count", "size", "compression",
    "source_base", "next_offset", "rebuilt", "high_watermark", "target_topic",
    "target_partition", "header", "rest", "attempts", "enqueue_no", "record_offsets", "done",
    "abandoned", "_callbacks", "_future", "start", "end", "acked", "target_base", "is_gap",
    "stamp_generation", "offsets"))
cdef object _ZERO = 0
cdef object _MINUS_ONE = -1


cdef int _generic_view_fields(object view, ViewFields *out) except -1:
    """``ViewFields`` read through ``view``'s attributes (the twin's BatchView, or a native one
    when the codec's capsule is missing): magic first, the rest only for a v2 batch."""
    out.magic = view.magic
    if out.magic != 2:
        return 0
    out.attributes = view.attributes
    out.base_offset = view.base_offset
    out.size = view.size
    out.last_offset_delta = view.last_offset_delta
    out.record_count = view.record_count
    return 0


def prepare_usual(list views, Py_ssize_t start, int64_t position, str topic, partition, lease,
                  high_watermark, fetched_at, bint stop_at_transactional, type batch_class):
    """The engine's batches for the usual views from ``start`` on; see
    ``loops.prepare_usual``. Made as ``batch_class.__init__`` would make them, without the
    call: allocated, then every field set at its slot. The views' fields come from the codec's
    ``_view_fields`` (``native/_fields.pxi``), read through their attributes otherwise."""
    cdef list out = []
    cdef Py_ssize_t i = start, n = len(views)
    cdef Py_ssize_t *f = _NEW.off
    cdef ViewFields vf
    if fetched_at is None:
        fetched_at = monotonic()
    while i < n:
        view = views[i]
        if _view_fields == NULL or not _view_fields(view, &vf):
            _generic_view_fields(view, &vf)
        if stop_at_transactional and vf.magic >= 2 and (vf.attributes & TRANSACTIONAL_MASK):
            break
        if not (vf.magic == 2 and vf.base_offset >= position
                and vf.record_count == <int64_t>vf.last_offset_delta + 1):
            break
        batch = PyType_GenericAlloc(<PyTypeObject *>batch_class, 0)
        _check(_NEW, batch)
        next_offset = PyLong_FromLongLong(vf.base_offset + vf.last_offset_delta + 1)
        _set(batch, f[N_TOPIC], topic)
        _set(batch, f[N_PARTITION], partition)
        _set(batch, f[N_VIEW], view)
        _set(batch, f[N_LEASE], lease)
        _set(batch, f[N_FETCHED_AT], fetched_at)
        _set(batch, f[N_RECORD_COUNT], PyLong_FromLongLong(vf.record_count))
        _set(batch, f[N_SIZE], PyLong_FromLongLong(vf.size))
        _set(batch, f[N_COMPRESSION], PyLong_FromLongLong(vf.attributes & COMPRESSION_MASK))
        _set(batch, f[N_SOURCE_BASE], PyLong_FromLongLong(vf.base_offset))
        _set(batch, f[N_NEXT_OFFSET], next_offset)
        _set(batch, f[N_REBUILT], None)
        _set(batch, f[N_HIGH_WATERMARK], high_watermark)
        _set(batch, f[N_TARGET_TOPIC], None)
        _set(batch, f[N_TARGET_PARTITION], None)
        _set(batch, f[N_HEADER], None)
        _set(batch, f[N_REST], None)
        _set(batch, f[N_ATTEMPTS], _ZERO)
        _set(batch, f[N_ENQUEUE_NO], _MINUS_ONE)
        _set(batch, f[N_RECORD_OFFSETS], None)
        _set(batch, f[N_DONE], False)
        _set(batch, f[N_ABANDONED], False)
        _set(batch, f[N_CALLBACKS], None)
        _set(batch, f[N_FUTURE], None)
        _set(batch, f[N_START], _MINUS_ONE)
        _set(batch, f[N_END], next_offset)
        _set(batch, f[N_ACKED], False)
        _set(batch, f[N_TARGET_BASE], None)
        _set(batch, f[N_IS_GAP], False)
        _set(batch, f[N_STAMP_GENERATION], _MINUS_ONE)
        _set(batch, f[N_OFFSETS], None)
        out.append(batch)
        i += 1
    return out, i


# ---- registering and addressing them --------------------------------------------------------

def add_batches(offsets, list batches):
    """``PartitionOffsets.add_batches(batches)``: its loop without the interpreter (see
    ``loops.add_batches``); the same check, raised as the method's assertion would be."""
    _check(_OFFSETS, offsets)
    cdef Py_ssize_t *b = _BATCH.off
    end = _get(offsets, _OFFSETS.off[O_END])
    cdef int64_t fetched_end = end, source_base, next_offset
    for batch in batches:
        _check(_BATCH, batch)
        source_base = _get_int(batch, b[B_SOURCE_BASE])
        next_offset = _get_int(batch, b[B_NEXT_OFFSET])
        if not (fetched_end <= source_base
                and source_base + _get_int(batch, b[B_RECORD_COUNT]) <= next_offset):
            raise AssertionError(
                f"batch at {source_base} starts below the fetched end {fetched_end}")
        _set(batch, b[B_START], end)
        end = _get(batch, b[B_NEXT_OFFSET])
        _set(batch, b[B_END], end)
        _set(batch, b[B_OFFSETS], offsets)
        fetched_end = next_offset
    _get(offsets, _OFFSETS.off[O_ENTRIES]).extend(batches)
    _set(offsets, _OFFSETS.off[O_END], end)


def enqueue_run(list batches, str target_topic, target_partition, int64_t last_no):
    """Address and number ``batches``; see ``loops.enqueue_run``."""
    cdef Py_ssize_t *b = _BATCH.off
    cdef int64_t no = last_no
    for batch in batches:
        _check(_BATCH, batch)
        _set(batch, b[B_TARGET_TOPIC], target_topic)
        _set(batch, b[B_TARGET_PARTITION], target_partition)
        no += 1
        if _get_int(batch, b[B_ENQUEUE_NO]) < 0:
            _set_int(batch, b[B_ENQUEUE_NO], no)


# ---- planning a request ---------------------------------------------------------------------

cdef object _drop_abandoned_heads(object tq):
    """Drop (and release) the abandoned batches at the head of ``tq``'s queue; return it."""
    _check(_QUEUE, tq)
    queue = _get(tq, _QUEUE.off[Q_QUEUE])
    while queue:
        head = queue[0]
        _check(_BATCH, head)
        if not _get(head, _BATCH.off[B_ABANDONED]):
            break
        queue.popleft().release()
    return queue


cdef bint _can_send(object tq, object conn, int64_t per_partition, bint idempotent,
                    object producer_id, object producer_epoch) except -1:
    """``loops.can_send`` for one partition queue (the identity read once per plan). The loop's
    clock is asked only for a partition in backoff: ``asyncio.get_running_loop()`` makes a
    ``getpid`` system call on every call in Python 3.11 (its fork check), once per request
    when it was asked per plan."""
    queue = _drop_abandoned_heads(tq)
    cdef Py_ssize_t *q = _QUEUE.off
    if not queue or _get(tq, q[Q_FAILED]):
        return False
    cdef int64_t in_flight = _get_int(tq, q[Q_IN_FLIGHT])
    if in_flight >= per_partition:
        return False
    if in_flight:
        tq_conn = _get(tq, q[Q_CONN])
        if tq_conn is None or tq_conn is not conn:
            return False
        if idempotent and (_get(tq, q[Q_ACKED_PRODUCER_ID]) != producer_id
                           or _get(tq, q[Q_ACKED_PRODUCER_EPOCH]) != producer_epoch):
            return False
    blocked_until = _get(tq, q[Q_BLOCKED_UNTIL])
    if blocked_until and asyncio.get_running_loop().time() < blocked_until:
        return False
    return True


def plan_picks(sink, conn):
    """Plan ``sink``'s next request on ``conn``; see ``loops.plan_picks`` (and its
    ``settle_ready``: ``sink.ready`` is updated in the same walk)."""
    cdef list picks = []
    cdef list too_large = []
    cdef dict partitions = sink.partitions
    cdef dict ready = sink.ready
    cdef list order = list(ready)
    owner = sink.owner
    identity = owner.identity
    if owner.identity_resetting:
        # Nothing may go; abandoned heads are still dropped, as the twin's visit does.
        for key in order:
            if not _drop_abandoned_heads(partitions[key]):
                del ready[key]
        return picks, too_large
    cdef int64_t per_partition = sink.per_partition
    cdef int64_t max_bytes = sink.max_request_bytes
    cdef bint idempotent = identity.idempotent
    producer_id = identity.producer_id
    producer_epoch = identity.producer_epoch
    cdef int64_t request_bytes = _REQUEST_OVERHEAD
    cdef int64_t extra
    cdef set topics_seen = set()
    cdef str topic
    cdef Py_ssize_t *q = _QUEUE.off
    for key in order:
        tq = partitions[key]
        if not _can_send(tq, conn, per_partition, idempotent, producer_id, producer_epoch):
            if not _get(tq, q[Q_QUEUE]):
                del ready[key]          # emptied (sent, or its abandoned heads dropped)
            continue
        queue = _get(tq, q[Q_QUEUE])
        batch = queue[0]
        topic = (<tuple>key)[0]
        extra = _get_int(batch, _BATCH.off[B_SIZE]) + _PARTITION_OVERHEAD
        if topic not in topics_seen:
            extra += topic_overhead_bytes(topic)
        if _REQUEST_OVERHEAD + extra > max_bytes:
            too_large.append((key, batch))
            continue
        if request_bytes + extra > max_bytes:
            continue        # a smaller head further on may still fit
        picks.append((key, batch))
        request_bytes += extra
        topics_seen.add(topic)
        # Picked: it leaves its queue, in flight on ``conn`` (each key comes once in ``order``,
        # so this is what the twin does after planning), and goes to the back of ``ready``.
        queue.popleft()
        _set_int(tq, q[Q_IN_FLIGHT], _get_int(tq, q[Q_IN_FLIGHT]) + 1)
        _set(tq, q[Q_CONN], conn)
        _set_int(batch, _BATCH.off[B_ATTEMPTS], _get_int(batch, _BATCH.off[B_ATTEMPTS]) + 1)
        del ready[key]
        if queue:
            ready[key] = None
    return picks, too_large


# ---- applying an answer ---------------------------------------------------------------------

cdef int _generic_answer_fields(object part, AnswerFields *out) except -1:
    """``AnswerFields`` read through ``part``'s attributes (the twin's answer)."""
    out.partition = part.partition
    out.error_code = part.error_code
    out.base_offset = part.base_offset
    return 0


# Answers with at most this many partitions are matched to their picks by scanning (the
# answer's order is the broker's: Kafka's follows a hash map); larger ones through a dict.
cdef enum:
    _SCAN_PARTS = 64

# A partition of the answer: its topic (borrowed: the answer holds it) and fields.
ctypedef AnswerPart _Part


cdef Py_ssize_t _flatten_answer(object response, _Part *out) except -2:
    """The answer's partitions into ``out`` (their fields read once), in answer order; -1 when
    there are more than ``_SCAN_PARTS``. The codec's ``ProduceAnswer`` gives them from its C
    arrays; another answer is walked through its objects."""
    cdef Py_ssize_t n = 0
    cdef AnswerFields af
    if _answer_parts != NULL:
        n = _answer_parts(response, out, _SCAN_PARTS)
        if n != -1:
            return -1 if n == -2 else n
        n = 0
    for item in response.topics:
        topic, parts = <tuple>item
        for part in parts:
            if n == _SCAN_PARTS:
                return -1
            if _answer_fields == NULL or not _answer_fields(part, &af):
                _generic_answer_fields(part, &af)
            out[n].topic = <void *>topic
            out[n].fields = af
            n += 1
    return n


cdef Py_ssize_t _find_part(_Part *parts, Py_ssize_t n, object topic, int32_t partition
                           ) except -2:
    """The index of ``topic``/``partition`` in ``parts``, the last one if it came twice (as a
    dict of them would keep it), or -1."""
    cdef Py_ssize_t i
    for i in range(n - 1, -1, -1):
        if parts[i].fields.partition == partition and (
                parts[i].topic == <void *>topic or <object>parts[i].topic == topic):
            return i
    return -1


def settle_picks(sink, list picks, response, list acked):
    """Apply a Produce answer's usual outcome; see ``loops.settle_picks``."""
    cdef _Part parts[_SCAN_PARTS]
    cdef Py_ssize_t n = _flatten_answer(response, parts)
    cdef dict by_tp = None
    cdef AnswerFields af
    if n < 0:                       # a large answer: its partitions by target partition
        by_tp = _answer_by_partition(response)
    cdef dict partitions = sink.partitions
    cdef list rest = []
    cdef int code
    cdef Py_ssize_t at
    cdef Py_ssize_t *q = _QUEUE.off
    cdef Py_ssize_t *b = _BATCH.off
    for pick in picks:
        ttp, batch = <tuple>pick
        if by_tp is None:
            at = _find_part(parts, n, (<tuple>ttp)[0], <int32_t>(<tuple>ttp)[1])
            if at < 0:
                rest.append(pick)
                continue
            af = parts[at].fields
        else:
            part = by_tp.get(ttp)
            if part is None:
                rest.append(pick)
                continue
            if _answer_fields == NULL or not _answer_fields(part, &af):
                _generic_answer_fields(part, &af)
        code = af.error_code
        tq = partitions[ttp]
        _check(_QUEUE, tq)
        if ((code != 0 and code != DUPLICATE_SEQUENCE_NUMBER) or _get(tq, q[Q_UNKNOWN_ATTEMPTS])
                or _get(tq, q[Q_FAILED])):
            rest.append(pick)
            continue
        _check(_BATCH, batch)
        _set_int(tq, q[Q_IN_FLIGHT], _get_int(tq, q[Q_IN_FLIGHT]) - 1)
        if _get_int(batch, b[B_STAMP_GENERATION]) >= 0:
            _set(tq, q[Q_ACKED_PRODUCER_ID], _get(batch, b[B_PRODUCER_ID]))
            _set(tq, q[Q_ACKED_PRODUCER_EPOCH], _get(batch, b[B_PRODUCER_EPOCH]))
        acked.append((batch, PyLong_FromLongLong(af.base_offset) if code == 0 else None))
    return rest


# ---- acknowledging ----------------------------------------------------------------------------

cdef int _ack_entry(object offsets, object batch, object target_base) except -1:
    """``PartitionOffsets.ack(batch, target_base)`` for the engine's batch (its own entry): the
    usual case inline, anything else by the method itself."""
    _check(_OFFSETS, offsets)
    cdef Py_ssize_t *b = _BATCH.off
    entries = _get(offsets, _OFFSETS.off[O_ENTRIES])
    if (len(entries) == 0 or entries[0] is not batch
            or (len(entries) > 1 and entries[1].acked)
            or _get(batch, b[B_START]) != _get(offsets, _OFFSETS.off[O_COMMITTED])):
        offsets.ack(batch, target_base)         # its checks and its general case
        return 0
    _set(batch, b[B_ACKED], True)
    _set(batch, b[B_TARGET_BASE], target_base)
    entries.popleft()
    cdef int64_t count = _get_int(batch, b[B_RECORD_COUNT])
    if not _get(batch, b[B_IS_GAP]) and count:
        _add_row(_get(offsets, _OFFSETS.off[O_OFFSET_MAP]), _get(batch, b[B_SOURCE_BASE]),
                 count, target_base)
    _set(offsets, _OFFSETS.off[O_COMMITTED], _get(batch, b[B_END]))
    return 0


cdef int _add_row(object offset_map, object source_base, int64_t count,
                  object target_base) except -1:
    """``OffsetMap.add_row``: the batch extending the last row inline, else the method."""
    _check(_MAP, offset_map)
    cdef Py_ssize_t *m = _MAP.off
    cdef int64_t next_source = _get_int(offset_map, m[M_NEXT_SOURCE])
    cdef int64_t next_target = _get_int(offset_map, m[M_NEXT_TARGET])
    if (target_base is None or next_source < 0 or <int64_t>source_base != next_source
            or <int64_t>target_base != next_target):
        offset_map.add_row(source_base, count, target_base)
        return 0
    counts = _get(offset_map, m[M_COUNTS])
    cdef Py_ssize_t last = len(counts) - 1        # (wraparound is off in this build)
    counts[last] = <int64_t>counts[last] + count
    _set_int(offset_map, m[M_NEXT_SOURCE], next_source + count)
    _set_int(offset_map, m[M_NEXT_TARGET], next_target + count)
    return 0


cdef int _drop_lease(object lease) except -1:
    """``FrameLease.drop``: another holder left inline, the last one by the method."""
    _check(_LEASE, lease)
    cdef int64_t holders = _get_int(lease, _LEASE.off[L_HOLDERS])
    if holders > 1:
        _set_int(lease, _LEASE.off[L_HOLDERS], holders - 1)
    else:
        lease.drop()
    return 0


cdef bint _extends(object run, int64_t source_base, int64_t target_base) except -1:
    """``AckRun.extends`` at the run's slots."""
    _check(_RUN, run)
    cdef Py_ssize_t *r = _RUN.off
    cdef int64_t run_upstream = _get_int(run, r[R_RUN_UPSTREAM])
    if not (0 <= run_upstream < source_base
            and _get_int(run, r[R_RUN_DOWNSTREAM]) + (source_base - run_upstream)
            == target_base):
        return False
    end = _get(run, r[R_END])
    if end is None:
        return True
    return (<int64_t>(<tuple>end)[0] >= source_base
            or <int64_t>(<tuple>end)[1] == target_base)


cdef object _run_point(int64_t upstream, int64_t downstream):
    """``hooks.RunPoint(upstream, downstream)`` without its Python ``__new__``: a tuple of
    the NamedTuple's class, made as ``tuple.__new__`` makes one for a subclass."""
    point = PyType_GenericAlloc(<PyTypeObject *>_RUN_POINT, 2)
    first = PyLong_FromLongLong(upstream)
    second = PyLong_FromLongLong(downstream)
    Py_INCREF(first)
    PyTuple_SET_ITEM(point, 0, first)
    Py_INCREF(second)
    PyTuple_SET_ITEM(point, 1, second)
    return point


cdef int _tally(object tally, object batch, object sp, double now) except -1:
    """``AckTally.add`` for ``batch`` (acknowledged at ``now``) at the tally's slots; the lag
    as ``loops.ack_batches`` computes it, after the acknowledgement."""
    _check(_TALLY, tally)
    cdef Py_ssize_t *t = _TALLY.off
    cdef Py_ssize_t *b = _BATCH.off
    _set_int(tally, t[T_CODECS],
             _get_int(tally, t[T_CODECS]) | (1 << _get_int(batch, b[B_COMPRESSION])))
    _set_int(tally, t[T_BATCHES], _get_int(tally, t[T_BATCHES]) + 1)
    _set_int(tally, t[T_RECORDS],
             _get_int(tally, t[T_RECORDS]) + _get_int(batch, b[B_RECORD_COUNT]))
    _set_int(tally, t[T_COMPRESSED_BYTES],
             _get_int(tally, t[T_COMPRESSED_BYTES]) + _get_int(batch, b[B_SIZE]))
    cdef double latency = (now - <double>_get(batch, b[B_FETCHED_AT])) * 1000
    _set(tally, t[T_LATENCY_SUM_MS], <double>_get(tally, t[T_LATENCY_SUM_MS]) + latency)
    if latency > <double>_get(tally, t[T_LATENCY_MAX_MS]):
        _set(tally, t[T_LATENCY_MAX_MS], latency)
    cdef int64_t high_watermark = _get_int(sp, _PARTITION.off[S_HIGH_WATERMARK])
    if high_watermark < 0:
        _set(tally, t[T_OFFSET_LAG], None)
    else:
        offsets = _get(sp, _PARTITION.off[S_OFFSETS])
        _check(_OFFSETS, offsets)
        _set_int(tally, t[T_OFFSET_LAG],
                 max(0, high_watermark - _get_int(offsets, _OFFSETS.off[O_COMMITTED])))
    return 0


def ack_batches(dict partitions, list acked, bint follow_runs=False, double tally_now=-1.0):
    """Acknowledge the usual batches of ``acked`` in order; see ``loops.ack_batches``."""
    cdef Py_ssize_t i, n = len(acked)
    cdef Py_ssize_t *b = _BATCH.off
    cdef Py_ssize_t *s = _PARTITION.off
    cdef Py_ssize_t *r = _RUN.off
    cdef int64_t source_base = 0, next_offset, target = 0
    for i in range(n):
        batch, target_base = <tuple>acked[i]
        _check(_BATCH, batch)
        sp = partitions.get((_get(batch, b[B_TOPIC]), _get(batch, b[B_PARTITION])))
        if (target_base is None or sp is None or _get(batch, b[B_ABANDONED])
                or _get(batch, b[B_ACKED]) or _get_int(batch, b[B_START]) < 0
                or _get(batch, b[B_DONE]) or _get(batch, b[B_FUTURE]) is not None
                or _get(batch, b[B_CALLBACKS]) is not None):
            return i
        _check(_PARTITION, sp)
        run = None
        if follow_runs:
            run = _get(sp, s[S_ACK_RUN])
            if run is None or _get(batch, b[B_RECORD_OFFSETS]) is not None:
                return i
            source_base = _get_int(batch, b[B_SOURCE_BASE])
            target = <int64_t>target_base
            if not _extends(run, source_base, target):
                return i
        tally = None
        if tally_now >= 0:
            tally = _get(sp, s[S_ACK_TALLY])
            if tally is None:
                return i
        _ack_entry(_get(sp, s[S_OFFSETS]), batch, target_base)
        _set_int(sp, s[S_RECORDS], _get_int(sp, s[S_RECORDS])
                 + _get_int(batch, b[B_RECORD_COUNT]))
        _set_int(sp, s[S_BATCHES], _get_int(sp, s[S_BATCHES]) + 1)
        _set_int(sp, s[S_BYTES], _get_int(sp, s[S_BYTES]) + _get_int(batch, b[B_SIZE]))
        if run is not None:
            next_offset = _get_int(batch, b[B_NEXT_OFFSET])
            _set(run, r[R_END], _run_point(next_offset, target + (next_offset - source_base)))
            _set(run, r[R_MOVED], True)
        if tally is not None:
            _tally(tally, batch, sp, tally_now)
        _set(batch, b[B_DONE], True)
        lease = _get(batch, b[B_LEASE])
        if lease is not None:
            _drop_lease(lease)
            _set(batch, b[B_LEASE], None)
        _set(batch, b[B_VIEW], None)
        _set(batch, b[B_REST], None)
    return n


# ---- the fetch loop's passes over every owned partition -------------------------------------
# With a fetch session a request names only what changed, but the loop still reads every
# owned partition's state once per Fetch (10,000 partitions: ~5-7 ms a pass in Python).

# SourcePartition fields the fetch loop reads
cdef enum:
    F_PAUSED, F_ERROR, F_LEADER, F_OFFSETS, F_HIGH_WATERMARK, F_HIGH_WATERMARK_AT
cdef _Layout _FETCHING = _Layout(("paused", "error", "leader", "offsets", "high_watermark",
                                  "high_watermark_at"))


cdef inline bint _fetchable(object sp) except -1:
    cdef Py_ssize_t *f = _FETCHING.off
    return (not _get(sp, f[F_PAUSED]) and _get(sp, f[F_ERROR]) is None
            and _get(sp, f[F_LEADER]) is not None)


cdef inline object _position(object sp):
    offsets = _get(sp, _FETCHING.off[F_OFFSETS])
    _check(_OFFSETS, offsets)
    return _get(offsets, _OFFSETS.off[O_END])


def fetch_positions(list order, dict partitions):
    """The fetchable partitions of ``order`` and their fetch positions; see
    ``loops.fetch_positions``."""
    cdef dict asked = {}
    cdef PyObject *found
    for tp in order:
        found = PyDict_GetItemWithError(partitions, tp)
        if found is NULL:
            continue
        sp = <object>found
        _check(_FETCHING, sp)
        if _fetchable(sp):
            asked[tp] = _position(sp)
    return asked


def mark_unchanged(dict asked, object answered, dict partitions, object sent_at):
    """Mark the high watermarks an incremental Fetch left unchanged; see
    ``loops.mark_unchanged``."""
    cdef PyObject *found
    cdef Py_ssize_t *f = _FETCHING.off
    for tp, position in asked.items():
        if tp in answered:
            continue
        found = PyDict_GetItemWithError(partitions, tp)
        if found is NULL:
            continue
        sp = <object>found
        _check(_FETCHING, sp)
        if _get_int(sp, f[F_HIGH_WATERMARK]) >= 0 and _position(sp) == position:
            _set(sp, f[F_HIGH_WATERMARK_AT], sent_at)


def changed_positions(dict wanted, dict sent, object max_bytes):
    """The entries of ``wanted`` whose position ``sent`` does not hold; see
    ``loops.changed_positions``."""
    cdef list send = []
    cdef PyObject *was
    for tp, offset in wanted.items():
        was = PyDict_GetItemWithError(sent, tp)
        if was is NULL or <object>was != offset:
            send.append((tp, offset, max_bytes))
    return send
