"""``encode_produce_batches``: a Produce request written from its stamped picks, native and twin.

The request must be byte for byte what ``encode_produce_request`` builds from the picks grouped
by topic, each batch as ``rewrite_for_produce`` stamps it (checked against that, not only
between the builds), its answer bound ``produce_response_min_bytes``'s, its errors the twin's.
The native request is a sequence of pieces that ``native/_csend.pyx`` writes from their pointers:
it is sent here over a real socketpair, whole and in part, by both writers.
"""

from __future__ import annotations

import importlib
import random
import re
import socket

import pytest

from shallowmirror.codec import messages as twin_messages
from shallowmirror.errors import UnsupportedFormatError
from shallowmirror.net import sendmsg as twin_send
from tests.unit.codec.batches import CODECS, build_batch, control_batch
from tests.unit.codec.batches import twin as twin_records
from tests.unit.codec.implementations import native_module
from tests.unit.codec.test_stamp_batches import SlotBatch

NATIVE_MESSAGES = native_module("_cmessages")
NATIVE_RECORDS = native_module("_crecords")
NATIVE_SEND = None if NATIVE_MESSAGES is None else importlib.import_module(
    "shallowmirror.net._csend")
IMPLS = {"twin": (twin_records, twin_messages)}
if NATIVE_MESSAGES is not None:
    IMPLS["native"] = (NATIVE_RECORDS, NATIVE_MESSAGES)
both = pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS.keys())
needs_native = pytest.mark.skipif(NATIVE_MESSAGES is None, reason="native codec not built")

ARGS = {"correlation_id": 41, "client_id": "mirror-1", "transactional_id": None, "acks": -1,
        "timeout_ms": 30_000}


def _picks(records, rnd: random.Random, n: int, *, batch_class=SlotBatch,
           value_size: int = 40, codec: str | None = None) -> list:
    """``n`` picks over 1-3 topics, partitions unique, batches of random codecs and sizes."""
    topics = ["orders", "événements", "t"][:rnd.randint(1, 3)]
    keys = rnd.sample([(t, p) for t in topics for p in range(12)], n)
    picks = []
    for i, key in enumerate(keys):
        data = build_batch(codec or rnd.choice(sorted(CODECS)), rnd.randint(1, 30), base_offset=1000 * i,
                           producer_id=rnd.choice((-1, 5)), producer_epoch=0, base_sequence=3,
                           value_size=value_size)
        view = records.split_batches(data).batches[0]
        picks.append((key, batch_class(view, view.record_count, -1)))
    return picks


def _stamp(records, picks, *, generation: int = 1, idempotent: bool = True, **kwargs) -> None:
    records.stamp_batches(picks, producer_id=4242 if idempotent else -1,
                          producer_epoch=7 if idempotent else -1, generation=generation,
                          sequences={} if idempotent else None, headers=False, **kwargs)


def _reference(records, picks, version: int, clear: bool) -> tuple[bytes, int]:
    """The request as the engine built it before: rewrite each batch, group, encode."""
    topics: dict = {}
    for (topic, partition), batch in picks:
        pieces = records.rewrite_for_produce(
            batch.view, producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence, clear_log_append_time=clear)
        topics.setdefault(topic, []).append((partition, (pieces,)))
    grouped = list(topics.items())
    request = twin_messages.encode_produce_request(version=version, topics=grouped, **ARGS)
    return (twin_messages.join_request(request),
            twin_messages.produce_response_min_bytes(version, grouped))


def _joined(request) -> bytes:
    return b"".join(bytes(piece) for piece in request)


@both
@pytest.mark.parametrize("version", range(3, 10))
@pytest.mark.parametrize("seed", range(6))
def test_the_request_is_what_rewrite_and_encode_produce_request_build(impl, version, seed):
    records, messages = impl
    rnd = random.Random(seed * 10 + version)
    clear = bool(seed % 2)
    picks = _picks(records, rnd, rnd.randint(1, 9))
    _stamp(records, picks, idempotent=seed % 3 != 0, clear_log_append_time=clear)
    request, answer_bytes = messages.encode_produce_batches(
        picks, version=version, clear_log_append_time=clear, **ARGS)
    # headers=False made no header of its own: the request's come from the stamps.
    assert not any(hasattr(batch, "header") for _, batch in picks)
    assert (_joined(request), answer_bytes) == _reference(records, picks, version, clear)


@needs_native
@pytest.mark.parametrize("version", (3, 8, 9))
def test_native_request_pieces_join_and_tail(version):
    records, messages = IMPLS["native"]
    picks = _picks(records, random.Random(version), 5)
    _stamp(records, picks)
    request, _ = messages.encode_produce_batches(picks, version=version, **ARGS)
    whole, _ = _reference(records, picks, version, False)
    assert request.join() == whole and request.nbytes == len(whole)
    # Framing and body alternate: one body piece per batch, each exactly its batch after the
    # 61-byte header; the first piece starts with the size prefix.
    assert len(request) in (2 * len(picks), 2 * len(picks) + 1)
    assert bytes(request[0])[:4] == (len(whole) - 4).to_bytes(4, "big")
    bodies = [bytes(request[i]) for i in range(1, 2 * len(picks), 2)]
    assert sorted(bodies) == sorted(bytes(b.view.buffer)[61:] for _, b in picks)
    assert bytes(request[-1]) == bytes(request[len(request) - 1])
    with pytest.raises(IndexError):
        request[len(request)]
    assert request.tail(0) == whole and request.tail(len(whole)) == b""
    assert request.tail(17) == whole[17:]
    with pytest.raises(ValueError, match="outside"):
        request.tail(len(whole) + 1)
    assert "5 batches" in repr(request)


@both
def test_a_resend_is_the_same_bytes_and_a_new_generation_restamps(impl):
    records, messages = impl
    picks = _picks(records, random.Random(3), 4)
    _stamp(records, picks, generation=1)
    first = _joined(messages.encode_produce_batches(picks, version=8, **ARGS)[0])
    assert records.stamp_batches(picks, producer_id=4242, producer_epoch=7, generation=1,
                                 sequences={}, headers=False) == 0      # already stamped
    assert _joined(messages.encode_produce_batches(picks, version=8, **ARGS)[0]) == first
    _stamp(records, picks, generation=2)       # a new identity generation: sequences anew
    assert _joined(messages.encode_produce_batches(picks, version=8, **ARGS)[0]) == first
    records.stamp_batches(picks, producer_id=99, producer_epoch=1, generation=3, sequences={},
                          headers=False)
    assert _joined(messages.encode_produce_batches(picks, version=8, **ARGS)[0]) != first


def _error(impl, picks, **overrides):
    records, messages = impl
    kwargs = {**ARGS, "version": 8, **overrides}
    with pytest.raises(Exception) as caught:
        messages.encode_produce_batches(picks, **kwargs)
    return type(caught.value), str(caught.value)


def _errors_agree(make, **overrides):
    """The same error type and text from both builds (each with its own batches)."""
    found = {name: _error(impl, make(impl), **overrides) for name, impl in IMPLS.items()}
    found = {name: (kind, re.sub(r" at 0x[0-9a-f]+", "", text))      # each build's own batch
             for name, (kind, text) in found.items()}
    assert len(set(found.values())) == 1, found
    return next(iter(found.values()))


def test_errors_are_the_twins():
    def stamped(impl, n=3):
        picks = _picks(impl[0], random.Random(5), n)
        _stamp(impl[0], picks)
        return picks

    def unstamped(impl):
        picks = stamped(impl)
        picks[1][1].stamp_generation = -1
        return picks

    def twice(impl):
        picks = stamped(impl, 2)
        return [picks[0], (picks[0][0], picks[1][1])]

    def control(impl):
        picks = stamped(impl, 2)
        view = impl[0].split_batches(control_batch(5, 0, 10, abort=True)).batches[0]
        picks[1][1].view = view
        return picks

    def foreign_view(impl):
        picks = stamped(impl, 1)
        picks[0][1].view = b"not a view"
        return picks

    def bad_stamp(impl):
        picks = stamped(impl, 1)
        picks[0][1].producer_epoch = 1 << 20
        return picks

    assert _errors_agree(unstamped)[0] is ValueError
    assert _errors_agree(twice) == (
        ValueError, f"partition {twice(next(iter(IMPLS.values())))[0][0][0]}-"
                    f"{twice(next(iter(IMPLS.values())))[0][0][1]} is listed twice in one "
                    "Produce request")
    assert _errors_agree(control)[0] is UnsupportedFormatError
    assert _errors_agree(foreign_view)[0] is TypeError
    assert _errors_agree(bad_stamp)[0] is ValueError
    assert _errors_agree(stamped, version=10)[0] is ValueError
    assert _errors_agree(stamped, acks=1 << 20)[0] is ValueError
    assert _errors_agree(stamped, client_id=5)[0] is TypeError

    def bad_partition(impl):
        picks = stamped(impl, 1)
        return [(("orders", 1 << 40), picks[0][1])]

    assert _errors_agree(bad_partition)[0] is ValueError


@both
def test_many_partitions_of_one_topic_and_a_duplicate_among_them(impl):
    """Past 16 partitions of a topic the native build finds a repeat through a set."""
    records, messages = impl
    data = build_batch("lz4", 2)
    picks = []
    for p in range(40):
        view = records.split_batches(data).batches[0]
        picks.append((("wide", p), SlotBatch(view, view.record_count, -1)))
    _stamp(records, picks)
    request, _ = messages.encode_produce_batches(picks, version=9, **ARGS)
    assert _joined(request) == _reference(records, picks, 9, False)[0]
    with pytest.raises(ValueError, match="wide-3 is listed twice"):
        messages.encode_produce_batches(picks + [picks[3]], version=9, **ARGS)


@both
def test_no_picks_is_an_empty_request(impl):
    _records, messages = impl
    request, answer_bytes = messages.encode_produce_batches([], version=9, **ARGS)
    reference = twin_messages.encode_produce_request(version=9, topics=[], **ARGS)
    assert _joined(request) == twin_messages.join_request(reference)
    assert answer_bytes == twin_messages.produce_response_min_bytes(9, [])


@needs_native
@pytest.mark.parametrize("writer", ["native", "twin"])
@pytest.mark.parametrize("sndbuf", [1 << 20, 4096])
def test_both_writers_send_the_native_request_whole_or_in_part(writer, sndbuf):
    """What the kernel takes arrives; what it does not comes back (one bytes object from the
    native writer), and together they are the request."""
    records, messages = IMPLS["native"]
    # Uncompressed batches of up to 60 KB (a codec would shrink these repeated values).
    picks = _picks(records, random.Random(11), 9, value_size=2000, codec="none")
    _stamp(records, picks)
    request, _ = messages.encode_produce_batches(picks, version=9, **ARGS)
    whole = request.join()
    send = NATIVE_SEND.send_buffers if writer == "native" else twin_send.send_buffers
    left, right = socket.socketpair()
    try:
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        left.setblocking(False)
        right.setblocking(False)
        rest = send(left, request)
        assert isinstance(rest, list)
        tail = b"".join(bytes(p) for p in rest)
        got = bytearray()
        while len(got) < len(whole) - len(tail):
            got += right.recv(1 << 20)
        assert bytes(got) + tail == whole
        if sndbuf == 4096:
            assert tail, "a 4 KiB socket buffer should not take the whole request"
    finally:
        left.close()
        right.close()
