"""The pair checks of `shallowmirror verify` on real batches (kafka-python's builder, every codec),
with the target side made by the forwarder's own header rewrite."""

from __future__ import annotations

import dataclasses

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from shallowmirror import codec
from shallowmirror.codec import deep
from shallowmirror.engine.pairing import (
    compare_forwarded,
    compare_records,
    needs_rebuild,
    same_bytes,
)

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _batch(offsets=range(200), compression: int = 0, value_bytes: int = 400,
           timestamp: int = 1_700_000_000_000):
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression,
                                        is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 22)
    for o in offsets:
        builder.append(o, timestamp=timestamp + o, key=b"key-%d" % (o % 7),
                       value=(b"value-%d-" % o) * (value_bytes // 10), headers=[("h", b"x")])
    return codec.split_batches(bytes(builder.build())).batches[0]


def _forwarded(view, producer_id: int = 4242):
    """The batch as the mirror sends it (its producer stamped), as the target stores it."""
    header, rest = codec.rewrite_for_produce(view, producer_id=producer_id, producer_epoch=3,
                                             base_sequence=17)
    return codec.split_batches(bytes(header) + bytes(rest)).batches[0]


def _edit(view, position: int, xor: int = 0xFF):
    data = bytearray(view.buffer)
    data[position] ^= xor
    return codec.split_batches(bytes(data), verify_crc=False).batches[0]


@pytest.mark.parametrize("name", sorted(CODECS))
def test_a_forwarded_batch_equals_its_source_despite_new_producer_fields(name):
    source = _batch(compression=CODECS[name])
    target = _forwarded(source)
    assert target.producer_id == 4242 and target.crc != source.crc
    assert compare_forwarded(source, target) is None


@pytest.mark.parametrize("name", sorted(CODECS))
def test_one_flipped_byte_in_the_records_section_is_found_where_it_is(name):
    source = _batch(compression=CODECS[name])
    for position in (61, source.size // 2, source.size - 1):
        reason = compare_forwarded(source, _edit(_forwarded(source), position))
        assert reason == (f"records section differs at byte {position} of the batch "
                          f"({source.size} bytes on the source, {source.size} on the target)")


def test_header_fields_that_count_are_named():
    source = _batch()
    assert "first timestamp" in compare_forwarded(source, _edit(_forwarded(source), 34, 1))
    assert "max timestamp" in compare_forwarded(source, _edit(_forwarded(source), 42, 1))
    other = _forwarded(_batch(range(199)))
    assert compare_forwarded(source, other) == \
        "record count 200 on the source, 199 on the target"
    assert "codec none on the source, lz4 on the target" in compare_forwarded(
        source, _forwarded(_batch(compression=3)))


def test_log_append_time_max_timestamp_is_not_compared():
    source = _batch()
    target = _edit(_edit(_forwarded(source), 22, 0x08), 42, 1)     # LogAppendTime bit, new max
    assert target.timestamp_type == 1
    assert compare_forwarded(source, target) is None


def test_same_bytes_across_slice_boundaries():
    data = bytes(range(256)) * 1000
    assert same_bytes(memoryview(data), memoryview(bytearray(data)))
    changed = bytearray(data)
    changed[65536] ^= 1
    assert not same_bytes(memoryview(data), memoryview(changed))
    assert not same_bytes(memoryview(data), memoryview(data)[1:])


def test_a_compacted_batch_is_compared_record_by_record_after_repack():
    source = _batch(offsets=[0, 2, 5, 9], compression=CODECS["zstd"])
    assert needs_rebuild(source, 0) and not needs_rebuild(_batch(), 0)
    repacked = codec.split_batches(deep.repack_batch(source)).batches[0]
    wanted, got = deep.decode_records(source), deep.decode_records(repacked)
    assert compare_records(wanted, got) is None
    got[2] = dataclasses.replace(got[2], value=b"other")
    assert compare_records(wanted, got) == ("record 2 of the re-packed batch (source offset 5) "
                                            "differs in key, value or headers")
