"""The membership consumer's client-level errors: a source broker lost mid-run makes librdkafka
report a transport error on every reconnect attempt; the operator gets one warning per kind now
and then, in librdkafka's words without its ``KafkaError{...}`` wrapping, not a flood."""

from __future__ import annotations

import asyncio
import logging

from confluent_kafka import KafkaError

from shallowmirror.engine.membership import Membership


def _membership() -> Membership:
    loop = asyncio.new_event_loop()
    try:
        return Membership({"bootstrap.servers": "127.0.0.1:1"}, group_id="g", mode="group",
                          session_timeout_ms=45_000, heartbeat_interval_ms=3_000, loop=loop,
                          on_assigned=lambda *_: None, on_revoked=lambda *_: None,
                          source_alias="A")
    finally:
        loop.close()


def test_a_lost_broker_is_one_warning_per_kind_not_one_per_reconnect(caplog):
    caplog.set_level(logging.DEBUG, logger="shallowmirror.engine.membership")
    membership = _membership()
    refused = KafkaError(KafkaError._TRANSPORT, "127.0.0.1:1/bootstrap: Connect to "
                         "ipv4#127.0.0.1:1 failed: Connection refused")
    for _ in range(50):
        membership._errors(refused)
    membership._errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "membership consumer (group g, cluster A): 127.0.0.1:1/bootstrap: Connect to "
        "ipv4#127.0.0.1:1 failed: Connection refused",
        "membership consumer (group g, cluster A): 1/1 brokers are down"]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG
             and "Connection refused" in r.getMessage()]
    assert len(debug) == 49
    assert membership.last_error is not None and "brokers are down" in membership.last_error
