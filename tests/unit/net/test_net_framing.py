"""Receive framing, without a broker: the protocol object is fed bytes in arbitrary cuts exactly
as asyncio would (get_buffer + buffer_updated). The zero-copy send is test_send_buffers.py's."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shallowmirror.errors import ConnectionFailedError
from shallowmirror.net.config import client_settings
from shallowmirror.net.connection import (
    _LARGE_FRAME_BYTES,
    _SCRATCH_BYTES,
    BrokerConnection,
    _FrameProtocol,
)


class _NullTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data) -> None:
        pass


def _frames(sizes: list[int]) -> list[bytes]:
    """Response frames (correlation ids 1..n) of the given body sizes, with a recognisable fill."""
    return [struct.pack(">i", i + 1) + bytes([(i * 7) % 251]) * size
            for i, size in enumerate(sizes)]


def _protocol(loop: asyncio.AbstractEventLoop) -> _FrameProtocol:
    """A connected protocol whose transport takes every write."""
    conn = BrokerConnection("127.0.0.1", 9, client_settings(
        {"bootstrap.servers": "127.0.0.1:9"}, "A"))
    proto = _FrameProtocol(conn, loop, 64 << 20)
    proto.connection_made(_NullTransport())
    return proto


def _feed(wire: bytes, cuts: list[int], sizes: list[int]):
    """Push ``wire`` through a protocol in pieces at ``cuts``; return delivered frames and the
    protocol."""
    loop = asyncio.new_event_loop()
    try:
        proto = _protocol(loop)
        futures = [proto.send([b""], i + 1, True, 60.0, None) for i in range(len(sizes))]
        position = 0
        for cut in sorted(set(cuts)) + [len(wire)]:
            while position < cut:
                buf = proto.get_buffer(-1)
                n = min(len(buf), cut - position)
                assert n > 0
                buf[:n] = wire[position:position + n]
                proto.buffer_updated(n)
                position += n
        return [f.result() for f in futures], proto
    finally:
        loop.close()


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 1, 10, 500, _LARGE_FRAME_BYTES - 5, _LARGE_FRAME_BYTES,
                                    _SCRATCH_BYTES + 3, 700_000]), min_size=1, max_size=6),
    cut_fractions=st.lists(st.floats(0, 1), max_size=12),
)
def test_frames_survive_any_cut(sizes, cut_fractions):
    frames = _frames(sizes)
    wire = b"".join(struct.pack(">i", len(f)) + f for f in frames)
    cuts = [int(fraction * len(wire)) for fraction in cut_fractions]
    delivered, proto = _feed(wire, cuts, sizes)
    assert [bytes(f) for f in delivered] == frames
    assert proto.in_flight == type(proto.in_flight)()
    assert proto.closed_error is None


def test_large_frame_is_received_in_place():
    """A large frame's memoryview is over its own exact-size buffer, not a copy of scratch."""
    size = 3 * _SCRATCH_BYTES
    frames = _frames([size])
    wire = struct.pack(">i", len(frames[0])) + frames[0]
    delivered, _ = _feed(wire, [100, 5000, 300_000], [size])
    frame = delivered[0]
    assert isinstance(frame.obj, bytearray) and len(frame.obj) == len(frames[0])
    assert bytes(frame) == frames[0]


def test_callback_requests_are_answered_on_the_reading_turn_and_failed_on_a_later_one():
    """``send_with_callback``'s path: the answer reaches the callback inside buffer_updated (the
    produce path writes its next request on that turn), mixed in order with future requests; a
    failure reaches callbacks on a later turn, as a future's callbacks would run."""
    loop = asyncio.new_event_loop()
    try:
        proto = _protocol(loop)
        got: list = []
        assert proto.send([b""], 1, True, 60.0, None,
                          lambda frame, err: got.append((bytes(frame), err))) is None
        future = proto.send([b""], 2, True, 60.0, None)
        proto.send([b""], 3, True, 60.0, None, lambda frame, err: got.append((frame, err)))
        wire = b"".join(struct.pack(">i", len(f)) + f for f in _frames([5, 5]))
        buf = proto.get_buffer(-1)
        buf[:len(wire)] = wire
        proto.buffer_updated(len(wire))
        assert got == [(_frames([5])[0], None)]           # already: no loop turn ran
        assert bytes(future.result()) == _frames([5, 5])[1]
        proto.connection_lost(None)
        assert got == [(_frames([5])[0], None)]           # the failure waits for a turn
        loop.run_until_complete(asyncio.sleep(0))
        frame, err = got[1]
        assert frame is None and "closed by the broker" in str(err)
    finally:
        loop.close()


def test_a_request_whose_write_fails_raises_and_never_calls_back():
    left, right = socket.socketpair()
    loop = asyncio.new_event_loop()
    try:
        proto = _protocol(loop)
        got: list = []
        right.close()
        left.shutdown(socket.SHUT_WR)                     # the next write fails: EPIPE
        with pytest.raises(ConnectionFailedError, match="connection lost while sending"):
            proto.send([b"x"], 1, True, 60.0, left, lambda frame, err: got.append(err))
        assert not proto.in_flight
        loop.run_until_complete(asyncio.sleep(0))
        assert got == []
    finally:
        loop.close()
        left.close()
