"""Wake marks (SO_RCVLOWAT): with ``BrokerConnection.coalesce_answers(2)`` and two requests in
flight the event loop is woken once both answers are there, and a large frame wakes it once per
MiB, never kept waiting for bytes that will not come. A real TCP connection to a scripted server
on 127.0.0.1 that answers when the test says (what is tested is the socket's mark as Linux
applies it; the real brokers run the whole suite with the marks on)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
from collections.abc import AsyncIterator

import pytest
from kafka.protocol.producer import ProduceResponse

from shallowmirror.codec import produce_response_min_bytes
from shallowmirror.net.config import client_settings
from shallowmirror.net.connection import (
    _FRAME_WAKE_BYTES,
    BrokerConnection,
    RequestTimedOutError,
)
from shallowmirror.testing.fake_cluster import api_versions_response

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="answers are coalesced on Linux only")

VERSION = 8
KT = ProduceResponse.TopicProduceResponse
KP = KT.PartitionProduceResponse


def answer(correlation_id: int, partitions: int, error_text: str | None = None) -> bytes:
    """A Produce v8 answer for ``partitions`` partitions of topic ``t``, framed."""
    msg = ProduceResponse(version=VERSION, throttle_time_ms=0, responses=[
        KT(name="t", partition_responses=[
            KP(index=p, error_code=0, base_offset=p, log_append_time_ms=-1, log_start_offset=0,
               record_errors=[], error_message=error_text) for p in range(partitions)])])
    msg.with_header(correlation_id=correlation_id)
    return bytes(msg.encode(header=True, framed=True))


class Server:
    """Answers ApiVersions itself; queues every other request's correlation id for the test,
    which writes the answers (``reply``) when it chooses."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[int] = asyncio.Queue()
        self.writer: asyncio.StreamWriter | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
                api_key, api_version, cid = struct.unpack_from(">hhi", frame)
                if api_key == 18:
                    reply = api_versions_response(cid, min(api_version, 3))
                    writer.write(struct.pack(">i", len(reply)) + reply)
                else:
                    self.requests.put_nowait(cid)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    async def reply(self, data: bytes) -> None:
        assert self.writer is not None
        self.writer.write(data)
        await self.writer.drain()


@contextlib.asynccontextmanager
async def talking() -> AsyncIterator[tuple[Server, BrokerConnection, dict[int, asyncio.Future]]]:
    """A server, a connection to it that coalesces two answers, and the answers' futures by
    correlation id (filled by ``send``); all closed on exit."""
    server = Server()
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    conn = BrokerConnection("127.0.0.1", port, client_settings(
        {"bootstrap.servers": f"127.0.0.1:{port}"}, "target"))
    try:
        await conn.connect()
        conn.coalesce_answers(2)
        yield server, conn, {}
    finally:
        await conn.close()
        listener.close()


def lowat(conn: BrokerConnection) -> int:
    assert conn._sock is not None
    return conn._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


async def send(conn: BrokerConnection, server: Server, partitions: int,
               arrived: dict[int, asyncio.Future], timeout_ms: int | None = None) -> int:
    """Send a request (the server only needs its frame) whose answer will cover ``partitions``
    partitions; return its correlation id once the server has it."""
    cid = conn.next_correlation_id()
    header = struct.pack(">hhih", 0, VERSION, cid, 1) + b"x"
    future = arrived[cid] = asyncio.get_running_loop().create_future()

    def done(frame, error) -> None:
        future.set_result(error if error is not None else bytes(frame))

    conn.send_with_callback([struct.pack(">i", len(header)) + header], cid, done,
                            timeout_ms=timeout_ms, min_response_bytes=produce_response_min_bytes(
                                VERSION, [("t", range(partitions))]))
    assert await asyncio.wait_for(server.requests.get(), 5) == cid
    return cid


async def not_before(future: asyncio.Future, seconds: float) -> bool:
    """True if ``future`` is still pending after ``seconds``."""
    await asyncio.sleep(seconds)
    return not future.done()


def test_two_answers_wake_the_loop_once_and_a_lone_answer_at_once() -> None:
    async def scenario() -> None:
        async with talking() as (server, conn, arrived):
            first = await send(conn, server, 8, arrived)
            assert lowat(conn) == 1                  # one in flight: every byte wakes
            second = await send(conn, server, 8, arrived)
            assert lowat(conn) == 2 * len(answer(first, 8))
            await server.reply(answer(first, 8))
            assert await not_before(arrived[first], 0.3), "woken for one answer of two"
            await server.reply(answer(second, 8))
            await asyncio.wait_for(asyncio.gather(arrived[first], arrived[second]), 5)
            assert lowat(conn) == 1
            lone = await send(conn, server, 3, arrived)
            await server.reply(answer(lone, 3))
            await asyncio.wait_for(arrived[lone], 5)
            assert conn._protocol is not None and conn._protocol.bound_broken == 0

    asyncio.run(scenario())


def test_answers_of_other_sizes_never_leave_the_socket_waiting() -> None:
    """A small request behind a large one, answers longer than their bound (error texts), and
    an answer arriving in two pieces: each is delivered, none waits for bytes that never come."""
    async def scenario() -> None:
        async with talking() as (server, conn, arrived):
            big = await send(conn, server, 64, arrived)
            small = await send(conn, server, 1, arrived)
            assert lowat(conn) == len(answer(big, 64)) + len(answer(small, 1))
            await server.reply(answer(big, 64, error_text="x" * 500))   # longer than its bound
            await server.reply(answer(small, 1))
            await asyncio.wait_for(asyncio.gather(arrived[big], arrived[small]), 5)

            one = await send(conn, server, 8, arrived)
            two = await send(conn, server, 8, arrived)
            data = answer(one, 8)
            await server.reply(data[:20])
            assert await not_before(arrived[one], 0.2)
            await server.reply(data[20:])
            three = await send(conn, server, 2, arrived)    # one answer waiting in the kernel
            await server.reply(answer(two, 8) + answer(three, 2))
            await asyncio.wait_for(asyncio.gather(arrived[one], arrived[two], arrived[three]), 5)
            assert [arrived[cid].result()[:4] for cid in (one, two, three)] == [
                struct.pack(">i", cid) for cid in (one, two, three)]
            assert lowat(conn) == 1

    asyncio.run(scenario())


def test_a_connection_lost_while_waiting_fails_the_requests() -> None:
    async def scenario() -> None:
        async with talking() as (server, conn, arrived):
            first = await send(conn, server, 8, arrived)
            second = await send(conn, server, 8, arrived)
            await server.reply(answer(first, 8)[:30])      # part of one answer, then gone
            assert server.writer is not None
            server.writer.close()
            errors = await asyncio.wait_for(asyncio.gather(arrived[first], arrived[second]), 5)
            assert all(isinstance(e, BaseException) for e in errors)

    asyncio.run(scenario())


def test_an_answer_below_its_bound_turns_coalescing_off() -> None:
    """The bound is a lower bound by construction (``test_produce_response_size``); should an
    answer ever be shorter, the connection stops coalescing rather than risk waiting."""
    async def scenario() -> None:
        async with talking() as (server, conn, arrived):
            first = await send(conn, server, 8, arrived)
            second = await send(conn, server, 8, arrived)
            # The first answer covers 1 partition where 8 were announced: the two answers are
            # short of the mark (two 8-partition answers) until a third answer's bytes come.
            await server.reply(answer(first, 1) + answer(second, 8))
            await asyncio.sleep(0.3)
            assert not arrived[first].done()
            proto = conn._protocol
            assert proto is not None
            third = await send(conn, server, 8, arrived)   # its answer brings the bytes
            await server.reply(answer(third, 8))
            await asyncio.wait_for(asyncio.gather(*arrived.values()), 5)
            assert proto.bound_broken == 1 and proto._coalesce == 1 and lowat(conn) == 1

    asyncio.run(scenario())


def test_a_large_answer_wakes_the_loop_once_per_mib() -> None:
    """A 5 MiB answer written 64 KiB at a time: delivered whole after a handful of reads (each
    mark the frame's rest, at most 1 MiB), not one read per write."""
    async def scenario() -> None:
        async with talking() as (server, conn, arrived):
            proto = conn._protocol
            assert proto is not None
            reads: list[int] = []
            marks: list[int] = []
            real_update = proto.buffer_updated

            def counting(nbytes: int) -> None:
                reads.append(nbytes)
                real_update(nbytes)
                marks.append(lowat(conn))

            proto.buffer_updated = counting  # type: ignore[method-assign]
            cid = await send(conn, server, 1, arrived)
            body = struct.pack(">i", cid) + bytes(range(256)) * (5 * 4096)
            data = struct.pack(">i", len(body)) + body
            for start in range(0, len(data), 64 * 1024):
                await server.reply(data[start:start + 64 * 1024])
                await asyncio.sleep(0.002)
            frame = await asyncio.wait_for(arrived[cid], 10)
            assert frame == body
            assert len(reads) <= 12, f"{len(reads)} reads for {len(data)} bytes"
            rest = len(data)
            for nbytes, mark in zip(reads[:-1], marks[:-1], strict=True):
                rest -= nbytes
                assert mark == min(rest, _FRAME_WAKE_BYTES)   # the rest of the frame, capped
            assert marks[-1] == 1                            # delivered: every byte wakes again

    asyncio.run(scenario())


def test_an_answer_waiting_under_the_mark_is_read_when_its_deadline_passes() -> None:
    """The first answer is here, the second never comes: at the first request's deadline its
    answer is read (the mark drops), not declared lost; only the second times out."""
    async def scenario() -> None:
        async with talking() as (server, conn, arrived):
            first = await send(conn, server, 8, arrived, timeout_ms=400)
            second = await send(conn, server, 8, arrived, timeout_ms=400)
            await server.reply(answer(first, 8))
            assert await not_before(arrived[first], 0.2)
            got = await asyncio.wait_for(arrived[first], 5)
            assert got == answer(first, 8)[4:], got
            late = await asyncio.wait_for(arrived[second], 5)
            assert isinstance(late, RequestTimedOutError), late

    asyncio.run(scenario())
