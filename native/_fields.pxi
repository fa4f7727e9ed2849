# Included by the codec's native modules and by the engine's native loops
# (``include "_fields.pxi"``): the fields of a codec object the loops read, handed over by a C
# function the codec module publishes in a capsule.
#
# The loops read a fetched batch's header fields and a Produce answer's partition fields for
# every forwarded batch. Through the objects' Python attributes each read is a generic
# attribute access (~140 instructions: type lookup, getter call) and a new int; through these
# functions, a type check and a few loads. The two modules are built apart (``cimport`` across
# them would tie their object layouts together), so a capsule carries the function and this
# file the one struct both sides agree on.
#
# Needs from the including module: from libc.stdint cimport int16_t, int32_t, int64_t.

cdef struct ViewFields:
    int64_t base_offset
    int64_t size                 # batchLength + 12
    int32_t last_offset_delta
    int32_t record_count
    int magic
    int attributes

# 1 and ``out`` filled if ``view`` is the native codec's BatchView, else 0 (not an error).
ctypedef int (*view_fields_fn)(object view, ViewFields *out) noexcept

cdef struct AnswerFields:
    int64_t base_offset
    int32_t partition
    int16_t error_code

# 1 and ``out`` filled if ``part`` is the native codec's ProducePartitionResponse, else 0.
ctypedef int (*answer_fields_fn)(object part, AnswerFields *out) noexcept

# The capsules' names (C strings: a capsule keeps the pointer, not a copy).
cdef const char *VIEW_FIELDS_CAPSULE = "shallowmirror.codec._crecords.view_fields"
cdef const char *ANSWER_FIELDS_CAPSULE = "shallowmirror.codec._cmessages.answer_fields"

# Writes the 61-byte Produce header of ``view`` stamped with the producer identity, exactly as
# ``rewrite_for_produce(view, producer_id=..., producer_epoch=..., base_sequence=...,
# clear_log_append_time=...)`` makes it (same checks, same errors; not transactional), into
# ``dest``, and points ``body``/``body_size`` at the batch's bytes after it (inside the view's
# record buffer: valid while the view lives).
ctypedef int (*stamp_into_fn)(object view, object producer_id, object producer_epoch,
                              object base_sequence, bint clear_log_append_time,
                              unsigned char *dest, const unsigned char **body,
                              Py_ssize_t *body_size) except -1

cdef const char *STAMP_INTO_CAPSULE = "shallowmirror.codec._crecords.stamp_into"

# A native ``ProduceRequest``'s buffer pieces for a writev (``native/_csend.pyx``), without a
# Python object per piece.
cdef struct Piece:
    const char *base
    Py_ssize_t size

# Copies ``request``'s pieces from piece ``first`` on into ``out`` (at most ``room``) and
# returns how many it copied; -1 when ``request`` is not the native codec's ProduceRequest.
ctypedef Py_ssize_t (*request_pieces_fn)(object request, Py_ssize_t first, Piece *out,
                                         Py_ssize_t room) noexcept

cdef const char *REQUEST_PIECES_CAPSULE = "shallowmirror.codec._cmessages.request_pieces"

# One partition of a Produce answer read into C (the native codec's ProduceAnswer): its topic
# name (borrowed: the answer holds it) and the fields the loops read.
cdef struct AnswerPart:
    void *topic
    AnswerFields fields

# Copies ``answer``'s partitions, in answer order, into ``out`` and returns how many; -1 when
# ``answer`` is not the native codec's ProduceAnswer, -2 when it has more than ``room``.
ctypedef Py_ssize_t (*answer_parts_fn)(object answer, AnswerPart *out, Py_ssize_t room) noexcept

cdef const char *ANSWER_PARTS_CAPSULE = "shallowmirror.codec._cmessages.answer_parts"
