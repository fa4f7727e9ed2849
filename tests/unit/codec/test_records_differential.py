"""Native vs twin on the same buffers: equal views, equal errors, byte-identical rewrites.

The aiokafka twins diverge on mixed-magic buffers; this suite exists so ours cannot.
"""

from __future__ import annotations

import pytest

from tests.unit.codec.batches import (
    CODECS,
    CORPUS_NAMES,
    NATIVE,
    build_batch,
    control_batch,
    corpus,
    fields,
    legacy_entry,
)
from tests.unit.codec.batches import twin as TWIN

pytestmark = pytest.mark.skipif(NATIVE is None, reason="native codec not built")
CORPUS = corpus()


def outcome(impl, data, **kwargs):
    """What split_batches does with ``data``: the views' fields, or the error class and where."""
    try:
        result = impl.split_batches(data, **kwargs)
    except Exception as err:  # noqa: BLE001 - the class is what is compared
        return ("error", type(err).__name__, getattr(err, "where", None), str(err))
    return ("ok", [fields(v) for v in result.batches], result.consumed, result.partial)


def rewrites(impl, data, **kwargs):
    out = []
    for view in impl.split_batches(data).batches:
        try:
            header, rest = impl.rewrite_for_produce(view, **kwargs)
        except Exception as err:  # noqa: BLE001
            out.append((type(err).__name__, str(err)))
        else:
            out.append((header, bytes(rest)))
    return out


def mixed_buffer() -> bytes:
    return b"".join([
        legacy_entry(0, "none", 2), legacy_entry(0, "gzip", 2, base_offset=2),
        legacy_entry(1, "snappy", 3, base_offset=4), legacy_entry(1, "lz4", 2, base_offset=7),
        *(build_batch(codec, 3, base_offset=9 + 3 * i) for i, codec in enumerate(CODECS)),
        control_batch(4, 0, 24, abort=True),
        build_batch("none", offset_deltas=[0, 4], base_offset=25),
    ])


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_corpus_identical(name):
    data = CORPUS[name]
    assert outcome(NATIVE, data, topic=name, partition=0) == outcome(TWIN, data, topic=name,
                                                                      partition=0)
    for kwargs in ({}, {"producer_id": 9, "producer_epoch": 1, "base_sequence": 77,
                        "transactional": True}, {"clear_log_append_time": True}):
        assert rewrites(NATIVE, data, **kwargs) == rewrites(TWIN, data, **kwargs)


def test_mixed_magic_identical():
    data = mixed_buffer()
    native, twin = outcome(NATIVE, data), outcome(TWIN, data)
    assert native == twin
    assert native[0] == "ok" and [f["magic"] for f in native[1]] == [0, 0, 0, 1, 1] + [2] * 7
    assert rewrites(NATIVE, data) == rewrites(TWIN, data)


def test_every_cut_identical():
    data = mixed_buffer()
    for cut in range(len(data) + 1):
        assert outcome(NATIVE, data[:cut]) == outcome(TWIN, data[:cut]), cut


def test_every_single_byte_flip_identical():
    """Flip one byte at every position of a small mixed buffer: same result or same error."""
    data = build_batch("gzip", 2) + legacy_entry(1, "none", 1, base_offset=2) + control_batch(
        3, 0, 3, abort=False)
    for position in range(len(data)):
        for flip in (0x01, 0x80, 0xFF):
            mutated = bytearray(data)
            mutated[position] ^= flip
            for verify in (True, False):
                native = outcome(NATIVE, bytes(mutated), verify_crc=verify)
                twin = outcome(TWIN, bytes(mutated), verify_crc=verify)
                assert native == twin, (position, flip, verify)


@pytest.mark.parametrize("aborted", [None, [], [(7, 0)], [(7, 5), (8, 3)]])
@pytest.mark.parametrize("fetch_offset", [0, 4, 9, 100])
def test_filter_identical(aborted, fetch_offset):
    from tests.unit.codec.test_records import _txn_log

    data = _txn_log() + mixed_buffer()
    for drop_control in (True, False):
        picked = [
            [v.position for v in impl.filter_batches(
                impl.split_batches(data).batches, fetch_offset=fetch_offset,
                aborted_transactions=aborted, drop_control=drop_control)]
            for impl in (NATIVE, TWIN)]
        assert picked[0] == picked[1]
