"""split_batches / filter_batches / rewrite_for_produce, each test run on the twin and native."""

from __future__ import annotations

import gc
import struct
import zlib

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatch

from shallowmirror.codec import layout as L
from shallowmirror.errors import (
    CorruptDataError,
    CrcMismatchError,
    ShallowMirrorError,
    UnsupportedFormatError,
)
from tests.unit.codec.batches import (
    CODECS,
    CORPUS_NAMES,
    IMPLS,
    NATIVE,
    build_batch,
    control_batch,
    corpus,
    corpus_index,
    legacy_entry,
    recrc,
    set_attributes,
)

CORPUS = corpus()


def test_native_layout_constants_match_layout_module():
    if NATIVE is None:
        pytest.skip("native codec not built")
    for name, value in NATIVE.LAYOUT.items():
        assert getattr(L, name) == value, name


# --- split_batches -------------------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_corpus_headers_match_kafka_python_reader(impl, name):
    data = CORPUS[name]
    result = impl.split_batches(data, topic=name, partition=0)
    assert not result.partial
    assert result.consumed == len(data)
    assert result.batches, "corpus file holds no batch"
    position = 0
    for view in result.batches:
        assert view.position == position
        reader = DefaultRecordBatch(bytes(view.buffer))
        assert reader.validate_crc()
        assert (view.base_offset, view.partition_leader_epoch, view.magic, view.crc,
                view.attributes, view.last_offset_delta, view.base_timestamp,
                view.max_timestamp, view.producer_id, view.producer_epoch, view.base_sequence,
                view.record_count) == (
            reader.base_offset, reader.leader_epoch, reader.magic, reader.crc,
            reader.attributes, reader.last_offset_delta, reader.first_timestamp,
            reader.max_timestamp, reader.producer_id, reader.producer_epoch,
            reader.base_sequence, reader.records_count)
        assert view.compression == reader.compression_type
        assert view.is_transactional == reader.is_transactional
        assert view.is_control == reader.is_control_batch
        assert view.timestamp_type == reader.timestamp_type
        assert view.last_offset == reader.last_offset
        assert view.next_offset == reader.next_offset
        assert view.size == reader.size_in_bytes == view.batch_length + 12
        assert not view.is_legacy
        position += view.size
    info = corpus_index()[name]
    assert {v.compression for v in result.batches if not v.is_control} == {CODECS[info["codec"]]}
    if info["mode"] == "transactional":
        assert sum(v.is_control for v in result.batches) == 3


@pytest.mark.parametrize("impl", IMPLS)
def test_views_alias_the_callers_buffer(impl):
    source = bytearray(build_batch("lz4", 4) + build_batch("none", 3, base_offset=4))
    result = impl.split_batches(source)
    first, second = result.batches
    assert first.buffer.obj is source
    assert second.buffer.obj is source
    header, rest = impl.rewrite_for_produce(second)
    assert rest.obj is source
    # Mutating the source shows through the views: no copy was made.
    source[second.position + 70] ^= 0xFF
    assert second.buffer[70] == source[second.position + 70]
    assert rest[70 - L.HEADER_SIZE] == source[second.position + 70]


@pytest.mark.skipif(NATIVE is None, reason="native codec not built")
def test_native_views_are_not_tracked_by_the_cycle_collector():
    """The native BatchView is ``no_gc``: it refers only to the caller's buffer, which cannot
    refer back, so it never sits in a cycle. Its views still release that buffer when they go
    (a bytearray with a buffer exported cannot grow)."""
    source = bytearray(build_batch("lz4", 4) + build_batch("none", 3, base_offset=4))
    views = NATIVE.split_batches(source).batches
    assert len(views) == 2 and not any(gc.is_tracked(view) for view in views)
    with pytest.raises(BufferError):
        source.extend(b"x")
    del views
    source.extend(b"x")


@pytest.mark.parametrize("impl", IMPLS)
def test_memoryview_input_keeps_the_underlying_object(impl):
    source = b"\x00" * 5 + build_batch("zstd", 3)
    result = impl.split_batches(memoryview(source)[5:])
    assert result.batches[0].buffer.obj is source
    assert bytes(result.batches[0].buffer) == source[5:]


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_buffer(impl):
    result = impl.split_batches(b"")
    assert (result.batches, result.consumed, result.partial) == ([], 0, False)


@pytest.mark.parametrize("impl", IMPLS)
def test_mixed_magic_buffer(impl):
    parts = [legacy_entry(0, "none", 2, base_offset=0), legacy_entry(1, "gzip", 3, base_offset=2),
             build_batch("snappy", 4, base_offset=5), legacy_entry(1, "none", 1, base_offset=9),
             build_batch("none", 2, base_offset=10)]
    data = b"".join(parts)
    result = impl.split_batches(data)
    assert not result.partial and result.consumed == len(data)
    magics = [v.magic for v in result.batches]
    assert magics == [0, 0, 1, 2, 1, 2]
    legacy = [v for v in result.batches if v.is_legacy]
    for view in legacy:
        assert (view.partition_leader_epoch, view.last_offset_delta, view.producer_id,
                view.producer_epoch, view.base_sequence, view.record_count,
                view.base_timestamp, view.max_timestamp) == (-1,) * 8
        assert view.last_offset == view.base_offset
        assert view.next_offset == view.base_offset + 1
        assert not view.is_control and not view.is_transactional
        reader = LegacyRecordBatch(bytes(view.buffer), view.magic)
        assert reader.validate_crc()
        assert view.compression == reader.compression_type
    # A compressed magic-1 wrapper carries the offset of its last inner message.
    gzip_wrapper = result.batches[2]
    assert gzip_wrapper.compression == 1 and gzip_wrapper.base_offset == 4


@pytest.mark.parametrize("impl", IMPLS)
def test_every_cut_of_a_small_buffer_stops_at_a_whole_batch(impl):
    parts = [build_batch("none", 2), legacy_entry(1, "none", 1, base_offset=2),
             build_batch("gzip", 2, base_offset=3)]
    data = b"".join(parts)
    ends = [sum(len(p) for p in parts[:i + 1]) for i in range(len(parts))]
    for cut in range(len(data) + 1):
        result = impl.split_batches(data[:cut])
        whole = [end for end in ends if end <= cut]
        assert result.consumed == (whole[-1] if whole else 0), cut
        assert len(result.batches) == len(whole), cut
        assert result.partial == (cut > result.consumed), cut


@pytest.mark.parametrize("impl", IMPLS)
def test_trailing_partial_batch_from_real_corpus(impl):
    data = CORPUS["librdkafka-zstd-transactional"]
    full = impl.split_batches(data)
    cut = data[:full.batches[-1].position + 30]
    result = impl.split_batches(cut)
    assert result.partial
    assert len(result.batches) == len(full.batches) - 1
    assert result.consumed == full.batches[-1].position


def _expect(impl, data, cls, *, position, offset, text, topic="t", partition=3):
    with pytest.raises(cls) as info:
        impl.split_batches(data, topic=topic, partition=partition)
    err = info.value
    assert err.where.topic == topic and err.where.partition == partition
    assert err.where.position == position
    assert err.where.offset == offset
    assert text in str(err)
    assert f"byte {position}" in str(err) and f"{topic}-{partition}" in str(err)
    return err


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_crc_names_topic_partition_offset_and_position(impl):
    good = build_batch("none", 3)
    bad = bytearray(build_batch("lz4", 3, base_offset=3))
    bad[-1] ^= 0x01
    err = _expect(impl, good + bytes(bad), CrcMismatchError, position=len(good), offset=3,
                  text="CRC-32C mismatch")
    assert isinstance(err, CorruptDataError) and isinstance(err, ShallowMirrorError)
    # The CRC is not checked when the caller says so.
    assert len(impl.split_batches(good + bytes(bad), verify_crc=False).batches) == 2


@pytest.mark.parametrize("impl", IMPLS)
def test_bytes_outside_the_crc_do_not_matter(impl):
    data = bytearray(build_batch("gzip", 3))
    data[0:8] = struct.pack(">q", 12345)            # base offset
    data[12:16] = struct.pack(">i", 77)             # leader epoch
    view = impl.split_batches(bytes(data)).batches[0]
    assert (view.base_offset, view.partition_leader_epoch) == (12345, 77)


@pytest.mark.parametrize("impl", IMPLS)
def test_legacy_crc_checked(impl):
    entry = bytearray(legacy_entry(1, "none", 1, base_offset=7))
    entry[-1] ^= 0x10
    _expect(impl, bytes(entry), CrcMismatchError, position=0, offset=7, text="CRC-32 mismatch")


@pytest.mark.parametrize("impl", IMPLS)
def test_unknown_magic(impl):
    data = bytearray(build_batch("none", 2, base_offset=9))
    data[16] = 3
    _expect(impl, bytes(data), CorruptDataError, position=0, offset=9, text="unknown magic 3")


@pytest.mark.parametrize("impl", IMPLS)
def test_unknown_magic_in_a_partial_tail_is_corrupt_not_partial(impl):
    good = build_batch("none", 1)
    junk = struct.pack(">qi", 1, 1 << 30) + b"\x00" * 4 + b"\x07" + b"junk"
    _expect(impl, good + junk, CorruptDataError, position=len(good), offset=1,
            text="unknown magic 7")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("length", [-1, 0, 13, -(1 << 31)])
def test_length_below_any_minimum(impl, length):
    data = struct.pack(">qi", 5, length) + b"\x00" * 2
    _expect(impl, data, CorruptDataError, position=0, offset=5, text="below the minimum")


@pytest.mark.parametrize("impl", IMPLS)
def test_v2_length_below_header(impl):
    data = bytearray(build_batch("none", 1))
    struct.pack_into(">i", data, 8, 48)
    _expect(impl, bytes(data), CorruptDataError, position=0, offset=0, text="minimum 49")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec(impl, codec):
    data = set_attributes(build_batch("none", 2), codec)
    _expect(impl, data, CorruptDataError, position=0, offset=0, text=f"unknown compression codec {codec}")


@pytest.mark.parametrize("impl", IMPLS)
def test_legacy_zstd_is_unknown(impl):
    data = bytearray(legacy_entry(1, "none", 1))
    data[L.LEGACY_ATTRIBUTES_OFFSET] = 4
    struct.pack_into(">I", data, 12, zlib.crc32(bytes(data[16:])))
    _expect(impl, bytes(data), CorruptDataError, position=0, offset=0, text="unknown compression")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("record_count,last_offset_delta", [(6, 4), (-1, 4), (1, -1)])
def test_record_count_must_fit_last_offset_delta(impl, record_count, last_offset_delta):
    data = bytearray(build_batch("none", 5))
    struct.pack_into(">i", data, L.RECORD_COUNT_OFFSET, record_count)
    struct.pack_into(">i", data, L.LAST_OFFSET_DELTA_OFFSET, last_offset_delta)
    _expect(impl, recrc(data), CorruptDataError, position=0, offset=0, text="record count")


@pytest.mark.parametrize("impl", IMPLS)
def test_compacted_batch_with_gaps_is_split_but_not_rewritten(impl):
    data = build_batch("gzip", offset_deltas=[0, 2, 5], base_offset=100)
    view = impl.split_batches(data).batches[0]
    assert (view.record_count, view.last_offset_delta, view.last_offset) == (3, 5, 105)
    with pytest.raises(UnsupportedFormatError, match="repack"):
        impl.rewrite_for_produce(view)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("field,value", [(L.LEGACY_KEY_LENGTH_OFFSET_V1, -2),
                                         (L.LEGACY_KEY_LENGTH_OFFSET_V1, 1000),
                                         ("value", 3), ("value", -5)])
def test_legacy_key_value_lengths_checked(impl, field, value):
    data = bytearray(legacy_entry(1, "none", 1))         # key None, value 30 bytes
    offset = field if field != "value" else L.LEGACY_KEY_LENGTH_OFFSET_V1 + 4
    struct.pack_into(">i", data, offset, value)
    struct.pack_into(">I", data, 12, zlib.crc32(bytes(data[16:])))
    _expect(impl, bytes(data), CorruptDataError, position=0, offset=0, text="legacy")


@pytest.mark.parametrize("impl", IMPLS)
def test_errors_without_topic_still_name_offset_and_position(impl):
    data = bytearray(build_batch("none", 2, base_offset=42))
    data[-1] ^= 1
    with pytest.raises(CrcMismatchError) as info:
        impl.split_batches(bytes(data))
    assert info.value.where.topic is None
    assert "offset 42" in str(info.value) and "byte 0" in str(info.value)


# --- filter_batches ------------------------------------------------------------------------

def _txn_log(pid_a=7, pid_b=8):
    """A log with two transactional producers: A aborts [0..5], B commits [3..4], A commits later.

    offsets: 0-2 A data, 3-4 B data, 5-6 A data, 7 A ABORT, 8 B COMMIT, 9-10 A data, 11 A COMMIT,
    12-13 plain data.
    """
    return b"".join([
        build_batch("lz4", 3, base_offset=0, producer_id=pid_a, producer_epoch=1,
                    base_sequence=0, transactional=True),
        build_batch("lz4", 2, base_offset=3, producer_id=pid_b, producer_epoch=0,
                    base_sequence=0, transactional=True),
        build_batch("lz4", 2, base_offset=5, producer_id=pid_a, producer_epoch=1,
                    base_sequence=3, transactional=True),
        control_batch(pid_a, 1, 7, abort=True),
        control_batch(pid_b, 0, 8, abort=False),
        build_batch("lz4", 2, base_offset=9, producer_id=pid_a, producer_epoch=1,
                    base_sequence=5, transactional=True),
        control_batch(pid_a, 1, 11, abort=False),
        build_batch("none", 2, base_offset=12),
    ])


def _offsets(batches):
    return [b.base_offset for b in batches]


@pytest.mark.parametrize("impl", IMPLS)
def test_filter_read_committed_drops_aborted_until_abort_marker(impl):
    batches = impl.split_batches(_txn_log()).batches
    kept = impl.filter_batches(batches, fetch_offset=0, aborted_transactions=[(7, 0)])
    assert _offsets(kept) == [3, 9, 12]
    assert all(k in batches for k in kept)


@pytest.mark.parametrize("impl", IMPLS)
def test_filter_read_uncommitted_keeps_aborted_data(impl):
    batches = impl.split_batches(_txn_log()).batches
    assert _offsets(impl.filter_batches(batches, fetch_offset=0)) == [0, 3, 5, 9, 12]
    assert _offsets(impl.filter_batches(batches, fetch_offset=0, aborted_transactions=[])) == [
        0, 3, 5, 9, 12]


@pytest.mark.parametrize("impl", IMPLS)
def test_filter_keeps_control_batches_when_asked(impl):
    batches = impl.split_batches(_txn_log()).batches
    kept = impl.filter_batches(batches, fetch_offset=0, aborted_transactions=[(7, 0)],
                               drop_control=False)
    assert _offsets(kept) == [3, 7, 8, 9, 11, 12]


@pytest.mark.parametrize("impl", IMPLS)
def test_filter_abort_starts_at_first_offset(impl):
    # The aborted transaction of producer 7 starts at offset 5: batch 0-2 was committed earlier
    # in this synthetic log (the Java consumer only starts skipping at first_offset).
    batches = impl.split_batches(_txn_log()).batches
    kept = impl.filter_batches(batches, fetch_offset=0, aborted_transactions=[(7, 5)])
    assert _offsets(kept) == [0, 3, 9, 12]


@pytest.mark.parametrize("impl", IMPLS)
def test_filter_abort_marker_below_fetch_offset_still_ends_the_transaction(impl):
    batches = impl.split_batches(_txn_log()).batches
    kept = impl.filter_batches(batches, fetch_offset=8, aborted_transactions=[(7, 0)])
    assert _offsets(kept) == [9, 12]


@pytest.mark.parametrize("impl", IMPLS)
def test_filter_unsorted_aborted_list_and_two_producers(impl):
    batches = impl.split_batches(_txn_log()).batches
    kept = impl.filter_batches(batches, fetch_offset=0, aborted_transactions=[(8, 3), (7, 0)])
    # B's transaction has no ABORT marker in this log: B stays aborting (as the Java consumer).
    assert _offsets(kept) == [9, 12]


@pytest.mark.parametrize("impl", IMPLS)
def test_filter_drops_wholly_below_keeps_straddling(impl):
    data = b"".join(build_batch("none", 5, base_offset=o) for o in (0, 5, 10))
    batches = impl.split_batches(data).batches
    assert _offsets(impl.filter_batches(batches, fetch_offset=5)) == [5, 10]
    assert _offsets(impl.filter_batches(batches, fetch_offset=7)) == [5, 10]
    assert _offsets(impl.filter_batches(batches, fetch_offset=9)) == [5, 10]
    assert _offsets(impl.filter_batches(batches, fetch_offset=10)) == [10]
    assert _offsets(impl.filter_batches(batches, fetch_offset=15)) == []


@pytest.mark.parametrize("impl", IMPLS)
def test_filter_legacy_entries_by_offset(impl):
    data = legacy_entry(1, "none", 1, base_offset=3) + legacy_entry(1, "none", 1, base_offset=4)
    batches = impl.split_batches(data).batches
    assert _offsets(impl.filter_batches(batches, fetch_offset=4, aborted_transactions=[])) == [4]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", [n for n in CORPUS_NAMES if n.endswith("transactional")])
def test_filter_real_transactional_corpus(impl, name):
    batches = impl.split_batches(CORPUS[name]).batches
    producer_id = batches[0].producer_id
    # Corpus layout (make_corpus.py): commit 0-5, marker 6, abort 7-12, marker 13, commit 14-19.
    kept = impl.filter_batches(batches, fetch_offset=0, aborted_transactions=[(producer_id, 7)])
    assert not any(b.is_control for b in kept)
    kept_offsets = {o for b in kept for o in range(b.base_offset, b.next_offset)}
    assert kept_offsets == set(range(0, 6)) | set(range(14, 20))


@pytest.mark.parametrize("impl", IMPLS)
def test_filter_corrupt_control_record(impl):
    marker = bytearray(control_batch(7, 1, 7, abort=True))
    marker[L.RECORDS_OFFSET:] = b"\xff" * (len(marker) - L.RECORDS_OFFSET)   # endless varint
    batches = impl.split_batches(recrc(marker)).batches
    with pytest.raises(CorruptDataError, match="varint"):
        impl.filter_batches(batches, fetch_offset=0, aborted_transactions=[(7, 0)])


# --- rewrite_for_produce -------------------------------------------------------------------

def _decode(header: bytes, rest) -> DefaultRecordBatch:
    reader = DefaultRecordBatch(header + bytes(rest))
    assert reader.validate_crc()
    return reader


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("codec", list(CODECS))
def test_rewrite_plain_keeps_crc_and_covered_bytes(impl, codec):
    source = build_batch(codec, 6, base_offset=500, leader_epoch=9)
    view = impl.split_batches(source).batches[0]
    header, rest = impl.rewrite_for_produce(view)
    assert len(header) == L.HEADER_SIZE and isinstance(header, bytes)
    assert header[:8] == b"\x00" * 8 and header[12:16] == b"\xff" * 4
    # Nothing inside the CRC changed: same CRC, same covered bytes.
    assert header[16:] == source[16:L.HEADER_SIZE]
    assert bytes(rest) == source[L.HEADER_SIZE:]
    reader = _decode(header, rest)
    assert (reader.base_offset, reader.leader_epoch) == (0, -1)
    original = DefaultRecordBatch(source)
    assert [(r.offset - 500, r.key, r.value, r.headers, r.timestamp) for r in original] == [
        (r.offset, r.key, r.value, r.headers, r.timestamp) for r in reader]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_rewrite_real_corpus_stamps_producer_and_recomputes_crc(impl, name):
    for view in impl.filter_batches(impl.split_batches(CORPUS[name]).batches, fetch_offset=0):
        header, rest = impl.rewrite_for_produce(view, producer_id=4242, producer_epoch=3,
                                                base_sequence=100, transactional=True)
        reader = _decode(header, rest)
        assert (reader.producer_id, reader.producer_epoch, reader.base_sequence) == (4242, 3, 100)
        assert reader.is_transactional
        assert reader.compression_type == view.compression
        assert struct.unpack_from(">I", header, L.CRC_OFFSET)[0] == crc32c(
            bytes(rest), crc32c(header[L.ATTRIBUTES_OFFSET:]))
        source_records = [(r.offset - view.base_offset, r.key, r.value, r.headers, r.timestamp)
                          for r in DefaultRecordBatch(bytes(view.buffer))]
        assert source_records == [(r.offset, r.key, r.value, r.headers, r.timestamp)
                                  for r in reader]
        # ...and back to a plain producer: transactional bit cleared, fields -1.
        header, rest = impl.rewrite_for_produce(view)
        reader = _decode(header, rest)
        assert (reader.producer_id, reader.producer_epoch, reader.base_sequence) == (-1, -1, -1)
        assert not reader.is_transactional


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("stamp", [False, True], ids=["plain", "idempotent"])
def test_rewrite_clears_the_source_delete_horizon(impl, stamp):
    """A compacted source batch may carry KIP-534's delete-horizon bit: the source cleaner's
    schedule. Forwarded, it would make the target drop tombstones on the source's clock."""
    source = build_batch("lz4", 3, value_size=0)
    attributes = struct.unpack_from(">h", source, L.ATTRIBUTES_OFFSET)[0]
    source = set_attributes(source, attributes | L.DELETE_HORIZON_MASK)
    view = impl.split_batches(source).batches[0]
    assert view.attributes & L.DELETE_HORIZON_MASK
    fields = {"producer_id": 7, "producer_epoch": 0, "base_sequence": 0} if stamp else {}
    header, rest = impl.rewrite_for_produce(view, **fields)
    attributes_out = struct.unpack_from(">h", header, L.ATTRIBUTES_OFFSET)[0]
    assert attributes_out == attributes                        # only the horizon bit went
    reader = _decode(header, rest)                             # CRC recomputed and valid
    assert [r.timestamp for r in reader] == [1_700_000_000_000 + i for i in range(3)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("clear", [False, True])
def test_rewrite_log_append_time(impl, clear):
    source = build_batch("zstd", 3)
    attributes = struct.unpack_from(">h", source, L.ATTRIBUTES_OFFSET)[0]
    source = set_attributes(source, attributes | L.TIMESTAMP_TYPE_MASK)
    view = impl.split_batches(source).batches[0]
    assert view.timestamp_type == 1
    header, rest = impl.rewrite_for_produce(view, clear_log_append_time=clear)
    reader = _decode(header, rest)
    assert reader.timestamp_type == (0 if clear else 1)
    if clear:
        assert header[L.CRC_OFFSET:L.ATTRIBUTES_OFFSET] != source[L.CRC_OFFSET:L.ATTRIBUTES_OFFSET]
        # The records' own create times come back once the bit is gone.
        assert [r.timestamp for r in reader] == [1_700_000_000_000 + i for i in range(3)]
    else:
        assert header[L.CRC_OFFSET:] == source[L.CRC_OFFSET:L.HEADER_SIZE]
        assert {r.timestamp for r in reader} == {view.max_timestamp}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_rewrite_keeps_a_damaged_batch_detectably_damaged(impl, codec):
    """The stamp's CRC is updated from the header's change, not recomputed over the records: a
    batch damaged before it was fetched (read with crc.check off) must not leave with a fresh,
    valid CRC over the damaged bytes, where the target would store it as good."""
    source = bytearray(build_batch(codec, 5, base_offset=40))
    source[-3] ^= 0x10                                         # one flipped bit in the records
    view = impl.split_batches(bytes(source), verify_crc=False).batches[0]
    header, rest = impl.rewrite_for_produce(view, producer_id=9, producer_epoch=1,
                                            base_sequence=0)
    stamped = struct.unpack_from(">I", header, L.CRC_OFFSET)[0]
    assert stamped != crc32c(bytes(rest), crc32c(header[L.ATTRIBUTES_OFFSET:]))
    # Undo the damage: the same stamp is then exactly right.
    source[-3] ^= 0x10
    good = impl.split_batches(bytes(source)).batches[0]
    good_header, good_rest = impl.rewrite_for_produce(good, producer_id=9, producer_epoch=1,
                                                      base_sequence=0)
    assert struct.unpack_from(">I", good_header, L.CRC_OFFSET)[0] == crc32c(
        bytes(good_rest), crc32c(good_header[L.ATTRIBUTES_OFFSET:]))
    assert good_header[L.ATTRIBUTES_OFFSET:] == header[L.ATTRIBUTES_OFFSET:]


@pytest.mark.parametrize("impl", IMPLS)
def test_rewrite_same_producer_fields_keep_crc(impl):
    source = build_batch("snappy", 3, producer_id=11, producer_epoch=2, base_sequence=30)
    view = impl.split_batches(source).batches[0]
    header, _ = impl.rewrite_for_produce(view, producer_id=11, producer_epoch=2, base_sequence=30)
    assert header[L.CRC_OFFSET:] == source[L.CRC_OFFSET:L.HEADER_SIZE]


@pytest.mark.parametrize("impl", IMPLS)
def test_rewrite_refuses_legacy_control_and_bad_arguments(impl):
    data = legacy_entry(1, "none", 1, base_offset=3) + control_batch(5, 0, 4, abort=False)
    legacy, control = impl.split_batches(data).batches
    with pytest.raises(UnsupportedFormatError, match="convert_legacy") as info:
        impl.rewrite_for_produce(legacy)
    assert info.value.where.offset == 3
    with pytest.raises(UnsupportedFormatError, match="control"):
        impl.rewrite_for_produce(control)
    plain = impl.split_batches(build_batch("none", 2)).batches[0]
    with pytest.raises(ValueError, match="producer id"):
        impl.rewrite_for_produce(plain, transactional=True)
    with pytest.raises(ValueError, match="producer_epoch"):
        impl.rewrite_for_produce(plain, producer_id=1, producer_epoch=1 << 15, base_sequence=0)
    with pytest.raises(ValueError, match="base_sequence"):
        impl.rewrite_for_produce(plain, producer_id=1, producer_epoch=0, base_sequence=1 << 31)
