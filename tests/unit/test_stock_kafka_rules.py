"""Settings that keep the mirror within what stock Apache Kafka brokers accept.

Found by reading Kafka's broker code (LogValidator, ApiVersionsRequest) since no real Kafka runs
here; each test pins one rule so it cannot regress silently.
"""

import re

import pytest

from shallowmirror.engine.config import resolve_settings
from shallowmirror.errors import ConfigError
from shallowmirror.mirror.filters import CONFIG_PROPERTIES_EXCLUDE_DEFAULT
from shallowmirror.net.connection import software_version

#: ApiVersionsRequest.isValid (KIP-511): software name and version must match this.
KAFKA_SOFTWARE_PATTERN = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def test_log_append_time_bit_is_cleared_by_default():
    # Kafka 3.0-3.5 rejects every client batch with the LogAppendTime bit (INVALID_TIMESTAMP).
    assert resolve_settings({})["log.append.time"] == "clear"
    assert resolve_settings({"log.append.time": "keep"})["log.append.time"] == "keep"


def test_idempotence_requires_acks_all():
    with pytest.raises(ConfigError, match="acks=1 with enable.idempotence=true"):
        resolve_settings({"acks": "1"})
    assert resolve_settings({"acks": "1", "enable.idempotence": "false"})["acks"] == "1"
    assert resolve_settings({"acks": "-1"})["acks"] == "-1"


@pytest.mark.parametrize("version, sent", [
    ("0.1.0", "0.1.0"), ("0.2.0+g1234", "0.2.0-g1234"), ("1.0.0.dev3", "1.0.0.dev3"),
    ("+local", "local"), ("!!!", "unknown"),
])
def test_client_software_version_is_valid_for_kafka(version, sent):
    assert software_version(version) == sent
    assert KAFKA_SOFTWARE_PATTERN.fullmatch(software_version(version))


@pytest.mark.parametrize("key", ["message.timestamp.before.max.ms",
                                 "message.timestamp.after.max.ms",
                                 "message.timestamp.difference.max.ms"])
def test_timestamp_windows_are_not_copied_to_remote_topics(key):
    assert any(re.fullmatch(pattern, key) for pattern in CONFIG_PROPERTIES_EXCLUDE_DEFAULT)
