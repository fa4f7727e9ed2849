"""Client settings from Kafka-style keys: both naming traditions, every problem at once."""

from __future__ import annotations

import re
import ssl

import pytest

from shallowmirror.errors import ConfigError
from shallowmirror.net.config import client_settings, parse_host_port, parse_jaas


def test_plaintext_defaults():
    s = client_settings({"bootstrap.servers": "a:9092, [::1]:9093,PLAINTEXT://b:1"}, "A")
    assert s.bootstrap_servers == (("a", 9092), ("::1", 9093), ("b", 1))
    assert s.security_protocol == "PLAINTEXT" and s.ssl_context is None
    assert s.sasl_mechanism is None and not s.uses_sasl
    assert s.reconnect_backoff_ms == 50 and s.reconnect_backoff_max_ms == 1000


def test_sasl_credentials_from_librdkafka_keys():
    s = client_settings({"bootstrap.servers": "h:1", "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "scram-sha-512", "sasl.username": "u",
                         "sasl.password": "p"}, "A")
    assert (s.sasl_mechanism, s.sasl_username, s.sasl_password) == ("SCRAM-SHA-512", "u", "p")


def test_sasl_credentials_from_java_jaas_line():
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="alice" password="pa\\"ss";')
    assert parse_jaas(jaas) == {"username": "alice", "password": 'pa"ss'}
    s = client_settings({"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL",
                         "sasl.mechanism": "PLAIN", "sasl.jaas.config": jaas}, "A")
    assert (s.sasl_username, s.sasl_password) == ("alice", 'pa"ss')
    assert isinstance(s.ssl_context, ssl.SSLContext) and s.ssl_check_hostname


def test_unsupported_mechanism_and_other_problems_reported_together():
    with pytest.raises(ConfigError) as info:
        client_settings({"bootstrap.servers": "nohost", "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "GSSAPI", "reconnect.backoff.ms": "500",
                         "reconnect.backoff.max.ms": "100"}, "src")
    problems = info.value.problems
    assert any("sasl.mechanism" in p and "GSSAPI" in p and "not supported" in p
               for p in problems)
    assert any(p.startswith("bootstrap.servers (cluster src)") for p in problems)
    assert any("reconnect.backoff.max.ms" in p for p in problems)


def test_missing_credentials_and_wrong_login_module():
    with pytest.raises(ConfigError) as info:
        client_settings({"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL",
                         "sasl.mechanism": "SCRAM-SHA-256",
                         "sasl.jaas.config": "org.apache.kafka.common.security.plain."
                                             "PlainLoginModule required;"}, "A")
    text = str(info.value)
    assert "ScramLoginModule" in text and "sasl.username/sasl.password" in text


def test_bad_security_protocol_and_jks_truststore():
    with pytest.raises(ConfigError) as info:
        client_settings({"bootstrap.servers": "h:1", "security.protocol": "TLS"}, "A")
    assert "security.protocol" in str(info.value)
    with pytest.raises(ConfigError) as info:
        client_settings({"bootstrap.servers": "h:1", "security.protocol": "SSL",
                         "ssl.truststore.location": "/nonexistent.jks",
                         "ssl.truststore.type": "JKS"}, "A")
    text = str(info.value)
    assert "only PEM" in text and "/nonexistent.jks" in text


def test_verification_switches():
    s = client_settings({"bootstrap.servers": "h:1", "security.protocol": "SSL",
                         "ssl.endpoint.identification.algorithm": ""}, "A")
    assert not s.ssl_check_hostname and s.ssl_context.verify_mode == ssl.CERT_REQUIRED
    s = client_settings({"bootstrap.servers": "h:1", "security.protocol": "SSL",
                         "enable.ssl.certificate.verification": "false"}, "A")
    assert s.ssl_context.verify_mode == ssl.CERT_NONE


def test_unknown_client_keys_are_the_typos_not_the_java_clients_keys():
    from shallowmirror.net.config import unknown_client_keys

    config = {"bootstrap.servers": "a:1", "bootstrap.server": "b:1", "security.protocl": "SSL",
              "linger.ms": 5, "auto.offset.reset": "earliest", "sasl.mechanisms": "PLAIN",
              "ssl.ca.location": "/x", "frobnicate": 1}
    assert unknown_client_keys(config) == [("bootstrap.server", "bootstrap.servers"),
                                           ("security.protocl", "security.protocol"),
                                           ("frobnicate", None)]


def test_an_engine_warns_of_each_unknown_client_key_naming_its_cluster(caplog):
    from shallowmirror.engine import MirrorEngine

    MirrorEngine({"bootstrap.servers": "a:1", "security.protocl": "SSL"},
                 {"bootstrap.servers": "b:1", "bootstrap.server": "c:1"}, topics=["t"])
    assert ("cluster source: unknown client key 'security.protocl', ignored (not a Kafka client "
            "setting); did you mean 'security.protocol'?") in caplog.text
    assert "cluster target: unknown client key 'bootstrap.server'" in caplog.text


def test_a_mirror_flows_configs_are_not_warned_about(caplog):
    """A flow's client configs carry its engine keys (legacy's ``partition.assignment = all``
    in --consumer.config) and were checked when its file was read: no warning for them."""
    from shallowmirror.engine import MirrorEngine

    MirrorEngine({"bootstrap.servers": "a:1", "partition.assignment": "all"},
                 {"bootstrap.servers": "b:1"}, topics=["t"], flow="source->target")
    assert "unknown client key" not in caplog.text


@pytest.mark.parametrize("entry, says", [
    ("127.0.0.1:26533;127.0.0.1:9093", "has ':;', which no host name or IP address has; "
                                       "separate addresses with commas"),
    ("my host:9092", "has ' ', which no host name or IP address has; a host name has no spaces"),
    ("kafka/0:9092", "has '/'"),
])
def test_a_host_no_resolver_could_find_is_refused_at_once(entry, says):
    """--check said 'configuration OK' for these; the run failed after reconnect.deadline.ms
    with 'unknown host'."""
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_host_port(entry)


@pytest.mark.parametrize("entry, parsed", [
    ("[::1]:9092", ("::1", 9092)), ("::1:9092", ("::1", 9092)),
    ("kafka-0.svc_x.local:9092", ("kafka-0.svc_x.local", 9092)),
    ("PLAINTEXT://h:1", ("h", 1)), ("fe80::1%eth0:9092", ("fe80::1%eth0", 9092)),
])
def test_hosts_kafka_takes_are_taken(entry, parsed):
    assert parse_host_port(entry) == parsed
