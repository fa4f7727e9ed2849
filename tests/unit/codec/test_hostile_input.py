"""Hostile input found by an outside fuzz run (issue 14), one test per reproducer, bytes inline.

Each reproducer of ``../shared/repros/codec/`` is here as a test; where native and twin both
exist the test is differential (same result, or the same error class, text and location). Cases
that crashed the interpreter run in a child process, so a regression fails the test instead of
killing the test run.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap

import pytest

from shallowmirror.codec import records as twin
from shallowmirror.errors import CorruptDataError
from tests.unit.codec.batches import IMPLS, NATIVE

ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]

#: A CRC-valid uncompressed batch of 3 records (offset deltas 0..2) at base offset 40.
THREE_RECORDS = bytes.fromhex(
    "00000000000000280000004c0000000002d421b1e70000000000020000018bcfe568000000018bcfe56800"
    "ffffffffffffffffffffffffffff0000000310000000026b02760010000002026b02760010000004026b027600")


def run_child(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (from the repository root): a crash is a return code."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def outcome(call):
    """What a call did, comparable across implementations: a value or (error class, text)."""
    try:
        return ("ok", call())
    except Exception as err:  # noqa: BLE001 - the comparison is the point
        return ("error", type(err).__name__, str(err))


def both(call) -> list:
    """``call(impl)`` on every implementation built; asserts they agree, returns the outcome."""
    impls = [twin] + ([NATIVE] if NATIVE is not None else [])
    outcomes = [outcome(lambda impl=impl: call(impl)) for impl in impls]
    assert all(o == outcomes[0] for o in outcomes), outcomes
    return outcomes[0]


# --- repro_07: native filter_batches crashed on malformed aborted_transactions -----------------

_FILTER_CHILD = """
    import sys
    from shallowmirror.codec import _crecords as NR, records as TR
    rs = bytes.fromhex(sys.argv[2])
    R = NR if sys.argv[1] == "native" else TR
    try:
        kept = R.filter_batches(R.split_batches(rs).batches, fetch_offset=0,
                                aborted_transactions=eval(sys.argv[3]))
        print(len(kept), "kept")
    except Exception as e:
        print(type(e).__name__, e)
"""


@pytest.mark.parametrize("aborted", ["[(1,)]", "[()]", "[(500, 0), (7,)]", "[[1]]",
                                     "[(1, 2, 3)]", "[None]", "[(1.5, 0)]", "[(0, 2**63)]",
                                     "[('a', 0)]", "[b'abc']", "7"])
def test_malformed_aborted_transactions_raise_the_same_error_in_a_live_process(aborted):
    outputs = {}
    for impl in ("twin", "native") if NATIVE is not None else ("twin",):
        child = run_child(_FILTER_CHILD, impl, THREE_RECORDS.hex(), aborted)
        assert child.returncode == 0, (impl, child.returncode, child.stderr[-2000:])
        outputs[impl] = child.stdout.strip()
    assert len(set(outputs.values())) == 1, outputs
    assert outputs["twin"].startswith(("TypeError", "ValueError")), outputs


def test_well_formed_aborted_transactions_still_work():
    # producer ids may come as any integer type (a list from a decoder, numpy ints...).
    assert both(lambda impl: len(impl.filter_batches(
        impl.split_batches(THREE_RECORDS).batches, fetch_offset=0,
        aborted_transactions=[[5, 3], (True, 0)]))) == ("ok", 1)


# --- argument boundary: every public native function checks types and ranges -------------------

def _view(impl):
    return impl.split_batches(THREE_RECORDS).batches[0]


@pytest.mark.parametrize("kwargs", [
    {"producer_id": 1.5}, {"producer_id": "1"}, {"producer_id": None}, {"producer_id": 2**63},
    {"producer_epoch": 2**15}, {"producer_epoch": 0.0}, {"base_sequence": -(2**31) - 1},
    {"base_sequence": [1]}, {"producer_id": -1, "transactional": True},
])
def test_rewrite_for_produce_rejects_bad_arguments_like_the_twin(kwargs):
    result = both(lambda impl: impl.rewrite_for_produce(_view(impl), **kwargs))
    assert result[0] == "error" and result[1] in ("TypeError", "ValueError"), result


def test_rewrite_for_produce_accepts_integer_like_arguments():
    class Index:
        def __index__(self):
            return 7

    result = both(lambda impl: impl.rewrite_for_produce(_view(impl), producer_id=Index(),
                                                        producer_epoch=True, base_sequence=0)[0])
    assert result[0] == "ok"
    assert struct.unpack_from(">qhi", result[1], 43) == (7, 1, 0)


@pytest.mark.parametrize("batch", [None, 3, b"\x00" * 61, "batch"])
def test_rewrite_for_produce_rejects_what_is_not_a_batch_view(batch):
    assert both(lambda impl: impl.rewrite_for_produce(batch))[1] == "TypeError"


@pytest.mark.skipif(NATIVE is None, reason="native codec not built")
def test_views_of_one_implementation_are_refused_by_the_other():
    for producer, consumer in ((twin, NATIVE), (NATIVE, twin)):
        view = _view(producer)
        with pytest.raises(TypeError, match="BatchView"):
            consumer.rewrite_for_produce(view)
        with pytest.raises(TypeError, match="BatchView"):
            consumer.filter_batches([view], fetch_offset=0)


@pytest.mark.skipif(NATIVE is None, reason="native codec not built")
def test_a_bare_native_batch_view_cannot_crash():
    # A BatchView made from Python has no buffer behind it; nothing may read through it.
    child = run_child("""
        from shallowmirror.codec import _crecords as NR
        bare = NR.BatchView()
        print(NR.filter_batches([bare], fetch_offset=0, aborted_transactions=[(0, 0)]))
        for call in (lambda: NR.rewrite_for_produce(bare), lambda: bare.buffer):
            try:
                call()
            except Exception as e:
                print(type(e).__name__)
    """)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split()[-2:] == ["UnsupportedFormatError", "TypeError"]


@pytest.mark.parametrize("fetch_offset", [2**63, -(2**63) - 1, 1.5, None, "0"])
def test_filter_batches_rejects_bad_fetch_offsets_like_the_twin(fetch_offset):
    # repro_01: native raised OverflowError for 2**63 where the twin answered.
    result = both(lambda impl: impl.filter_batches(impl.split_batches(THREE_RECORDS).batches,
                                                   fetch_offset=fetch_offset))
    assert result[0] == "error" and result[1] in ("TypeError", "ValueError"), result


@pytest.mark.parametrize("batches", [[None], [b"x"], [1]])
def test_filter_batches_rejects_what_is_not_a_batch_view(batches):
    assert both(lambda impl: impl.filter_batches(batches, fetch_offset=0))[1] == "TypeError"


# --- repro_01: offsets near 2**63 --------------------------------------------------------------

@pytest.mark.parametrize("base", [2**63 - 3, 2**63 - 2, 2**63 - 1])
def test_a_batch_whose_next_offset_passes_int64_is_corrupt_in_both(base):
    data = struct.pack(">q", base) + THREE_RECORDS[8:]          # baseOffset is outside the CRC
    result = both(lambda impl: impl.split_batches(data))
    assert result[:2] == ("error", "CorruptDataError"), result
    assert "leaves no next offset within int64" in result[2]
    with pytest.raises(CorruptDataError) as err:
        twin.split_batches(data, topic="t", partition=3)
    assert (err.value.where.topic, err.value.where.partition, err.value.where.offset) == (
        "t", 3, base)


@pytest.mark.parametrize("impl", IMPLS)
def test_the_largest_representable_batch_is_kept(impl):
    base = 2**63 - 4                                            # next_offset == 2**63 - 1
    view = impl.split_batches(struct.pack(">q", base) + THREE_RECORDS[8:]).batches[0]
    assert (view.last_offset, view.next_offset) == (2**63 - 2, 2**63 - 1)
    assert impl.filter_batches([view], fetch_offset=0) == [view]
    assert impl.filter_batches([view], fetch_offset=2**63 - 1) == []


def test_a_legacy_entry_at_the_largest_offset_is_corrupt_in_both():
    from tests.unit.codec.batches import legacy_entry

    entry = bytearray(legacy_entry(1, "none", 1))
    struct.pack_into(">q", entry, 0, 2**63 - 1)                  # outside the CRC-32 too
    result = both(lambda impl: impl.split_batches(bytes(entry)))
    assert result[:2] == ("error", "CorruptDataError"), result


@pytest.mark.skipif(NATIVE is None, reason="native codec not built")
def test_native_views_cannot_be_rebuilt_from_a_crafted_state():
    # Cython's generated pickle support (__setstate_cython__) let any caller set a view's
    # position to -2**40; rewrite_for_produce then copied from there and the process died.
    import pickle

    child = run_child("""
        import pickle
        from shallowmirror.codec import _crecords as NR
        view = NR.split_batches(bytes.fromhex(__import__("sys").argv[1])).batches[0]
        print(hasattr(view, "__setstate_cython__"), hasattr(view, "__reduce_cython__"))
        for obj in (view, NR.split_batches(b"")):
            try:
                pickle.dumps(obj)
            except TypeError as e:
                print("TypeError")
    """, THREE_RECORDS.hex())
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split() == ["False", "False", "TypeError", "TypeError"]
    with pytest.raises(TypeError):                      # the twin's views do not pickle either
        pickle.dumps(_view(twin))


def test_a_flipped_batch_length_reads_as_a_partial_tail_in_both():
    # repro_06: batchLength is outside the CRC; 0x4c -> 0x1004c makes the only batch look cut
    # by the fetch. Both implementations say so (the documented partial-tail rule); the engine
    # turns "no complete batch in a full-size fetch" into an error (tests/unit/engine/
    # test_engine_corrupt_length.py).
    bad = bytearray(THREE_RECORDS)
    bad[9] ^= 0x01
    result = both(lambda impl: (lambda s: (len(s.batches), s.consumed, s.partial))(
        impl.split_batches(bytes(bad), verify_crc=True)))
    assert result == ("ok", (0, 0, True))
