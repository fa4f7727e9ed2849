"""Fuzz the record-set codec (twin and native) with hypothesis.

Every outcome must be a valid result or a ``CorruptDataError`` (never another exception, a crash
or a hang), and native and twin must agree: same views or the same error class and location.

The default run is a few thousand cases in total. For a long fuzz, set
``SHALLOWMIRROR_FUZZ_EXAMPLES`` (examples per test), e.g.
``SHALLOWMIRROR_FUZZ_EXAMPLES=200000 pytest tests/unit/codec/test_fuzz_records.py``.
"""

from __future__ import annotations

import os
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shallowmirror.codec import layout as L
from shallowmirror.errors import CorruptDataError, UnsupportedFormatError
from tests.unit.codec.batches import (
    CODECS,
    NATIVE,
    build_batch,
    control_batch,
    corpus,
    fields,
    legacy_entry,
    recrc,
)
from tests.unit.codec.batches import twin as TWIN

EXAMPLES = int(os.environ.get("SHALLOWMIRROR_FUZZ_EXAMPLES", "600"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="SHALLOWMIRROR_FUZZ_EXAMPLES"
                not in os.environ, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.data_too_large])
IMPLS = [TWIN] + ([NATIVE] if NATIVE is not None else [])

_SEEDS = [
    *corpus().values(),
    build_batch("none", 3), build_batch("gzip", 2, producer_id=3, producer_epoch=0,
                                        base_sequence=0, transactional=True),
    build_batch("zstd", offset_deltas=[0, 3], base_offset=8),
    control_batch(3, 0, 5, abort=True), control_batch(3, 0, 6, abort=False),
    legacy_entry(0, "none", 2), legacy_entry(1, "gzip", 3), legacy_entry(1, "lz4", 2),
]
_HEADER_FIELD_SPOTS = [0, 8, 12, 16, 17, 21, 23, 27, 35, 43, 51, 53, 57, 61]


def run(impl, data: bytes, verify_crc: bool, fetch_offset: int, aborted):
    """Split, filter and rewrite; return a comparable outcome. Only codec errors are allowed."""
    try:
        result = impl.split_batches(data, verify_crc=verify_crc, topic="fuzz", partition=1)
        kept = impl.filter_batches(result.batches, fetch_offset=fetch_offset,
                                   aborted_transactions=aborted)
    except CorruptDataError as err:
        return ("corrupt", type(err).__name__, err.where)
    rewritten = []
    for view in kept:
        try:
            header, rest = impl.rewrite_for_produce(view, producer_id=5, producer_epoch=0,
                                                    base_sequence=1)
        except UnsupportedFormatError as err:
            rewritten.append(("unsupported", err.where))
        else:
            assert len(header) == L.HEADER_SIZE
            assert len(rest) == view.size - L.HEADER_SIZE
            rewritten.append(header + bytes(rest))
    return ("ok", [fields(v) for v in result.batches], result.consumed, result.partial,
            [v.position for v in kept], rewritten)


def check(data: bytes, verify_crc: bool = True, fetch_offset: int = 0, aborted=None):
    outcomes = [run(impl, data, verify_crc, fetch_offset, aborted) for impl in IMPLS]
    assert all(o == outcomes[0] for o in outcomes), outcomes
    return outcomes[0]


@st.composite
def mutated(draw):
    """A seed record set (or several concatenated) with a few bytes changed, cut or appended."""
    pieces = draw(st.lists(st.sampled_from(_SEEDS), min_size=1, max_size=3))
    data = bytearray(b"".join(pieces))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "field", "cut", "append", "length", "recrc"]))
        if not data:
            break
        if kind == "flip":
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "field":
            pos = draw(st.sampled_from(_HEADER_FIELD_SPOTS))
            if pos < len(data):
                data[pos] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[draw(st.integers(0, len(data))):]
        elif kind == "append":
            data += draw(st.binary(max_size=40))
        elif kind == "length" and len(data) >= 12:
            struct.pack_into(">i", data, 8, draw(st.integers(-(1 << 31), (1 << 31) - 1)))
        elif kind == "recrc" and len(data) >= L.HEADER_SIZE and data[16] == 2:
            # Make a mutated first batch pass the CRC so the checks behind it get exercised.
            size = struct.unpack_from(">i", data, 8)[0] + 12
            if L.HEADER_SIZE <= size <= len(data):
                data[:size] = recrc(data[:size])
    return bytes(data)


@FUZZ
@given(data=mutated(), verify_crc=st.booleans(), fetch_offset=st.integers(-1, 30),
       aborted=st.one_of(st.none(), st.lists(st.tuples(st.integers(-1, 30),
                                                       st.integers(0, 30)), max_size=3)))
def test_mutated_record_sets(data, verify_crc, fetch_offset, aborted):
    check(data, verify_crc, fetch_offset, aborted)


@FUZZ
@given(data=st.binary(max_size=300), verify_crc=st.booleans())
def test_random_bytes(data, verify_crc):
    check(data, verify_crc)


@st.composite
def forged_headers(draw):
    """Random but plausible headers (valid magic and lengths) over a random body."""
    magic = draw(st.sampled_from([0, 1, 2, 2, 2]))
    body = draw(st.binary(min_size=0, max_size=120))
    minimum = {0: 14, 1: 22, 2: 49}[magic]
    length = draw(st.one_of(st.just(minimum + len(body)), st.integers(-5, 200)))
    head = struct.pack(">qi", draw(st.integers(-2, 1 << 40)), length)
    head += struct.pack(">i", draw(st.integers(-(1 << 31), (1 << 31) - 1)))  # epoch/crc bytes
    head += bytes([magic])
    rest = bytearray(draw(st.binary(min_size=minimum - 5, max_size=minimum - 5)) + body)
    data = bytearray(head + rest)
    if magic == 2 and len(data) >= L.HEADER_SIZE and draw(st.booleans()):
        data[L.ATTRIBUTES_OFFSET:L.ATTRIBUTES_OFFSET + 2] = struct.pack(
            ">h", draw(st.sampled_from([0, 1, 4, 0x10, 0x30, 0x08, 7])))
        delta, count = draw(st.integers(-1, 5)), draw(st.integers(-1, 6))
        struct.pack_into(">i", data, L.LAST_OFFSET_DELTA_OFFSET, delta)
        struct.pack_into(">i", data, L.RECORD_COUNT_OFFSET, count)
        struct.pack_into(">q", data, L.PRODUCER_ID_OFFSET, draw(st.integers(-1, 3)))
        if L.HEADER_SIZE <= length + 12 <= len(data):
            data[:length + 12] = recrc(data[:length + 12])
    return bytes(data)


@FUZZ
@given(data=forged_headers(), fetch_offset=st.integers(-1, 10),
       aborted=st.one_of(st.none(), st.lists(st.tuples(st.integers(-1, 3), st.integers(0, 10)),
                                             max_size=2)))
def test_forged_headers(data, fetch_offset, aborted):
    check(data, True, fetch_offset, aborted)


@FUZZ
@given(codec=st.sampled_from(list(CODECS)), count=st.integers(1, 8),
       base_offset=st.integers(0, 1 << 40), producer=st.tuples(
           st.integers(-1, 1 << 40), st.integers(-1, 100), st.integers(-1, 1 << 30)),
       transactional=st.booleans(), clear=st.booleans(), stamp=st.tuples(
           st.integers(-1, (1 << 63) - 1), st.integers(-1, (1 << 15) - 1),
           st.integers(-1, (1 << 31) - 1)))
def test_valid_batches_rewrite_identically_and_validate(codec, count, base_offset, producer,
                                                        transactional, clear, stamp):
    from kafka.record.default_records import DefaultRecordBatch

    pid, epoch, seq = producer
    transactional = transactional and pid >= 0
    data = build_batch(codec, count, base_offset=base_offset, producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq, transactional=transactional)
    outputs = []
    for impl in IMPLS:
        view = impl.split_batches(data).batches[0]
        new_txn = stamp[0] >= 0 and transactional
        header, rest = impl.rewrite_for_produce(
            view, producer_id=stamp[0], producer_epoch=stamp[1], base_sequence=stamp[2],
            transactional=new_txn, clear_log_append_time=clear)
        reader = DefaultRecordBatch(header + bytes(rest))
        assert reader.validate_crc()
        assert (reader.producer_id, reader.producer_epoch, reader.base_sequence) == stamp
        assert reader.is_transactional == new_txn
        outputs.append(header + bytes(rest))
    assert all(o == outputs[0] for o in outputs)

