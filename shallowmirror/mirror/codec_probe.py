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

from kafka.protocol.consumer import FetchRequest

from shallowmirror import codec

log = logging.getLogger(__name__)

#: Attribute bits 0-2 of a RecordBatch -> codec name.
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_FETCH_API_KEY, _FETCH_VERSIONS = 1, (4, 12)


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
    leader = cluster.leader(topic, partition)
    if leader is None:
        return None
    conn = await cluster.connection(leader)
    version = conn.api_version(_FETCH_API_KEY, _FETCH_VERSIONS)
    req = FetchRequest[version](
        replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1024 * 1024,
        isolation_level=0, session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(
                partition=partition, current_leader_epoch=-1, fetch_offset=0,
                log_start_offset=-1, partition_max_bytes=1024 * 1024)])],
        forgotten_topics_data=[], rack_id="")
    frame = await conn.request_frame(req)
    if frame is None:
        return None
    response = codec.decode_fetch_response(frame, version)
    for t in response.topics:
        for part in t.partitions:
            if part.error_code or part.records is None:
                continue
            split = codec.split_batches(part.records, verify_crc=False, topic=topic,
                                        partition=partition)
            for batch in split.batches:
                if not batch.is_control:
                    return CODEC_NAMES.get(batch.compression)
    return None
