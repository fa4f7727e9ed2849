"""Deep paths (decode, trim, repack, legacy conversion) for every codec, fed with views from both
implementations; outputs checked with kafka-python's reader and with our own split_batches."""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch

from shallowmirror.codec import deep
from shallowmirror.codec import layout as L
from shallowmirror.errors import CorruptDataError, UnsupportedFormatError
from tests.unit.codec.batches import (
    CODECS,
    CORPUS_NAMES,
    IMPLS,
    build_batch,
    control_batch,
    corpus,
    legacy_entry,
    set_attributes,
)

CORPUS = corpus()


def _records(batch_bytes: bytes) -> list[tuple]:
    reader = DefaultRecordBatch(batch_bytes)
    assert reader.validate_crc()
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers) for r in reader]


def _as_tuples(records: list[deep.Record]) -> list[tuple]:
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers)
            for r in records]


def _header(batch_bytes: bytes) -> DefaultRecordBatch:
    return DefaultRecordBatch(batch_bytes)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_decode_real_corpus_matches_kafka_python(impl, name):
    for view in impl.split_batches(CORPUS[name]).batches:
        records = deep.decode_records(view)
        assert len(records) == view.record_count
        assert _as_tuples(records) == _records(bytes(view.buffer))
        if not view.is_control:
            assert all(r.value.startswith(b"record-") for r in records)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("codec", list(CODECS))
def test_trim_drops_records_below_fetch_offset_and_keeps_the_rest(impl, codec):
    source = build_batch(codec, 8, base_offset=100, producer_id=12, producer_epoch=3,
                         base_sequence=40, transactional=True, leader_epoch=6)
    view = impl.split_batches(source).batches[0]
    trimmed = deep.trim_batch(view, 103)
    header = _header(trimmed)
    assert header.compression_type == CODECS[codec]
    assert (header.base_offset, header.leader_epoch) == (103, 6)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (12, 3, 43)
    assert header.is_transactional
    assert header.records_count == header.last_offset_delta + 1 == 5
    assert _records(trimmed) == _records(source)[3:]
    # The result is itself a valid batch for the hot path.
    again = impl.split_batches(trimmed).batches[0]
    assert again.base_offset == 103 and again.record_count == 5
    # Nothing to trim: the same bytes come back.
    assert deep.trim_batch(view, 100) == source
    with pytest.raises(ValueError, match="below"):
        deep.trim_batch(view, 108)


@pytest.mark.parametrize("name", [n for n in CORPUS_NAMES if "plain" in n])
def test_trim_real_corpus(name):
    from tests.unit.codec.batches import twin

    first = twin.split_batches(CORPUS[name]).batches[0]
    trimmed = deep.trim_batch(first, first.base_offset + 2)
    assert _records(trimmed) == _records(bytes(first.buffer))[2:]
    assert _header(trimmed).compression_type == first.compression


def test_trim_sequence_wraps_like_kafka():
    source = build_batch("none", 4, producer_id=1, producer_epoch=0,
                         base_sequence=(1 << 31) - 2)
    header = _header(deep.trim_batch(source, 3))
    # sequences of records 0..3: MAX-1, MAX, 0, 1
    assert header.base_sequence == 1


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("codec", list(CODECS))
def test_repack_renumbers_a_compacted_batch(impl, codec):
    source = build_batch(codec, offset_deltas=[0, 2, 3, 7], base_offset=50, producer_id=4,
                         producer_epoch=0, base_sequence=9)
    view = impl.split_batches(source).batches[0]
    with pytest.raises(UnsupportedFormatError):
        impl.rewrite_for_produce(view)
    repacked = deep.repack_batch(view)
    header = _header(repacked)
    assert header.compression_type == CODECS[codec]
    assert header.records_count == header.last_offset_delta + 1 == 4
    assert header.base_offset == 50 and header.producer_id == 4
    original = _records(source)
    assert [r[0] for r in original] == [50, 52, 53, 57]
    assert [(r[0],) + r[1:] for r in _records(repacked)] == [
        (50 + i,) + r[1:] for i, r in enumerate(original)]
    # Now the hot path accepts it.
    new_view = impl.split_batches(repacked).batches[0]
    header_bytes, rest = impl.rewrite_for_produce(new_view)
    assert _records(header_bytes + bytes(rest))[0][3:] == original[0][3:]
    # A dense batch is returned as is.
    assert deep.repack_batch(build_batch(codec, 3)) == build_batch(codec, 3)


def test_repack_empty_compacted_batch_says_skip():
    source = bytearray(build_batch("none", 1))
    struct.pack_into(">i", source, 8, L.V2_MIN_BATCH_LENGTH)
    del source[L.HEADER_SIZE:]
    struct.pack_into(">i", source, L.RECORD_COUNT_OFFSET, 0)
    struct.pack_into(">i", source, L.LAST_OFFSET_DELTA_OFFSET, 4)
    from tests.unit.codec.batches import recrc

    with pytest.raises(ValueError, match="skip"):
        deep.repack_batch(recrc(source))


@pytest.mark.parametrize("codec", list(CODECS))
def test_trim_keeps_log_append_time(codec):
    source = build_batch(codec, 4)
    attributes = struct.unpack_from(">h", source, L.ATTRIBUTES_OFFSET)[0]
    source = set_attributes(source, attributes | L.TIMESTAMP_TYPE_MASK)
    trimmed = deep.trim_batch(source, 1)
    header = _header(trimmed)
    assert header.timestamp_type == 1
    assert [r[1:] for r in _records(trimmed)] == [r[1:] for r in _records(source)[1:]]


@pytest.mark.parametrize("impl", IMPLS)
# Magic 0 + lz4 is left out: kafka-python needs the xxhash package to write that old framing.
@pytest.mark.parametrize("magic,codec", [(0, "none"), (0, "gzip"), (0, "snappy"), (1, "none"),
                                         (1, "gzip"), (1, "snappy"), (1, "lz4")])
def test_convert_legacy(impl, magic, codec):
    data = legacy_entry(magic, codec, 3, base_offset=0) + legacy_entry(magic, codec, 2,
                                                                      base_offset=3)
    entries = impl.split_batches(data).batches
    assert all(e.is_legacy for e in entries)
    expected = [r for e in entries for r in deep.decode_records(e)]
    assert [r.offset for r in expected] == [0, 1, 2, 3, 4]
    converted = deep.convert_legacy(entries)
    assert len(converted) == 1
    out = [r for batch in converted for r in _records(batch)]
    assert [(r[0], r[3], r[4]) for r in out] == [(r.offset, r.key, r.value) for r in expected]
    if magic == 1:
        assert [r[1] for r in out] == [r.timestamp for r in expected]
    else:
        assert {r[1] for r in out} == {-1}
    for batch in converted:
        header = _header(batch)
        assert header.compression_type == CODECS[codec]
        assert header.magic == 2 and header.producer_id == -1
        view = impl.split_batches(batch).batches[0]
        impl.rewrite_for_produce(view)      # accepted by the hot path


def test_convert_legacy_groups_by_codec():
    data = [legacy_entry(1, "none", 1, base_offset=0), legacy_entry(1, "gzip", 2, base_offset=1),
            legacy_entry(1, "gzip", 1, base_offset=3), legacy_entry(1, "none", 1, base_offset=4)]
    converted = deep.convert_legacy(data)
    assert [_header(b).compression_type for b in converted] == [0, 1, 0]
    assert [_header(b).base_offset for b in converted] == [0, 1, 4]
    assert [_header(b).records_count for b in converted] == [1, 3, 1]


def test_deep_errors_are_codec_errors():
    bad = bytearray(build_batch("gzip", 3, base_offset=8))
    bad[-3] ^= 0xFF
    with pytest.raises(CorruptDataError, match="CRC") as info:
        deep.decode_records(bytes(bad))
    assert info.value.where.offset == 8
    from tests.unit.codec.batches import recrc

    with pytest.raises(CorruptDataError, match="gzip payload does not decompress"):
        deep.decode_records(recrc(bad))
    with pytest.raises(UnsupportedFormatError):
        deep.trim_batch(control_batch(1, 0, 0, abort=True), 0)
    with pytest.raises(UnsupportedFormatError):
        deep.convert_legacy([build_batch("none", 1)])
    with pytest.raises(CorruptDataError):
        deep.decode_records(b"\x00" * 5)


def test_snappy_available_to_kafka_python():
    import kafka.codec

    assert kafka.codec.has_snappy()
    payload = b"shallow " * 1000
    assert kafka.codec.snappy_decode(kafka.codec.snappy_encode(payload)) == payload
