# cython: language_level=3
"""Scatter/gather writes of a request's buffers, native build of ``shallowmirror.net.sendmsg``.

Same contract and same results as the twin (the differential tests run both). Written here, not
left to ``socket.sendmsg``, because the produce hot path writes one request of ~3 buffers per
batch (a framing chunk, the stamped header, the records), and ``socket.sendmsg`` with the twin's
checks around it spends ~800 instructions per buffer (argument parsing, a buffer export and
release per piece, the slice and the length sum): ~20,000 per 8-batch request of 25 buffers,
counted under valgrind. Here a bytes object or a contiguous memoryview gives its pointer
directly; anything else is exported once and released after the write.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_SetFromErrno
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.errno cimport errno
from libc.stdint cimport int16_t, int32_t, int64_t
from libc.string cimport memset

cdef extern from "Python.h":
    bint PyMemoryView_Check(object o)
    Py_buffer *PyMemoryView_GET_BUFFER(object o)
    int PyBuffer_IsContiguous(const Py_buffer *view, char order)

cdef extern from *:
    """
    #include <errno.h>
    /* Nothing written now: the socket is full (EAGAIN and EWOULDBLOCK may be one value) or a
       signal came first; the rest is left to the transport either way. */
    static int sm_not_now(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == EINTR; }
    """
    bint sm_not_now(int e) noexcept

cdef extern from "<sys/uio.h>":
    struct iovec:
        void *iov_base
        size_t iov_len

cdef extern from "<sys/socket.h>" nogil:
    struct msghdr:
        void *msg_name
        unsigned int msg_namelen
        iovec *msg_iov
        size_t msg_iovlen
        void *msg_control
        size_t msg_controllen
        int msg_flags
    ssize_t sendmsg(int fd, const msghdr *msg, int flags)
    enum: MSG_NOSIGNAL

from shallowmirror.net.sendmsg import IOV_MAX as _IOV_MAX_PY

cdef Py_ssize_t IOV_MAX = _IOV_MAX_PY
#: Buffers whose iovec fits on the stack (a request of 8 batches has ~25).
DEF STACK_IOVS = 64


cdef inline bint _direct(object piece, iovec *iov) noexcept:
    """Point ``iov`` at ``piece`` without exporting a buffer: bytes, or a C-contiguous
    memoryview. False for anything else."""
    cdef Py_buffer *view
    if PyBytes_CheckExact(piece):
        iov.iov_base = PyBytes_AS_STRING(piece)
        iov.iov_len = <size_t>PyBytes_GET_SIZE(piece)
        return True
    if PyMemoryView_Check(piece):
        view = PyMemoryView_GET_BUFFER(piece)
        if PyBuffer_IsContiguous(view, b'C'):
            iov.iov_base = view.buf
            iov.iov_len = <size_t>view.len
            return True
    return False


cdef Py_ssize_t _write(int fd, list chunk, iovec *iov, Py_buffer *held,
                       bint *would_block) except -1:
    """One sendmsg of ``chunk``'s buffers; the bytes the kernel took (0 and ``would_block``
    when it took none now)."""
    cdef Py_ssize_t n = len(chunk), i, exported = 0
    cdef ssize_t sent
    cdef msghdr msg
    cdef object piece
    try:
        for i in range(n):
            piece = chunk[i]
            if not _direct(piece, &iov[i]):
                PyObject_GetBuffer(piece, &held[exported], PyBUF_SIMPLE)
                iov[i].iov_base = held[exported].buf
                iov[i].iov_len = <size_t>held[exported].len
                exported += 1
        memset(&msg, 0, sizeof(msg))
        msg.msg_iov = iov
        msg.msg_iovlen = <size_t>n
        # MSG_NOSIGNAL: a reset connection is an EPIPE error here, never a SIGPIPE, even in an
        # embedding program that did not ignore the signal as the interpreter does.
        sent = sendmsg(fd, &msg, MSG_NOSIGNAL)
        if sent < 0:
            if sm_not_now(errno):
                would_block[0] = True
                return 0
            PyErr_SetFromErrno(OSError)
            return -1
        return sent
    finally:
        for i in range(exported):
            PyBuffer_Release(&held[i])


# The codec's ProduceRequest (``encode_produce_batches``): its pieces are read as pointers,
# not as a Python object each (native/_fields.pxi).
include "_fields.pxi"

cdef request_pieces_fn _pieces_of = NULL
try:
    from shallowmirror.codec import _cmessages as _native_messages
except ImportError:              # no native codec: no ProduceRequest can come
    pass
else:
    _pieces_of = <request_pieces_fn>PyCapsule_GetPointer(_native_messages.REQUEST_PIECES,
                                                         REQUEST_PIECES_CAPSULE)


cdef list _send_request(int fd, object request):
    """``send_buffers`` for a ProduceRequest: its pieces straight from their pointers. The
    rest, if the kernel did not take it all, comes back as one bytes object."""
    cdef Piece pieces[STACK_IOVS]
    cdef iovec iov[STACK_IOVS]
    cdef Py_ssize_t first = 0, n, i, width = min(STACK_IOVS, IOV_MAX), offered
    cdef Py_ssize_t total = 0
    cdef ssize_t sent
    cdef msghdr msg
    while True:
        n = _pieces_of(request, first, pieces, width)
        if n <= 0:
            return []
        offered = 0
        for i in range(n):
            iov[i].iov_base = <void *>pieces[i].base
            iov[i].iov_len = <size_t>pieces[i].size
            offered += pieces[i].size
        memset(&msg, 0, sizeof(msg))
        msg.msg_iov = iov
        msg.msg_iovlen = <size_t>n
        sent = sendmsg(fd, &msg, MSG_NOSIGNAL)       # MSG_NOSIGNAL: see _write
        if sent < 0:
            if sm_not_now(errno):
                break
            PyErr_SetFromErrno(OSError)
            return None
        total += sent
        if sent < offered:
            break
        first += n
    return [request.tail(total)]


def send_buffers(sock, buffers):
    """Send as much of ``buffers`` as the non-blocking ``sock`` takes now; return views of the
    rest (the pieces not touched as the caller's own objects). Raises OSError as
    ``socket.sendmsg`` does."""
    if (type(buffers) is not list and _pieces_of != NULL
            and _pieces_of(buffers, 0, NULL, 0) >= 0):
        return _send_request(sock.fileno(), buffers)
    cdef list pieces = buffers if type(buffers) is list else list(buffers)
    cdef Py_ssize_t count = len(pieces), index = 0, width, i, size
    cdef Py_ssize_t sent
    cdef int fd = sock.fileno()
    cdef bint would_block = False
    cdef iovec stack_iov[STACK_IOVS]
    cdef Py_buffer stack_held[STACK_IOVS]
    cdef iovec *iov = stack_iov
    cdef Py_buffer *held = stack_held
    cdef list chunk, rest
    width = min(count, IOV_MAX)
    if width > STACK_IOVS:
        iov = <iovec *>PyMem_Malloc(width * sizeof(iovec))
        held = <Py_buffer *>PyMem_Malloc(width * sizeof(Py_buffer))
        if iov == NULL or held == NULL:
            PyMem_Free(iov)
            PyMem_Free(held)
            raise MemoryError()
    try:
        while index < count:
            width = min(count - index, IOV_MAX)
            chunk = pieces[index:index + width] if index or width < count else pieces
            sent = _write(fd, chunk, iov, held, &would_block)
            if would_block:
                break
            # Skip the buffers sent whole, then cut into the one sent in part.
            for i in range(width):
                size = <Py_ssize_t>iov[i].iov_len
                if sent >= size:
                    sent -= size
                    index += 1
                    continue
                rest = [memoryview(pieces[index])[sent:]]
                rest.extend(pieces[index + 1:])
                return rest
        return pieces[index:]
    finally:
        if iov != stack_iov:
            PyMem_Free(iov)
            PyMem_Free(held)
