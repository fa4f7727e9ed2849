"""``stamp_batches``: one Produce request's batches stamped in one call, as ``rewrite_for_produce``
would stamp them one by one, with the sequences a producer would give them; native and twin alike.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from crc32c import crc32c

from shallowmirror.errors import UnsupportedFormatError
from tests.unit.codec.batches import CODECS, NATIVE, build_batch, control_batch
from tests.unit.codec.batches import twin as TWIN

IMPLS = [pytest.param(TWIN, id="twin"),
         pytest.param(NATIVE, id="native",
                      marks=pytest.mark.skipif(NATIVE is None, reason="native codec not built"))]


class SlotBatch:
    """A batch class with the fields in ``__slots__``, as the engine's FetchedBatch has them:
    the native build reaches those at their slots, any other object's by name."""

    __slots__ = ("view", "record_count", "stamp_generation", "header", "rest", "producer_id",
                 "producer_epoch", "base_sequence")

    def __init__(self, view, record_count: int, stamp_generation: int) -> None:
        self.view = view
        self.record_count = record_count
        self.stamp_generation = stamp_generation


def request(impl, counts: list[int], *, codec: str = "lz4", generation: int = -1,
            batch_class=SimpleNamespace):
    """(key, batch) picks of one request: a batch per partition, ``counts`` records each."""
    data = b"".join(build_batch(codec, n, base_offset=100 * i, producer_id=9, producer_epoch=1,
                                base_sequence=40) for i, n in enumerate(counts))
    views = impl.split_batches(data).batches
    return [(("target", i), batch_class(view=v, record_count=v.record_count,
                                        stamp_generation=generation))
            for i, v in enumerate(views)]


def crc_holds(batch) -> bool:
    whole = bytes(batch.header) + bytes(batch.rest)
    return crc32c(whole[21:]) == int.from_bytes(whole[17:21], "big")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("batch_class", [SimpleNamespace, SlotBatch])
def test_each_batch_as_rewrite_would_stamp_it_with_the_next_sequence(impl, codec, batch_class):
    picks = request(impl, [3, 5, 1], codec=codec, batch_class=batch_class) + [
        (("target", 0), b)
        for _, b in request(impl, [2], codec=codec, batch_class=batch_class)]  # partition 0 again
    # Partition 1 wraps at 2**31 like Kafka's producer; partition 2 stays above 2**30.
    sequences = {("target", 1): 2**31 - 2, ("target", 2): 2**30 + 7}
    assert impl.stamp_batches(picks, producer_id=77, producer_epoch=4, generation=3,
                              sequences=sequences) == 4
    expected_sequences = [0, 2**31 - 2, 2**30 + 7, 3]
    for (key, batch), sequence in zip(picks, expected_sequences, strict=True):
        header, rest = impl.rewrite_for_produce(batch.view, producer_id=77, producer_epoch=4,
                                                base_sequence=sequence)
        assert (batch.header, bytes(batch.rest)) == (header, bytes(rest)), key
        assert (batch.producer_id, batch.producer_epoch, batch.base_sequence,
                batch.stamp_generation) == (77, 4, sequence, 3)
        assert crc_holds(batch)
    assert sequences == {("target", 0): 5, ("target", 1): 3, ("target", 2): 2**30 + 8}


@pytest.mark.parametrize("impl", IMPLS)
def test_a_batch_of_the_generation_keeps_its_bytes_and_its_sequence(impl):
    picks = request(impl, [4, 4])
    sequences: dict = {}
    impl.stamp_batches(picks, producer_id=5, producer_epoch=0, generation=1, sequences=sequences)
    first = [(b.header, b.rest, b.base_sequence) for _, b in picks]
    # Resent under the same identity: nothing changes, no sequence is used up.
    assert impl.stamp_batches(picks, producer_id=5, producer_epoch=0, generation=1,
                              sequences=sequences) == 0
    assert [(b.header, b.rest, b.base_sequence) for _, b in picks] == first
    assert sequences == {("target", 0): 4, ("target", 1): 4}
    # After an identity reset (a new generation, sequences from 0): stamped again.
    sequences = {}
    assert impl.stamp_batches(picks, producer_id=5, producer_epoch=1, generation=2,
                              sequences=sequences) == 2
    assert [b.producer_epoch for _, b in picks] == [1, 1]
    assert all(crc_holds(b) for _, b in picks)


@pytest.mark.parametrize("impl", IMPLS)
def test_without_sequences_the_stamp_is_plain(impl):
    picks = request(impl, [2, 3])
    assert impl.stamp_batches(picks, generation=0, clear_log_append_time=True) == 2
    for _, batch in picks:
        header, rest = impl.rewrite_for_produce(batch.view, clear_log_append_time=True)
        assert (batch.header, batch.base_sequence, batch.producer_id) == (header, -1, -1)
        assert crc_holds(batch)


@pytest.mark.skipif(NATIVE is None, reason="native codec not built")
@pytest.mark.parametrize("clear", [False, True])
def test_native_and_twin_stamp_the_same_bytes(clear):
    stamped = []
    for impl in (NATIVE, TWIN):
        picks = request(impl, [1, 7, 2, 9], codec="zstd")
        sequences = {("target", 2): 12345}
        impl.stamp_batches(picks, producer_id=2**40, producer_epoch=32767, generation=8,
                           sequences=sequences, clear_log_append_time=clear)
        stamped.append(([(b.header, bytes(b.rest), b.base_sequence) for _, b in picks],
                        sequences))
    assert stamped[0] == stamped[1]


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_input_is_refused_by_name(impl):
    picks = request(impl, [2])
    with pytest.raises(TypeError, match="sequences must be a dict"):
        impl.stamp_batches(picks, producer_id=1, producer_epoch=0, generation=1, sequences=[])
    with pytest.raises(ValueError, match="producer_id"):
        impl.stamp_batches(picks, producer_id=2**63, generation=1, sequences={})
    with pytest.raises(TypeError, match="batch.view must be a BatchView"):
        impl.stamp_batches([(("t", 0), SimpleNamespace(view=b"\0" * 70, record_count=1,
                                                       stamp_generation=0))],
                           producer_id=1, producer_epoch=0, generation=1, sequences={})
    empty = SimpleNamespace(view=picks[0][1].view, record_count=0, stamp_generation=0)
    with pytest.raises(ValueError, match="at least one record"):
        impl.stamp_batches([(("t", 0), empty)], producer_id=1, producer_epoch=0, generation=1,
                           sequences={})
    control = impl.split_batches(control_batch(3, 0, 10, abort=True)).batches[0]
    with pytest.raises(UnsupportedFormatError, match="control batches"):
        impl.stamp_batches([(("t", 0), SimpleNamespace(view=control, record_count=1,
                                                       stamp_generation=0))],
                           producer_id=1, producer_epoch=0, generation=1, sequences={})
