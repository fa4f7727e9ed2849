"""librdkafka's client-level errors as the operator sees them (``rdkafka_logs.ClientErrors``):
each kind a warning at most once per interval, naming the client; the rest at debug. The
rate limit within an interval: ``tests/unit/engine/test_membership_errors.py``."""

import logging
import time

from confluent_kafka import KafkaError

from shallowmirror.rdkafka_logs import ClientErrors


def test_a_kind_is_warned_again_once_its_interval_has_passed(caplog):
    log = logging.getLogger("test.client_errors")
    errors = ClientErrors(log, "producer", interval_s=0.0)
    with caplog.at_level(logging.WARNING, logger="test.client_errors"):
        errors(KafkaError(KafkaError._AUTHENTICATION, "denied"))
        errors(KafkaError(KafkaError._AUTHENTICATION, "denied"))
    assert [r.getMessage() for r in caplog.records] == ["producer: denied", "producer: denied"]


def test_an_outage_is_warned_about_once_until_the_cluster_answers(caplog):
    """A target lost for a minute gave two warnings every 10 s (librdkafka's reconnect
    errors, relayed at each interval); the outage is said once, and again only after the
    cluster answered in between."""
    errors = ClientErrors(logging.getLogger("test.client_errors"), "consumer", interval_s=0.0)
    down = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
    refused = KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:1 failed")
    with caplog.at_level(logging.WARNING, logger="test.client_errors"):
        for _ in range(5):
            errors(down)
            errors(refused)
        errors.reached()
        errors(down)
        errors(refused)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == ["consumer: 1/1 brokers are down", "consumer: Connect to ipv4#127.0.0.1:1 "
                    "failed"] * 2


def test_all_brokers_down_lasts_while_reconnects_fail_and_ends_when_they_stop():
    errors = ClientErrors(logging.getLogger("test.client_errors"), "consumer", interval_s=60)
    refused = KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:1 failed")
    errors(refused)                      # one failed connection is not the cluster down
    assert errors.down_for_s() is None
    errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    time.sleep(0.05)
    errors(refused)                      # still failing: still down, counted from the start
    assert errors.down_for_s(quiet_s=10) >= 0.05
    time.sleep(0.2)                      # no failure for longer than quiet_s: back
    assert errors.down_for_s(quiet_s=0.1) is None
    assert errors.down_for_s(quiet_s=10) is None


def test_an_answer_from_the_cluster_ends_the_outage_at_once_and_a_new_one_counts_anew(caplog):
    errors = ClientErrors(logging.getLogger("test.client_errors"), "consumer", interval_s=60)
    refused = KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:1 failed")
    errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    time.sleep(0.05)
    errors(refused)
    assert errors.down_for_s(quiet_s=10) >= 0.05
    with caplog.at_level(logging.INFO, logger="test.client_errors"):
        errors.reached()                 # e.g. a group assignment: the broker answered
        errors.reached()                 # said once per outage
    assert errors.down_for_s(quiet_s=10) is None
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(said) == 1 and said[0].startswith("consumer: reachable again after 0.")
    errors(refused)                      # a refused connection alone does not start an outage
    assert errors.down_for_s(quiet_s=10) is None
    errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert 0 <= errors.down_for_s(quiet_s=10) < 0.05   # counted from the new outage


def test_a_client_at_debug_level_follows_the_outage_without_a_warning(caplog):
    """An internal topic's writer follows its cluster's outages (its flush gives up on a lost
    cluster) where the engine already warns about them: its lines stay at debug."""
    errors = ClientErrors(logging.getLogger("test.client_errors"), "writer", interval_s=60,
                          level=logging.DEBUG)
    with caplog.at_level(logging.DEBUG, logger="test.client_errors"):
        errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
        assert errors.down_for_s() is not None
        errors.reached()
    assert errors.down_for_s() is None
    assert [(r.levelno, r.getMessage().split(" after")[0]) for r in caplog.records] == [
        (logging.DEBUG, "writer: 1/1 brokers are down"),
        (logging.DEBUG, "writer: reachable again")]
