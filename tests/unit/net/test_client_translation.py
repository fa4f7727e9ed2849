"""One client configuration path: a cluster's Kafka/MM2-style keys become librdkafka's through
``librdkafka_connection`` (the same validation as the net layer's), and real confluent-kafka
clients accept the result where they refuse the keys as written."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import AdminClient

from shallowmirror.errors import ConfigError
from shallowmirror.mirror.clients import build_client
from shallowmirror.net.config import TRANSLATED_KEYS, client_settings, librdkafka_connection

JAAS_PLAIN = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
              'username="alice" password="alice-secret";')
JAAS_SCRAM = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
              'username="bob" password="b\\"ob";')
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"
# A port nothing listens on: the clients are created and closed, never connected.
NOWHERE = "127.0.0.1:1"


def _sasl(mechanism: str, jaas: str, protocol: str = "SASL_PLAINTEXT") -> dict[str, str]:
    return {"bootstrap.servers": NOWHERE, "security.protocol": protocol,
            "sasl.mechanism": mechanism, "sasl.jaas.config": jaas}


def test_jaas_line_becomes_librdkafka_username_and_password():
    conf = librdkafka_connection(_sasl("SCRAM-SHA-512", JAAS_SCRAM), "A")
    assert conf == {"bootstrap.servers": NOWHERE, "client.id": "shallowmirror",
                    "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                    "sasl.username": "bob", "sasl.password": 'b"ob'}


def test_librdkafka_accepts_the_translation_and_refuses_the_jaas_line_as_written():
    raw = {**_sasl("PLAIN", JAAS_PLAIN), "group.id": "g"}
    with pytest.raises(KafkaException, match="JAAS"):     # the bug: what membership used to do
        Consumer(raw)
    consumer = Consumer({**librdkafka_connection(raw, "A"), "group.id": "g"})
    consumer.close()


def test_java_ssl_names_become_librdkafka_names():
    conf = librdkafka_connection({
        "bootstrap.servers": NOWHERE, "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": JAAS_PLAIN, "ssl.truststore.location": SYSTEM_CA,
        "ssl.truststore.type": "PEM", "ssl.endpoint.identification.algorithm": ""}, "A")
    assert conf["ssl.ca.location"] == SYSTEM_CA
    assert conf["ssl.endpoint.identification.algorithm"] == "none"
    assert conf["enable.ssl.certificate.verification"] == "true"
    assert not {"ssl.truststore.location", "ssl.truststore.type", "sasl.jaas.config"} & set(conf)
    AdminClient(conf)                        # librdkafka takes every key and value


def test_librdkafka_mechanisms_alias_is_the_same_key():
    s = client_settings({"bootstrap.servers": NOWHERE, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "u",
                         "sasl.password": "p"}, "A")
    assert s.sasl_mechanism == "SCRAM-SHA-256"


def test_bad_values_fail_naming_the_key_and_cluster():
    with pytest.raises(ConfigError) as info:
        librdkafka_connection({"bootstrap.servers": NOWHERE,
                               "security.protocol": "SASL_PLAINTEXT",
                               "sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": JAAS_PLAIN,
                               "ssl.truststore.type": "JKS"}, "A")
    text = str(info.value)
    assert "sasl.jaas.config (cluster A)" in text and "ScramLoginModule" in text


def test_build_client_translates_connection_keys_and_keeps_role_keys(caplog):
    config = {**_sasl("SCRAM-SHA-256", JAAS_SCRAM), "group.id": "g",
              "auto.offset.reset": "earliest", "key.deserializer": "org.Foo"}
    seen: list[dict] = []

    def factory(conf: dict) -> Consumer:
        seen.append(conf)
        return Consumer(conf)

    build_client(factory, config, what="test consumer", alias="A").close()
    conf = seen[-1]
    assert conf["sasl.username"] == "bob" and conf["group.id"] == "g"
    assert conf["auto.offset.reset"] == "earliest"
    assert not (set(conf) & {"sasl.jaas.config", "key.deserializer"})
    with pytest.raises(ConfigError, match="security.protocol"):
        build_client(factory, {**config, "security.protocol": "SASL_KERBEROS"},
                     what="test consumer", alias="A")


def test_every_translated_key_is_a_connection_setting_or_librdkafka_alias():
    from shallowmirror.net.config import CONNECTION_SETTINGS
    assert TRANSLATED_KEYS - set(CONNECTION_SETTINGS.names()) == {"sasl.mechanisms"}
