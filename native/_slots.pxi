# Included by the native modules that walk the engine's objects (``include "_slots.pxi"``).
#
# Reading a field of a Python object from C with a generic attribute access costs ~140
# instructions (type lookup, descriptor call) and a write ~200; the hot loops make dozens per
# forwarded batch. A ``__slots__`` field lives at a fixed offset in its object, published by its
# member descriptor (``PyMemberDef.offset``, public C API), so a ``_Layout`` reads the offsets of
# the fields it names once per class and ``_get``/``_set`` then read and write at them, a few
# instructions each, after an exact type check per object (``_check``). A ``strict`` layout
# refuses a class without those slots (TypeError); a lenient one reports it (``_check`` returns
# False) and its caller takes the generic path (``_read``/``_write`` do either).
#
# Needs from the including module: cimport cython; from cpython.long cimport
# PyLong_AsLongLong, PyLong_FromLongLong; from cpython.object cimport Py_TYPE, PyObject,
# PyTypeObject; from cpython.ref cimport Py_INCREF, Py_XDECREF; from libc.stdint cimport int64_t.

cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        const char *name
        int type
        Py_ssize_t offset
        int flags
        const char *doc
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member


@cython.final
cdef class _Layout:
    """The slot offsets of the fields ``names`` in one class (the last class seen)."""
    cdef PyTypeObject *cls          # the class the offsets are for (NULL: none yet)
    cdef PyTypeObject *generic      # the last class seen without these slots (lenient only)
    cdef tuple names
    cdef bint strict
    cdef Py_ssize_t off[32]

    def __cinit__(self, tuple names, bint strict=True):
        assert len(names) <= 32
        self.names = names
        self.strict = strict
        self.cls = NULL
        self.generic = NULL

    cdef bint bind(self, object obj) except -1:
        """Read ``obj``'s class's offsets; False (lenient) if it lacks one of the slots."""
        cls = type(obj)
        cdef Py_ssize_t i
        cdef Py_ssize_t offsets[32]
        for i, name in enumerate(self.names):
            descr = None
            for klass in cls.__mro__:
                descr = klass.__dict__.get(name)
                if descr is not None:
                    break
            if type(descr).__name__ != "member_descriptor":
                if not self.strict:
                    self.generic = Py_TYPE(obj)
                    return False
                raise TypeError(f"{cls.__qualname__}.{name} is not a __slots__ field: the "
                                "engine's native loops need the engine's own classes")
            offsets[i] = (<PyMemberDescrObject *><PyObject *>descr).d_member.offset
        for i in range(len(self.names)):
            self.off[i] = offsets[i]
        self.cls = Py_TYPE(obj)
        return True


cdef inline bint _check(_Layout layout, object obj) except -1:
    """Whether ``obj``'s fields are at ``layout``'s offsets (binding its class if new)."""
    cdef PyTypeObject *cls = Py_TYPE(obj)
    if cls is layout.cls:
        return True
    if cls is layout.generic:
        return False
    return layout.bind(obj)


cdef inline object _get(object obj, Py_ssize_t offset):
    cdef PyObject *value = (<PyObject **>((<char *><PyObject *>obj) + offset))[0]
    if value is NULL:
        raise AttributeError(f"a {type(obj).__qualname__} field is not set")
    return <object>value


cdef inline int64_t _get_int(object obj, Py_ssize_t offset) except? -1:
    return PyLong_AsLongLong(_get(obj, offset))


cdef inline int _set(object obj, Py_ssize_t offset, object value) except -1:
    cdef PyObject **slot = <PyObject **>((<char *><PyObject *>obj) + offset)
    cdef PyObject *old = slot[0]
    Py_INCREF(value)
    slot[0] = <PyObject *>value
    Py_XDECREF(old)
    return 0


cdef inline int _set_int(object obj, Py_ssize_t offset, int64_t value) except -1:
    return _set(obj, offset, PyLong_FromLongLong(value))


cdef inline object _read(_Layout layout, object obj, bint fast, int field):
    """Field ``field`` of ``obj``: at its slot when ``fast`` (``_check`` said so), else by name."""
    if fast:
        return _get(obj, layout.off[field])
    return getattr(obj, <str>layout.names[field])


cdef inline int _write(_Layout layout, object obj, bint fast, int field, object value) except -1:
    if fast:
        return _set(obj, layout.off[field], value)
    setattr(obj, <str>layout.names[field], value)
    return 0
