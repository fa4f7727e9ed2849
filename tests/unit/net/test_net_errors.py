"""Connection error paths a real broker cannot be made to produce, against the scripted FAKE broker
(shallowmirror/testing/fake_cluster.py). Behaviour with real brokers: tests/integration/test_net.py."""

from __future__ import annotations

import asyncio
import logging
import struct

import pytest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from shallowmirror.errors import ConnectionFailedError
from shallowmirror.net import (
    AuthenticationFailedError,
    BrokerConnection,
    Cluster,
    RequestTimedOutError,
    UnsupportedVersionError,
    client_settings,
)
from shallowmirror.testing.fake_cluster import (
    CLOSE,
    FakeBroker,
    FakeRequest,
    api_versions_response,
    default_handler,
    encode_response,
)


def _settings(port: int, **extra: str):
    return client_settings({"bootstrap.servers": f"127.0.0.1:{port}", **extra}, "A")


def _metadata(version: int = 12):
    return MetadataRequest(topics=None, allow_auto_topic_creation=False, version=version)


def test_request_unanswered_times_out_and_fails_everything_in_flight():
    async def main():
        def handler(req: FakeRequest):
            if req.api_key == 18:
                return api_versions_response(req.correlation_id)
            return None  # never answer Metadata

        async with FakeBroker(handler) as fake:
            conn = BrokerConnection("127.0.0.1", fake.port,
                                    _settings(fake.port, **{"request.timeout.ms": "200"}))
            await conn.connect()
            first = asyncio.ensure_future(conn.request(_metadata()))
            second = asyncio.ensure_future(conn.request(_metadata(), timeout_ms=60000))
            with pytest.raises(RequestTimedOutError) as info:
                await first
            # Kafka's clients close the connection on a timeout: the later request fails too.
            with pytest.raises(ConnectionFailedError):
                await second
            assert "request.timeout.ms=200" in str(info.value)
            assert "cluster A" in str(info.value)
            assert not conn.connected
            assert conn.in_flight == 0

    asyncio.run(main())


def test_wrong_correlation_id_is_a_protocol_error():
    async def main():
        def handler(req: FakeRequest):
            if req.api_key == 18:
                return api_versions_response(req.correlation_id)
            return struct.pack(">i", req.correlation_id + 7) + b"\0" * 20

        async with FakeBroker(handler) as fake:
            conn = BrokerConnection("127.0.0.1", fake.port, _settings(fake.port))
            await conn.connect()
            with pytest.raises(ConnectionFailedError, match="correlation id"):
                await conn.request(_metadata())
            assert not conn.connected

    asyncio.run(main())


def test_absurd_frame_size_is_a_protocol_error():
    async def main():
        sent = []

        def handler(req: FakeRequest):
            if req.api_key == 18:
                return api_versions_response(req.correlation_id)
            sent.append(req)
            return None

        async with FakeBroker(handler) as fake:
            conn = BrokerConnection("127.0.0.1", fake.port, _settings(
                fake.port, **{"receive.message.max.bytes": "4096"}))
            await conn.connect()
            pending = asyncio.ensure_future(conn.request(_metadata()))
            while not sent:
                await asyncio.sleep(0.01)
            # Write a frame header announcing 1 MB behind the fake's back.
            writer = fake._writers[0]
            writer.write(struct.pack(">i", 1 << 20))
            with pytest.raises(ConnectionFailedError, match="receive.message.max.bytes"):
                await pending

    asyncio.run(main())


def test_api_versions_downgrades_when_the_broker_refuses_our_version():
    async def main():
        def handler(req: FakeRequest):
            if req.api_key == 18 and req.api_version > 2:
                # Kafka answers an unknown ApiVersions version in v0 with error 35.
                return api_versions_response(req.correlation_id, version=0, error_code=35,
                                             keys={18: (0, 2)})
            return default_handler(lambda: fake.port)(req)

        async with FakeBroker(handler) as fake:
            conn = BrokerConnection("127.0.0.1", fake.port, _settings(fake.port))
            await conn.connect()
            seen = [r.api_version for r in fake.requests if r.api_key == 18]
            assert seen[0] > 2 and seen[-1] == 2
            assert conn.api_version(3, (1, 20)) == 12
            with pytest.raises(UnsupportedVersionError, match="Metadata"):
                conn.api_version(3, (13, 15))
            await conn.close()

    asyncio.run(main())


def _sasl_handler(handshake_error: int, auth_error: int, port_of):
    def handler(req: FakeRequest):
        if req.api_key == 17:
            return encode_response(SaslHandshakeResponse(
                error_code=handshake_error, mechanisms=["SCRAM-SHA-512"],
                version=req.api_version), req.correlation_id)
        if req.api_key == 36:
            return encode_response(SaslAuthenticateResponse(
                error_code=auth_error, error_message="Invalid username or password",
                auth_bytes=b"", session_lifetime_ms=0, version=req.api_version),
                req.correlation_id)
        return default_handler(port_of)(req)

    return handler


def test_unsupported_sasl_mechanism_is_not_retried(caplog):
    async def main():
        fake = FakeBroker()
        fake.handler = _sasl_handler(33, 0, lambda: fake.port)
        async with fake:
            cluster = Cluster({"bootstrap.servers": fake.bootstrap,
                               "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                               "sasl.username": "u", "sasl.password": "p"}, "A")
            with pytest.raises(AuthenticationFailedError) as info:
                await cluster.start()
            await cluster.close()
            assert fake.connections == 1
            message = str(info.value)
            assert "does not offer SASL PLAIN" in message and "SCRAM-SHA-512" in message
            assert "cluster A" in message

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert "retrying" not in caplog.text


def test_rejected_password_is_a_clear_non_retriable_error():
    async def main():
        fake = FakeBroker()
        fake.handler = _sasl_handler(0, 58, lambda: fake.port)
        async with fake:
            cluster = Cluster({"bootstrap.servers": fake.bootstrap,
                               "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                               "sasl.username": "alice", "sasl.password": "wrong"}, "A")
            with pytest.raises(AuthenticationFailedError) as info:
                await cluster.start()
            await cluster.close()
            assert fake.connections == 1
            message = str(info.value)
            assert "'alice'" in message and "SASL_AUTHENTICATION_FAILED" in message
            assert "Invalid username or password" in message

    asyncio.run(main())


def test_broker_dropping_every_connection_gives_up_at_the_deadline(caplog):
    async def main():
        async with FakeBroker(lambda req: CLOSE) as fake:
            cluster = Cluster({"bootstrap.servers": fake.bootstrap,
                               "reconnect.deadline.ms": "300", "reconnect.backoff.ms": "20"}, "A")
            with pytest.raises(ConnectionFailedError) as info:
                await cluster.start()
            await cluster.close()
            assert fake.connections >= 2
            assert fake.bootstrap in str(info.value) and "cluster A" in str(info.value)
            assert "ApiVersions" in str(info.value)  # the phase hint

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert "cluster A: cannot reach 127.0.0.1:" in caplog.text and "retrying in" in caplog.text


def test_an_unreachable_broker_is_one_warning_per_interval_not_one_per_attempt(caplog):
    """Retried about once a second for up to two minutes: a warning every
    RETRY_WARNING_INTERVAL_S, naming the attempts so far; every other attempt goes to debug."""
    import socket

    from shallowmirror.net import cluster as cluster_module

    with socket.socket() as s:          # a port nobody listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

        async def main():
            cluster = Cluster({"bootstrap.servers": f"127.0.0.1:{port}",
                               "reconnect.deadline.ms": "1500", "reconnect.backoff.ms": "20",
                               "reconnect.backoff.max.ms": "40"}, "A")
            with pytest.raises(ConnectionFailedError) as info:
                await cluster.start()
            await cluster.close()
            return info.value

        caplog.set_level(logging.DEBUG, logger=cluster_module.__name__)
        err = asyncio.run(main())
    retries = [r for r in caplog.records if "retrying in" in r.getMessage()]
    warnings = [r for r in retries if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and len(retries) >= 10, [r.getMessage() for r in retries]
    assert warnings[0].getMessage().startswith(f"cluster A: cannot reach 127.0.0.1:{port} ")
    assert "gave up after" in str(err)
