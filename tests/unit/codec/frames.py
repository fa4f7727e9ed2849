"""Shared helpers for the message-codec tests: both implementations, and reference frames built
with kafka-python's protocol classes (generated from Kafka's own JSON schemas)."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

import pytest
from implementations import native_module
from kafka.protocol.consumer import FetchResponse as KFetchResponse
from kafka.protocol.producer import ProduceRequest as KProduceRequest
from kafka.protocol.producer import ProduceResponse as KProduceResponse

from shallowmirror.codec import messages as twin

FETCH_VERSIONS = list(range(4, 13))
PRODUCE_VERSIONS = list(range(3, 10))

_KFTopic = KFetchResponse.FetchableTopicResponse
_KFPartition = _KFTopic.PartitionData
_KPTopic = KProduceRequest.TopicProduceData
_KPPartition = _KPTopic.PartitionProduceData
_KRTopic = KProduceResponse.TopicProduceResponse
_KRPartition = _KRTopic.PartitionProduceResponse




NATIVE = native_module("_cmessages")


def implementations() -> list:
    """pytest params: the twin and the native module (skipped when not built)."""
    native = (pytest.param(NATIVE, id="native") if NATIVE is not None else
              pytest.param(None, id="native",
                           marks=pytest.mark.skip(reason="native _cmessages not built")))
    return [pytest.param(twin, id="python"), native]


IMPLS = implementations()
BOTH_BUILT = NATIVE is not None


# ---------------------------------------------------------------------------- Fetch responses

@dataclass
class PartitionSpec:
    """What a test puts in one partition of a Fetch response."""

    partition: int
    error_code: int = 0
    high_watermark: int = 0
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: list | None = field(default_factory=list)
    preferred_read_replica: int = -1
    records: bytes | None = b""
    tagged: bool = False     # v12: also send the tagged fields current_leader etc.


def fetch_frame(version: int, topics: list[tuple[str, list[PartitionSpec]]], *,
                correlation_id: int = 7, throttle_time_ms: int = 0, error_code: int = 0,
                session_id: int = 0) -> bytes:
    """A Fetch response frame (without its size prefix) as kafka-python encodes it."""
    responses = []
    for topic, parts in topics:
        partitions = []
        for p in parts:
            kwargs = {}
            if p.tagged and version >= 12:
                kwargs = {
                    "diverging_epoch": _KFPartition.EpochEndOffset(epoch=3, end_offset=99),
                    "current_leader": _KFPartition.LeaderIdAndEpoch(leader_id=1, leader_epoch=4),
                    "snapshot_id": _KFPartition.SnapshotId(end_offset=5, epoch=6),
                }
            aborted = (None if p.aborted_transactions is None else
                       [_KFPartition.AbortedTransaction(producer_id=a, first_offset=b)
                        for a, b in p.aborted_transactions])
            partitions.append(_KFPartition(
                partition_index=p.partition, error_code=p.error_code,
                high_watermark=p.high_watermark, last_stable_offset=p.last_stable_offset,
                log_start_offset=p.log_start_offset, aborted_transactions=aborted,
                preferred_read_replica=p.preferred_read_replica, records=p.records, **kwargs))
        responses.append(_KFTopic(topic=topic, partitions=partitions))
    msg = KFetchResponse(version=version, throttle_time_ms=throttle_time_ms,
                         error_code=error_code, session_id=session_id, responses=responses)
    msg.with_header(correlation_id=correlation_id)
    framed = bytes(msg.encode(header=True, framed=True))
    assert struct.unpack(">i", framed[:4])[0] == len(framed) - 4
    return framed[4:]


def expected_partition(version: int, p: PartitionSpec) -> dict:
    """The fields a decoder must return for ``p`` at ``version`` (version-less fields: -1/[])."""
    return {
        "partition": p.partition,
        "error_code": p.error_code,
        "high_watermark": p.high_watermark,
        "last_stable_offset": p.last_stable_offset,
        "log_start_offset": p.log_start_offset if version >= 5 else -1,
        "aborted_transactions": [tuple(a) for a in (p.aborted_transactions or [])],
        "preferred_read_replica": p.preferred_read_replica if version >= 11 else -1,
        "records": p.records,
    }


def random_fetch_topics(rng: random.Random, max_topics: int = 3,
                        max_partitions: int = 4) -> list[tuple[str, list[PartitionSpec]]]:
    """A varied Fetch response body: nulls, empties, aborted transactions, tagged fields."""
    topics = []
    for t in range(rng.randint(0, max_topics)):
        name = f"topic-{t}-" + "x" * rng.randint(0, 20)
        parts = []
        for p in rng.sample(range(64), rng.randint(0, max_partitions)):
            records = rng.choice([None, b"", rng.randbytes(rng.randint(1, 300))])
            aborted = rng.choice([None, [], [(rng.randint(0, 2**40), rng.randint(0, 2**40))
                                             for _ in range(rng.randint(1, 3))]])
            parts.append(PartitionSpec(
                partition=p, error_code=rng.choice([0, 0, 1, 6]),
                high_watermark=rng.randint(-1, 2**62), last_stable_offset=rng.randint(-1, 2**62),
                log_start_offset=rng.randint(-1, 2**40), aborted_transactions=aborted,
                preferred_read_replica=rng.choice([-1, 0, 3]), records=records,
                tagged=rng.random() < 0.3))
        topics.append((name, parts))
    return topics


# ---------------------------------------------------------------------------- Produce

def kafka_produce_request(frame: bytes, version: int):
    """Decode a framed Produce request with kafka-python (header included)."""
    return KProduceRequest.decode(frame, version=version, header=True, framed=True)


def kafka_encode_produce_request(version: int, *, correlation_id: int, client_id: str | None,
                                 transactional_id: str | None, acks: int, timeout_ms: int,
                                 topics: list[tuple[str, list[tuple[int, bytes]]]]) -> bytes:
    """The same request encoded by kafka-python, framed, header included."""
    msg = KProduceRequest(
        version=version, transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms,
        topic_data=[_KPTopic(name=t, partition_data=[_KPPartition(index=p, records=r)
                                                     for p, r in parts])
                    for t, parts in topics])
    msg.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(msg.encode(header=True, framed=True))


def produce_response_frame(version: int, topics: list, *, correlation_id: int = 9,
                           throttle_time_ms: int = 0) -> bytes:
    """A Produce response frame (no size prefix) from kafka-python.

    ``topics``: [(name, [dict(index=, error_code=, base_offset=, log_append_time_ms=,
    log_start_offset=, record_errors=[(i, msg)], error_message=, leader=(id, epoch)|None)])]."""
    responses = []
    for name, parts in topics:
        partitions = []
        for p in parts:
            errors = [_KRPartition.BatchIndexAndErrorMessage(batch_index=i,
                                                             batch_index_error_message=m)
                      for i, m in p.get("record_errors", [])]
            partitions.append(_KRPartition(
                index=p["index"], error_code=p.get("error_code", 0),
                base_offset=p.get("base_offset", 0),
                log_append_time_ms=p.get("log_append_time_ms", -1),
                log_start_offset=p.get("log_start_offset", -1), record_errors=errors,
                error_message=p.get("error_message")))
        responses.append(_KRTopic(name=name, partition_responses=partitions))
    msg = KProduceResponse(version=version, responses=responses,
                           throttle_time_ms=throttle_time_ms)
    msg.with_header(correlation_id=correlation_id)
    return bytes(msg.encode(header=True, framed=True))[4:]


def random_produce_response_topics(rng: random.Random) -> list:
    topics = []
    for t in range(rng.randint(0, 3)):
        parts = []
        for p in rng.sample(range(32), rng.randint(0, 4)):
            errors = [(rng.randint(0, 100), rng.choice([None, "", "bad record ü"]))
                      for _ in range(rng.choice([0, 0, 1, 2]))]
            parts.append({
                "index": p, "error_code": rng.choice([0, 0, 2, 87]),
                "base_offset": rng.randint(-1, 2**50),
                "log_append_time_ms": rng.choice([-1, 1_700_000_000_000]),
                "log_start_offset": rng.randint(-1, 2**30), "record_errors": errors,
                "error_message": rng.choice([None, "", "boom"]),
            })
        topics.append((f"t{t}" + "é" * rng.randint(0, 3), parts))
    return topics


def expected_produce_partition(version: int, p: dict) -> dict:
    return {
        "partition": p["index"],
        "error_code": p.get("error_code", 0),
        "base_offset": p.get("base_offset", 0),
        "log_append_time_ms": p.get("log_append_time_ms", -1),
        "log_start_offset": p.get("log_start_offset", -1) if version >= 5 else -1,
        "record_errors": list(p.get("record_errors", [])) if version >= 8 else [],
        "error_message": p.get("error_message") if version >= 8 else None,
    }


def fields(obj, names) -> dict:
    """The named attributes of a result object, records as bytes (None stays None)."""
    out = {}
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, memoryview):
            value = value.tobytes()
        out[name] = value
    return out


FETCH_PARTITION_FIELDS = ("partition", "error_code", "high_watermark", "last_stable_offset",
                          "log_start_offset", "aborted_transactions", "preferred_read_replica",
                          "records")
PRODUCE_PARTITION_FIELDS = ("partition", "error_code", "base_offset", "log_append_time_ms",
                            "log_start_offset", "record_errors", "error_message")


def outcome(fn, *args):
    """("ok", result) or ("corrupt", str(error), where); any other exception propagates."""
    from shallowmirror.errors import CorruptDataError

    try:
        return ("ok", fn(*args))
    except CorruptDataError as err:
        return ("corrupt", str(err), err.where)
