"""shallowmirror.net against real brokers of the session's flavor (embedded tansu or Apache
Kafka), or an external cluster from SHALLOWMIRROR_SOURCE_BOOTSTRAP (tests that stop, restart or
reconfigure a broker need brokers this session starts and are skipped otherwise).

TLS: tansu 0.6 accepts --cert but still serves plaintext, so TLS is tested through a small
TLS-terminating proxy (asyncio, in this file) in front of a real broker that advertises the
proxy's port. SASL: tansu --authentication speaks SCRAM but with memory storage no user can be
created, so only rejection is tested on it; on Kafka a SASL_PLAINTEXT listener with SCRAM only
serves the same rejection tests (the issue-10 SASL tests log in for real).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest, MetadataResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from shallowmirror import codec
from shallowmirror.errors import BrokerError, ConnectionFailedError
from shallowmirror.net import AuthenticationFailedError, Cluster, UnsupportedVersionError
from shallowmirror.testing import kafka as kafka_brokers
from shallowmirror.testing.clusters import broker_flavor, start_one
from shallowmirror.testing.embedded import (
    api_versions_ok,
    external_from_env,
    find_tansu,
    free_port,
)
from shallowmirror.testing.topics import wait_for_partitions

pytestmark = pytest.mark.integration

NEEDS_EMBEDDED = pytest.mark.skipif(
    external_from_env() is not None,
    reason="starts brokers with extra listeners or flags: needs brokers this session starts")
FLAVOR = broker_flavor()


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    external = external_from_env()
    if external is not None:
        yield external[0].bootstrap
        return
    cluster = start_one(FLAVOR, "net", log_dir=tmp_path_factory.mktemp("net"))
    try:
        yield cluster.bootstrap
    finally:
        cluster.stop()


def _create_topics(bootstrap: str, topics: dict[str, int], **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=configs)
                                   for name, partitions in topics.items()])
    for future in futures.values():
        future.result(30)
    for name, partitions in topics.items():      # Kafka's metadata cache lags the create a little
        assert wait_for_partitions(admin, name, partitions), f"{name} has no leaders after 15 s"


def _topic(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


def _config(bootstrap: str, **extra: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, "client.id": "test-net", **extra}


def test_api_versions_negotiated(bootstrap):
    async def main():
        async with Cluster(_config(bootstrap), "A") as cluster:
            conn = await cluster.any_connection()
            for api_key in (0, 1, 3, 18):  # Produce, Fetch, Metadata, ApiVersions
                assert api_key in conn.api_versions
            low, high = conn.api_versions[3]
            assert conn.api_version(3, (1, 12)) == min(12, high)
            assert conn.api_version(3, (0, 1)) == 1
            with pytest.raises(UnsupportedVersionError, match="Metadata"):
                conn.api_version(3, (high + 1, high + 5))
            # An unset request version becomes the highest both sides speak.
            response = await conn.request(ApiVersionsRequest(
                client_software_name="t", client_software_version="1"))
            assert response.error_code == 0
            assert response.version == min(ApiVersionsRequest.max_version,
                                            conn.api_versions[18][1])

    asyncio.run(main())


def test_metadata_for_created_topics_and_leaders(bootstrap):
    three, one, missing = _topic("three"), _topic("one"), _topic("missing")
    _create_topics(bootstrap, {three: 3, one: 1})

    async def main():
        async with Cluster(_config(bootstrap), "A") as cluster:
            assert cluster.cluster_id
            assert cluster.brokers
            meta = await cluster.refresh_metadata([three, one, missing])
            assert meta is cluster.metadata
            assert cluster.partitions(three) == [0, 1, 2]
            assert cluster.partitions(one) == [0]
            for partition in range(3):
                assert cluster.leader(three, partition) in cluster.brokers
            assert cluster.leader(three, 7) is None
            # Unknown topics are reported, not created (allow_auto_topic_creation=False).
            assert cluster.partitions(missing) is None
            assert cluster.topic_error(missing).name == "UNKNOWN_TOPIC_OR_PARTITION"
            await cluster.refresh_metadata([missing])
            assert cluster.partitions(missing) is None
            with pytest.raises(BrokerError) as info:
                await cluster.leader_connection(missing, 0)
            assert info.value.code == 3 and info.value.where.topic == missing
            # Leader lookup lands on the leader's own connection, reused.
            conn = await cluster.leader_connection(three, 1)
            assert conn.node_id == cluster.leader(three, 1)
            assert (conn.host, conn.port) == (cluster.brokers[conn.node_id].host,
                                              cluster.brokers[conn.node_id].port)
            assert await cluster.leader_connection(three, 1) is conn
            # A refresh of one topic keeps the others cached.
            await cluster.refresh_metadata([one])
            assert cluster.partitions(three) == [0, 1, 2]
            # All topics: both created topics listed.
            everything = await cluster.refresh_metadata()
            assert {three, one} <= set(everything.topics)
            assert missing not in everything.topics

    asyncio.run(main())


def test_concurrent_refreshes_share_one_request(bootstrap):
    topic = _topic("shared")
    _create_topics(bootstrap, {topic: 2})

    async def main():
        async with Cluster(_config(bootstrap), "A") as cluster:
            conn = await cluster.any_connection()
            before = conn.next_correlation_id()
            await asyncio.gather(*[cluster.refresh_metadata([topic]) for _ in range(20)])
            used = conn.next_correlation_id() - before - 1
            assert used == 1
            assert cluster.partitions(topic) == [0, 1]

    asyncio.run(main())


def test_pipelined_requests_all_answered_and_matched(bootstrap):
    async def main():
        async with Cluster(_config(bootstrap), "A") as cluster:
            conn = await cluster.any_connection()
            version = conn.api_version(3, (4, 12))
            names = [f"pipelined-{i}-{os.getpid()}" for i in range(50)]
            seen: list[int] = []
            tasks = [asyncio.ensure_future(conn.request(MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=name)],
                allow_auto_topic_creation=False, version=version))) for name in names]
            # Runs in the same loop iteration right after the 50 tasks wrote their requests,
            # before any response can be read.
            asyncio.get_running_loop().call_soon(lambda: seen.append(conn.in_flight))
            responses = await asyncio.gather(*tasks)
            assert seen == [50]
            # Each response echoes the topic its own request asked for.
            assert [r.topics[0].name for r in responses] == names
            assert all(r.topics[0].error_code == 3 for r in responses)
            assert conn.in_flight == 0

    asyncio.run(main())


def test_send_raw_with_many_pieces_beyond_iov_max(bootstrap):
    """A Metadata request for 1500 topics sent as ~30000 tiny pieces (sendmsg in chunks)."""

    async def main():
        async with Cluster(_config(bootstrap), "A") as cluster:
            conn = await cluster.any_connection()
            version = conn.api_version(3, (4, 12))
            names = [f"iov-{i:05d}" for i in range(1500)]
            request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=n)
                                              for n in names],
                                      allow_auto_topic_creation=False, version=version)
            correlation_id = conn.next_correlation_id()
            request.with_header(correlation_id=correlation_id, client_id="test-net")
            data = memoryview(bytes(request.encode(header=True, framed=True)))
            pieces = [data[i:i + 3] for i in range(0, len(data), 3)]
            assert len(pieces) > 2048
            frame = await conn.send_raw(pieces, correlation_id)
            response = MetadataResponse.decode(frame, version=version, header=True)
            assert response.header.correlation_id == correlation_id
            assert sorted(t.name for t in response.topics) == names

    asyncio.run(main())


def _record_batch(size_bytes: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=size_bytes * 2)
    value_size = 10_000
    for i in range(size_bytes // value_size):
        value = bytes([i % 251]) * value_size
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=value,
                       headers=[])
    return bytes(builder.build())


def test_produce_via_send_raw_and_fetch_large_frame_back(bootstrap):
    """Hot path round trip: codec-encoded Produce as buffer pieces, then a ~2 MB Fetch response
    frame (received in place) decoded by the codec; the batch comes back byte-for-byte."""
    topic = _topic("raw")
    # Kafka's default max.message.bytes (~1 MiB) would refuse the 2 MB batch.
    _create_topics(bootstrap, {topic: 1}, **{"max.message.bytes": str(4 << 20)})
    batch = _record_batch(2_000_000)

    async def main():
        async with Cluster(_config(bootstrap), "A") as cluster:
            await cluster.refresh_metadata([topic])
            conn = await cluster.leader_connection(topic, 0)
            produce_version = conn.api_version(0, (3, 9))
            correlation_id = conn.next_correlation_id()
            view = memoryview(batch)
            pieces = [view[:61], view[61:100_000], view[100_000:]]
            buffers = codec.encode_produce_request(
                version=produce_version, correlation_id=correlation_id, client_id="test-net",
                transactional_id=None, acks=-1, timeout_ms=30000,
                topics=[(topic, [(0, [pieces])])])
            frame = await conn.send_raw(buffers, correlation_id)
            produced = codec.decode_produce_response(frame, produce_version)
            assert produced.correlation_id == correlation_id
            (name, parts), = produced.topics
            assert name == topic and parts[0].error_code == 0 and parts[0].base_offset == 0

            fetch_version = conn.api_version(1, (4, 12))
            fetch = FetchRequest[fetch_version](
                replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=8 << 20,
                isolation_level=0, session_id=0, session_epoch=-1,
                topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                    FetchRequest.FetchTopic.FetchPartition(
                        partition=0, current_leader_epoch=-1, fetch_offset=0,
                        log_start_offset=-1, partition_max_bytes=8 << 20)])],
                forgotten_topics_data=[], rack_id="")
            frame = await conn.request_frame(fetch)
            assert len(frame) > len(batch)
            assert isinstance(frame.obj, bytearray)  # received in place, not via scratch
            response = codec.decode_fetch_response(frame, fetch_version)
            part = response.topics[0].partitions[0]
            assert part.error_code == 0
            records = bytes(part.records)
            # Same batch; baseOffset/partitionLeaderEpoch (outside the CRC) may be rewritten.
            assert len(records) == len(batch)
            assert records[8:12] == batch[8:12] and records[16:] == batch[16:]

    asyncio.run(main())


def test_reconnect_after_connection_dropped(bootstrap):
    async def main():
        async with Cluster(_config(bootstrap), "A") as cluster:
            node_id = next(iter(cluster.brokers))
            conn = await cluster.connection(node_id)
            pending = asyncio.ensure_future(conn.request(MetadataRequest(
                topics=None, allow_auto_topic_creation=False, version=4)))
            await asyncio.sleep(0)
            conn._protocol.transport.abort()  # the socket goes away under the connection
            with pytest.raises(ConnectionFailedError) as info:
                await pending
            assert "cluster A" in str(info.value) and conn.address in str(info.value)
            assert not conn.connected
            again = await cluster.connection(node_id)
            assert again is not conn and again.connected
            await cluster.refresh_metadata([])
            assert cluster.cluster_id

    asyncio.run(main())


def test_reconnect_with_backoff_while_broker_restarts(caplog, start_broker):
    broker = start_broker("restart")
    port = broker.port
    restarted = threading.Event()
    release = threading.Event()

    def restart_later() -> None:
        time.sleep(0.6)
        if broker.flavor == "kafka":
            broker.restart()      # same port, same data, by pid
        else:
            start_broker("restart", port=port)  # tansu keeps nothing: a new, empty broker
        restarted.set()
        release.wait(120)  # the broker dies with the thread that started it (PDEATHSIG)

    async def main():
        cluster = Cluster(_config(broker.bootstrap, **{"reconnect.backoff.ms": "50",
                                                       "reconnect.backoff.max.ms": "200"}), "A")
        try:
            await cluster.start()
            first_id = cluster.cluster_id
            node_id = next(iter(cluster.brokers))
            conn = await cluster.connection(node_id)
            broker.kill() if broker.flavor == "kafka" else broker.stop()
            with pytest.raises(ConnectionFailedError):
                await conn.request(MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                                   version=4))
            thread.start()
            again = await cluster.connection(node_id)
            await asyncio.to_thread(restarted.wait, 120)
            assert again.connected and again is not conn
            await cluster.refresh_metadata([])
            if broker.flavor == "kafka":
                assert cluster.cluster_id == first_id  # the same cluster, restarted
            else:
                assert cluster.cluster_id != first_id  # a new (empty, memory-only) tansu
        finally:
            await cluster.close()

    thread = threading.Thread(target=restart_later)
    try:
        with caplog.at_level(logging.WARNING):
            asyncio.run(main())
    finally:
        release.set()
        if thread.is_alive():
            thread.join(150)
    assert f"cluster A: cannot reach 127.0.0.1:{port} (Connection refused); retrying in" \
        in caplog.text


def test_unreachable_broker_logs_retries_then_fails(caplog):
    port = free_port()

    async def main():
        cluster = Cluster({"bootstrap.servers": f"127.0.0.1:{port}",
                           "reconnect.deadline.ms": "600"}, "A")
        with pytest.raises(ConnectionFailedError) as info:
            await cluster.start()
        await cluster.close()
        return info.value

    with caplog.at_level(logging.WARNING):
        err = asyncio.run(main())
    assert f"cluster A: cannot reach 127.0.0.1:{port} (Connection refused); retrying in" \
        in caplog.text
    message = str(err)
    assert err.where.cluster == "A"
    assert f"127.0.0.1:{port} (Connection refused)" in message
    assert "gave up after" in message and "reconnect.deadline.ms=600" in message


# -- brokers started with extra flags (authentication, TLS via proxy) ------------------------------

@contextlib.contextmanager
def _tansu(*flags: str, advertised_port: int | None = None):
    """A tansu broker with extra flags, stopped by pid. Yields its listening port."""
    port = free_port()
    advertised = advertised_port or port
    process = subprocess.Popen(
        [str(find_tansu()), "broker", "--cluster-id", f"net-{port}",
         "--listener-url", f"tcp://127.0.0.1:{port}",
         "--advertised-listener-url", f"tcp://127.0.0.1:{advertised}", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while not api_versions_ok("127.0.0.1", port, timeout_s=0.5):
            assert process.poll() is None, "tansu exited at start"
            assert time.monotonic() < deadline, "tansu did not come up"
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@contextlib.contextmanager
def _plain_broker(advertised_port: int, log_dir):
    """A broker of the session's flavor that advertises another port (a proxy's). Yields the
    port it listens on."""
    if FLAVOR == "tansu":
        with _tansu(advertised_port=advertised_port) as port:
            yield port
        return
    port = free_port()
    overrides = {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{advertised_port}"}
    prepared = kafka_brokers.prepare_kafka_cluster("advertised", log_dir=log_dir, port=port,
                                                   overrides=overrides)
    try:
        # Ready means Metadata answers on the advertised (proxy) port: probe the process only.
        kafka_brokers.launch(prepared, wait=False)
        deadline = time.monotonic() + 90
        while not api_versions_ok("127.0.0.1", port, timeout_s=0.5):
            assert prepared.alive, prepared.log_tail()
            assert time.monotonic() < deadline, "Kafka did not come up"
            time.sleep(0.1)
        yield port
    finally:
        prepared.stop()


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory):
    """(port, flavor) of a broker that requires SASL: tansu --authentication (SCRAM, no users
    can be created), or Kafka with a SASL_PLAINTEXT listener offering only SCRAM-SHA-256 and
    one user (alice)."""
    if external_from_env() is not None:
        pytest.skip("starts a broker with a SASL listener: needs brokers this session starts")
    if FLAVOR == "tansu":
        with _tansu("--authentication") as port:
            yield port, FLAVOR
        return
    cluster = kafka_brokers.start_kafka_cluster(
        "sasl", log_dir=tmp_path_factory.mktemp("sasl"), sasl_users={"alice": "alice-secret"},
        overrides={"sasl.enabled.mechanisms": "SCRAM-SHA-256"})
    try:
        yield cluster.sasl_port, FLAVOR
    finally:
        cluster.stop()


def test_scram_login_rejected_by_real_broker_is_not_retried(caplog, sasl_broker):
    async def main(port: int):
        cluster = Cluster(_config(f"127.0.0.1:{port}", **{
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
                                'required username="nobody" password="x";'}), "A")
        with pytest.raises(AuthenticationFailedError) as info:
            await cluster.start()
        await cluster.close()
        return info.value

    port, flavor = sasl_broker
    with caplog.at_level(logging.WARNING):
        err = asyncio.run(main(port))
    assert "'nobody'" in str(err) and "cluster A" in str(err)
    # tansu names the reason; Kafka says only "invalid credentials" (by design).
    assert ("unknown-user" if flavor == "tansu" else "invalid credentials") in str(err)
    assert "retrying" not in caplog.text


def test_sasl_mechanism_the_broker_lacks_names_the_setting(sasl_broker):
    async def main(port: int):
        cluster = Cluster(_config(f"127.0.0.1:{port}", **{
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": "u", "sasl.password": "p", "reconnect.deadline.ms": "300"}), "A")
        with pytest.raises((ConnectionFailedError, AuthenticationFailedError)) as info:
            await cluster.start()
        await cluster.close()
        return info.value

    # tansu drops the connection; Kafka answers UNSUPPORTED_SASL_MECHANISM.
    err = asyncio.run(main(sasl_broker[0]))
    assert "SASL PLAIN" in str(err) and "sasl.mechanism" in str(err)


def _certificate(directory: Path) -> Path | None:
    """A self-signed certificate for 127.0.0.1 (cert and key in one PEM), or None."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert


class _TlsProxy:
    """TLS-terminating proxy on its own thread and loop: listen_port (TLS) -> broker (plain)."""

    def __init__(self, listen_port: int, broker_port: int, cert: Path):
        self.listen_port, self.broker_port = listen_port, broker_port
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, cert.with_name("key.pem"))
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _TlsProxy:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(
            self._serve, "127.0.0.1", self.listen_port, ssl=self.context))
        self._ready.set()
        self._loop.run_forever()
        server.close()
        for task in asyncio.all_tasks(self._loop):
            task.cancel()
        self._loop.run_until_complete(asyncio.sleep(0))
        self._loop.close()

    async def _serve(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.broker_port)

        async def pump(src, dst):
            with contextlib.suppress(Exception):
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


@NEEDS_EMBEDDED
def test_tls_through_proxy_to_real_broker(tmp_path):
    cert = _certificate(tmp_path)
    if cert is None:
        pytest.skip("openssl is needed to make a test certificate")
    topic = _topic("tls")
    proxy_port = free_port()

    async def main():
        settings = {"security.protocol": "SSL", "ssl.ca.location": str(cert)}
        async with Cluster(_config(f"127.0.0.1:{proxy_port}", **settings), "A") as cluster:
            # Created through TLS too (a plaintext admin would be sent to the advertised TLS port).
            conn = await cluster.any_connection()
            created = await conn.request(CreateTopicsRequest(
                topics=[CreateTopicsRequest.CreatableTopic(
                    name=topic, num_partitions=2, replication_factor=1, assignments=[],
                    configs=[])], timeout_ms=10000, validate_only=False))
            assert created.topics[0].error_code == 0
            await cluster.refresh_metadata([topic])
            assert cluster.partitions(topic) == [0, 1]
            conn = await cluster.leader_connection(topic, 1)
            assert conn.port == proxy_port and conn._sock is None  # TLS: no direct sendmsg
            names = [f"tls-{i}" for i in range(20)]
            responses = await asyncio.gather(*[conn.request(MetadataRequest(
                topics=[MetadataRequest.MetadataRequestTopic(name=n)],
                allow_auto_topic_creation=False, version=4)) for n in names])
            assert [r.topics[0].name for r in responses] == names
        # Wrong CA: not retried, says what to check.
        (tmp_path / "other").mkdir()
        other = _certificate(tmp_path / "other")
        bad = Cluster(_config(f"127.0.0.1:{proxy_port}", **{
            "security.protocol": "SSL", "ssl.ca.location": str(other)}), "A")
        with pytest.raises(AuthenticationFailedError, match="ssl.ca.location"):
            await bad.start()
        await bad.close()

    with _plain_broker(proxy_port, tmp_path) as broker_port, \
            _TlsProxy(proxy_port, broker_port, cert):
        asyncio.run(main())


def test_tls_client_against_plaintext_listener_says_so(bootstrap):
    async def main():
        cluster = Cluster(_config(bootstrap, **{
            "security.protocol": "SSL", "socket.connection.setup.timeout.ms": "500",
            "reconnect.deadline.ms": "0"}), "A")
        with pytest.raises(ConnectionFailedError) as info:
            await cluster.start()
        await cluster.close()
        return info.value

    err = asyncio.run(main())
    assert "TLS" in str(err) and "security.protocol=SSL" in str(err)
