"""The zero-copy send of a request's buffers, native build and pure-Python twin: both write on a
real socketpair whose small buffer makes partial writes happen, and both must hand back exactly
the bytes the kernel did not take, the untouched pieces as the caller's own objects."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shallowmirror.net import sendmsg as twin
from shallowmirror.net.sendmsg import IOV_MAX

native = pytest.importorskip("shallowmirror.net._csend")
IMPLEMENTATIONS = {"python": twin, "native": native}
both = pytest.mark.parametrize("impl", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS.keys())


def _pair(sndbuf: int) -> tuple[socket.socket, socket.socket]:
    left, right = socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    left.setblocking(False)
    right.setblocking(False)
    return left, right


def _drain(sock: socket.socket, want: int) -> bytes:
    received = bytearray()
    while len(received) < want:
        received += sock.recv(1 << 20)
    with pytest.raises(BlockingIOError):      # nothing more than was reported sent
        sock.recv(1)
    return bytes(received)


def _check_one_send(impl, pieces: list, sndbuf: int) -> int:
    """Send ``pieces`` once; check what arrived and what came back; the bytes sent now."""
    payload = b"".join(bytes(p) for p in pieces)
    left, right = _pair(sndbuf)
    try:
        rest = impl.send_buffers(left, pieces)
        assert isinstance(rest, list)
        sent_now = len(payload) - sum(len(p) for p in rest)
        assert _drain(right, sent_now) == payload[:sent_now]
        assert b"".join(bytes(p) for p in rest) == payload[sent_now:]
        # Pieces not cut into are handed back as the caller's own objects, not copies.
        untouched = pieces[len(pieces) - len(rest) + 1:] if rest else []
        assert all(a is b for a, b in zip(rest[1:], untouched, strict=True))
        if rest and len(rest[0]) == len(pieces[len(pieces) - len(rest)]):
            assert rest[0] is pieces[len(pieces) - len(rest)]
        return sent_now
    finally:
        left.close()
        right.close()


@both
def test_more_pieces_than_iov_max_and_bytes_than_the_socket_takes(impl):
    pieces = [bytes([i % 256]) * (1 + i % 97) for i in range(3 * IOV_MAX)]
    sent = _check_one_send(impl, pieces, 4096)
    assert 0 < sent < sum(map(len, pieces))


@both
def test_everything_sent_leaves_an_empty_rest(impl):
    pieces = [b"size", memoryview(b"--header--")[2:8], bytearray(b"records"), b""]
    assert _check_one_send(impl, pieces, 1 << 20) == 4 + 6 + 7
    left, right = _pair(4096)
    try:
        assert impl.send_buffers(left, []) == []
        assert impl.send_buffers(left, ()) == []
    finally:
        left.close()
        right.close()


@both
def test_a_full_socket_hands_every_piece_back_untouched(impl):
    left, right = _pair(4096)
    try:
        while not impl.send_buffers(left, [b"x" * 65536]):
            pass                                   # fill the socket until it takes nothing
        pieces = [b"a" * 10, memoryview(b"b" * 20), bytearray(b"c" * 30)]
        rest = impl.send_buffers(left, pieces)
        if len(rest) == 3:                         # nothing of it fitted (the usual case)
            assert all(a is b for a, b in zip(rest, pieces, strict=True))
        assert b"".join(bytes(p) for p in rest) == b"".join(bytes(p) for p in pieces)[
            -sum(len(p) for p in rest):]
    finally:
        left.close()
        right.close()


@both
def test_a_non_contiguous_piece_is_refused_before_anything_is_sent(impl):
    left, right = _pair(1 << 16)
    try:
        strided = memoryview(b"abcdefgh")[::2]
        with pytest.raises(BufferError):
            impl.send_buffers(left, [b"first", strided])
        with pytest.raises(BlockingIOError):
            right.recv(1)
    finally:
        left.close()
        right.close()


@both
def test_a_closed_peer_is_an_oserror(impl):
    left, right = _pair(1 << 16)
    right.close()
    try:
        with pytest.raises(OSError):
            impl.send_buffers(left, [b"request"])
    finally:
        left.close()


@pytest.mark.parametrize("name", IMPLEMENTATIONS.keys())
def test_a_reset_connection_raises_even_where_sigpipe_kills(name):
    """An embedding program may restore SIGPIPE's default (terminate); a write to a reset
    connection must still be an exception, not the end of the process."""
    module = "shallowmirror.net.sendmsg" if name == "python" else "shallowmirror.net._csend"
    code = textwrap.dedent(f"""
        import signal, socket
        from {module} import send_buffers
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        left, right = socket.socketpair()
        left.setblocking(False)
        right.close()
        try:
            send_buffers(left, [b"request"])
        except OSError as err:
            print("raised", type(err).__name__)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.startswith("raised BrokenPipeError"), done.stdout


_piece = st.one_of(
    st.binary(max_size=3000),
    st.binary(min_size=2, max_size=3000).map(lambda b: memoryview(b)[1:]),
    st.binary(max_size=3000).map(bytearray),
)


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(_piece, max_size=80), sndbuf=st.sampled_from([2048, 8192, 1 << 20]))
def test_both_builds_send_any_pieces_exactly(pieces, sndbuf):
    for impl in IMPLEMENTATIONS.values():
        _check_one_send(impl, pieces, sndbuf)
