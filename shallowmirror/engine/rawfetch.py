"""A fetch-only raw batch reader: Fetch requests over the net layer, split by the codec, nothing
forwarded.

Two uses: tests compare the *batch composition* of a source and a target topic (same number of
batches, same record counts, same codec: proof nothing was decompressed and re-batched), and the
benchmark runs it as the "fetch-only consumer" baseline next to the mirror.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafka.errors import OffsetOutOfRangeError

from shallowmirror import codec
from shallowmirror.engine.source import log_start
from shallowmirror.errors import BrokerError, Where
from shallowmirror.net import Cluster
from shallowmirror.net.protocol import FETCH_API_KEY, fetch_request, versions


@dataclass(frozen=True)
class BatchInfo:
    """The header facts of one stored batch."""

    base_offset: int
    record_count: int
    compression: int
    size: int
    producer_id: int
    is_control: bool
    is_transactional: bool
    timestamp_type: int
    max_timestamp: int
    producer_epoch: int
    base_sequence: int
    crc: int


@dataclass
class FetchTotals:
    batches: int = 0
    records: int = 0
    bytes: int = 0
    fetches: int = 0


async def fetch_all(config: Mapping[str, Any], topic: str, *, alias: str = "cluster",
                    keep: bool = True, max_bytes: int = 16 * 1024 * 1024,
                    isolation_level: int = 0) -> tuple[dict[int, list[BatchInfo]], FetchTotals]:
    """Every batch of ``topic`` from its log start to the high watermark seen along the way."""
    cluster = Cluster(config, alias)
    await cluster.start()
    totals = FetchTotals()
    out: dict[int, list[BatchInfo]] = {}
    try:
        await cluster.refresh_metadata([topic])
        partitions = cluster.partitions(topic) or []
        position = {p: 0 for p in partitions}
        high = {p: -1 for p in partitions}
        by_leader: dict[int, list[int]] = {}
        for p in partitions:
            leader = cluster.leader(topic, p)
            assert leader is not None, f"{topic}-{p} has no leader on {alias}"
            by_leader.setdefault(leader, []).append(p)

        async def run(leader: int, parts: list[int]) -> None:
            conn = await cluster.connection(leader)
            version = conn.api_version(FETCH_API_KEY, versions(FETCH_API_KEY))
            rotation = 0
            while True:
                todo = [p for p in parts if high[p] < 0 or position[p] < high[p]]
                if not todo:
                    return
                rotation += 1
                todo = todo[rotation % len(todo):] + todo[:rotation % len(todo)]
                req = fetch_request(version, ((topic, p, position[p], max_bytes) for p in todo),
                                    max_wait_ms=100, min_bytes=1, max_bytes=max_bytes,
                                    isolation_level=isolation_level)
                frame = await conn.request_frame(req)
                totals.fetches += 1
                response = codec.decode_fetch_response(frame, version)
                for t in response.topics:
                    for part in t.partitions:
                        if (part.error_code == OffsetOutOfRangeError.errno
                                and position[part.partition] == 0):
                            position[part.partition] = await log_start(
                                cluster, (topic, part.partition), part.log_start_offset)
                            if position[part.partition] > 0:
                                continue
                        if part.error_code:
                            raise BrokerError(part.error_code, Where(
                                cluster=alias, topic=topic, partition=part.partition,
                                offset=position[part.partition]))
                        high[part.partition] = part.high_watermark
                        if part.records is None:
                            continue
                        split = codec.split_batches(part.records, topic=topic,
                                                    partition=part.partition)
                        for b in split.batches:
                            if b.next_offset <= position[part.partition]:
                                continue
                            totals.batches += 1
                            totals.records += b.record_count
                            totals.bytes += b.size
                            if keep:
                                out.setdefault(part.partition, []).append(BatchInfo(
                                    b.base_offset, b.record_count, b.compression, b.size,
                                    b.producer_id, b.is_control, b.is_transactional,
                                    b.timestamp_type, b.max_timestamp, b.producer_epoch,
                                    b.base_sequence, b.crc))
                            position[part.partition] = b.next_offset

        await asyncio.gather(*(run(leader, parts) for leader, parts in by_leader.items()))
    finally:
        await cluster.close()
    return out, totals


def composition(batches: Mapping[int, list[BatchInfo]], *,
                with_control: bool = False) -> dict[int, list[tuple[int, int]]]:
    """Per partition: (record_count, compression) of each data batch, in order."""
    return {p: [(b.record_count, b.compression) for b in bs if with_control or not b.is_control]
            for p, bs in sorted(batches.items())}
