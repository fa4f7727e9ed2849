"""Scatter/gather writes of a request's buffers: the pure-Python twin of ``native/_csend.pyx``.

A request goes out as the list of buffers the codec built (framing chunks, stamped headers, views
of fetched records), never joined into one copy. ``send_buffers`` writes as much of it as a
non-blocking socket takes now and returns the rest, which the connection then leaves to its
transport. The native build does the same without ``socket.sendmsg``'s per-buffer cost; the
differential tests run both.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

BufferLike = bytes | bytearray | memoryview

try:
    #: Buffers per sendmsg call: the system's limit, at most 1024.
    IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024)
except (AttributeError, ValueError, OSError):
    IOV_MAX = 16
_NO_SIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)


def send_buffers(sock: socket.socket, buffers: Sequence[BufferLike]) -> list[BufferLike]:
    """Send as much of ``buffers`` as the non-blocking ``sock`` takes now; return views of the
    rest (the pieces not touched as the caller's own objects). Raises OSError as
    ``socket.sendmsg`` does."""
    if not isinstance(buffers, list):
        buffers = list(buffers)      # e.g. the native codec's ProduceRequest: its pieces
    index, count = 0, len(buffers)
    while index < count:
        chunk = buffers[index:index + IOV_MAX]
        try:
            # MSG_NOSIGNAL: a reset connection is an EPIPE error here, never a SIGPIPE, even in
            # an embedding program that did not ignore the signal as the interpreter does.
            sent = sock.sendmsg(chunk, (), _NO_SIGNAL)
        except (BlockingIOError, InterruptedError):
            break
        if sent == sum(map(len, chunk)):      # the usual case: all of it, no walk
            index += len(chunk)
            continue
        # Skip the buffers sent whole, then cut into the one sent in part.
        for piece in chunk:
            size = len(piece)
            if sent >= size:
                sent -= size
                index += 1
                continue
            rest = [memoryview(piece)[sent:]]
            rest.extend(buffers[index + 1:])
            return rest
    return list(buffers[index:])
