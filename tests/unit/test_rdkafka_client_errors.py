"""librdkafka's client-level errors as the operator sees them (``rdkafka_logs.ClientErrors``):
each kind a warning at most once per interval, naming the client; the rest at debug. The
rate limit within an interval: ``tests/unit/engine/test_membership_errors.py``."""

import logging

from confluent_kafka import KafkaError

from shallowmirror.rdkafka_logs import ClientErrors


def test_a_kind_is_warned_again_once_its_interval_has_passed(caplog):
    log = logging.getLogger("test.client_errors")
    errors = ClientErrors(log, "producer", interval_s=0.0)
    with caplog.at_level(logging.WARNING, logger="test.client_errors"):
        errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "down"))
        errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "down"))
    assert [r.getMessage() for r in caplog.records] == ["producer: down", "producer: down"]
