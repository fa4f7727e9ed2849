# cython: language_level=3
"""Record-set half of the codec, native build of ``shallowmirror.codec.records`` (the twin).

Same contract, same decisions, same errors as the twin (see its docstring and
``shallowmirror/codec/layout.py`` for the byte layout); the differential suite holds them to it.

Why it is fast: one buffer acquisition per call, header fields read straight from the char
pointer (no struct module, no dicts), one small object per batch created without ``__init__``,
and the CRC-32C left to the ``crc32c`` package (SSE4.2) on a memoryview made over raw memory.
``boundscheck`` is off for the whole build, so every wire length is checked by hand below before
any byte it covers is read, and every argument of a public function is checked at the boundary
(type, length, range; the same errors as the twin) before it reaches C: no argument and no byte
can make these functions read outside an object.

Wire layout (v2): baseOffset@0 q, batchLength@8 i, partitionLeaderEpoch@12 i, magic@16 b,
crc@17 I, attributes@21 h, lastOffsetDelta@23 i, baseTimestamp@27 q, maxTimestamp@35 q,
producerId@43 q, producerEpoch@51 h, baseSequence@53 i, recordCount@57 i, records@61.
CRC-32C covers [21, end). Legacy: offset@0 q, size@8 i, crc@12 I (CRC-32 over [16, end)),
magic@16 b, attributes@17 b, [timestamp@18 q if magic 1], keyLength, key, valueLength, value.
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.long cimport (
    PyLong_AsLongLong,
    PyLong_AsLongLongAndOverflow,
    PyLong_CheckExact,
    PyLong_FromLongLong,
)
from cpython.object cimport Py_TYPE, PyObject, PyTypeObject
from cpython.pycapsule cimport PyCapsule_New
from cpython.ref cimport Py_INCREF, Py_XDECREF
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

import operator
import zlib

from crc32c import crc32c as _crc32c

from shallowmirror.errors import CorruptDataError, CrcMismatchError, UnsupportedFormatError, Where

ctypedef signed char int8_t_cast

cdef extern from "Python.h":
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_READ

# Layout constants (mirrors shallowmirror/codec/layout.py; a unit test compares them).
cdef int64_t SEQUENCE_MODULUS = 1 << 31
cdef enum:
    LOG_OVERHEAD = 12
    MAGIC_OFFSET = 16
    CRC_OFFSET = 17
    ATTRIBUTES_OFFSET = 21
    PRODUCER_ID_OFFSET = 43
    HEADER_SIZE = 61
    V2_MIN_BATCH_LENGTH = 49
    LEGACY_MIN_LENGTH_V0 = 14
    LEGACY_MIN_LENGTH_V1 = 22
    COMPRESSION_MASK = 0x07
    TIMESTAMP_TYPE_MASK = 0x08
    TRANSACTIONAL_MASK = 0x10
    CONTROL_MASK = 0x20
    DELETE_HORIZON_MASK = 0x40

LAYOUT = {
    "LOG_OVERHEAD": LOG_OVERHEAD, "MAGIC_OFFSET": MAGIC_OFFSET, "CRC_OFFSET": CRC_OFFSET,
    "ATTRIBUTES_OFFSET": ATTRIBUTES_OFFSET, "PRODUCER_ID_OFFSET": PRODUCER_ID_OFFSET,
    "HEADER_SIZE": HEADER_SIZE, "V2_MIN_BATCH_LENGTH": V2_MIN_BATCH_LENGTH,
    "LEGACY_MIN_LENGTH_V0": LEGACY_MIN_LENGTH_V0, "LEGACY_MIN_LENGTH_V1": LEGACY_MIN_LENGTH_V1,
    "COMPRESSION_MASK": COMPRESSION_MASK, "TIMESTAMP_TYPE_MASK": TIMESTAMP_TYPE_MASK,
    "TRANSACTIONAL_MASK": TRANSACTIONAL_MASK, "CONTROL_MASK": CONTROL_MASK,
    "DELETE_HORIZON_MASK": DELETE_HORIZON_MASK, "SEQUENCE_MODULUS": SEQUENCE_MODULUS,
}

__all__ = ["BatchView", "SplitResult", "split_batches", "filter_batches", "rewrite_for_produce",
           "stamp_batches"]


cdef inline int64_t rd64(const uint8_t *p) noexcept nogil:
    return <int64_t>((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40)
                     | (<uint64_t>p[3] << 32) | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16)
                     | (<uint64_t>p[6] << 8) | <uint64_t>p[7])

cdef inline uint32_t rdu32(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]

cdef inline int32_t rd32(const uint8_t *p) noexcept nogil:
    return <int32_t>rdu32(p)

cdef inline int16_t rd16(const uint8_t *p) noexcept nogil:
    return <int16_t>((<uint16_t>p[0] << 8) | <uint16_t>p[1])

cdef inline void wr64(uint8_t *p, int64_t v) noexcept nogil:
    cdef uint64_t u = <uint64_t>v
    cdef int i
    for i in range(8):
        p[7 - i] = <uint8_t>(u & 0xFF)
        u >>= 8

cdef inline void wr32(uint8_t *p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>(v >> 24)
    p[1] = <uint8_t>(v >> 16)
    p[2] = <uint8_t>(v >> 8)
    p[3] = <uint8_t>v

cdef inline void wr16(uint8_t *p, int16_t v) noexcept nogil:
    cdef uint16_t u = <uint16_t>v
    p[0] = <uint8_t>(u >> 8)
    p[1] = <uint8_t>u


cdef extern from "crc32c_hw.h":
    uint32_t sm_crc32c_long[4][256]
    uint32_t sm_crc32c_short[4][256]
    int sm_crc32c_have_hw
    uint32_t sm_crc32c_x8n_33[4][256]
    int sm_crc32c_have_clmul
    int sm_crc32c_cpu_has_hw() noexcept nogil
    int sm_crc32c_cpu_has_clmul() noexcept nogil
    uint32_t sm_crc32c_delta_hw(const uint8_t *old_head, const uint8_t *new_head,
                                size_t head_size, uint64_t tail_size) noexcept nogil
    uint32_t sm_crc32c_hw(uint32_t crc, const uint8_t *data, size_t size) noexcept nogil


cdef inline uint32_t crc32c_of(const uint8_t *data, Py_ssize_t size, uint32_t seed) except? 0xFFFFFFFF:
    """CRC-32C of raw memory the caller keeps alive: the SSE4.2 instruction in C when the CPU
    has it (``native/crc32c_hw.h``: why), else through the crc32c package."""
    if sm_crc32c_have_hw:
        return sm_crc32c_hw(seed, data, <size_t>size)
    return _crc32c(PyMemoryView_FromMemory(<char *>data, size, PyBUF_READ), seed)


def crc32c(data, uint32_t seed=0):
    """The CRC-32C ``crc32c_of`` computes, for any bytes-like ``data`` (for the tests, which
    hold it to the crc32c package's)."""
    cdef Py_buffer pybuf
    PyObject_GetBuffer(data, &pybuf, PyBUF_SIMPLE)
    try:
        return crc32c_of(<const uint8_t *>pybuf.buf, pybuf.len, seed)
    finally:
        PyBuffer_Release(&pybuf)


def use_crc_instructions(bint enabled):
    """Use the CPU's crc32 and carry-less multiply instructions where it has them (the default),
    or not (``enabled`` False: the crc32c package and the table code, as on a CPU without
    them), so the tests run both paths on any machine. Returns the previous setting."""
    global sm_crc32c_have_hw, sm_crc32c_have_clmul
    previous = bool(sm_crc32c_have_hw or sm_crc32c_have_clmul)
    sm_crc32c_have_hw = sm_crc32c_cpu_has_hw() if enabled else 0
    sm_crc32c_have_clmul = sm_crc32c_cpu_has_clmul() if enabled else 0
    return previous


def crc32c_implementation():
    """How the CRC check and the stamp's CRC update run: ("sse4.2" (the instruction, in C) or
    "crc32c package", "pclmul" (carry-less multiply) or "tables")."""
    return ("sse4.2" if sm_crc32c_have_hw else "crc32c package",
            "pclmul" if sm_crc32c_have_clmul else "tables")


cdef int64_t INT64_MAX_C = 0x7FFFFFFFFFFFFFFF

# ---- the CRC of a stamped batch from the header's change alone ----
# CRC-32C is linear: crc(new) = crc(old) ^ L(delta of the covered header bytes, then n zero
# bytes), L(d + zeros(n)) = L(d) * x**(8n) mod P. Written here rather than taken from a library
# because it is the per-batch hot path (the crc32c package has no combine/shift) and it is 40
# table lookups plus at most four 32-bit carry-less products, independent of the batch's size:
# x**(8n) is the product of one table entry per non-zero byte of n (``_X8N``).
cdef enum:
    CRC32C_POLY = 0x82F63B78          # bit-reflected Castagnoli polynomial

cdef uint32_t _CRC_TABLE[256]
cdef uint32_t _X2N[32]                # x**(2**k) mod P
cdef uint32_t _X8N[4][256]            # x**(8 * k * 256**j) mod P, at [j][k]
cdef enum:
    X0 = 0x80000000                   # x**0 (bit-reflected)


cdef inline uint32_t _multiply(uint32_t a, uint32_t b) noexcept nogil:
    """a * b mod P (bit-reflected); ``a`` is never 0 here (a power of x)."""
    cdef uint32_t m = <uint32_t>1 << 31
    cdef uint32_t p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ CRC32C_POLY if b & 1 else b >> 1


cdef void _init_crc_tables() noexcept nogil:
    cdef uint32_t c, p
    cdef int i, k
    for i in range(256):
        c = <uint32_t>i
        for k in range(8):
            c = (c >> 1) ^ CRC32C_POLY if c & 1 else c >> 1
        _CRC_TABLE[i] = c
    p = <uint32_t>1 << 30             # x**1
    for k in range(32):
        _X2N[k] = p
        p = _multiply(p, p)
    cdef int j
    for j in range(4):
        _X8N[j][0] = X0
        _X8N[j][1] = _X2N[3 + 8 * j]  # x**(8 * 256**j) = x**(2**(3 + 8j))
        for k in range(2, 256):
            _X8N[j][k] = _multiply(_X8N[j][k - 1], _X8N[j][1])


_init_crc_tables()


cdef void _init_hw_crc() noexcept nogil:
    """The SSE4.2 CRC's stream-joining tables (``native/crc32c_hw.h``), from ``_shift_zeros``:
    shifting is linear, so each byte of a register shifts on its own."""
    cdef int j, k
    for j in range(4):
        for k in range(256):
            sm_crc32c_long[j][k] = _shift_zeros((<uint32_t>k) << (8 * j), 8192)
            sm_crc32c_short[j][k] = _shift_zeros((<uint32_t>k) << (8 * j), 256)
    global sm_crc32c_have_hw, sm_crc32c_have_clmul
    sm_crc32c_have_hw = sm_crc32c_cpu_has_hw()
    # x**-33: dividing by x undoes a multiply by x (the constant term of P is 1).
    cdef uint32_t x_minus_33 = X0
    for k in range(33):
        x_minus_33 = ((x_minus_33 ^ CRC32C_POLY) << 1) | 1 if x_minus_33 & X0 else x_minus_33 << 1
    for j in range(4):
        for k in range(256):
            sm_crc32c_x8n_33[j][k] = _multiply(x_minus_33, _X8N[j][k])
    sm_crc32c_have_clmul = sm_crc32c_cpu_has_clmul()


_init_hw_crc()


cdef inline uint32_t _shift_zeros(uint32_t crc, uint64_t n) noexcept nogil:
    """L(d + zeros(n)) from crc == L(d): one table entry per non-zero byte of n below 2**32,
    O(log n) squarings beyond (never for a Kafka batch, whose length is an int32)."""
    cdef uint32_t power = X0
    cdef unsigned k = 3                         # n bytes are 8n bits
    cdef int j
    cdef unsigned byte
    if crc == 0 or n == 0:
        return crc
    if n < (<uint64_t>1 << 32):
        for j in range(4):
            byte = (n >> (8 * j)) & 0xFF
            if byte:
                power = _X8N[j][byte] if power == X0 else _multiply(_X8N[j][byte], power)
        return _multiply(power, crc)
    while n:
        if n & 1:
            power = _multiply(_X2N[k & 31], power)
        n >>= 1
        k += 1
    return _multiply(power, crc)


cdef inline uint32_t _updated_crc(uint32_t old_crc, const uint8_t *old_head,
                                  const uint8_t *new_head, Py_ssize_t head_size,
                                  Py_ssize_t tail_size) noexcept nogil:
    if sm_crc32c_have_clmul:
        return old_crc ^ sm_crc32c_delta_hw(old_head, new_head, <size_t>head_size,
                                            <uint64_t>tail_size)
    cdef uint32_t crc = 0
    cdef Py_ssize_t i
    for i in range(head_size):
        crc = _CRC_TABLE[(crc ^ old_head[i] ^ new_head[i]) & 0xFF] ^ (crc >> 8)
    return old_crc ^ _shift_zeros(crc, <uint64_t>tail_size)


def updated_crc(uint32_t old_crc, const uint8_t[::1] old_covered_head,
                const uint8_t[::1] new_covered_head, Py_ssize_t tail_bytes):
    """The CRC-32C of a message whose first covered bytes changed from ``old_covered_head`` to
    ``new_covered_head`` (same length), followed by ``tail_bytes`` unchanged bytes, given its
    old CRC (what the stamp uses; exposed for the tests, which check it against a full CRC)."""
    if old_covered_head.shape[0] != new_covered_head.shape[0]:
        raise ValueError("both heads must have the same length")
    if tail_bytes < 0:
        raise ValueError("tail_bytes must be >= 0")
    if old_covered_head.shape[0] == 0:
        return old_crc
    return _updated_crc(old_crc, &old_covered_head[0], &new_covered_head[0],
                        old_covered_head.shape[0], tail_bytes)


cdef str _overflow_message(int64_t base_offset, int64_t last_offset_delta):
    return (f"base offset {base_offset} + last offset delta {last_offset_delta} leaves no next "
            f"offset within int64 (at most {INT64_MAX_C})")


cdef object _corrupt(str message, object topic, object partition, int64_t offset,
                     Py_ssize_t position, object cls=CorruptDataError):
    return cls(message, Where(topic=topic, partition=partition, offset=offset, position=position))


# No pickling: Cython's generated __setstate__ would let any caller set position and lengths,
# which the functions below trust (they came from split_batches). The twin's views do not
# pickle either (they hold a memoryview).
# Not tracked by the cyclic garbage collector: a view's one reference is the buffer it was split
# from (a fetch frame: bytes, bytearray or a memoryview of one), which cannot refer back to it,
# so no view is ever part of a cycle; untracked, the thousands in flight are not walked by every
# young collection.
@cython.no_gc
@cython.auto_pickle(False)
cdef class BatchView:
    """One batch (or legacy entry) of a record set; ``buffer`` aliases the caller's bytes."""

    cdef readonly object _records
    cdef readonly Py_ssize_t position
    cdef readonly int64_t base_offset
    cdef readonly int32_t batch_length
    cdef readonly int32_t partition_leader_epoch
    cdef readonly int magic
    cdef readonly uint32_t crc
    cdef readonly int attributes
    cdef readonly int32_t last_offset_delta
    cdef readonly int64_t base_timestamp
    cdef readonly int64_t max_timestamp
    cdef readonly int64_t producer_id
    cdef readonly int producer_epoch
    cdef readonly int32_t base_sequence
    cdef readonly int32_t record_count

    @property
    def compression(self):
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self):
        if self.magic == 0:
            return 0
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self):
        return self.magic >= 2 and (self.attributes & TRANSACTIONAL_MASK) != 0

    @property
    def is_control(self):
        return self.magic >= 2 and (self.attributes & CONTROL_MASK) != 0

    @property
    def is_legacy(self):
        return self.magic < 2

    @property
    def last_offset(self):
        return self._last_offset()

    @property
    def next_offset(self):
        return self._last_offset() + 1

    @property
    def size(self):
        return <Py_ssize_t>self.batch_length + LOG_OVERHEAD

    @property
    def buffer(self):
        return self._records[self.position:self.position + self.batch_length + LOG_OVERHEAD]

    cdef inline int64_t _last_offset(self):
        if self.magic < 2:
            return self.base_offset
        return self.base_offset + self.last_offset_delta

    def __repr__(self):
        return (f"BatchView(position={self.position}, base_offset={self.base_offset}, "
                f"magic={self.magic}, size={self.size}, record_count={self.record_count}, "
                f"attributes={self.attributes:#x})")


# ---- the loops' view of a batch (native/_fields.pxi) ---------------------------------------

include "_fields.pxi"


cdef int _view_fields(object view, ViewFields *out) noexcept:
    """``ViewFields`` of ``view`` if it is a BatchView of this module (1), else 0."""
    if type(view) is not BatchView:
        return 0
    cdef BatchView v = <BatchView>view
    out.base_offset = v.base_offset
    out.size = <int64_t>v.batch_length + LOG_OVERHEAD
    out.last_offset_delta = v.last_offset_delta
    out.record_count = v.record_count
    out.magic = v.magic
    out.attributes = v.attributes
    return 1


#: ``_view_fields`` for the engine's native loops (``shallowmirror.engine._cloops``).
VIEW_FIELDS = PyCapsule_New(<void *>_view_fields, VIEW_FIELDS_CAPSULE, NULL)


@cython.auto_pickle(False)
cdef class SplitResult:
    """Batches of a record set, the bytes they cover, and whether a truncated tail remains."""

    cdef public list batches
    cdef public Py_ssize_t consumed
    cdef public bint partial

    def __repr__(self):
        return (f"SplitResult(batches={len(self.batches)}, consumed={self.consumed}, "
                f"partial={self.partial})")


cdef object _as_bytes_view(object records):
    cdef object view = memoryview(records)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def split_batches(records, *, bint verify_crc=True, topic=None, partition=None):
    """Split a record set into batch views; stop cleanly at a trailing partial batch."""
    cdef object view = _as_bytes_view(records)
    cdef Py_buffer pybuf
    PyObject_GetBuffer(view, &pybuf, PyBUF_SIMPLE)
    cdef list batches = []
    cdef SplitResult result = SplitResult.__new__(SplitResult)
    cdef const uint8_t *base = <const uint8_t *>pybuf.buf
    cdef Py_ssize_t end = pybuf.len
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t remaining, size
    cdef int64_t base_offset
    cdef int32_t length, min_length
    cdef int magic
    cdef bint partial = False
    try:
        while True:
            remaining = end - pos
            if remaining < LOG_OVERHEAD:
                partial = remaining > 0
                break
            base_offset = rd64(base + pos)
            length = rd32(base + pos + 8)
            if remaining <= MAGIC_OFFSET:
                # Magic not readable yet: only the length can be judged.
                if length < LEGACY_MIN_LENGTH_V0:
                    raise _corrupt(f"batch length {length} below the minimum "
                                   f"{LEGACY_MIN_LENGTH_V0}", topic, partition, base_offset, pos)
                partial = True
                break
            magic = <int8_t_cast>base[pos + MAGIC_OFFSET]
            if magic == 2:
                min_length = V2_MIN_BATCH_LENGTH
            elif magic == 1:
                min_length = LEGACY_MIN_LENGTH_V1
            elif magic == 0:
                min_length = LEGACY_MIN_LENGTH_V0
            else:
                raise _corrupt(f"unknown magic {magic}", topic, partition, base_offset, pos)
            if length < min_length:
                raise _corrupt(f"batch length {length} below the minimum {min_length} for magic "
                               f"{magic}", topic, partition, base_offset, pos)
            size = <Py_ssize_t>length + LOG_OVERHEAD
            if size > remaining:
                partial = True
                break
            if magic == 2:
                batches.append(_parse_v2(view, base, pos, size, verify_crc, topic, partition))
            else:
                batches.append(_parse_legacy(view, base, pos, size, magic, verify_crc, topic,
                                             partition))
            pos += size
    finally:
        PyBuffer_Release(&pybuf)
    result.batches = batches
    result.consumed = pos
    result.partial = partial
    return result


cdef BatchView _parse_v2(object view, const uint8_t *base, Py_ssize_t pos, Py_ssize_t size,
                         bint verify_crc, object topic, object partition):
    cdef const uint8_t *p = base + pos
    cdef BatchView b = BatchView.__new__(BatchView)
    cdef uint32_t computed
    b._records = view
    b.position = pos
    b.base_offset = rd64(p)
    b.batch_length = rd32(p + 8)
    b.partition_leader_epoch = rd32(p + 12)
    b.magic = 2
    b.crc = rdu32(p + CRC_OFFSET)
    b.attributes = rd16(p + ATTRIBUTES_OFFSET)
    b.last_offset_delta = rd32(p + 23)
    b.base_timestamp = rd64(p + 27)
    b.max_timestamp = rd64(p + 35)
    b.producer_id = rd64(p + 43)
    b.producer_epoch = rd16(p + 51)
    b.base_sequence = rd32(p + 53)
    b.record_count = rd32(p + 57)
    if (b.attributes & COMPRESSION_MASK) > 4:
        raise _corrupt(f"unknown compression codec {b.attributes & COMPRESSION_MASK}",
                       topic, partition, b.base_offset, pos)
    if (b.last_offset_delta < 0 or b.record_count < 0
            or <int64_t>b.record_count > <int64_t>b.last_offset_delta + 1):
        raise _corrupt(f"record count {b.record_count} does not fit last offset delta "
                       f"{b.last_offset_delta}", topic, partition, b.base_offset, pos)
    # next_offset must stay an int64 (C overflow is undefined; the twin's ints would not wrap).
    if b.base_offset > INT64_MAX_C - 1 - <int64_t>b.last_offset_delta:
        raise _corrupt(_overflow_message(b.base_offset, b.last_offset_delta), topic, partition,
                       b.base_offset, pos)
    if verify_crc:
        computed = crc32c_of(p + ATTRIBUTES_OFFSET, size - ATTRIBUTES_OFFSET, 0)
        if computed != b.crc:
            raise _corrupt(f"CRC-32C mismatch: stored {b.crc:#010x}, computed {computed:#010x}",
                           topic, partition, b.base_offset, pos, CrcMismatchError)
    return b


cdef BatchView _parse_legacy(object view, const uint8_t *base, Py_ssize_t pos, Py_ssize_t size,
                             int magic, bint verify_crc, object topic, object partition):
    cdef const uint8_t *p = base + pos
    cdef BatchView b = BatchView.__new__(BatchView)
    cdef Py_ssize_t end = pos + size
    cdef Py_ssize_t key_pos, value_pos
    cdef int32_t key_length, value_length
    cdef uint32_t computed
    b._records = view
    b.position = pos
    b.base_offset = rd64(p)
    b.batch_length = rd32(p + 8)
    b.crc = rdu32(p + 12)
    b.magic = magic
    b.attributes = <int8_t_cast>p[17]
    b.partition_leader_epoch = -1
    b.last_offset_delta = -1
    b.base_timestamp = -1
    b.max_timestamp = -1
    b.producer_id = -1
    b.producer_epoch = -1
    b.base_sequence = -1
    b.record_count = -1
    if (b.attributes & COMPRESSION_MASK) > 3:
        raise _corrupt(f"unknown compression codec {b.attributes & COMPRESSION_MASK} for magic "
                       f"{magic}", topic, partition, b.base_offset, pos)
    if b.base_offset > INT64_MAX_C - 1:
        raise _corrupt(_overflow_message(b.base_offset, 0), topic, partition, b.base_offset, pos)
    key_pos = pos + (26 if magic == 1 else 18)
    # The minimum length checked by the caller guarantees key_pos + 8 <= end.
    key_length = rd32(base + key_pos)
    value_pos = key_pos + 4 + (key_length if key_length > 0 else 0)
    if key_length < -1 or value_pos + 4 > end:
        raise _corrupt(f"legacy key length {key_length} does not fit the message", topic,
                       partition, b.base_offset, pos)
    value_length = rd32(base + value_pos)
    if value_length < -1 or value_pos + 4 + (value_length if value_length > 0 else 0) != end:
        raise _corrupt(f"legacy value length {value_length} does not fill the message", topic,
                       partition, b.base_offset, pos)
    if verify_crc:
        computed = zlib.crc32(PyMemoryView_FromMemory(<char *>(p + MAGIC_OFFSET),
                                                      size - MAGIC_OFFSET, PyBUF_READ))
        if computed != b.crc:
            raise _corrupt(f"CRC-32 mismatch: stored {b.crc:#010x}, computed {computed:#010x}",
                           topic, partition, b.base_offset, pos, CrcMismatchError)
    return b


cdef int64_t _read_varint(const uint8_t *base, Py_ssize_t *pos, Py_ssize_t end, int max_bytes,
                          BatchView batch) except? -1:
    """Zigzag varint at ``pos[0]``; at most ``max_bytes`` bytes and never past ``end``."""
    cdef uint64_t raw = 0
    cdef int shift = 0
    cdef int i
    cdef uint8_t byte
    for i in range(max_bytes):
        if pos[0] + i >= end:
            break
        byte = base[pos[0] + i]
        raw |= (<uint64_t>(byte & 0x7F)) << shift
        if not (byte & 0x80):
            pos[0] += i + 1
            return <int64_t>(raw >> 1) ^ -(<int64_t>(raw & 1))
        shift += 7
    raise CorruptDataError("malformed varint in control record",
                           Where(offset=batch.base_offset, position=batch.position))


cdef bint _is_abort_marker(BatchView batch) except -1:
    """Whether a control batch's first record is an ABORT marker (as the Java consumer reads)."""
    if batch.record_count == 0:
        return False
    cdef Py_buffer pybuf
    cdef const uint8_t *base
    cdef Py_ssize_t pos = batch.position + HEADER_SIZE
    cdef Py_ssize_t end = batch.position + batch.batch_length + LOG_OVERHEAD
    cdef int64_t key_length
    cdef int16_t version
    PyObject_GetBuffer(batch._records, &pybuf, PyBUF_SIMPLE)
    try:
        base = <const uint8_t *>pybuf.buf
        if end > pybuf.len:
            raise CorruptDataError("batch view outruns its buffer",
                                   Where(offset=batch.base_offset, position=batch.position))
        _read_varint(base, &pos, end, 5, batch)            # record length
        pos += 1                                            # record attributes
        _read_varint(base, &pos, end, 10, batch)           # timestamp delta
        _read_varint(base, &pos, end, 5, batch)            # offset delta
        key_length = _read_varint(base, &pos, end, 5, batch)
        if key_length < 4 or pos + 4 > end:
            raise CorruptDataError(f"control record key of {key_length} bytes is too short",
                                   Where(offset=batch.base_offset, position=batch.position))
        version = rd16(base + pos)
        if version < 0:
            raise CorruptDataError(f"control record version {version} is negative",
                                   Where(offset=batch.base_offset, position=batch.position))
        return rd16(base + pos + 2) == 0
    finally:
        PyBuffer_Release(&pybuf)


# Python ints, built once: the range checks must accept any int and raise ValueError as the twin.
cdef object _INT64_MIN = -(1 << 63), _INT64_MAX = (1 << 63) - 1
cdef int64_t C_INT16_MIN = -(1 << 15), C_INT16_MAX = (1 << 15) - 1
cdef int64_t C_INT32_MIN = -(1 << 31), C_INT32_MAX = (1 << 31) - 1
cdef int64_t C_INT64_MIN = -INT64_MAX_C - 1


cdef object _as_int(str name, object value, object low, object high):
    """An integer argument in [low, high]: TypeError if not an integer, ValueError if out."""
    if type(value) is not int:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} {value} out of range [{low}, {high}]")
    return value


cdef int64_t _c_int(str name, object value, int64_t low, int64_t high) except? -1:
    """``_as_int`` compared in C for the usual exact int (the per-batch stamp takes three)."""
    cdef int overflow = 0
    cdef long long v
    if PyLong_CheckExact(value):
        v = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow and low <= v <= high:
            return v
    return _as_int(name, value, low, high)


def _first_offset(tuple pair):
    return pair[1]


cdef list _aborted_pairs(object aborted_transactions):
    """(producer_id, first_offset) pairs, checked, sorted by first offset (as the twin)."""
    cdef list pairs = []
    for item in aborted_transactions:
        try:
            producer_id, first_offset = item
        except (TypeError, ValueError):
            raise TypeError("aborted_transactions entries must be (producer_id, first_offset) "
                            f"pairs, got {type(item).__name__} {item!r:.60}") from None
        pairs.append((_as_int("aborted producer_id", producer_id, _INT64_MIN, _INT64_MAX),
                      _as_int("aborted first_offset", first_offset, _INT64_MIN, _INT64_MAX)))
    pairs.sort(key=_first_offset)
    return pairs


def filter_batches(batches, *, fetch_offset, aborted_transactions=None,
                   bint drop_control=True):
    """Batches worth forwarding; same rules as the twin's ``filter_batches``."""
    cdef int64_t fetch_at = _as_int("fetch_offset", fetch_offset, _INT64_MIN, _INT64_MAX)
    cdef bint read_committed = aborted_transactions is not None
    # Checked pairs of C-range ints: the loop below may read them without bounds checks.
    cdef list pending = _aborted_pairs(aborted_transactions) if read_committed else []
    cdef Py_ssize_t next_pending = 0
    cdef Py_ssize_t n_pending = len(pending)
    cdef tuple pair
    cdef set aborting = set()
    cdef list kept = []
    cdef BatchView b
    cdef int64_t last_offset
    cdef bint control
    for obj in batches:
        if type(obj) is not BatchView:
            raise TypeError("batches must hold BatchView objects from split_batches, got "
                            f"{type(obj).__name__}")
        b = <BatchView>obj
        last_offset = b._last_offset()
        control = b.magic >= 2 and (b.attributes & CONTROL_MASK) != 0
        if read_committed and b.producer_id >= 0:
            while next_pending < n_pending:
                pair = <tuple>pending[next_pending]
                if <int64_t>pair[1] > last_offset:
                    break
                aborting.add(pair[0])
                next_pending += 1
            if control:
                if _is_abort_marker(b):
                    aborting.discard(b.producer_id)
            elif (b.magic >= 2 and (b.attributes & TRANSACTIONAL_MASK) != 0
                  and b.producer_id in aborting):
                continue
        if control and drop_control:
            continue
        if last_offset < fetch_at:
            continue
        kept.append(b)
    return kept


def rewrite_for_produce(batch, *, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                        bint transactional=False, bint clear_log_append_time=False):
    """(new 61-byte header, view of the rest) for a Produce request; same rules as the twin."""
    cdef int64_t pid
    cdef int16_t epoch
    cdef int32_t seq
    view = _stampable(batch, producer_id, producer_epoch, base_sequence, &pid, &epoch, &seq)
    return _rewrite_c(view, pid, epoch, seq, transactional, clear_log_append_time)



# The batch fields stamp_batches reads and writes: at their slots when the batch class has them
# (the engine's FetchedBatch), by name otherwise (native/_slots.pxi).
include "_slots.pxi"

cdef enum:
    S_STAMP_GENERATION, S_VIEW, S_RECORD_COUNT, S_HEADER, S_REST, S_PRODUCER_ID,
    S_PRODUCER_EPOCH, S_BASE_SEQUENCE
cdef _Layout _STAMPED = _Layout(("stamp_generation", "view", "record_count", "header", "rest",
                                 "producer_id", "producer_epoch", "base_sequence"), False)


def stamp_batches(picks, *, producer_id=-1, producer_epoch=-1, generation, sequences=None,
                  bint clear_log_append_time=False, bint headers=True):
    """Stamp one Produce request's batches in one call; same rules as the twin. The loop is
    here rather than in the engine because it runs once per forwarded batch (one call per
    request instead of one per batch: 0.25 us less per 5.6 KB batch in hotpath_micro.py), and
    it reaches the fields of the engine's batches at their slots (``_slots.pxi``)."""
    cdef int64_t pid = _c_int("producer_id", producer_id, C_INT64_MIN, INT64_MAX_C)
    cdef int16_t epoch = <int16_t>_c_int("producer_epoch", producer_epoch, C_INT16_MIN,
                                         C_INT16_MAX)
    if sequences is not None and type(sequences) is not dict:
        raise TypeError(f"sequences must be a dict or None, got {type(sequences).__name__}")
    cdef dict seqs = <dict>sequences if sequences is not None else None
    cdef object pid_obj = pid, epoch_obj = epoch          # made once, shared by every batch
    cdef int stamped = 0
    cdef int64_t base, count
    cdef int32_t seq
    cdef object key, batch, view, base_obj
    cdef tuple header_rest
    cdef bint fast
    for pick in picks:
        key, batch = pick
        fast = _check(_STAMPED, batch)
        if _read(_STAMPED, batch, fast, S_STAMP_GENERATION) == generation:
            continue                          # stamped: a resend keeps its bytes
        view = _read(_STAMPED, batch, fast, S_VIEW)
        if type(view) is not BatchView:
            raise TypeError(f"batch.view must be a BatchView from split_batches, got "
                            f"{type(view).__name__}")
        if seqs is None:
            seq = -1
        else:
            count = _read(_STAMPED, batch, fast, S_RECORD_COUNT)
            if count <= 0:
                raise ValueError(f"an idempotent batch needs at least one record ({batch!r})")
            base_obj = seqs.get(key, 0)
            base = _c_int("sequence", base_obj, 0, C_INT32_MAX)
            seqs[key] = (base + count) % SEQUENCE_MODULUS
            seq = <int32_t>base
        _check_producible(<BatchView>view)
        if headers:
            header_rest = _rewrite_c(<BatchView>view, pid, epoch, seq, False,
                                     clear_log_append_time)
            _write(_STAMPED, batch, fast, S_HEADER, header_rest[0])
            _write(_STAMPED, batch, fast, S_REST, header_rest[1])
        _write(_STAMPED, batch, fast, S_PRODUCER_ID, pid_obj)
        _write(_STAMPED, batch, fast, S_PRODUCER_EPOCH, epoch_obj)
        _write(_STAMPED, batch, fast, S_BASE_SEQUENCE, seq)
        _write(_STAMPED, batch, fast, S_STAMP_GENERATION, generation)
        stamped += 1
    return stamped


cdef int _check_producible(BatchView batch) except -1:
    """What no Produce request may carry: legacy entries, control batches, offset gaps."""
    if batch.magic < 2:
        raise UnsupportedFormatError(
            f"legacy magic {batch.magic} entry cannot go into Produce v3+; convert it with "
            "shallowmirror.codec.deep.convert_legacy",
            Where(offset=batch.base_offset, position=batch.position))
    if batch.attributes & CONTROL_MASK:
        raise UnsupportedFormatError("control batches cannot be produced; drop them",
                                     Where(offset=batch.base_offset, position=batch.position))
    if batch.record_count != <int64_t>batch.last_offset_delta + 1:
        raise UnsupportedFormatError(
            f"batch has offset gaps (record count {batch.record_count}, last offset delta "
            f"{batch.last_offset_delta}); repack it with shallowmirror.codec.deep.repack_batch",
            Where(offset=batch.base_offset, position=batch.position))
    return 0


cdef BatchView _stampable(object batch, object producer_id, object producer_epoch,
                          object base_sequence, int64_t *pid, int16_t *epoch,
                          int32_t *seq):
    """``batch`` as a BatchView that may go into a Produce request, and the stamp's fields in
    C: ``rewrite_for_produce``'s checks, in the twin's order (the batch first, then the
    arguments), for it and for the encoder's ``_stamp_into``."""
    if type(batch) is not BatchView:
        raise TypeError(f"batch must be a BatchView from split_batches, got {type(batch).__name__}")
    _check_producible(<BatchView>batch)
    pid[0] = _c_int("producer_id", producer_id, C_INT64_MIN, INT64_MAX_C)
    epoch[0] = <int16_t>_c_int("producer_epoch", producer_epoch, C_INT16_MIN, C_INT16_MAX)
    seq[0] = <int32_t>_c_int("base_sequence", base_sequence, C_INT32_MIN, C_INT32_MAX)
    return <BatchView>batch


cdef tuple _rewrite_c(BatchView batch, int64_t pid, int16_t epoch, int32_t seq,
                      bint transactional, bint clear_log_append_time):
    """The rewrite itself, for a batch ``_check_producible`` passed."""
    if transactional and pid < 0:
        raise ValueError("a transactional batch needs a producer id")
    cdef bytes header = PyBytes_FromStringAndSize(NULL, HEADER_SIZE)
    cdef const uint8_t *body
    cdef Py_ssize_t body_size
    _write_header(batch, pid, epoch, seq, transactional, clear_log_append_time,
                  <uint8_t *>PyBytes_AS_STRING(header), &body, &body_size)
    cdef Py_ssize_t start = batch.position + HEADER_SIZE
    return header, batch._records[start:start + body_size]


cdef int _write_header(BatchView batch, int64_t pid, int16_t epoch, int32_t seq,
                       bint transactional, bint clear_log_append_time, uint8_t *h,
                       const uint8_t **body, Py_ssize_t *body_size) except -1:
    """Write ``batch``'s Produce header, stamped, to ``h[0:61]``; point ``body`` at the rest."""
    # The delete horizon (KIP-534) is the source cleaner's schedule, not the target's: clear it.
    cdef int attributes = batch.attributes & ~(TRANSACTIONAL_MASK | DELETE_HORIZON_MASK)
    if transactional:
        attributes |= TRANSACTIONAL_MASK
    if clear_log_append_time:
        attributes &= ~TIMESTAMP_TYPE_MASK

    cdef Py_ssize_t start = batch.position
    cdef Py_ssize_t size = <Py_ssize_t>batch.batch_length + LOG_OVERHEAD
    cdef Py_buffer pybuf
    cdef const uint8_t *p
    cdef uint32_t crc
    # The pointer outlives the export: ``_records`` is a memoryview, which holds its own export
    # of the fetched bytes for as long as it (and so the view) lives.
    PyObject_GetBuffer(batch._records, &pybuf, PyBUF_SIMPLE)
    try:
        if start + size > pybuf.len:
            raise CorruptDataError("batch view outruns its buffer",
                                   Where(offset=batch.base_offset, position=start))
        p = <const uint8_t *>pybuf.buf + start
        memcpy(h, p, HEADER_SIZE)
        wr64(h, 0)                                  # baseOffset 0, outside the CRC
        wr32(h + 12, 0xFFFFFFFF)                    # partitionLeaderEpoch -1, outside the CRC
        if (attributes != batch.attributes or pid != batch.producer_id
                or epoch != batch.producer_epoch or seq != batch.base_sequence):
            wr16(h + ATTRIBUTES_OFFSET, <int16_t>attributes)
            wr64(h + PRODUCER_ID_OFFSET, pid)
            wr16(h + 51, epoch)
            wr32(h + 53, <uint32_t>seq)
            # From the header's change alone: the records are not read again, and a batch
            # that came with a wrong CRC keeps a wrong one (never a fresh CRC over bad bytes).
            crc = _updated_crc(batch.crc, p + ATTRIBUTES_OFFSET, h + ATTRIBUTES_OFFSET,
                               HEADER_SIZE - ATTRIBUTES_OFFSET, size - HEADER_SIZE)
            wr32(h + CRC_OFFSET, crc)
        body[0] = p + HEADER_SIZE
        body_size[0] = size - HEADER_SIZE
    finally:
        PyBuffer_Release(&pybuf)
    return 0


cdef int _stamp_into(object view, object producer_id, object producer_epoch,
                     object base_sequence, bint clear_log_append_time, unsigned char *dest,
                     const unsigned char **body, Py_ssize_t *body_size) except -1:
    """``stamp_into_fn`` (native/_fields.pxi), for the codec's Produce encoder: the checks of
    ``rewrite_for_produce``, then the header into ``dest``."""
    cdef int64_t pid
    cdef int16_t epoch
    cdef int32_t seq
    batch = _stampable(view, producer_id, producer_epoch, base_sequence, &pid, &epoch, &seq)
    return _write_header(batch, pid, epoch, seq, False, clear_log_append_time, dest, body,
                         body_size)


#: ``_stamp_into`` for ``shallowmirror.codec._cmessages.encode_produce_batches``.
STAMP_INTO = PyCapsule_New(<void *>_stamp_into, STAMP_INTO_CAPSULE, NULL)
