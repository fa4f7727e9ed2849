"""The consumer-protocol membership's coordinator requests (OffsetFetch at assignment,
OffsetCommit) go on through a dropped connection, as a moving coordinator's answers already did.
A FAKE broker (``testing.fake_cluster.FakeBroker``): a real one cannot be made to drop exactly
the OffsetFetch's connection on demand."""

from __future__ import annotations

import asyncio

from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorResponse

from shallowmirror.engine.consumer_group import ConsumerGroupMembership
from shallowmirror.testing.fake_cluster import (
    CLOSE,
    FakeBroker,
    api_versions_response,
    encode_response,
    metadata_response,
)

_KEYS = {18: (0, 3), 3: (0, 12), 10: (0, 3), 9: (7, 7)}
_Topic = OffsetFetchResponse.OffsetFetchResponseTopic


def _coordinator_broker(drops: int) -> FakeBroker:
    """One broker, its own group coordinator, that drops the connection of the first ``drops``
    OffsetFetch requests and then answers offset 42 for every partition asked."""
    state = {"offset_fetches": 0}

    def handle(req):
        if req.api_key == 18:
            return api_versions_response(req.correlation_id, min(req.api_version, 3), keys=_KEYS)
        if req.api_key == 3:
            return metadata_response(req.correlation_id, req.api_version, broker.port)
        if req.api_key == 10:
            return encode_response(FindCoordinatorResponse(
                version=req.api_version, throttle_time_ms=0, error_code=0, error_message=None,
                node_id=1, host="127.0.0.1", port=broker.port), req.correlation_id)
        if req.api_key == 9:
            state["offset_fetches"] += 1
            if state["offset_fetches"] <= drops:
                return CLOSE
            # v7 is flexible: the header's empty tagged fields (one 0 byte) come first
            asked = OffsetFetchRequest.decode(req.body[1:], version=req.api_version)
            return encode_response(OffsetFetchResponse(
                version=req.api_version, throttle_time_ms=0, error_code=0, topics=[
                    _Topic(name=t.name, partitions=[_Topic.OffsetFetchResponsePartition(
                        partition_index=p, committed_offset=42, committed_leader_epoch=-1,
                        metadata="", error_code=0) for p in t.partition_indexes])
                    for t in asked.topics]), req.correlation_id)
        return CLOSE

    broker = FakeBroker(handle)
    return broker


def test_committed_offsets_are_read_through_a_dropped_connection(caplog):
    async def scenario():
        async with _coordinator_broker(drops=2) as broker:
            membership = ConsumerGroupMembership(
                {"bootstrap.servers": broker.bootstrap}, group_id="g", mode="group",
                session_timeout_ms=10000, heartbeat_interval_ms=3000,
                loop=asyncio.get_running_loop(), on_assigned=None, on_revoked=None,
                source_alias="A")
            await membership._cluster.start()
            try:
                return await membership._committed([("t", 0), ("t", 1)]), broker
            finally:
                await membership._cluster.close()

    caplog.set_level("INFO")
    committed, broker = asyncio.run(scenario())
    assert committed == {("t", 0): 42, ("t", 1): 42}
    assert [r.api_key for r in broker.requests].count(9) == 3
    assert "group g on cluster A: OffsetFetch not answered" in caplog.text
