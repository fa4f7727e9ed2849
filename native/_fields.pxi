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
