"""Fuzz the argument boundary of every public codec function: arbitrary Python values (wrong
types, huge and negative ints, floats, nested sequences, objects with ``__index__``, views of
the other implementation) in every parameter. The native build is compiled without bounds
checks, so an argument that slipped through unchecked could crash the interpreter; here every
call must return or raise an ordinary exception, and native and twin must agree (same result,
or the same exception class and message).

A few hundred cases per test by default; ``SHALLOWMIRROR_FUZZ_EXAMPLES=N`` runs N (``make fuzz``
runs this module in a child process under an address-space limit, so a crash fails it).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shallowmirror.codec import messages as twin_messages
from shallowmirror.codec import records as twin_records
from tests.unit.codec.batches import NATIVE, build_batch, control_batch, legacy_entry
from tests.unit.codec.implementations import native_module

EXAMPLES = int(os.environ.get("SHALLOWMIRROR_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="SHALLOWMIRROR_FUZZ_EXAMPLES"
                not in os.environ, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.data_too_large])
NATIVE_MESSAGES = native_module("_cmessages")
pytestmark = pytest.mark.skipif(NATIVE is None or NATIVE_MESSAGES is None,
                                reason="native codec not built: nothing to compare")

RECORD_SET = (build_batch("none", 3, base_offset=4)
              + control_batch(7, 0, 7, abort=True)
              + build_batch("gzip", 2, base_offset=8, producer_id=7, producer_epoch=0,
                            base_sequence=0, transactional=True)
              + build_batch("lz4", offset_deltas=[0, 2], base_offset=10)
              + legacy_entry(1, "none", 1, base_offset=13))


class Index:
    """An integer-like object (``operator.index`` accepts it)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"Index({self.value})"


class Exploding:
    """Fails in every protocol a codec might try on it."""

    def __index__(self):
        raise RuntimeError("no index")

    def __len__(self):
        raise RuntimeError("no len")

    def __iter__(self):
        raise RuntimeError("no iter")

    def __bool__(self):
        raise RuntimeError("no bool")

    def __repr__(self) -> str:
        return "Exploding()"


INTS = st.one_of(st.integers(-3, 3), st.integers(-(1 << 70), 1 << 70),
                 st.sampled_from([2**15, -(2**15) - 1, 2**31, -(2**31) - 1, 2**63, -(2**63) - 1,
                                  2**63 - 1, 2**64]))
SCALARS = st.one_of(INTS, st.booleans(), st.none(), st.floats(allow_nan=True),
                    st.text(max_size=5), st.binary(max_size=20),
                    INTS.map(Index), st.just(Exploding()), st.just(object()))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.tuples(inner, inner),
                                                       st.tuples(inner)), max_leaves=8)


def outcome(call):
    try:
        return ("ok", call())
    except Exception as err:  # noqa: BLE001 - any ordinary exception; a crash ends the process
        return ("error", type(err).__name__, str(err))


def agree(call, normalize=lambda value: value):
    """``call(records, messages)`` on both implementations; they must agree."""
    results = []
    for records, messages in ((twin_records, twin_messages), (NATIVE, NATIVE_MESSAGES)):
        result = outcome(lambda r=records, m=messages: call(r, m))
        if result[0] == "ok":
            result = ("ok", normalize(result[1]))
        results.append(result)
    assert results[0] == results[1], results


def _hashable(value) -> bool:
    try:
        hash(value)
    except Exception:  # noqa: BLE001 - whatever hashing raises: not a dict key
        return False
    return True


def _views(records):
    return records.split_batches(RECORD_SET).batches


@FUZZ
@given(data=st.one_of(VALUES, st.binary(max_size=100)), verify=VALUES, topic=VALUES,
       partition=VALUES)
def test_split_batches_arguments(data, verify, topic, partition):
    agree(lambda r, m: r.split_batches(data, verify_crc=verify, topic=topic,
                                       partition=partition),
          lambda s: ([(v.position, v.size) for v in s.batches], s.consumed, s.partial))


@FUZZ
@given(which=st.lists(st.integers(0, 4), max_size=5), extra=st.lists(VALUES, max_size=2),
       fetch_offset=VALUES, aborted=st.one_of(st.none(), VALUES,
                                              st.lists(st.tuples(INTS, INTS), max_size=3)),
       drop_control=VALUES)
def test_filter_batches_arguments(which, extra, fetch_offset, aborted, drop_control):
    def call(r, m):
        views = _views(r)
        return r.filter_batches([views[i] for i in which] + extra, fetch_offset=fetch_offset,
                                aborted_transactions=aborted, drop_control=drop_control)
    agree(call, lambda kept: [v.position for v in kept])


@FUZZ
@given(which=st.integers(0, 4), foreign=st.booleans(), other=st.one_of(st.none(), VALUES),
       producer_id=VALUES, producer_epoch=VALUES, base_sequence=VALUES, transactional=VALUES,
       clear=VALUES)
def test_rewrite_for_produce_arguments(which, foreign, other, producer_id, producer_epoch,
                                       base_sequence, transactional, clear):
    def call(r, m):
        source = (NATIVE if r is twin_records else twin_records) if foreign else r
        batch = _views(source)[which] if other is None else other
        header, rest = r.rewrite_for_produce(
            batch, producer_id=producer_id, producer_epoch=producer_epoch,
            base_sequence=base_sequence, transactional=transactional,
            clear_log_append_time=clear)
        return header + bytes(rest)
    agree(call)


@FUZZ
@given(which=st.integers(0, 4), foreign=st.booleans(), key=VALUES, count=VALUES,
       generation=VALUES, stamped=VALUES, producer_id=VALUES, producer_epoch=VALUES,
       sequences=st.one_of(st.none(), st.dictionaries(VALUES.filter(_hashable), VALUES,
                                                       max_size=2), VALUES),
       pairs=st.one_of(st.none(), VALUES))
def test_stamp_batches_arguments(which, foreign, key, count, generation, stamped, producer_id,
                                 producer_epoch, sequences, pairs):
    def call(r, m):
        source = (NATIVE if r is twin_records else twin_records) if foreign else r
        batch = SimpleNamespace(view=_views(source)[which], record_count=count,
                                stamp_generation=stamped)
        seqs = dict(sequences) if isinstance(sequences, dict) else sequences
        picks = [(key, batch)] if pairs is None else pairs
        n = r.stamp_batches(picks, producer_id=producer_id, producer_epoch=producer_epoch,
                            generation=generation, sequences=seqs)
        header = getattr(batch, "header", None)
        return (n, seqs, header, bytes(batch.rest) if header is not None else None,
                getattr(batch, "base_sequence", None))
    agree(call)


@FUZZ
@given(frame=st.one_of(VALUES, st.binary(max_size=60)), version=VALUES,
       produce=st.booleans())
def test_decode_arguments(frame, version, produce):
    def call(r, m):
        decode = m.decode_produce_response if produce else m.decode_fetch_response
        return repr(decode(frame, version))
    agree(call)


@FUZZ
@given(version=st.one_of(st.integers(2, 10), VALUES), correlation_id=VALUES,
       client_id=st.one_of(st.text(max_size=5), VALUES),
       transactional_id=st.one_of(st.none(), VALUES), acks=VALUES, timeout_ms=VALUES,
       topics=st.one_of(VALUES, st.lists(st.tuples(
           st.one_of(st.text(max_size=3), VALUES),
           st.one_of(VALUES, st.lists(st.tuples(st.one_of(INTS, VALUES), st.one_of(
               VALUES, st.lists(st.lists(st.one_of(st.binary(max_size=8), VALUES),
                                         max_size=2), max_size=2))), max_size=2))),
           max_size=2)),
       allow=VALUES)
def test_encode_produce_request_arguments(version, correlation_id, client_id, transactional_id,
                                          acks, timeout_ms, topics, allow):
    def call(r, m):
        return b"".join(bytes(memoryview(piece)) for piece in m.encode_produce_request(
            version=version, correlation_id=correlation_id, client_id=client_id,
            transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms, topics=topics,
            allow_multiple_batches=allow))
    agree(call)
