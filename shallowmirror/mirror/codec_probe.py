"""Which codec a topic's producers used: read one stored batch's header with a raw Fetch.

The deep path recompresses with the codec the data came in (so a deep/shallow comparison is
like for like); confluent-kafka cannot tell, the batch header can. Best effort: None when the
topic is empty, unreadable or the fetch fails; the caller picks a default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from kafka.errors import OffsetOutOfRangeError

from shallowmirror import codec
from shallowmirror.codec.layout import COMPRESSION_NAMES
from shallowmirror.net.protocol import FETCH_API_KEY, fetch_request, versions

log = logging.getLogger(__name__)



async def probe_codec(config: Mapping[str, Any], topic: str, *, alias: str = "source",
                      timeout_s: float = 10.0) -> str | None:
    """The codec of the first data batch found in ``topic`` (partitions tried in order)."""
    from shallowmirror.net import Cluster

    cluster = Cluster(config, alias)
    try:
        return await asyncio.wait_for(_probe(cluster, topic), timeout_s)
    except Exception as err:  # noqa: BLE001 - best effort by contract
        log.debug("codec probe of %s on %s failed: %s", topic, alias, err)
        return None
    finally:
        with contextlib.suppress(Exception):
            await cluster.close()


async def _probe(cluster: Any, topic: str) -> str | None:
    await cluster.start()
    await cluster.refresh_metadata([topic])
    for partition in cluster.partitions(topic) or []:
        found = await _first_codec(cluster, topic, partition)
        if found is not None:
            return found
    return None


async def _first_codec(cluster: Any, topic: str, partition: int) -> str | None:
    """The codec of the partition's first data batch: from offset 0, or from the log start where
    retention moved it (Kafka answers the fetch at 0 with OFFSET_OUT_OF_RANGE, no log start)."""
    from shallowmirror.engine.source import log_start

    leader = cluster.leader(topic, partition)
    if leader is None:
        return None
    conn = await cluster.connection(leader)
    version = conn.api_version(FETCH_API_KEY, versions(FETCH_API_KEY))
    found, part = await _codec_at(conn, version, topic, partition, 0)
    if part is not None and part.error_code == OffsetOutOfRangeError.errno:
        start = await log_start(cluster, (topic, partition), part.log_start_offset)
        found, _ = await _codec_at(conn, version, topic, partition, start)
    return found


async def _codec_at(conn: Any, version: int, topic: str, partition: int,
                    offset: int) -> tuple[str | None, Any]:
    """(codec of the first data batch at or after ``offset``, the partition's answer; None
    without one)."""
    req = fetch_request(version, [(topic, partition, offset, 1024 * 1024)], max_wait_ms=100,
                        min_bytes=1, max_bytes=1024 * 1024)
    frame = await conn.request_frame(req)
    if frame is None:
        return None, None
    response = codec.decode_fetch_response(frame, version)
    for t in response.topics:
        for part in t.partitions:
            if part.error_code or part.records is None:
                return None, part
            split = codec.split_batches(part.records, verify_crc=False, topic=topic,
                                        partition=partition)
            for batch in split.batches:
                if not batch.is_control:
                    return COMPRESSION_NAMES.get(batch.compression), part
    return None, None
