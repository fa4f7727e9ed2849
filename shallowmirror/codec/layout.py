"""Wire-layout constants of Kafka record sets: v2 RecordBatch and legacy (magic 0/1) messages.

Every codec module (the twin ``records``, the native ``_crecords``, ``deep``) takes its offsets
from here or mirrors them (the .pyx repeats them as C constants; a unit test checks they agree).

v2 RecordBatch (magic 2), big-endian; the fixed header is 61 bytes::

    offset size  field                  in CRC?  notes
    ------ ----  ---------------------  -------  ------------------------------------------------
         0    8  baseOffset             no       client-sent batches must carry 0
         8    4  batchLength            no       bytes after this field: size = batchLength + 12
        12    4  partitionLeaderEpoch   no       set by the leader; we send -1
        16    1  magic                  no       2 (byte 16 is the magic for every format)
        17    4  crc                    -        CRC-32C (Castagnoli), unsigned
        21    2  attributes             yes      bits below
        23    4  lastOffsetDelta        yes      recordCount - 1 unless compaction left gaps
        27    8  baseTimestamp          yes      (Kafka's Java name: firstTimestamp)
        35    8  maxTimestamp           yes      the append time when LogAppendTime is set
        43    8  producerId             yes      -1 when not idempotent
        51    2  producerEpoch          yes      -1 when not idempotent
        53    4  baseSequence           yes      -1 when not idempotent
        57    4  recordCount            yes
        61    -  records                yes      compressed as one block when a codec is set

    The CRC-32C covers bytes 21 .. end of batch (attributes through the last record). So
    rewriting baseOffset and partitionLeaderEpoch is free, while rewriting attributes or the
    producer fields means recomputing the CRC.

v2 attribute bits (int16)::

    bits 0-2  compression: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd (5-7 invalid)
    bit  3    timestamp type: 0 CreateTime, 1 LogAppendTime
    bit  4    transactional
    bit  5    control (transaction markers; records are never compressed)
    bit  6    delete horizon set (compaction, KIP-534)
    bits 7-15 unused

A control record's key is ``version:int16, type:int16`` (type 0 ABORT, 1 COMMIT); the first record
of a control batch starts at byte 61 as varint length, int8 attributes, varlong timestampDelta,
varint offsetDelta, varint keyLength, key.

Legacy message set entry (magic 0 and 1), big-endian::

    offset size  field          notes
    ------ ----  -------------  -----------------------------------------------------------------
         0    8  offset         for a compressed wrapper: the offset of the *last* inner message
         8    4  messageSize    bytes after this field: size = messageSize + 12
        12    4  crc            CRC-32 (zlib polynomial) over bytes 16 .. end of message
        16    1  magic          0 or 1
        17    1  attributes     bits 0-2 compression (0-3; no zstd), bit 3 timestamp type (magic 1)
        18    8  timestamp      magic 1 only
    18/26     4  keyLength      -1 for a null key
              k  key
              4  valueLength    -1 for a null value; a compressed wrapper's value is the
              v  value          compressed inner message set
"""

from __future__ import annotations

# --- the 12-byte log overhead shared by every format ---
BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
LOG_OVERHEAD = 12           # baseOffset + length: size = length + LOG_OVERHEAD
MAGIC_OFFSET = 16           # same position for magic 0, 1 and 2

# --- v2 RecordBatch header ---
PARTITION_LEADER_EPOCH_OFFSET = 12
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21      # the CRC-32C covers [ATTRIBUTES_OFFSET, end of batch)
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORD_COUNT_OFFSET = 57
RECORDS_OFFSET = 61
HEADER_SIZE = 61            # the fixed v2 header; rewrite_for_produce returns a new one
V2_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD   # 49: an empty batch

# --- attributes ---
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
MAX_COMPRESSION_V2 = COMPRESSION_ZSTD
MAX_COMPRESSION_LEGACY = COMPRESSION_LZ4
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
#: The codec names, in codec-id order (what compression.type and the tools accept).
CODEC_NAMES = tuple(COMPRESSION_NAMES.values())

CREATE_TIME = 0
LOG_APPEND_TIME = 1

# --- producer sequences ---
# A batch's base sequence grows by its record count and wraps to 0 after Int32 max (Kafka's
# DefaultRecordBatch.incrementSequence); every stamper of idempotent batches uses this.
SEQUENCE_MODULUS = 1 << 31


def take_sequence(sequences: dict, key: object, record_count: int) -> int:
    """The base sequence of ``key``'s next batch of ``record_count`` records (0 for its
    first); advances ``sequences[key]`` past it, wrapping as Kafka does. The native codec's
    ``stamp_batches`` does the same step in C."""
    base = sequences.get(key, 0)
    sequences[key] = (base + record_count) % SEQUENCE_MODULUS
    return base

# --- control records ---
CONTROL_TYPE_ABORT = 0
CONTROL_TYPE_COMMIT = 1

# --- legacy messages (magic 0 / 1) ---
LEGACY_CRC_OFFSET = 12      # CRC-32 (zlib) covers [MAGIC_OFFSET, end of message)
LEGACY_ATTRIBUTES_OFFSET = 17
LEGACY_TIMESTAMP_OFFSET = 18            # magic 1 only
LEGACY_KEY_LENGTH_OFFSET_V0 = 18
LEGACY_KEY_LENGTH_OFFSET_V1 = 26
# crc + magic + attributes (+ timestamp) + keyLength + valueLength
LEGACY_MIN_LENGTH_V0 = 4 + 1 + 1 + 4 + 4            # 14
LEGACY_MIN_LENGTH_V1 = 4 + 1 + 1 + 8 + 4 + 4        # 22

# Invariants the offsets above must satisfy (a typo here would corrupt every batch).
assert ATTRIBUTES_OFFSET == CRC_OFFSET + 4
assert RECORDS_OFFSET == RECORD_COUNT_OFFSET + 4 == HEADER_SIZE
assert LEGACY_KEY_LENGTH_OFFSET_V1 == LEGACY_TIMESTAMP_OFFSET + 8
