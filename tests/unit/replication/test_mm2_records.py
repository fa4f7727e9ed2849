"""MM2 record encodings against bytes MirrorMaker 2 3.7's own classes produced.

The hex constants were printed by ``OffsetSync.recordKey/recordValue``,
``Checkpoint.recordKey/recordValue`` and ``Heartbeat.recordKey/recordValue`` from
``connect-mirror(-client)-3.7.0.jar`` (a class in package ``org.apache.kafka.connect.mirror``
calling the package-private serializers)."""

from __future__ import annotations

import pytest

from shallowmirror.mirror.policy import DefaultReplicationPolicy
from shallowmirror.replication.mm2_records import (
    Checkpoint,
    Heartbeat,
    InternalTopics,
    MM2RecordError,
    OffsetSync,
    decode_offset_sync_key,
)

JAVA_SYNC = ("00066f726465727300000003", "0000011f71fb04cb000000000000002a")
JAVA_CHECKPOINT = ("0002673100066f726465727300000002",
                   "00000000000000000064000000000000005a00066d657461c3a9")
JAVA_HEARTBEAT = ("000141000142", "00000000018bcfe56800")


def test_offset_sync_bytes_equal_mm2s() -> None:
    sync = OffsetSync("orders", 3, 1234567890123, 42)
    assert (sync.key().hex(), sync.value().hex()) == JAVA_SYNC
    assert OffsetSync.decode(bytes.fromhex(JAVA_SYNC[0]), bytes.fromhex(JAVA_SYNC[1])) == sync


def test_checkpoint_bytes_equal_mm2s() -> None:
    checkpoint = Checkpoint("g1", "orders", 2, 100, 90, "meta\u00e9")
    assert (checkpoint.key().hex(), checkpoint.value().hex()) == JAVA_CHECKPOINT
    assert Checkpoint.decode(*map(bytes.fromhex, JAVA_CHECKPOINT)) == checkpoint


def test_heartbeat_bytes_equal_mm2s() -> None:
    heartbeat = Heartbeat("A", "B", 1_700_000_000_000)
    assert (heartbeat.key().hex(), heartbeat.value().hex()) == JAVA_HEARTBEAT
    assert Heartbeat.decode(*map(bytes.fromhex, JAVA_HEARTBEAT)) == heartbeat


@pytest.mark.parametrize("record", [
    OffsetSync("", 0, 0, 0),
    OffsetSync("t\u00fcpic", 2**31 - 1, 2**63 - 1, -1),
    Checkpoint("group with spaces", "a.b-c", 7, 0, 0, ""),
    Checkpoint("g", "t", 0, 5, 5, "x" * 1000),
    Heartbeat("east", "west", 0),
    Heartbeat("a" * 200, "\u00e9", -5),
])
def test_round_trip(record) -> None:
    assert type(record).decode(record.key(), record.value()) == record


def test_trailing_key_bytes_are_ignored_like_javas_schema_read() -> None:
    key = OffsetSync("orders", 1, 0, 0).key() + b"\x00\x00\x00\x00\x00\x00\x00\x07"
    assert decode_offset_sync_key(key) == ("orders", 1, b"\x00" * 7 + b"\x07")
    assert OffsetSync.decode(key, OffsetSync("orders", 1, 10, 20).value()).upstream_offset == 10


@pytest.mark.parametrize("kind,key,value,words", [
    (OffsetSync, b"\x00\x06ord", b"", ["offset sync key", "topic"]),
    (OffsetSync, b"\x00\x01t\x00\x00\x00\x01", b"\x00" * 12, ["offset sync value", "offset"]),
    (OffsetSync, None, b"\x00" * 16, ["tombstone"]),
    (Checkpoint, b"", b"\x00\x01" + b"\x00" * 30, ["version 1", "not supported"]),
    (Checkpoint, b"\x00\x01g", b"\x00\x00" + b"\x00" * 16 + b"\xff\xff",
     ["never null", "metadata"]),
    (Heartbeat, b"\x00\x01A\x00\x02\xff\xfe", b"\x00" * 10, ["not UTF-8", "targetClusterAlias"]),
    (Heartbeat, b"\x00\x01A\x00\x01B", None, ["heartbeat", "value is null"]),
])
def test_malformed_records_name_the_field(kind, key, value, words) -> None:
    with pytest.raises(MM2RecordError) as caught:
        kind.decode(key, value)
    for word in words:
        assert word in str(caught.value)


def test_topic_names_follow_mm2s_default_replication_policy() -> None:
    names = InternalTopics()
    assert names.heartbeats == "heartbeats"
    assert names.offset_syncs("B") == "mm2-offset-syncs.B.internal"
    assert names.checkpoints("A") == "A.checkpoints.internal"
    assert names.checkpoints_source("A.checkpoints.internal") == "A"
    assert names.checkpoints_source("orders") is None


def test_topic_names_honour_the_separator() -> None:
    names = InternalTopics.from_policy(DefaultReplicationPolicy(separator="_"))
    assert names.offset_syncs("B") == "mm2-offset-syncs_B_internal"
    assert names.checkpoints("A") == "A_checkpoints_internal"
    legacy = InternalTopics("_", internal_separator_enabled=False)
    assert legacy.offset_syncs("B") == "mm2-offset-syncs.B.internal"
    assert legacy.checkpoints("A") == "A.checkpoints.internal"
    assert legacy.is_checkpoints_topic("A.checkpoints.internal")
