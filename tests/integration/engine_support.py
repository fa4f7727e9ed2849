"""Helpers shared by the engine integration tests (not fixtures: plain functions)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from shallowmirror.engine import EngineStats, MirrorEngine
from shallowmirror.engine.rawfetch import composition, fetch_all
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
