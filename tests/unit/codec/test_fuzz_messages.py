"""Fuzzing the message codec: random and mutated frames give a valid result or CorruptDataError,
never another exception, a crash or a hang; the twin and the native build agree on every input
(equal results, or the same error message and location).

A few thousand cases by default; ``SHALLOWMIRROR_FUZZ_EXAMPLES=N`` runs N per test instead.
"""

from __future__ import annotations

import os
import random

import pytest
from frames import (
    BOTH_BUILT,
    FETCH_VERSIONS,
    IMPLS,
    NATIVE,
    PRODUCE_VERSIONS,
    fetch_frame,
    kafka_produce_request,
    outcome,
    produce_response_frame,
    random_fetch_topics,
    random_produce_response_topics,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shallowmirror.codec import messages as twin


def examples(default: int) -> int:
    override = os.environ.get("SHALLOWMIRROR_FUZZ_EXAMPLES")
    return int(override) if override else default


def fuzz_settings(default: int):
    # No deadline: timing is not what is under test and CI machines vary.
    return settings(max_examples=examples(default), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


needs_both = pytest.mark.skipif(not BOTH_BUILT, reason="native _cmessages not built")

# Valid frames to mutate: several per version, with nulls, empties, aborted transactions, tags.
FETCH_SEEDS = [(v, fetch_frame(v, random_fetch_topics(random.Random(v * 10 + i), 2, 3),
                               session_id=i, error_code=i % 2))
               for v in FETCH_VERSIONS for i in range(4)]
PRODUCE_SEEDS = [(v, produce_response_frame(v, random_produce_response_topics(
                      random.Random(v * 10 + i))))
                 for v in PRODUCE_VERSIONS for i in range(4)]


@st.composite
def mutated(draw, seeds):
    """A seed frame with a few byte-level mutations (flip, set, insert, delete, truncate)."""
    version, frame = draw(st.sampled_from(seeds))
    data = bytearray(frame)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF]))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        else:
            del data[at:]
    return version, bytes(data)


def random_frames(versions):
    return st.tuples(st.sampled_from(versions), st.binary(max_size=160))


def check_fetch_result(frame: bytes, result) -> None:
    """What a successful decode must satisfy: records are views into the frame."""
    for topic in result.topics:
        assert isinstance(topic.topic, str)
        for part in topic.partitions:
            if part.records is not None:
                assert part.records.obj is frame
                assert part.records.nbytes <= len(frame)
            assert all(isinstance(a, tuple) and len(a) == 2 for a in part.aborted_transactions)


def decode_fetch(impl, version, frame):
    got = outcome(impl.decode_fetch_response, frame, version)
    if got[0] == "ok":
        check_fetch_result(frame, got[1])
    else:
        assert got[2].position is not None and 0 <= got[2].position <= len(frame)
    return got


def decode_produce(impl, version, frame):
    got = outcome(impl.decode_produce_response, frame, version)
    if got[0] == "corrupt":
        assert got[2].position is not None and 0 <= got[2].position <= len(frame)
    return got


# ------------------------------------------------------------- each implementation on its own

@pytest.mark.parametrize("impl", IMPLS)
@fuzz_settings(300)
@given(case=st.one_of(random_frames(FETCH_VERSIONS), mutated(FETCH_SEEDS)))
def test_fetch_random_or_mutated_frames(impl, case):
    decode_fetch(impl, *case)


@pytest.mark.parametrize("impl", IMPLS)
@fuzz_settings(300)
@given(case=st.one_of(random_frames(PRODUCE_VERSIONS), mutated(PRODUCE_SEEDS)))
def test_produce_response_random_or_mutated_frames(impl, case):
    decode_produce(impl, *case)


# ---------------------------------------------------------------------- twin and native agree

@needs_both
@fuzz_settings(800)
@given(case=st.one_of(random_frames(FETCH_VERSIONS), mutated(FETCH_SEEDS)))
def test_fetch_twins_agree(case):
    assert decode_fetch(twin, *case) == decode_fetch(NATIVE, *case)


@needs_both
@fuzz_settings(500)
@given(case=st.one_of(random_frames(PRODUCE_VERSIONS), mutated(PRODUCE_SEEDS)))
def test_produce_response_twins_agree(case):
    assert decode_produce(twin, *case) == decode_produce(NATIVE, *case)


@needs_both
def test_twins_agree_on_every_cut_of_every_seed():
    """Deterministic companion to the fuzzing: each seed cut at every byte, and with one byte
    appended, gives the same error (message and location) from both implementations."""
    for seeds, name in ((FETCH_SEEDS, "decode_fetch_response"),
                        (PRODUCE_SEEDS, "decode_produce_response")):
        for version, frame in seeds[::3]:
            for data in [frame[:cut] for cut in range(len(frame))] + [frame + b"\x00"]:
                ours = outcome(getattr(twin, name), data, version)
                theirs = outcome(getattr(NATIVE, name), data, version)
                assert ours[0] == "corrupt" and ours == theirs


def test_seeds_decode_cleanly():
    """The mutation seeds themselves are valid (else the fuzzing above proves little)."""
    for version, frame in FETCH_SEEDS:
        assert outcome(twin.decode_fetch_response, frame, version)[0] == "ok"
    for version, frame in PRODUCE_SEEDS:
        assert outcome(twin.decode_produce_response, frame, version)[0] == "ok"


# ------------------------------------------------------------------------ Produce encoding

pieces = st.lists(st.binary(max_size=40) | st.binary(max_size=40).map(bytearray),
                  min_size=0, max_size=3)
partition_entries = st.lists(st.tuples(st.integers(-3, 40),
                                       st.lists(pieces, min_size=0, max_size=3)),
                             max_size=4)
request_topics = st.lists(st.tuples(st.text(max_size=12), partition_entries), max_size=3)


def encode_outcome(impl, kwargs):
    try:
        return ("ok", impl.join_request(impl.encode_produce_request(**kwargs)))
    except (ValueError, TypeError) as err:
        return ("error", type(err), str(err))


@pytest.mark.parametrize("impl", IMPLS)
@fuzz_settings(250)
@given(version=st.sampled_from(PRODUCE_VERSIONS), topics=request_topics,
       allow=st.booleans(), client_id=st.none() | st.text(max_size=8),
       transactional_id=st.none() | st.text(max_size=8))
def test_encode_produce_request_round_trips(impl, version, topics, allow, client_id,
                                            transactional_id):
    kwargs = {"version": version, "correlation_id": 11, "client_id": client_id,
              "transactional_id": transactional_id, "acks": -1, "timeout_ms": 500,
              "topics": topics, "allow_multiple_batches": allow}
    got = encode_outcome(impl, kwargs)
    if got[0] == "error":
        return
    # Every accepted request decodes, with Kafka's generated decoder, to what was given.
    req = kafka_produce_request(got[1], version)
    assert [(t.name, [(p.index, p.records) for p in t.partition_data]) for t in req.topic_data] \
        == [(name, [(p, b"".join(b"".join(batch) for batch in batches))
                    for p, batches in parts])
            for name, parts in topics]
    assert all(batches and (allow or len(batches) == 1) for _, parts in topics
               for _, batches in parts)
    if BOTH_BUILT:
        other = NATIVE if impl is twin else twin
        assert encode_outcome(other, kwargs) == got
