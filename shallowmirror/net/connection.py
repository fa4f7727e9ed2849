"""One pipelined asyncio connection to one Kafka broker.

Contract
--------
``BrokerConnection`` owns one TCP (or TLS) connection: ``connect()`` opens it, negotiates
ApiVersions, authenticates with SASL when configured, and from then on any number of requests may
be outstanding (pipelining). Kafka answers the requests of one connection in the order they were
sent, so responses are matched against a FIFO of correlation ids: O(1) per response, and a
mismatch is a protocol violation that closes the connection.

A connection is used once: after it is closed or lost every waiter gets ``ConnectionFailedError``
and ``Cluster.connection()`` opens a new one.

Why not kafka-python's ``kafka.net``: it runs its own selector kernel (not asyncio), copies every
received chunk into a per-frame buffer and decodes every response with the schema classes. The
engine runs on asyncio and must receive Fetch responses as raw frames for the native codec. So this
module is a small asyncio layer; kafka-python supplies everything else: request/response classes
(ApiVersions, SaslHandshake, SaslAuthenticate, Metadata, ...) and the SASL mechanisms (PLAIN,
SCRAM).

Buffers (the hot path)
----------------------
Receive: ``asyncio.BufferedProtocol``, so the kernel writes into buffers we choose. Bytes land in a
256 KiB scratch buffer; a frame wholly inside it is copied out once (small frames: Metadata,
Produce responses). Once a frame of 64 KiB or more is announced, a ``bytearray`` of exactly its
size is allocated, the part already received is copied into it, and the rest is received straight
into it — large Fetch responses cost no copy beyond the kernel's. Frames are handed out as
``memoryview`` (starting at the correlation id, size prefix excluded).

Send: ``send_raw`` (or ``send_nowait``, which returns the response's future instead of awaiting
it, or ``send_with_callback``, whose callback gets the response frame on the event-loop turn that
read it: no turn for a future's callbacks) takes a sequence of buffers
(``codec.encode_produce_request`` output, or the request ``codec.encode_produce_batches`` makes).
On a plaintext connection whose transport has nothing queued it calls ``socket.sendmsg`` on them
directly — payload pieces are not joined (Python
3.11's ``transport.writelines`` would join) — and queues only what the kernel did not take. TLS
encrypts anyway, so there the pieces go through ``transport.writelines``.

Out of scope: throttling (``throttle_time_ms`` is returned to the caller untouched), KIP-368 SASL
re-authentication, GSSAPI/OAUTHBEARER.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import socket
import ssl
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

from kafka.net.sasl import get_sasl_mechanism
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from shallowmirror import codec
from shallowmirror._version import __version__
from shallowmirror.errors import (
    BrokerError,
    ConnectionFailedError,
    CorruptDataError,
    LocatedError,
    Where,
)
from shallowmirror.implementation import choose
from shallowmirror.net import sendmsg as _sendmsg_twin
from shallowmirror.net.config import ClientSettings
from shallowmirror.net.protocol import versions
from shallowmirror.net.sendmsg import BufferLike

log = logging.getLogger(__name__)


def _load_native_send():
    from shallowmirror.net import _csend

    return _csend


#: The send path's build, chosen as the codec's is ("native" or "python").
SEND_IMPLEMENTATION, _send = choose(_sendmsg_twin, _load_native_send, "send path")
send_buffers = _send.send_buffers

_SIZE = struct.Struct(">i")
#: Receive buffer for small frames and the heads of large ones.
_SCRATCH_BYTES = 256 * 1024
#: Frames at least this large are received directly into their own buffer.
_LARGE_FRAME_BYTES = 64 * 1024
#: A large frame being received wakes the event loop once this many more bytes are there (or its
#: rest, if less), not every time a few segments arrive: measured on a 16 KiB-batch mirror of
#: Kafka 3.7, ~70 wake-ups per 12 MB Fetch answer before.
_FRAME_WAKE_BYTES = 1 << 20
#: How long a request past its deadline under a raised wake mark is given once the mark is
#: dropped: its answer, if it is here, is read on the next loop turn.
_OVERDUE_GRACE_S = 0.1
_UNSUPPORTED_VERSION = 35
_UNSUPPORTED_SASL_MECHANISM = 33
_ILLEGAL_SASL_STATE = 34



class AuthenticationFailedError(LocatedError):
    """The broker rejected our credentials (SASL) or TLS verification failed: not retriable."""


class UnsupportedVersionError(LocatedError):
    """The broker supports no version of an API inside the range this code can speak."""


class RequestTimedOutError(ConnectionFailedError):
    """A request was not answered within its timeout; the connection was closed (as Kafka's
    clients do: later responses on it could no longer be trusted to arrive)."""


#: ``callback(frame, None)`` with the response, or ``callback(None, error)`` once the connection
#: failed (``send_with_callback``).
ResponseCallback = Callable[[memoryview | None, BaseException | None], None]


#: SO_RCVLOWAT makes epoll report a TCP socket readable only once that many bytes are queued; Linux
#: honours it for TCP (``tcp_poll``, and ``tcp_data_ready`` does not wake the reader before it).
_CAN_COALESCE = sys.platform.startswith("linux") and hasattr(socket, "SO_RCVLOWAT")


class _InFlight:
    """A sent request waiting for its response: a future, or a callback. ``min_bytes``: a lower
    bound of its response's size on the wire, size prefix included (0: unknown)."""

    __slots__ = ("correlation_id", "future", "deadline", "callback", "min_bytes")

    def __init__(self, correlation_id: int, future: asyncio.Future | None, deadline: float,
                 callback: ResponseCallback | None = None, min_bytes: int = 0):
        self.correlation_id = correlation_id
        self.future = future
        self.deadline = deadline
        self.callback = callback
        self.min_bytes = min_bytes


class _FrameProtocol(asyncio.BufferedProtocol):
    """Frames in, buffers out; matches responses to the FIFO of in-flight requests."""

    def __init__(self, owner: BrokerConnection, loop: asyncio.AbstractEventLoop,
                 max_frame_bytes: int):
        self._owner = owner
        self._loop = loop
        self._max_frame_bytes = max_frame_bytes
        self.transport: asyncio.Transport | None = None
        self.in_flight: collections.deque[_InFlight] = collections.deque()
        self.closed_error: ConnectionFailedError | None = None
        self._connected = loop.create_future()
        self._scratch = bytearray(_SCRATCH_BYTES)
        self._scratch_view = memoryview(self._scratch)
        self._start = 0            # first unparsed byte in scratch
        self._end = 0              # end of received bytes in scratch
        self._frame: bytearray | None = None   # large frame being received directly
        self._frame_view: memoryview | None = None
        self._frame_filled = 0
        self._timer: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future] = []
        #: Answers per wake-up (``coalesce``): 1 wakes the loop for every answer.
        self._coalesce = 1
        self._sock: socket.socket | None = None
        self._lowat = 1            # the socket's SO_RCVLOWAT as last set
        self._reading = False      # inside buffer_updated (answers' callbacks may send)
        #: The request whose deadline passed under a raised mark (``_check_timeout``).
        self._overdue: _InFlight | None = None
        #: How often the mark was raised above 1, and responses found below their bound (tests).
        self.lowat_raised = 0
        self.bound_broken = 0

    # -- asyncio callbacks ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self._connected.done():
            self._connected.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection lost ({exc})" if exc else "connection closed by the broker"
        self._fail(self._owner.error(reason, cause=exc))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame_view is not None:
            return self._frame_view[self._frame_filled:]
        if self._end == len(self._scratch):
            self._compact()
        return self._scratch_view[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        self._reading = True
        try:
            if self._frame_view is not None:
                self._frame_filled += nbytes
                if self._frame_filled == len(self._frame_view):
                    frame = self._frame_view
                    self._frame = self._frame_view = None
                    self._frame_filled = 0
                    self._deliver(frame)
            else:
                self._end += nbytes
                self._parse_scratch()
        finally:
            self._reading = False
        if self._sock is not None:
            self._update_lowat()

    def eof_received(self) -> bool | None:
        return False  # close the transport; connection_lost fails whatever is in flight

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- receive -------------------------------------------------------------------------------
    def _parse_scratch(self) -> None:
        scratch, view = self._scratch, self._scratch_view
        start, end = self._start, self._end
        while end - start >= 4:
            size = _SIZE.unpack_from(scratch, start)[0]
            if size < 4 or size > self._max_frame_bytes:
                self._start, self._end = start, end
                self._protocol_error(f"response frame size {size} is outside 4.."
                                     f"{self._max_frame_bytes} (receive.message.max.bytes)")
                return
            available = end - start - 4
            if available >= size:
                # One copy out of scratch, so scratch can be reused at once.
                frame = memoryview(bytes(view[start + 4:start + 4 + size]))
                start += 4 + size
                self._start = start
                self._deliver(frame)
                if self.closed_error is not None:
                    return
                continue
            if size >= _LARGE_FRAME_BYTES:
                # Receive the rest straight into the frame's own buffer.
                self._frame = codec.receive_buffer(size)    # not zeroed: received over
                self._frame_view = memoryview(self._frame)
                self._frame_view[:available] = view[start + 4:end]
                self._frame_filled = available
                start = end
            break
        if start == end:
            start = end = 0
        self._start, self._end = start, end

    def _compact(self) -> None:
        """Move the unparsed tail (a partial small frame) to the front of scratch."""
        start, end = self._start, self._end
        if start:
            self._scratch_view[:end - start] = self._scratch_view[start:end]
            self._start, self._end = 0, end - start

    def _deliver(self, frame: memoryview) -> None:
        if not self.in_flight:
            self._protocol_error("a response arrived with no request in flight")
            return
        waiting = self.in_flight.popleft()
        if len(frame) < 4 or _SIZE.unpack_from(frame, 0)[0] != waiting.correlation_id:
            got = _SIZE.unpack_from(frame, 0)[0] if len(frame) >= 4 else None
            self.in_flight.appendleft(waiting)
            self._protocol_error(f"response correlation id {got} does not match the oldest "
                                 f"request in flight ({waiting.correlation_id})")
            return
        if not self.in_flight and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if waiting.min_bytes > len(frame) + 4:
            self._bound_broken(waiting, len(frame) + 4)
        if waiting.callback is not None:
            waiting.callback(frame, None)      # now: no loop turn of its own (the produce path)
        elif not waiting.future.done():        # the caller may have given up (cancelled)
            waiting.future.set_result(frame)

    # -- send ----------------------------------------------------------------------------------
    def send(self, buffers: Sequence[BufferLike], correlation_id: int, expect_response: bool,
             timeout_s: float, sock: socket.socket | None,
             callback: ResponseCallback | None = None,
             min_response_bytes: int = 0) -> asyncio.Future | None:
        """Write one framed request; return the future of its response frame (None without a
        response, or when ``callback`` takes it). ``min_response_bytes``: see ``_InFlight``."""
        if self.closed_error is not None:
            raise self.closed_error
        transport = self.transport
        assert transport is not None
        future = None
        if expect_response:
            # Registered before writing: a response can only arrive after the write.
            if callback is None:
                future = self._loop.create_future()
            deadline = self._loop.time() + timeout_s
            self.in_flight.append(_InFlight(correlation_id, future, deadline, callback,
                                            min_response_bytes))
            if self._timer is None:
                self._timer = self._loop.call_at(deadline, self._check_timeout)
            if self._coalesce > 1 and self._lowat == 1 and not self._reading:
                # Only this send can raise the mark now (a request appended behind others
                # leaves the first ones' sum as it was); during a read, the read's end does.
                self._update_lowat()
        if sock is not None and transport.get_write_buffer_size() == 0:
            try:
                rest = send_buffers(sock, buffers)
            except OSError as err:       # reset or closed by the broker under the write
                if expect_response:
                    self.in_flight.pop()  # this request: its caller gets the raise instead
                self._fail(self._owner.error(f"connection lost while sending: {err}"))
                assert self.closed_error is not None
                raise self.closed_error from err
            if rest:
                transport.write(b"".join(rest))  # only what the kernel did not take
        elif len(buffers) == 1:
            transport.write(buffers[0])
        else:
            transport.writelines(buffers)
        return future

    async def drain(self) -> None:
        if self._write_paused and self.closed_error is None:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    # -- fewer wake-ups ------------------------------------------------------------------------
    def use_wake_marks(self, sock: socket.socket) -> None:
        """Let this (plaintext) connection's ``sock`` wake the loop only when enough bytes are
        there (SO_RCVLOWAT; Linux only, else nothing changes): the rest of a large frame up to
        ``_FRAME_WAKE_BYTES`` at a time, and with ``coalesce`` several answers at once."""
        if _CAN_COALESCE:
            self._sock = sock

    def coalesce(self, answers: int) -> None:
        """Wake the event loop once ``answers`` responses have arrived, not for each, while at
        least that many requests of known response size are in flight. A wake-up is the
        costliest part of a small request on a busy host (context switch, cold caches):
        measured on Kafka 3.7 with 8 x 6 KB batches per Produce request, 61 -> 40 us of the
        client's CPU per request at 2 (``benchmarks/engine/request_floor.py``)."""
        self._coalesce = max(1, answers) if self._sock is not None else 1
        self._update_lowat()

    def _bound_broken(self, waiting: _InFlight, got: int) -> None:
        """A response shorter than its request's lower bound: a bug in that bound, which could
        leave the socket waiting for bytes that never come. Stop coalescing on this connection."""
        if self._coalesce > 1:
            log.warning("%s: response %d is %d bytes, below the %d expected; answers are no "
                        "longer coalesced on this connection", self._owner.address,
                        waiting.correlation_id, got, waiting.min_bytes)
        self.bound_broken += 1
        self._coalesce = 1
        self._update_lowat()

    def _update_lowat(self) -> None:
        """Set SO_RCVLOWAT to bytes that must still arrive anyway before anything can be done
        with them. Inside a large frame: its rest, at most ``_FRAME_WAKE_BYTES`` (the frame is
        only delivered whole; the loop woke every ~180 KB of a Fetch answer before). Else,
        before the first ``_coalesce`` responses in flight are all here: their sizes' lower
        bounds, less what of the first is already received. Never more than will certainly
        come, so the socket always becomes readable: 1 (every byte wakes) unless one of these
        applies. A closed or reset connection is readable whatever the mark."""
        if self._sock is None:
            return
        want = 1
        n = self._coalesce
        if self._frame_view is not None:
            want = min(len(self._frame_view) - self._frame_filled, _FRAME_WAKE_BYTES)
        elif (n > 1 and len(self.in_flight) >= n and self.closed_error is None
              and self.in_flight[0] is not self._overdue):
            need = 0
            for waiting in self.in_flight:
                if waiting.min_bytes <= 0:
                    need = 0
                    break
                need += waiting.min_bytes
                n -= 1
                if n == 0:
                    break
            if need:
                want = max(1, need - (self._end - self._start))   # less what is held
        if want != self._lowat:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            except OSError:
                return          # closed under us: connection_lost follows
            if want > 1:
                self.lowat_raised += 1
            self._lowat = want

    # -- failure -------------------------------------------------------------------------------
    def _check_timeout(self) -> None:
        self._timer = None
        if not self.in_flight or self.closed_error is not None:
            return
        head = self.in_flight[0]
        now = self._loop.time()
        if head.deadline > now:
            # Responses come in order: the head's deadline is the next that can expire.
            self._timer = self._loop.call_at(head.deadline, self._check_timeout)
            return
        if self._lowat > 1 and head is not self._overdue:
            # Its answer may be here, under a wake mark that counts on the next answer too
            # (which may be late: a broker answers one request per connection at a time). Read
            # what is there before calling it lost: the mark drops to 1 for this request, and
            # the kernel signals the socket at once if bytes are waiting.
            self._overdue = head
            self._update_lowat()
            self._timer = self._loop.call_at(now + _OVERDUE_GRACE_S, self._check_timeout)
            return
        waited = self._owner.settings.request_timeout_ms
        err = self._owner.error(
            f"no response to request {head.correlation_id} within its timeout "
            f"(request.timeout.ms={waited}); closing the connection",
            kind=RequestTimedOutError)
        self._fail(err)

    def _protocol_error(self, message: str) -> None:
        self._fail(self._owner.error(f"protocol error: {message}; closing the connection"))

    def _fail(self, err: ConnectionFailedError) -> None:
        """Close the connection and fail every waiter with ``err`` (first error wins)."""
        if self.closed_error is None:
            self.closed_error = err
        if not self._connected.done():
            self._connected.set_exception(err)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self.in_flight:
            waiting = self.in_flight.popleft()
            if waiting.callback is not None:
                # A later turn, as a future's callbacks would run: _fail may be running inside
                # the caller's own send, which raises the error to it as well.
                self._loop.call_soon(waiting.callback, None, self.closed_error)
            elif not waiting.future.done():
                waiting.future.set_exception(self.closed_error)
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(self.closed_error)
        self._drain_waiters = []
        self._frame = self._frame_view = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


#: Appended to connection errors by phase: what a failure at that step usually means.
_PHASE_HINTS = {
    "tls": "during the TLS handshake; does {conn.address} speak TLS? "
           "(security.protocol={settings.security_protocol})",
    "api_versions": "before ApiVersions was answered; if the listener expects TLS or SASL, "
                    "check security.protocol (now {settings.security_protocol})",
    "sasl": "during SASL {settings.sasl_mechanism} authentication; does the listener accept "
            "SASL {settings.sasl_mechanism}? (check sasl.mechanism)",
}


class BrokerConnection:
    """One TCP/TLS connection to one broker: connect, negotiate versions, pipeline requests."""

    def __init__(self, host: str, port: int, settings: ClientSettings, node_id: int = -1):
        self.host = host
        self.port = port
        self.node_id = node_id
        self.settings = settings
        self.client_id = settings.client_id
        self.api_versions: dict[int, tuple[int, int]] = {}
        self._protocol: _FrameProtocol | None = None
        self._sock: socket.socket | None = None
        self._correlation_id = 0
        self._closing = False
        #: What connect() is doing, for error messages: tcp, tls, api_versions, sasl, ready.
        self.phase = "new"

    def __repr__(self) -> str:
        state = "connected" if self.connected else "not connected"
        return (f"<BrokerConnection cluster={self.settings.alias} node={self.node_id} "
                f"{self.host}:{self.port} {state} in_flight={self.in_flight}>")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        """True while requests can be sent (open, versions negotiated, authenticated)."""
        proto = self._protocol
        return (proto is not None and proto.closed_error is None and bool(self.api_versions)
                and not self._closing)

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._protocol.in_flight) if self._protocol is not None else 0

    def error(self, reason: str, *, cause: BaseException | None = None,
              kind: type[ConnectionFailedError] = ConnectionFailedError) -> ConnectionFailedError:
        """A connection error naming cluster and broker; ``detail`` holds the bare reason."""
        node = f" (node {self.node_id})" if self.node_id >= 0 else ""
        hint = _PHASE_HINTS.get(self.phase)
        if hint:
            reason = f"{reason} {hint.format(conn=self, settings=self.settings)}"
        err = kind(f"broker {self.address}{node}: {reason}", Where(cluster=self.settings.alias))
        err.detail = reason  # type: ignore[attr-defined]
        if cause is not None:
            err.__cause__ = cause
        return err

    # -- lifecycle -----------------------------------------------------------------------------
    async def connect(self) -> None:
        """Open TCP (+TLS), negotiate ApiVersions, authenticate with SASL if configured.

        Raises ``ConnectionFailedError`` (retriable: refused, timed out, dropped) or
        ``AuthenticationFailedError`` (not retriable: bad credentials, TLS verification)."""
        timeout_s = self.settings.connection_setup_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                await self._open()
                self.phase = "api_versions"
                await self._negotiate_api_versions()
                if self.settings.uses_sasl:
                    self.phase = "sasl"
                    await self._authenticate()
                self.phase = "ready"
        except TimeoutError as err:
            await self.close()
            raise self.error(f"no connection within {timeout_s:g}s "
                             "(socket.connection.setup.timeout.ms)", cause=err) from err
        except ssl.SSLCertVerificationError as err:
            await self.close()
            raise AuthenticationFailedError(
                f"broker {self.address}: TLS certificate not accepted: {err.verify_message} "
                "(check ssl.ca.location / ssl.endpoint.identification.algorithm)",
                Where(cluster=self.settings.alias)) from err
        except ssl.SSLError as err:
            await self.close()
            raise self.error(f"TLS handshake failed ({err.reason or err}); does the listener "
                             f"speak {self.settings.security_protocol}?", cause=err) from err
        except OSError as err:
            await self.close()
            # asyncio's sock_connect puts "Connect call failed (...)" in strerror: prefer the
            # errno's own words ("Connection refused"), which is what an operator searches for.
            reason = os.strerror(err.errno) if err.errno else (str(err) or type(err).__name__)
            raise self.error(reason, cause=err) from err
        except BaseException:
            await self.close()
            raise

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        last_err: OSError | None = None
        self.phase = "tcp"
        for family, type_, proto, _, address in infos:
            sock = socket.socket(family, type_, proto)
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, address)
            except OSError as err:
                sock.close()
                last_err = err
                continue
            except BaseException:
                sock.close()
                raise
            break
        else:
            raise last_err or OSError(f"no address for {self.host}")
        settings = self.settings
        context = settings.ssl_context if settings.uses_ssl else None
        protocol = _FrameProtocol(self, loop, settings.receive_message_max_bytes)
        if context is not None:
            self.phase = "tls"
        try:
            await loop.create_connection(
                lambda: protocol, sock=sock, ssl=context,
                server_hostname=self.host if context is not None else None)
        except BaseException:
            sock.close()
            raise
        self._protocol = protocol
        # Direct sendmsg only without TLS: with TLS the socket carries ciphertext. Wake marks
        # (SO_RCVLOWAT) likewise count plaintext bytes.
        self._sock = sock if context is None else None
        if context is None:
            protocol.use_wake_marks(sock)

    async def _negotiate_api_versions(self) -> None:
        version = ApiVersionsRequest.max_version
        for _ in range(3):
            request = ApiVersionsRequest(client_software_name="shallowmirror",
                                         client_software_version=software_version(),
                                         version=version)
            response = await self.request(request)
            if response.error_code == 0:
                break
            if response.error_code == _UNSUPPORTED_VERSION:
                # The broker answers in v0 and lists the ApiVersions range it speaks.
                ranges = {k.api_key: k.max_version for k in response.api_keys}
                version = min(version - 1, ranges.get(ApiVersionsRequest.API_KEY, 0))
                if version < 0:
                    break
                continue
            raise BrokerError(response.error_code, Where(cluster=self.settings.alias),
                              f"ApiVersions from {self.address}")
        if response.error_code:
            raise BrokerError(response.error_code, Where(cluster=self.settings.alias),
                              f"ApiVersions from {self.address}")
        self.api_versions = {k.api_key: (k.min_version, k.max_version)
                             for k in response.api_keys}
        log.debug("cluster %s: %s speaks %d APIs (ApiVersions v%d)", self.settings.alias,
                  self.address, len(self.api_versions), version)

    async def _authenticate(self) -> None:
        settings = self.settings
        mechanism_name = settings.sasl_mechanism
        where = Where(cluster=settings.alias)
        handshake_version = self.api_version(SaslHandshakeRequest.API_KEY,
                                             versions(SaslHandshakeRequest.API_KEY))
        handshake = await self.request(SaslHandshakeRequest(mechanism=mechanism_name,
                                                            version=handshake_version))
        if handshake.error_code == _UNSUPPORTED_SASL_MECHANISM:
            raise AuthenticationFailedError(
                f"broker {self.address} does not offer SASL {mechanism_name}; it offers "
                f"{', '.join(handshake.mechanisms) or 'none'} (check sasl.mechanism)", where)
        if handshake.error_code:
            raise BrokerError(handshake.error_code, where, f"SaslHandshake with {self.address}")
        mechanism = get_sasl_mechanism(mechanism_name)(
            sasl_mechanism=mechanism_name, sasl_plain_username=settings.sasl_username,
            sasl_plain_password=settings.sasl_password, host=self.host,
            security_protocol=settings.security_protocol)
        auth_version = self.api_version(SaslAuthenticateRequest.API_KEY,
                                        versions(SaslAuthenticateRequest.API_KEY))
        while not mechanism.is_done():
            response = await self.request(SaslAuthenticateRequest(
                auth_bytes=mechanism.auth_bytes(), version=auth_version))
            if response.error_code:
                name = BrokerError(response.error_code).name
                raise AuthenticationFailedError(
                    f"broker {self.address} rejected SASL {mechanism_name} login as "
                    f"{settings.sasl_username!r}: {name}: {response.error_message or ''}".rstrip(
                        ": "), where)
            try:
                mechanism.receive(response.auth_bytes)
            except Exception as err:  # SCRAM raises on a bad server signature or nonce
                said = bytes(response.auth_bytes or b"")
                # RFC 5802: a server-final "e=..." names the failure (e.g. unknown-user).
                detail = (said[2:].decode("utf-8", "replace") if said.startswith(b"e=")
                          else f"{type(err).__name__}: {err}")
                raise AuthenticationFailedError(
                    f"broker {self.address} rejected SASL {mechanism_name} login as "
                    f"{settings.sasl_username!r}: {detail}", where) from err
        if not mechanism.is_authenticated():
            raise AuthenticationFailedError(
                f"broker {self.address}: SASL {mechanism_name} login as "
                f"{settings.sasl_username!r} was not accepted", where)
        log.debug("cluster %s: %s: %s", settings.alias, self.address, mechanism.auth_details())

    async def close(self) -> None:
        """Close the connection; requests still in flight fail with ConnectionFailedError."""
        self._closing = True
        proto = self._protocol
        if proto is not None and proto.closed_error is None:
            proto._fail(self.error("connection closed by shallowmirror"))
        self._sock = None

    # -- versions ------------------------------------------------------------------------------
    def api_version(self, api_key: int, wanted: tuple[int, int]) -> int:
        """Highest version of ``api_key`` inside ``wanted`` (min, max) that the broker speaks."""
        broker = self.api_versions.get(api_key)
        low, high = wanted
        if broker is not None:
            best = min(high, broker[1])
            if best >= max(low, broker[0]):
                return best
        spoken = f"{broker[0]}..{broker[1]}" if broker else "none"
        raise UnsupportedVersionError(
            f"broker {self.address} speaks versions {spoken} of API {_api_name(api_key)} "
            f"(key {api_key}); shallowmirror needs {low}..{high}",
            Where(cluster=self.settings.alias))

    # -- requests ------------------------------------------------------------------------------
    def next_correlation_id(self) -> int:
        """A fresh correlation id (wraps at 2**31)."""
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        return self._correlation_id

    async def request(self, req: Any, timeout_ms: int | None = None) -> Any:
        """Send a kafka-python request; return its decoded kafka-python response.

        An unset ``req`` version becomes the highest both sides speak. Error codes inside the
        response are the caller's to read (``BrokerError`` for those it cannot handle)."""
        frame = await self.request_frame(req, timeout_ms)
        if frame is None:
            return None
        header = req.header
        response_class = header.get_response_class()
        try:
            return response_class.decode(frame, version=req.API_VERSION, header=True)
        except Exception as err:
            raise CorruptDataError(
                f"cannot decode {type(req).__name__.split('_v')[0]} v{req.API_VERSION} response "
                f"from {self.address}: {err}", Where(cluster=self.settings.alias)) from err

    async def request_frame(self, req: Any, timeout_ms: int | None = None) -> memoryview | None:
        """Send a kafka-python request; return the raw response frame (from the correlation id).

        Used for Fetch, whose responses the native codec decodes."""
        if req.API_VERSION is None:
            req.API_VERSION = self.api_version(req.API_KEY, (0, req.max_version))
        correlation_id = self.next_correlation_id()
        req.with_header(correlation_id=correlation_id, client_id=self.client_id)
        data = req.encode(header=True, framed=True)
        return await self.send_raw([data], correlation_id, req.expect_response(), timeout_ms)

    async def send_raw(self, buffers: Sequence[BufferLike], correlation_id: int,
                       expect_response: bool = True,
                       timeout_ms: int | None = None) -> memoryview | None:
        """Write a complete framed request given as buffer pieces; return the response frame.

        ``correlation_id`` must be the one encoded in the request (from ``next_correlation_id``).
        Pieces are not copied on plaintext connections unless the socket is full. With
        ``expect_response=False`` (acks=0) returns None once the bytes are handed over."""
        if expect_response:
            return await self.send_nowait(buffers, correlation_id, timeout_ms)
        proto = self._live_protocol()
        proto.send(buffers, correlation_id, False, 0.0, self._sock)
        await proto.drain()
        return None

    def send_nowait(self, buffers: Sequence[BufferLike], correlation_id: int,
                    timeout_ms: int | None = None) -> asyncio.Future:
        """``send_raw`` without the await, for callers that are not coroutines (the produce hot
        path, which saves a task per request): write the request now and return the future of
        its response frame. It fails with ``ConnectionFailedError`` as ``send_raw`` raises it;
        this call raises it when the connection is already gone or breaks under the write."""
        proto = self._live_protocol()
        timeout_s = (self.settings.request_timeout_ms if timeout_ms is None else timeout_ms) / 1000
        future = proto.send(buffers, correlation_id, True, timeout_s, self._sock)
        assert future is not None
        return future

    def send_with_callback(self, buffers: Sequence[BufferLike], correlation_id: int,
                           callback: ResponseCallback, timeout_ms: int | None = None,
                           min_response_bytes: int = 0) -> None:
        """``send_nowait`` without a future: ``callback(frame, None)`` runs on the loop turn that
        read the response (no further turn for a future's callbacks), ``callback(None, error)``
        on a later turn once the connection failed or the request timed out. Raises
        ``ConnectionFailedError`` when the connection is already gone or breaks under the write;
        the callback is then never called."""
        proto = self._live_protocol()
        timeout_s = (self.settings.request_timeout_ms if timeout_ms is None else timeout_ms) / 1000
        proto.send(buffers, correlation_id, True, timeout_s, self._sock, callback,
                   min_response_bytes)

    def coalesce_answers(self, answers: int) -> None:
        """Wake for every ``answers`` responses rather than each (see ``_FrameProtocol.coalesce``);
        requests sent with ``min_response_bytes`` are the ones counted."""
        self._live_protocol().coalesce(answers)

    def _live_protocol(self) -> _FrameProtocol:
        proto = self._protocol
        if proto is None:
            raise self.error("not connected (call connect() first)")
        if proto.closed_error is not None:
            raise proto.closed_error
        return proto


def _api_name(api_key: int) -> str:
    try:
        from kafka.protocol.api_key import ApiKey

        return ApiKey(api_key).name
    except Exception:
        return str(api_key)


def software_version(version: str = __version__) -> str:
    r"""Our version as ApiVersions v3+ requires it: brokers reject anything outside
    ``[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?`` with INVALID_REQUEST (a PEP 440 local version
    such as ``0.2.0+g1234`` would fail every connection)."""
    cleaned = re.sub(r"[^a-zA-Z0-9.\-]", "-", version).strip(".-")
    return cleaned or "unknown"
