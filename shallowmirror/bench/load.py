"""Load a workload into a source topic (``shallowmirror.testing.workload``) and measure it.

The records are the shared loader's JSON-like click events (1000 keys, two headers, CreateTime
timestamps) produced with the workload's codec and ``batch.size``. What every mirror mode then
moves is measured on the source itself (``watermarks.scan``): records and RecordBatch bytes as
stored. Uncompressed bytes are the key + value + header bytes produced.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from shallowmirror.bench import topics, watermarks
from shallowmirror.bench.matrix import Workload


@dataclass
class LoadedSource:
    topic: str
    latency_topic: str
    records: int
    compressed_bytes: int
    uncompressed_bytes: int
    batches: int
    load_s: float


def load(bootstrap: str, topic: str, workload: Workload, *,
         progress: Callable[[int, int], None] | None = None, seed: int = 0) -> LoadedSource:
    """Create ``topic`` and its ``-latency`` companion; produce the workload into ``topic``."""
    from shallowmirror.testing import workload as shared

    started = time.monotonic()
    result = shared.load(
        {"bootstrap.servers": bootstrap},
        shared.Workload(topic=topic, records=workload.records, value_bytes=workload.value_bytes,
                        partitions=workload.partitions, codec=workload.codec,
                        batch_bytes=workload.batch_bytes, linger_ms=100, seed=seed),
        progress=progress,
    )
    uncompressed = result.uncompressed_bytes
    del result  # it holds every record; the harness only needs the counts
    latency_topic = latency_topic_of(topic)
    topics.create(bootstrap, latency_topic, 1)
    stored = watermarks.scan(bootstrap, topic)
    if stored.records != workload.records:
        raise RuntimeError(f"loaded {workload.records} records into {topic} but the topic holds "
                           f"{stored.records}")
    return LoadedSource(topic, latency_topic, stored.records, stored.compressed_bytes,
                        uncompressed, stored.batches, time.monotonic() - started)


def latency_topic_of(topic: str) -> str:
    """The companion topic the latency probes go through (mirrored along with ``topic``)."""
    return f"{topic}-latency"
