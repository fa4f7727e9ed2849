"""A scripted FAKE Kafka broker — only for error paths a real broker cannot be made to produce.

Real behaviour is tested against real brokers (tests/integration/test_net.py). This fake exists for
what tansu (or any healthy broker) will not do on demand: never answer, answer with the wrong
correlation id or an absurd frame size, refuse an ApiVersions version, reject a SASL mechanism or a
PLAIN password with a proper error code.

A handler gets each request (api key, version, correlation id, body) and returns the response
frame (without the size prefix, starting at the correlation id), ``None`` to stay silent, or
``CLOSE`` to drop the connection. Responses are encoded with kafka-python's protocol classes.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse

CLOSE = object()


@dataclass
class FakeRequest:
    api_key: int
    api_version: int
    correlation_id: int
    body: bytes          # after the request header's client id (tagged fields not stripped)


Handler = Callable[[FakeRequest], Any]


def encode_response(response: Any, correlation_id: int) -> bytes:
    """A kafka-python response object as a frame body (no size prefix)."""
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True))


def api_versions_response(correlation_id: int, version: int = 3, error_code: int = 0,
                          keys: dict[int, tuple[int, int]] | None = None) -> bytes:
    """ApiVersions answer listing ``keys`` (default: ApiVersions 0..3, Metadata 0..12,
    SaslHandshake 0..1, SaslAuthenticate 0..2)."""
    keys = keys or {18: (0, 3), 3: (0, 12), 17: (0, 1), 36: (0, 2)}
    entries = [ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
               for k, (lo, hi) in keys.items()]
    return encode_response(ApiVersionsResponse(error_code=error_code, api_keys=entries,
                                               throttle_time_ms=0, version=version),
                           correlation_id)


def metadata_response(correlation_id: int, version: int, port: int) -> bytes:
    """Metadata answer with one broker (node 1 on 127.0.0.1:port) and no topics."""
    broker = MetadataResponse.MetadataResponseBroker(node_id=1, host="127.0.0.1", port=port,
                                                     rack=None)
    return encode_response(MetadataResponse(throttle_time_ms=0, brokers=[broker],
                                            cluster_id="fake", controller_id=1, topics=[],
                                            version=version), correlation_id)


def default_handler(port_of: Callable[[], int]) -> Handler:
    """Answers ApiVersions and Metadata like a healthy one-broker cluster."""

    def handle(req: FakeRequest) -> Any:
        if req.api_key == 18:
            return api_versions_response(req.correlation_id, min(req.api_version, 3))
        if req.api_key == 3:
            return metadata_response(req.correlation_id, req.api_version, port_of())
        return CLOSE

    return handle


class FakeBroker:
    """Scripted broker on 127.0.0.1:<free port>; ``requests`` records what it received."""

    def __init__(self, handler: Handler | None = None):
        self.handler = handler or default_handler(lambda: self.port)
        self.requests: list[FakeRequest] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> FakeBroker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                frame = await reader.readexactly(size)
                api_key, api_version, correlation_id, id_len = struct.unpack_from(">hhih", frame)
                body = frame[10 + max(id_len, 0):]
                request = FakeRequest(api_key, api_version, correlation_id, body)
                self.requests.append(request)
                answer = self.handler(request)
                if answer is CLOSE:
                    break
                if answer is not None:
                    writer.write(struct.pack(">i", len(answer)) + answer)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
