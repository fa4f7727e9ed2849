"""``listener_hint``: what a TCP connect tells about a bootstrap address no client got a Kafka
answer from (real sockets on 127.0.0.1)."""

from __future__ import annotations

import socket

from shallowmirror.net.probe import listener_hint


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_refused_address_is_one_where_nothing_listens() -> None:
    port = _closed_port()
    assert listener_hint(f"127.0.0.1:{port}") == f"nothing listens at 127.0.0.1:{port}"


def test_an_accepting_address_is_asked_whether_it_is_kafka_of_that_protocol() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        hint = listener_hint(f"127.0.0.1:{port}", "SASL_SSL")
    assert hint == (f"127.0.0.1:{port} accepts connections but gave no Kafka answer: is it a "
                    "Kafka listener, and does it expect TLS or SASL (security.protocol is "
                    "SASL_SSL)?")


def test_every_address_is_told_apart_and_at_most_three_are_tried() -> None:
    first, second = _closed_port(), _closed_port()
    hint = listener_hint(f"127.0.0.1:{first}, no-such-host.invalid:9092,127.0.0.1:{second},"
                         f"127.0.0.1:{_closed_port()},not-an-address")
    assert hint == (f"nothing listens at 127.0.0.1:{first}, 127.0.0.1:{second}; unknown host "
                    "no-such-host.invalid")
    assert listener_hint("not-an-address") == ""
