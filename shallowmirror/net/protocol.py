"""Protocol facts in one place: the API versions this project speaks, and the one FetchRequest
builder every raw fetch uses (the engine's sources, the fetch-only reader, the codec probe, the
produce-ceiling bench).

Versions: each request is sent at the highest version both this table and the broker's
ApiVersions answer allow (``BrokerConnection.api_version``). Fetch and Produce are bounded by
what the hand-written codec decodes and encodes (``codec.messages``); the others by what the
code that builds and reads them was checked against. Error codes come from ``kafka.errors``
(``shallowmirror.errors.broker_error_info``), codec names from ``codec.layout``.
"""

from __future__ import annotations

from collections.abc import Iterable

from kafka.protocol.admin import DescribeConfigsRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.consumer.group import OffsetFetchRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from shallowmirror.codec.messages import (
    FETCH_VERSIONS,
    PRODUCE_API_KEY,
    PRODUCE_VERSIONS,
)

FETCH_API_KEY = FetchRequest.API_KEY

#: api key -> (lowest, highest) version this project sends.
API_VERSIONS: dict[int, tuple[int, int]] = {
    PRODUCE_API_KEY: PRODUCE_VERSIONS,
    FETCH_API_KEY: FETCH_VERSIONS,
    # v1+: one offset per partition; v7 adds max-timestamp lookups, which are never sent.
    ListOffsetsRequest.API_KEY: (1, 7),
    # v1: null topics means all topics; v4+: the auto-creation flag (always false here).
    MetadataRequest.API_KEY: (1, 12),
    # v3+: tansu fails v0-2.
    InitProducerIdRequest.API_KEY: (3, 5),
    # Exactly-once (engine.transactions). FindCoordinator v1-3: one key with its key type (v4+
    # batches keys). AddPartitionsToTxn v4+ is broker-to-broker only (KIP-890: CLUSTER_ACTION).
    # OffsetFetch v7: require_stable (waits out pending transactional commits), single group.
    # AddOffsetsToTxn/TxnOffsetCommit/EndTxn: up to what Kafka 3.7 speaks (v5 of EndTxn and
    # TxnOffsetCommit are KIP-890 part 2's implicit-add protocol, which is not used here).
    FindCoordinatorRequest.API_KEY: (1, 3),
    AddPartitionsToTxnRequest.API_KEY: (0, 3),
    AddOffsetsToTxnRequest.API_KEY: (0, 3),
    TxnOffsetCommitRequest.API_KEY: (0, 3),
    EndTxnRequest.API_KEY: (0, 3),
    OffsetFetchRequest.API_KEY: (7, 7),
    # v1+: include_synonyms; only a topic's max.message.bytes is ever asked for.
    DescribeConfigsRequest.API_KEY: (1, 4),
    SaslHandshakeRequest.API_KEY: (1, 1),
    SaslAuthenticateRequest.API_KEY: (0, 2),
}


def versions(api_key: int) -> tuple[int, int]:
    """The version range of ``api_key`` (KeyError for an API this project does not speak)."""
    return API_VERSIONS[api_key]


def fetch_request(version: int, partitions: Iterable[tuple[str, int, int, int]], *,
                  max_wait_ms: int, min_bytes: int, max_bytes: int,
                  isolation_level: int = 0, session_id: int = 0, session_epoch: int = -1,
                  forgotten: Iterable[tuple[str, int]] = ()):
    """A FetchRequest (no rack) for ``(topic, partition, fetch_offset, partition_max_bytes)``
    entries, grouped by topic in the order given. Sessionless by default (epoch -1); a fetch
    session (KIP-227, ``engine.fetch_session``) passes its id, epoch and the partitions to
    forget."""
    topics: dict[str, list] = {}
    for topic, partition, fetch_offset, partition_max_bytes in partitions:
        topics.setdefault(topic, []).append(FetchRequest.FetchTopic.FetchPartition(
            partition=partition, current_leader_epoch=-1, fetch_offset=fetch_offset,
            log_start_offset=-1, partition_max_bytes=partition_max_bytes))
    return FetchRequest[version](
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
        isolation_level=isolation_level, session_id=session_id, session_epoch=session_epoch,
        topics=[FetchRequest.FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()],
        forgotten_topics_data=_forgotten(forgotten), rack_id="")


def _forgotten(partitions: Iterable[tuple[str, int]]) -> list:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return [FetchRequest.ForgottenTopic(topic=t, partitions=ps) for t, ps in by_topic.items()]
