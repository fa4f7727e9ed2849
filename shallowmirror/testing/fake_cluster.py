"""Scripted FAKE Kafka brokers - only for error paths a real broker cannot be made to produce on
demand. Behaviour is tested against real brokers (tests/integration/); these fakes are named as
such wherever they are used.

One serving loop (``ScriptedServer``: size-prefixed frames in, a handler's answer out) carries:
- ``FakeBroker``: one broker whose ``handler(FakeRequest)`` returns the response frame (without
  the size prefix, starting at the correlation id), ``None`` to stay silent, or ``CLOSE`` to drop
  the connection - for the net layer's error paths (never answering, a wrong correlation id, an
  absurd frame size, a refused ApiVersions version, a rejected SASL mechanism or password).
- ``FakeTargetCluster``: N brokers (node ids 1..N) sharing topics, leaders, one log per partition
  and an idempotent producer state modelled on Kafka's (per producer id and partition: the next
  expected sequence; a resent batch already written is DUPLICATE_SEQUENCE_NUMBER, a sequence gap
  OUT_OF_ORDER_SEQUENCE_NUMBER); a broker that does not lead a partition answers
  NOT_LEADER_OR_FOLLOWER - for the engine's produce-side error paths (leader moves, partial
  failures, sequence and fencing errors, duplicates, MESSAGE_TOO_LARGE). ``script(attempt)`` sees
  every batch a Produce request carries, before the broker would store it, and returns None
  (behave like a broker), an error code (answer it, store nothing) or ``Stored(code)`` (store the
  batch, then answer ``code``: a write whose answer was lost). Every batch received is recorded in
  ``attempts`` with the answer given; ``answer_produce = False`` leaves Produce requests
  unanswered (a broker that stopped answering). Protocol subset: ApiVersions, Metadata (all
  topics, whatever was asked), InitProducerId (a new producer id per call), Produce v3-8 (parsed
  by hand; one batch per partition).
- ``scripted_source_cluster``: the real source cluster's connections, except for a scripted
  OFFSET_OUT_OF_RANGE below a moved log start (retention a real broker cannot be made to run on
  demand); ``write_source_batches`` writes known batches to a real source cluster.

Responses are encoded with kafka-python's protocol classes.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from shallowmirror import codec
from shallowmirror.net import Cluster
from shallowmirror.testing.workload import Workload, create_topic

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

        def answer(request: FakeRequest) -> Any:
            self.requests.append(request)
            return self.handler(request)

        await serve_frames(reader, writer, answer)


async def serve_frames(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       answer: Handler) -> None:
    """The one serving loop of every fake: read size-prefixed request frames, write the size-
    prefixed ``answer(request)`` (None: stay silent; ``CLOSE``: drop the connection)."""
    try:
        while True:
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            frame = await reader.readexactly(size)
            api_key, api_version, correlation_id, id_len = struct.unpack_from(">hhih", frame)
            body = frame[10 + max(id_len, 0):]
            reply = answer(FakeRequest(api_key, api_version, correlation_id, body))
            if reply is CLOSE:
                break
            if reply is not None:
                writer.write(struct.pack(">i", len(reply)) + reply)
                await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass            # client gone, or the test's loop shutting down
    finally:
        writer.close()


# ---------------------------------------------------------------------------------------------
# The scripted target cluster.

NOT_LEADER_OR_FOLLOWER = 6
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46

TP = tuple[str, int]
GZIP = 1


@dataclass(frozen=True)
class Stored:
    """Script answer: store the batch, then answer ``error_code`` anyway."""

    error_code: int


@dataclass
class Attempt:
    """One batch as a Produce request carried it, and what the fake answered."""

    node_id: int
    topic: str
    partition: int
    data: bytes
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    error_code: int = 0
    base_offset: int = -1

    @property
    def identity(self) -> tuple[int, int, int]:
        return (self.producer_id, self.producer_epoch, self.base_sequence)


@dataclass
class StoredBatch:
    base_offset: int
    data: bytes
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int


@dataclass
class _ProducerState:
    next_sequence: int = 0
    written: dict[int, int] = field(default_factory=dict)   # base_sequence -> base_offset


Script = Callable[[Attempt], "int | Stored | None"]


def _string(buf: bytes, pos: int) -> tuple[str | None, int]:
    (n,) = struct.unpack_from(">h", buf, pos)
    pos += 2
    if n < 0:
        return None, pos
    return buf[pos:pos + n].decode(), pos + n


def parse_produce(body: bytes) -> list[tuple[str, int, bytes]]:
    """(topic, partition, records) of a Produce v3-8 request body (after the client id)."""
    _txn, pos = _string(body, 0)
    pos += 6                                   # acks int16, timeout_ms int32
    (topics,) = struct.unpack_from(">i", body, pos)
    pos += 4
    out = []
    for _ in range(topics):
        name, pos = _string(body, pos)
        (parts,) = struct.unpack_from(">i", body, pos)
        pos += 4
        for _ in range(parts):
            index, size = struct.unpack_from(">ii", body, pos)
            pos += 8
            out.append((name, index, body[pos:pos + max(size, 0)]))
            pos += max(size, 0)
    return out


class FakeTargetCluster:
    """``brokers`` scripted brokers (node ids 1..N) sharing topics, leaders and logs."""

    def __init__(self, topics: dict[str, int], *, brokers: int = 1,
                 script: Script | None = None) -> None:
        self.topics = dict(topics)
        self.node_ids = list(range(1, brokers + 1))
        self.leaders: dict[TP, int] = {(t, p): 1 for t, n in topics.items() for p in range(n)}
        #: Leaders Metadata answers name instead of ``leaders`` (which decide who takes a
        #: Produce): a cluster whose metadata already names a new leader while the old one
        #: still answers for the partition.
        self.metadata_leaders: dict[TP, int] = {}
        self.logs: dict[TP, list[StoredBatch]] = {tp: [] for tp in self.leaders}
        self.script = script
        self.attempts: list[Attempt] = []
        self.produce_requests = 0
        #: False: Produce requests are received (counted) but never answered.
        self.answer_produce = True
        self.metadata_requests = 0
        self.producer_ids: list[int] = []
        self.ports: dict[int, int] = {}
        self._producers: dict[tuple[int, str, int], _ProducerState] = {}
        self._servers: list[asyncio.base_events.Server] = []
        self._writers: list[asyncio.StreamWriter] = []

    # ---- lifecycle ----
    async def __aenter__(self) -> FakeTargetCluster:
        for node_id in self.node_ids:
            server = await asyncio.start_server(
                lambda r, w, n=node_id: self._serve(n, r, w), "127.0.0.1", 0)
            self._servers.append(server)
            self.ports[node_id] = server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()
        for writer in self._writers:
            writer.close()
        for server in self._servers:
            await server.wait_closed()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports[self.node_ids[0]]}"

    def config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    # ---- what the fake holds ----
    def stored(self, topic: str, partition: int) -> list[StoredBatch]:
        return self.logs[(topic, partition)]

    def attempts_for(self, topic: str, partition: int) -> list[Attempt]:
        return [a for a in self.attempts if (a.topic, a.partition) == (topic, partition)]

    # ---- serving ----
    async def _serve(self, node_id: int, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        await serve_frames(reader, writer, lambda r: self._handle(
            node_id, r.api_key, r.api_version, r.correlation_id, r.body))

    def _handle(self, node_id: int, api_key: int, version: int, cid: int,
                body: bytes) -> Any:
        if api_key == 18:                      # ApiVersions
            keys = {18: (0, 3), 3: (1, 12), 22: (0, 5), 0: (3, 8), 2: (1, 5)}
            entries = [ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                       for k, (lo, hi) in keys.items()]
            return encode_response(ApiVersionsResponse(error_code=0, api_keys=entries,
                                              throttle_time_ms=0, version=min(version, 3)), cid)
        if api_key == 3:
            self.metadata_requests += 1
            return encode_response(self._metadata(version), cid)
        if api_key == 22:                      # InitProducerId: a new id each time
            producer_id = 1000 + len(self.producer_ids)
            self.producer_ids.append(producer_id)
            return encode_response(InitProducerIdResponse(throttle_time_ms=0, error_code=0,
                                                 producer_id=producer_id, producer_epoch=0,
                                                 version=version), cid)
        if api_key == 0:
            self.produce_requests += 1
            if not self.answer_produce:
                return None
            return encode_response(self._produce(node_id, version, body), cid)
        if api_key == 2:                       # ListOffsets: log start 0, end after the log
            return encode_response(self._list_offsets(version, body), cid)
        return CLOSE                           # anything else: close the connection

    def _metadata(self, version: int) -> Any:
        brokers = [MetadataResponse.MetadataResponseBroker(node_id=n, host="127.0.0.1",
                                                           port=self.ports[n], rack=None)
                   for n in self.node_ids]
        T = MetadataResponse.MetadataResponseTopic
        topics = [T(error_code=0, name=name, is_internal=False, partitions=[
            T.MetadataResponsePartition(error_code=0, partition_index=p,
                                        leader_id=self.metadata_leaders.get(
                                            (name, p), self.leaders[(name, p)]), leader_epoch=0,
                                        replica_nodes=self.node_ids, isr_nodes=self.node_ids,
                                        offline_replicas=[])
            for p in range(n)]) for name, n in self.topics.items()]
        return MetadataResponse(throttle_time_ms=0, brokers=brokers, cluster_id="fake-target",
                                controller_id=1, topics=topics, version=version)

    def _list_offsets(self, version: int, body: bytes) -> Any:
        req = ListOffsetsRequest.decode(body, version=version)
        R = ListOffsetsResponse.ListOffsetsTopicResponse
        topics = []
        for topic in req.topics:
            parts = []
            for asked in topic.partitions:
                log = self.logs.get((topic.name, asked.partition_index), [])
                end = log[-1].base_offset + offset_count_of(log[-1]) if log else 0
                parts.append(R.ListOffsetsPartitionResponse(
                    partition_index=asked.partition_index, error_code=0, timestamp=-1,
                    offset=0 if asked.timestamp == -2 else end, leader_epoch=0))
            topics.append(R(name=topic.name, partitions=parts))
        return ListOffsetsResponse(throttle_time_ms=0, topics=topics, version=version)

    def _produce(self, node_id: int, version: int, body: bytes) -> Any:
        answers: dict[str, list] = {}
        P = ProduceResponse.TopicProduceResponse.PartitionProduceResponse
        for topic, partition, records in parse_produce(body):
            (view,) = codec.split_batches(records, verify_crc=True).batches
            attempt = Attempt(node_id, topic, partition, bytes(records), view.producer_id,
                              view.producer_epoch, view.base_sequence, view.record_count)
            self._answer(attempt, view.last_offset_delta + 1)
            self.attempts.append(attempt)
            answers.setdefault(topic, []).append(P(
                index=partition, error_code=attempt.error_code, base_offset=attempt.base_offset,
                log_append_time_ms=-1, log_start_offset=0, record_errors=[], error_message=None))
        return ProduceResponse(responses=[
            ProduceResponse.TopicProduceResponse(name=t, partition_responses=ps)
            for t, ps in answers.items()], throttle_time_ms=0, version=version)

    def _answer(self, attempt: Attempt, offset_count: int) -> None:
        tp = (attempt.topic, attempt.partition)
        if self.leaders.get(tp) != attempt.node_id:
            attempt.error_code = NOT_LEADER_OR_FOLLOWER
            return
        scripted = self.script(attempt) if self.script is not None else None
        if isinstance(scripted, int):
            attempt.error_code = scripted
            return
        if self.leaders.get(tp) != attempt.node_id:      # the script moved the leader
            attempt.error_code = NOT_LEADER_OR_FOLLOWER
            return
        state = self._producers.setdefault(
            (attempt.producer_id, *tp), _ProducerState())
        if attempt.producer_id >= 0:
            if attempt.base_sequence in state.written:
                attempt.error_code = DUPLICATE_SEQUENCE_NUMBER
                return
            # Like Kafka 3.x (ProducerAppendInfo.checkSequence, KIP-360): a producer the broker
            # holds no state for may start at *any* sequence; after that, gaps are refused.
            if state.written and attempt.base_sequence != state.next_sequence:
                attempt.error_code = OUT_OF_ORDER_SEQUENCE_NUMBER
                return
        log = self.logs[tp]
        base = log[-1].base_offset + offset_count_of(log[-1]) if log else 0
        log.append(StoredBatch(base, attempt.data, attempt.producer_id, attempt.producer_epoch,
                               attempt.base_sequence, attempt.record_count))
        state.written[attempt.base_sequence] = base
        state.next_sequence = attempt.base_sequence + attempt.record_count
        attempt.base_offset = base
        if isinstance(scripted, Stored):
            attempt.error_code = scripted.error_code
            attempt.base_offset = -1


def offset_count_of(batch: StoredBatch) -> int:
    """Offsets a stored batch takes (last_offset_delta + 1)."""
    (view,) = codec.split_batches(batch.data, verify_crc=False).batches
    return view.last_offset_delta + 1


# ---------------------------------------------------------------------------------------------
# Scripted source: a real source cluster whose connections answer one scripted error.

class ScriptedConnectionBase:
    """A real connection that answers everything itself, except what a subclass overrides
    (``request_frame``, ``request``); ``_cluster`` is the scripted cluster it belongs to."""

    def __init__(self, conn: Any, cluster: Any) -> None:
        self._conn = conn
        self._cluster = cluster

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class ScriptedSourceConnection(ScriptedConnectionBase):
    """A real source connection, except: a Fetch below ``cluster.log_start_offset`` (once
    ``cluster.truncated``) is answered OFFSET_OUT_OF_RANGE, and ListOffsets(earliest) answers
    ``log_start_offset`` — what a broker says after retention deleted the first records."""

    async def request_frame(self, req: Any, timeout_ms: int | None = None) -> Any:
        from kafka.protocol.consumer import FetchResponse

        c = self._cluster
        if req.API_KEY == 1:
            c.truncated = True                 # retention ran just before the first Fetch
        if req.API_KEY == 1:
            below = [(t.topic, p.partition) for t in req.topics for p in t.partitions
                     if p.fetch_offset < c.log_start_offset]
            if below:
                c.out_of_range_answers += 1
                T = FetchResponse.FetchableTopicResponse
                response = FetchResponse(throttle_time_ms=0, error_code=0, session_id=0,
                                         version=req.API_VERSION, responses=[
                    T(topic=topic, partitions=[T.PartitionData(
                        partition_index=partition, error_code=1, high_watermark=-1,
                        last_stable_offset=-1, log_start_offset=c.log_start_offset,
                        aborted_transactions=None, preferred_read_replica=-1, records=None)])
                    for topic, partition in below])
                response.with_header(correlation_id=self._conn.next_correlation_id())
                return memoryview(bytes(response.encode(header=True)))
        return await self._conn.request_frame(req, timeout_ms)

    async def request(self, req: Any, timeout_ms: int | None = None) -> Any:
        response = await self._conn.request(req, timeout_ms)
        if req.API_KEY == 2 and self._cluster.truncated:          # ListOffsets
            for topic, t_resp in zip(req.topics, response.topics, strict=True):
                for asked, part in zip(topic.partitions, t_resp.partitions, strict=True):
                    if asked.timestamp == -2:
                        part.offset = self._cluster.log_start_offset
        return response


class ScriptedSourceClusterBase(Cluster):
    """A real ``Cluster`` whose connections, for the source alias only, are wrapped in
    ``connection_class(conn, cluster)``: the scripted connections answer like the real broker
    but for what they script. Subclasses set ``connection_class``; every instance is kept in the
    subclass's ``instances`` (the engine builds its clusters itself)."""

    connection_class: type = object
    instances: list

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.instances = []

    def __init__(self, config: Any, alias: str) -> None:
        super().__init__(config, alias)
        self.scripted = alias == "source"
        type(self).instances.append(self)

    def _wrap(self, conn: Any) -> Any:
        return self.connection_class(conn, self) if self.scripted else conn

    async def connection(self, node_id: int, lane: int = 0) -> Any:
        return self._wrap(await super().connection(node_id, lane))

    async def leader_connection(self, topic: str, partition: int) -> Any:
        return self._wrap(await super().leader_connection(topic, partition))


def scripted_source_cluster(log_start_offset: int) -> type:
    """A ``Cluster`` subclass (for the source alias) whose connections are scripted as above;
    ``truncated`` turns true at the first Fetch (retention ran after the engine started)."""
    class ScriptedSourceCluster(ScriptedSourceClusterBase):
        connection_class = ScriptedSourceConnection

        def __init__(self, config: Any, alias: str) -> None:
            super().__init__(config, alias)
            self.log_start_offset = log_start_offset
            self.truncated = False
            self.out_of_range_answers = 0

    return ScriptedSourceCluster


# ---------------------------------------------------------------------------------------------
# Source data for these tests: known batches written to the real source cluster.

def source_batch(partition: int, index: int, records: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=GZIP, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i in range(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i,
                       value=b"p%d-b%d-r%d " % (partition, index, i) * 8, headers=[])
    return bytes(builder.build())


#: Produce errors of a partition whose leader is not serving yet.
_NOT_READY_YET = frozenset({3, 6})  # UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER


async def write_source_batches(cluster, topic: str, partitions: int, batches: int,
                        records: int = 5, *, first: int = 0) -> dict[int, list[bytes]]:
    """Produce ``batches`` gzip batches per partition, one per request; return their bytes.
    The topic is created unless ``first`` (the first batch's index) says it holds some."""
    if first == 0:
        create_topic(cluster.client_config(), Workload(topic=topic, partitions=partitions))
    written: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    c = Cluster(cluster.client_config(), "source")
    await c.start()
    try:
        await c.refresh_metadata([topic])
        for p in range(partitions):
            conn = await c.leader_connection(topic, p)
            version = conn.api_version(0, (3, 9))
            for i in range(first, first + batches):
                data = source_batch(p, i, records)
                for attempt in range(50):
                    cid = conn.next_correlation_id()
                    buffers = codec.encode_produce_request(
                        version=version, correlation_id=cid, client_id="test",
                        transactional_id=None, acks=-1, timeout_ms=10000,
                        topics=[(topic, [(p, [[data]])])])
                    response = codec.decode_produce_response(await conn.send_raw(buffers, cid),
                                                             version)
                    code = response.topics[0][1][0].error_code
                    # A topic just created on Kafka: metadata may name the leader a moment before
                    # it leads (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION): retry.
                    if code not in _NOT_READY_YET or attempt == 49:
                        break
                    await asyncio.sleep(0.1)
                    await c.refresh_metadata([topic])
                    conn = await c.leader_connection(topic, p)
                assert code == 0, f"producing to {topic}-{p} failed with error {code}"
                written[p].append(data)
    finally:
        await c.close()
    return written


# ---------------------------------------------------------------------------------------------
# A real target cluster with scripted faults after the broker did its work.

class ScriptedTargetConnection(ScriptedConnectionBase):
    """A real target connection, except that a fault the cluster's ``faults`` script names
    strikes *after* the real broker handled the request: a Produce whose batch the broker wrote
    but whose answer is lost (``ConnectionFailedError``), or a coordinator answer whose error
    codes are replaced - target errors in the middle of a transaction that a healthy broker
    cannot be made to produce on demand."""

    async def send_raw(self, buffers: Any, correlation_id: int, *args: Any, **kwargs: Any) -> Any:
        frame = await self._conn.send_raw(buffers, correlation_id, *args, **kwargs)
        c = self._cluster
        c.produce_requests += 1
        if c.produce_requests in c.lose_produce_answers:
            from shallowmirror.errors import ConnectionFailedError, Where
            c.faults_injected += 1
            raise ConnectionFailedError("scripted fault: the broker wrote the batch, the answer "
                                        "was lost", Where(cluster=c.alias))
        return frame

    async def request(self, req: Any, timeout_ms: int | None = None) -> Any:
        response = await self._conn.request(req, timeout_ms)
        c = self._cluster
        code = c.error_answers.get(req.API_KEY)
        if code is not None:
            c.calls[req.API_KEY] = c.calls.get(req.API_KEY, 0) + 1
            if c.calls[req.API_KEY] in c.error_calls:
                c.faults_injected += 1
                _set_error_codes(response, code)
        return response


def _set_error_codes(response: Any, code: int) -> None:
    """Replace every error code in ``response`` (top level and per partition) with ``code``."""
    if hasattr(response, "error_code"):
        response.error_code = code
    for topic in getattr(response, "topics", None) or []:
        for part in getattr(topic, "partitions", None) or []:
            part.error_code = code


def scripted_target_cluster(*, lose_produce_answers: set[int] = frozenset(),  # type: ignore[assignment]
                            error_answers: dict[int, int] | None = None,
                            error_calls: set[int] = frozenset()) -> type:  # type: ignore[assignment]
    """A ``Cluster`` subclass whose *target* connections are ``ScriptedTargetConnection``s:
    the Produce requests numbered in ``lose_produce_answers`` (1 = the first) lose their answer
    after the broker wrote them; the calls numbered in ``error_calls`` of each api key in
    ``error_answers`` (api key -> error code) are answered with that code after the broker
    handled them."""
    class ScriptedTargetCluster(ScriptedSourceClusterBase):
        connection_class = ScriptedTargetConnection

        def __init__(self, config: Any, alias: str) -> None:
            super().__init__(config, alias)
            self.scripted = alias == "target"
            self.lose_produce_answers = set(lose_produce_answers)
            self.error_answers = dict(error_answers or {})
            self.error_calls = set(error_calls)
            self.produce_requests = 0
            self.calls: dict[int, int] = {}
            self.faults_injected = 0

    return ScriptedTargetCluster
