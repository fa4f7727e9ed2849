"""``produce_response_min_bytes``, both builds, against kafka-python's own encoding of Produce
responses: exact for an answer with no errors, and never above an answer with error texts and
record errors (the bound ``BrokerConnection.coalesce_answers`` sets SO_RCVLOWAT from: above it,
a socket would wait for bytes that never come)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.producer import ProduceResponse

from shallowmirror.codec import messages
from shallowmirror.codec.messages import PRODUCE_VERSIONS
from tests.unit.codec.implementations import native_module

_native = native_module("_cmessages")
BUILDS = [pytest.param(messages.produce_response_min_bytes, id="python")] + (
    [pytest.param(_native.produce_response_min_bytes, id="native")] if _native else [])
MinBytes = Callable[[int, list], int]

KT = ProduceResponse.TopicProduceResponse
KP = KT.PartitionProduceResponse


def request_topics(shape: list[tuple[str, int]]) -> list[tuple[str, list]]:
    """A Produce request's ``topics`` with ``shape``'s partition counts (batches not read)."""
    return [(topic, [(p, ((b"",),)) for p in range(partitions)]) for topic, partitions in shape]


def wire_bytes(version: int, shape: list[tuple[str, int]], *, error_text: str | None = None,
               record_errors: int = 0) -> int:
    """kafka-python's Produce response for ``shape``, on the wire (size prefix included)."""
    errors = [KP.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message="bad")
              for i in range(record_errors)]
    msg = ProduceResponse(version=version, throttle_time_ms=0, responses=[
        KT(name=topic, partition_responses=[
            KP(index=p, error_code=0 if error_text is None else 87, base_offset=123,
               log_append_time_ms=-1, log_start_offset=0, record_errors=errors,
               error_message=error_text) for p in range(partitions)])
        for topic, partitions in shape])
    msg.with_header(correlation_id=7)
    return len(msg.encode(header=True, framed=True))


VERSIONS = range(PRODUCE_VERSIONS[0], PRODUCE_VERSIONS[1] + 1)
topic_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1,
                      max_size=249)
shapes = st.lists(st.tuples(topic_names, st.integers(1, 300)), min_size=1, max_size=5,
                  unique_by=lambda t: t[0])


@pytest.mark.parametrize("min_bytes", BUILDS)
@settings(max_examples=150, deadline=None)
@given(version=st.sampled_from(VERSIONS), shape=shapes)
def test_exact_for_an_answer_without_errors(min_bytes: MinBytes, version: int,
                                            shape: list[tuple[str, int]]) -> None:
    assert min_bytes(version, request_topics(shape)) == wire_bytes(version, shape)


@pytest.mark.parametrize("min_bytes", BUILDS)
@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from(VERSIONS), shape=shapes,
       text=st.text(max_size=40), record_errors=st.integers(0, 3))
def test_never_above_an_answer_with_errors(min_bytes: MinBytes, version: int,
                                           shape: list[tuple[str, int]], text: str,
                                           record_errors: int) -> None:
    assert min_bytes(version, request_topics(shape)) <= wire_bytes(
        version, shape, error_text=text, record_errors=record_errors)


@pytest.mark.parametrize("min_bytes", BUILDS)
def test_varint_boundaries_of_the_flexible_version(min_bytes: MinBytes) -> None:
    """127 and 128 partitions, 126/127-byte names: where compact lengths take a second byte."""
    for partitions in (126, 127, 128, 129, 16383, 16384):
        for name in ("t" * 126, "t" * 127, "t" * 128):
            shape = [(name, partitions)]
            assert min_bytes(9, request_topics(shape)) == wire_bytes(9, shape)


@pytest.mark.parametrize("min_bytes", BUILDS)
def test_multibyte_topic_names_count_in_utf8_bytes(min_bytes: MinBytes) -> None:
    """A name's length on the wire is its UTF-8 byte count, not its character count."""
    shape = [("tópico-ü", 3), ("日本", 2)]
    for version in VERSIONS:
        assert min_bytes(version, request_topics(shape)) == wire_bytes(version, shape)


@settings(max_examples=200, deadline=None)
@given(version=st.sampled_from(VERSIONS), shape=shapes)
def test_native_equals_twin(version: int, shape: list[tuple[str, int]]) -> None:
    if _native is None:
        pytest.skip("native codec not built")
    topics = request_topics(shape)
    assert _native.produce_response_min_bytes(version, topics) == \
        messages.produce_response_min_bytes(version, topics)
