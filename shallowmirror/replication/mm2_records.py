"""MirrorMaker 2's record encodings (Kafka 3.7 ``connect-mirror`` / ``connect-mirror-client``) and
its internal topic names, byte for byte, so MM2's own readers (``RemoteClusterUtils``,
``OffsetSyncStore``, the console formatters) read what shallowmirror writes and vice versa.

Wire layout (Kafka's ``org.apache.kafka.common.protocol.types``: big-endian fixed-width ints;
STRING = int16 byte length + UTF-8 bytes, never null)::

    OffsetSync  key    topic STRING | partition INT32
                value  upstreamOffset INT64 | offset INT64           (no version header)
    Checkpoint  key    group STRING | topic STRING | partition INT32
                value  version INT16 (=0) | upstreamOffset INT64 | offset INT64 | metadata STRING
    Heartbeat   key    sourceClusterAlias STRING | targetClusterAlias STRING
                value  version INT16 (=0) | timestamp INT64

Readers here behave like Java's ``Schema.read``: fields are read in order and trailing bytes are
ignored (shallowmirror's offset-sync keys use that, see ``replication/offset_syncs.py``); a
record too short for its schema, a negative string length or bad UTF-8 raises
``MM2RecordError`` naming the record kind and the field. A value of a version other than 0 is
refused as MM2 3.7 refuses it.

Topic names (``DefaultReplicationPolicy`` 3.7, also inherited by ``IdentityReplicationPolicy``)::

    heartbeats                                        heartbeats
    offset syncs   (written on the source)            mm2-offset-syncs<sep><target alias><sep>internal
    checkpoints    (written on the target)            <source alias><sep>checkpoints<sep>internal

``<sep>`` is ``replication.policy.separator`` when
``replication.policy.internal.topic.separator.enabled`` is true (the default), else ``.``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from shallowmirror.errors import ShallowMirrorError
from shallowmirror.mirror.policy import DefaultReplicationPolicy

#: The only value version MM2 3.7 writes and reads (Checkpoint.VERSION, Heartbeat.VERSION).
VERSION = 0

OFFSET_SYNCS_TOPIC_PREFIX = "mm2-offset-syncs"
CHECKPOINTS_TOPIC_NAME = "checkpoints"
INTERNAL_TOPIC_NAME = "internal"
HEARTBEATS_TOPIC = "heartbeats"

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_TWO_INT64 = struct.Struct(">qq")


class MM2RecordError(ShallowMirrorError):
    """A record in an MM2 internal topic does not follow MM2's encoding."""


# ---------------------------------------------------------------------------------------------
# Primitive fields


def _string(value: str) -> bytes:
    data = value.encode("utf-8")
    if len(data) > 0x7FFF:
        raise MM2RecordError(f"string of {len(data)} bytes does not fit an MM2 STRING field "
                             "(at most 32767)")
    return _INT16.pack(len(data)) + data


class _Reader:
    """Reads fields in order from one key or value, naming the field that is missing."""

    def __init__(self, data: bytes | memoryview, kind: str) -> None:
        self._data = bytes(data)
        self._kind = kind
        self.position = 0

    def _take(self, size: int, field: str) -> bytes:
        end = self.position + size
        if end > len(self._data):
            raise MM2RecordError(f"{self._kind}: {len(self._data)} bytes end inside field "
                                 f"{field!r} at byte {self.position} (needs {size})")
        chunk = self._data[self.position:end]
        self.position = end
        return chunk

    def int16(self, field: str) -> int:
        return _INT16.unpack(self._take(2, field))[0]

    def int32(self, field: str) -> int:
        return _INT32.unpack(self._take(4, field))[0]

    def int64(self, field: str) -> int:
        return _INT64.unpack(self._take(8, field))[0]

    def string(self, field: str) -> str:
        size = self.int16(field)
        if size < 0:
            raise MM2RecordError(f"{self._kind}: field {field!r} has length {size} "
                                 "(MM2 strings are never null)")
        raw = self._take(size, field)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise MM2RecordError(f"{self._kind}: field {field!r} is not UTF-8: {err}") from err

    def rest(self) -> bytes:
        return self._data[self.position:]

    def version(self) -> int:
        version = self.int16("version")
        if version != VERSION:
            raise MM2RecordError(f"{self._kind}: value version {version} is not supported "
                                 f"(MM2 3.7 writes and reads version {VERSION})")
        return version


def _require(data: bytes | memoryview | None, kind: str, part: str) -> bytes | memoryview:
    if data is None:
        raise MM2RecordError(f"{kind}: {part} is null (a tombstone is not an MM2 record)")
    return data


# ---------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class OffsetSync:
    """``upstream_offset`` on the source partition is ``downstream_offset`` on the target."""

    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int

    def key(self) -> bytes:
        return encode_offset_sync_key(self.topic, self.partition)

    def value(self) -> bytes:
        return _TWO_INT64.pack(self.upstream_offset, self.downstream_offset)

    @classmethod
    def decode(cls, key: bytes | memoryview | None,
               value: bytes | memoryview | None) -> OffsetSync:
        topic, partition, _ = decode_offset_sync_key(key)
        reader = _Reader(_require(value, "offset sync", "value"), "offset sync value")
        upstream = reader.int64("upstreamOffset")
        downstream = reader.int64("offset")
        return cls(topic, partition, upstream, downstream)


def encode_offset_sync_key(topic: str, partition: int) -> bytes:
    """OffsetSync.KEY_SCHEMA: topic STRING, partition INT32."""
    return _string(topic) + _INT32.pack(partition)


def decode_offset_sync_key(key: bytes | memoryview | None) -> tuple[str, int, bytes]:
    """(topic, partition, bytes after the MM2 fields) of an offset-sync key."""
    reader = _Reader(_require(key, "offset sync", "key"), "offset sync key")
    topic = reader.string("topic")
    partition = reader.int32("partition")
    return topic, partition, reader.rest()


@dataclass(frozen=True)
class Checkpoint:
    """Group ``group`` committed ``upstream_offset`` on the source partition; on the target that
    is ``downstream_offset``. ``topic`` is the topic's name *on the target* (MM2's
    ``renameTopicPartition``: ``A.orders`` for ``orders`` of cluster A; ``orders`` for a
    ``B.orders`` checkpointed back to B), as ``RemoteClusterUtils.translateOffsets`` returns it."""

    group: str
    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int
    metadata: str = ""

    def key(self) -> bytes:
        return _string(self.group) + _string(self.topic) + _INT32.pack(self.partition)

    def value(self) -> bytes:
        return (_INT16.pack(VERSION) + _TWO_INT64.pack(self.upstream_offset,
                                                       self.downstream_offset)
                + _string(self.metadata))

    @classmethod
    def decode(cls, key: bytes | memoryview | None,
               value: bytes | memoryview | None) -> Checkpoint:
        reader = _Reader(_require(value, "checkpoint", "value"), "checkpoint value")
        reader.version()
        upstream = reader.int64("upstreamOffset")
        downstream = reader.int64("offset")
        metadata = reader.string("metadata")
        key_reader = _Reader(_require(key, "checkpoint", "key"), "checkpoint key")
        group = key_reader.string("group")
        topic = key_reader.string("topic")
        partition = key_reader.int32("partition")
        return cls(group, topic, partition, upstream, downstream, metadata)


@dataclass(frozen=True)
class Heartbeat:
    """A heartbeat the flow ``source_alias -> target_alias`` emitted at ``timestamp_ms``."""

    source_alias: str
    target_alias: str
    timestamp_ms: int

    def key(self) -> bytes:
        return _string(self.source_alias) + _string(self.target_alias)

    def value(self) -> bytes:
        return _INT16.pack(VERSION) + _INT64.pack(self.timestamp_ms)

    @classmethod
    def decode(cls, key: bytes | memoryview | None,
               value: bytes | memoryview | None) -> Heartbeat:
        reader = _Reader(_require(value, "heartbeat", "value"), "heartbeat value")
        reader.version()
        timestamp = reader.int64("timestamp")
        key_reader = _Reader(_require(key, "heartbeat", "key"), "heartbeat key")
        source = key_reader.string("sourceClusterAlias")
        target = key_reader.string("targetClusterAlias")
        return cls(source, target, timestamp)


# ---------------------------------------------------------------------------------------------
# Topic names


@dataclass(frozen=True)
class InternalTopics:
    """MM2's internal topic names for one ``replication.policy.separator`` setting."""

    separator: str = "."
    internal_separator_enabled: bool = True

    @classmethod
    def from_policy(cls, policy: DefaultReplicationPolicy,
                    internal_separator_enabled: bool = True) -> InternalTopics:
        """The names a flow's replication policy gives MM2's internal topics."""
        return cls(policy.separator, internal_separator_enabled)

    @property
    def internal_separator(self) -> str:
        return self.separator if self.internal_separator_enabled else "."

    @property
    def heartbeats(self) -> str:
        return HEARTBEATS_TOPIC

    def offset_syncs(self, target_alias: str) -> str:
        """Offset syncs of flows *to* ``target_alias`` (DefaultReplicationPolicy.offsetSyncsTopic
        is called with the target alias)."""
        sep = self.internal_separator
        return f"{OFFSET_SYNCS_TOPIC_PREFIX}{sep}{target_alias}{sep}{INTERNAL_TOPIC_NAME}"

    def checkpoints(self, source_alias: str) -> str:
        """Checkpoints of groups of ``source_alias``, written on the target."""
        sep = self.internal_separator
        return f"{source_alias}{sep}{CHECKPOINTS_TOPIC_NAME}{sep}{INTERNAL_TOPIC_NAME}"

    def is_checkpoints_topic(self, topic: str) -> bool:
        sep = self.internal_separator
        return topic.endswith(f"{sep}{CHECKPOINTS_TOPIC_NAME}{sep}{INTERNAL_TOPIC_NAME}")

    def checkpoints_source(self, topic: str) -> str | None:
        """The source alias a checkpoints topic belongs to, or None."""
        suffix = f"{self.internal_separator}{CHECKPOINTS_TOPIC_NAME}" \
                 f"{self.internal_separator}{INTERNAL_TOPIC_NAME}"
        if not topic.endswith(suffix) or len(topic) == len(suffix):
            return None
        return topic[:-len(suffix)]
