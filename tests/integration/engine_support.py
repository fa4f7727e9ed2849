"""Helpers shared by the engine integration tests (not fixtures: plain functions)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka.record.default_records import DefaultRecordBatchBuilder

from shallowmirror import codec
from shallowmirror.engine import EngineStats, MirrorEngine
from shallowmirror.engine.rawfetch import composition, fetch_all
from shallowmirror.net import Cluster
from shallowmirror.testing.workload import Workload, create_topic, load


def group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def load_topic(cluster: Any, topic: str, records: int, codec: str = "lz4", partitions: int = 8,
               **kwargs: Any):
    """Write a workload (fast settings) and return the LoadResult."""
    w = Workload(topic=topic, records=records, partitions=partitions, codec=codec,
                 value_bytes=kwargs.pop("value_bytes", 200), keys=kwargs.pop("keys", 1000),
                 headers=kwargs.pop("headers", 1), batch_bytes=kwargs.pop("batch_bytes", 256_000),
                 linger_ms=kwargs.pop("linger_ms", 50), **kwargs)
    return load(cluster.client_config(), w)


def create_target(cluster: Any, topic: str, partitions: int = 8) -> None:
    create_topic(cluster.client_config(), Workload(topic=topic, partitions=partitions))


def commit_offset(cluster: Any, group_id: str, topic: str, offset: int) -> None:
    """Commit ``offset`` for ``group_id`` on partition 0 of ``topic``, as a member would."""
    consumer = Consumer({**cluster.client_config(), "group.id": group_id,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


async def run_until_caught_up(source: Any, target: Any, topics: list[str], *,
                              settings: Mapping[str, Any] | None = None,
                              timeout_s: float = 120.0, engine_out: list | None = None,
                              **kwargs: Any) -> EngineStats:
    s = {"partition.assignment": "all", "group.id": group(), "fetch.max.wait.ms": 100,
         **dict(settings or {})}
    engine = MirrorEngine(source.client_config(), target.client_config(), topics=topics,
                          settings=s, **kwargs)
    if engine_out is not None:
        engine_out.append(engine)
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    try:
        while not engine.ready:
            if task.done():
                await task
            await asyncio.sleep(0.02)
        caught_up = await engine.wait_caught_up(timeout_s)
        assert caught_up, f"engine did not catch up in {timeout_s}s: {engine.stats()}"
    finally:
        stop.set()
        await task
    return engine.stats()


@contextlib.asynccontextmanager
async def caught_up(engine: MirrorEngine, timeout_s: float = 60.0) -> AsyncIterator[None]:
    """Run ``engine`` until it is ready and caught up, keep it running for the ``async with``
    body, then stop it and wait for it to finish: for scenarios that act on a live engine."""
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    try:
        while not engine.ready:
            await asyncio.sleep(0.02)
        assert await engine.wait_caught_up(timeout_s), engine.stats()
        yield
    finally:
        stop.set()
        await task


def run_until(source: Any, target: Any, topics: list[str], settings: Mapping[str, Any],
              done: Callable[[EngineStats], bool], *, polls: int = 400) -> EngineStats:
    """Run one engine (all partitions, its own group) until ``done(stats)`` or ``polls`` x 50 ms,
    then stop it and return its final stats: for scenarios that end in a stopped partition."""

    async def scenario() -> EngineStats:
        s = {"partition.assignment": "all", "group.id": group(), **dict(settings)}
        engine = MirrorEngine(source.client_config(), target.client_config(), topics=topics,
                              settings=s)
        stop = asyncio.Event()
        task = asyncio.create_task(engine.run(stop))
        for _ in range(polls):
            if done(engine.stats()):
                break
            await asyncio.sleep(0.05)
        stop.set()
        await task
        return engine.stats()

    return asyncio.run(scenario())


def batch_composition(cluster: Any, topic: str) -> dict[int, list[tuple[int, int]]]:
    batches, _ = asyncio.run(fetch_all(cluster.client_config(), topic))
    return composition(batches)


def raw_batches(cluster: Any, topic: str):
    batches, _ = asyncio.run(fetch_all(cluster.client_config(), topic))
    return batches


def engine_process(source: Any, target: Any, topics: list[str], settings: Mapping[str, Any],
                   log_path: str) -> subprocess.Popen:
    """``python -m shallowmirror.engine.run`` as a child process (stopped by the caller)."""
    cmd = [sys.executable, "-m", "shallowmirror.engine.run", "--source", source.bootstrap,
           "--target", target.bootstrap, "--topics", ",".join(topics)]
    for key, value in settings.items():
        cmd += ["--set", f"{key}={value}"]
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env={**os.environ})


async def produce_corrupt_batch(cluster, topic: str, partition: int) -> None:
    """A batch whose last byte is flipped: the CRC no longer matches. tansu stores it as sent;
    Apache Kafka validates CRCs on produce, so there the batch is written intact and its last
    byte flipped in the segment file afterwards (a broker serves fetches from the file as it is,
    without checking: bit rot on disk)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i in range(3):
        builder.append(i, timestamp=None, key=None, value=b"corrupt-%d" % i, headers=[])
    data = bytearray(builder.build())
    on_disk = getattr(cluster, "flavor", None) == "kafka"
    if not on_disk:
        data[-1] ^= 0xFF
    c = Cluster(cluster.client_config(), "source")
    await c.start()
    try:
        await c.refresh_metadata([topic])
        conn = await c.leader_connection(topic, partition)
        version = conn.api_version(0, (3, 9))
        cid = conn.next_correlation_id()
        buffers = codec.encode_produce_request(
            version=version, correlation_id=cid, client_id="test", transactional_id=None,
            acks=-1, timeout_ms=10000, topics=[(topic, [(partition, [[bytes(data)]])])])
        frame = await conn.send_raw(buffers, cid)
        response = codec.decode_produce_response(frame, version)
        (_, parts), = response.topics
        if parts[0].error_code:
            pytest.skip(f"this broker validates CRCs on produce (error {parts[0].error_code})")
    finally:
        await c.close()
    if on_disk:
        _flip_last_byte_on_disk(cluster, topic, partition)


def _flip_last_byte_on_disk(cluster, topic: str, partition: int) -> None:
    """Flip the last byte of the partition's active segment: the batch just appended."""
    segments = sorted((cluster.data_dir / f"{topic}-{partition}").glob("*.log"))
    assert segments, f"no segment file for {topic}-{partition} under {cluster.data_dir}"
    with open(segments[-1], "r+b") as segment:
        segment.seek(-1, os.SEEK_END)
        last = segment.read(1)[0]
        segment.seek(-1, os.SEEK_END)
        segment.write(bytes([last ^ 0xFF]))


class RunningEngine:
    """A MirrorEngine running in a thread of its own (its own event loop) while the test does
    synchronous work: ``with RunningEngine(...) as running: ... running.stats()``. Stopped and
    joined on exit; an engine that died is re-raised there."""

    def __init__(self, source: Any, target: Any, topics: list[str],
                 settings: Mapping[str, Any] | None = None) -> None:
        import threading

        self.settings = {"partition.assignment": "all", "group.id": group(),
                         "fetch.max.wait.ms": 100, **dict(settings or {})}
        self.engine = MirrorEngine(source.client_config(), target.client_config(), topics=topics,
                                   settings=self.settings)
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-engine", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._stop = asyncio.Event()
            self._ready.set()
            await self.engine.run(self._stop)

        try:
            self._loop.run_until_complete(main())
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            self._error = err
        finally:
            self._ready.set()
            self._loop.close()

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def __enter__(self) -> RunningEngine:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(120)
        assert not self._thread.is_alive(), "the engine did not stop within 120 s"
        if self._error is not None and exc[0] is None:
            raise self._error


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str,
               running: RunningEngine | None = None) -> None:
    """Poll ``condition`` every 0.2 s; fail naming ``what`` (and the engine's stats) on timeout."""
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            detail = f"; engine: {running.stats()}" if running is not None else ""
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}{detail}")
        time.sleep(0.2)



async def until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """``condition`` became true within ``timeout_s`` (polled every 0.05 s on the loop)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True

def three_batches(cluster: Any, topic: str, compression: str = "lz4") -> None:
    """One partition, three batches of ``compression``: offsets 0-99, 100-199, 200-299."""
    from confluent_kafka import Producer

    create_topic(cluster.client_config(), Workload(topic, partitions=1))
    producer = Producer({**cluster.client_config(), "compression.type": compression,
                         "linger.ms": 1000, "batch.size": 1_000_000})
    for b in range(3):
        for i in range(100):
            producer.produce(topic, key=f"k{b}-{i}".encode(), value=b"v" * 100, partition=0)
        producer.flush(30)


#: For ``needs_real_kafka``: why a test that calls ``delete_records_before`` cannot run on tansu.
NO_DELETE_RECORDS = "tansu has no DeleteRecords (it closes the connection)"


def delete_records_before(cluster: Any, topic: str, offset: int) -> None:
    """DeleteRecords on partition 0. Its callers are marked ``needs_real_kafka`` (tansu has
    none); anywhere else a failure fails the test rather than skipping it."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(cluster.client_config())
    done = admin.delete_records([TopicPartition(topic, 0, offset)])
    low = next(iter(done.values())).result(30)
    assert low.low_watermark == offset, vars(low)


def benchmark_script(name: str) -> Any:
    """``benchmarks/engine/<name>.py`` as a module (the scripts are not part of the package)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "engine" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
