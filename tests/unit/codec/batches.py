"""Shared helpers for the record-set codec tests: both implementations, the saved corpus of real
broker-stored batches, and batch builders over kafka-python's record module.

Not a conftest: plain functions and constants that test modules import.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from implementations import native_module
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from shallowmirror.codec import layout as L
from shallowmirror.codec import records as twin
from shallowmirror.codec.deep import _SameCodecBuilder

DATA = Path(__file__).parent / "data"
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}




NATIVE = native_module("_crecords")
#: Parametrize a test over both implementations: ``@pytest.mark.parametrize("impl", IMPLS)``.
IMPLS = [
    pytest.param(twin, id="twin"),
    pytest.param(NATIVE, id="native",
                 marks=pytest.mark.skipif(NATIVE is None, reason="native codec not built")),
]

HEADER_FIELDS = (
    "position", "base_offset", "batch_length", "partition_leader_epoch", "magic", "crc",
    "attributes", "last_offset_delta", "base_timestamp", "max_timestamp", "producer_id",
    "producer_epoch", "base_sequence", "record_count", "compression", "timestamp_type",
    "is_transactional", "is_control", "is_legacy", "last_offset", "next_offset", "size",
)


def fields(view) -> dict:
    """Every contract attribute of a batch view, plus its bytes, for equality checks."""
    out = {name: getattr(view, name) for name in HEADER_FIELDS}
    out["bytes"] = bytes(view.buffer)
    return out


def corpus_index() -> dict:
    return json.loads((DATA / "index.json").read_text())


def corpus() -> dict[str, bytes]:
    """name -> raw record set, as fetched from a real broker (see make_corpus.py)."""
    return {name: (DATA / f"{name}.bin").read_bytes() for name in sorted(corpus_index())}


CORPUS_NAMES = sorted(json.loads((DATA / "index.json").read_text()))


def _value(i: int, size: int) -> bytes:
    text = (f"value-{i:06d}-" * (size // 13 + 1)).encode()
    return text[:size]


def build_batch(codec: str | int = "none", count: int = 5, *, base_offset: int = 0,
                producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                transactional: bool = False, value_size: int = 40, offset_deltas=None,
                timestamp: int = 1_700_000_000_000, leader_epoch: int = 0) -> bytes:
    """A v2 batch built with kafka-python's builder (always in the given codec)."""
    compression = CODECS[codec] if isinstance(codec, str) else codec
    builder = _SameCodecBuilder(2, compression, transactional, producer_id, producer_epoch,
                                base_sequence, 1 << 30)
    deltas = list(range(count)) if offset_deltas is None else list(offset_deltas)
    for i, delta in enumerate(deltas):
        builder.append(delta, timestamp + i, f"key-{i}".encode() if i % 3 else None,
                       _value(i, value_size), [("h", b"x")] if i % 2 else [])
    out = bytearray(builder.build())
    struct.pack_into(">q", out, 0, base_offset)
    struct.pack_into(">i", out, 12, leader_epoch)
    return bytes(out)


def recrc(batch: bytearray | bytes) -> bytes:
    """Recompute a v2 batch's CRC-32C after editing covered bytes."""
    out = bytearray(batch)
    struct.pack_into(">I", out, L.CRC_OFFSET, crc32c(memoryview(out)[L.ATTRIBUTES_OFFSET:]))
    return bytes(out)


def set_attributes(batch: bytes, attributes: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">h", out, L.ATTRIBUTES_OFFSET, attributes)
    return recrc(out)


def control_batch(producer_id: int, producer_epoch: int, base_offset: int, *, abort: bool,
                  coordinator_epoch: int = 0) -> bytes:
    """A transaction marker batch as a broker writes it (control + transactional bits)."""
    builder = _SameCodecBuilder(2, 0, True, producer_id, producer_epoch, -1, 1 << 20)
    key = struct.pack(">hh", 0, 0 if abort else 1)
    value = struct.pack(">hi", 0, coordinator_epoch)
    builder.append(0, 1_700_000_000_000, key, value, [])
    out = bytearray(builder.build())
    struct.pack_into(">q", out, 0, base_offset)
    attributes = struct.unpack_from(">h", out, L.ATTRIBUTES_OFFSET)[0] | L.CONTROL_MASK
    return set_attributes(out, attributes)


def legacy_entry(magic: int, codec: str = "none", count: int = 1, *, base_offset: int = 0,
                 timestamp: int = 1_700_000_000_000) -> bytes:
    """Legacy message set bytes (magic 0/1); compressed: one wrapper holding ``count`` messages."""
    compression = CODECS[codec]
    builder = LegacyRecordBatchBuilder(magic, compression, 1 << 20)
    for i in range(count):
        builder.append(base_offset + i, timestamp + i if magic else None,
                       f"key-{i}".encode() if i % 2 else None, _value(i, 30))
    out = bytearray(builder.build())
    if compression:
        # As a broker stores it: the wrapper carries the offset of its last inner message.
        struct.pack_into(">q", out, 0, base_offset + count - 1)
    return bytes(out)
