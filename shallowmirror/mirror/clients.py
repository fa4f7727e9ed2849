"""confluent-kafka clients built from Kafka (Java) style configs.

mm2.properties and MirrorMaker 1 config files carry Java client keys librdkafka does not know
(``key.deserializer``, ``sasl.jaas.config``, ``partition.assignment.strategy`` class names ...).
librdkafka refuses to start on an unknown key, so such keys are dropped with one warning each;
engine-only keys never reach librdkafka. Connection keys (``bootstrap.servers``,
``security.protocol``, ``sasl.*`` including a Java ``sasl.jaas.config``, ``ssl.*`` Java names) are
not passed as written: they come from ``net.config.librdkafka_connection``, the one translation
every client shares, which also validates them.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from shallowmirror.net.config import TRANSLATED_KEYS, librdkafka_connection
from shallowmirror.rdkafka_logs import with_log_config

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Java client keys with no librdkafka meaning (or a different one): always dropped.
JAVA_ONLY_KEYS = frozenset({
    "key.deserializer", "value.deserializer", "key.serializer", "value.serializer",
    "interceptor.classes",
    "sasl.login.callback.handler.class", "sasl.client.callback.handler.class",
    "metric.reporters", "security.providers", "default.api.timeout.ms",
    "auto.include.jmx.reporter", "buffer.memory", "max.block.ms", "exclude.internal.topics",
    "ssl.truststore.password", "ssl.keystore.password",
    "ssl.protocol", "ssl.enabled.protocols",
})
#: The longest one Metadata call holds the calling thread in librdkafka (``list_topics``).
METADATA_SLICE_S = 0.5
#: The longest a producer's flush holds the calling thread in librdkafka (``flush_sliced``).
FLUSH_SLICE_S = 0.5
#: librdkafka's errors for "no answer yet" (a single long call would have waited on).
NOT_ANSWERING = frozenset({KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                           KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE})
#: shallowmirror's own connection keys (net.config): meaningful to the engine, not to librdkafka.
OWN_CONNECTION_KEYS = frozenset({"reconnect.deadline.ms"})
_UNKNOWN_RE = re.compile(r'No such configuration property: "([^"]+)"')
_warned: set[tuple[str, str]] = set()


def build_client(factory: Callable[[dict[str, Any]], T], config: Mapping[str, Any], *,
                 what: str, alias: str | None = None) -> T:
    """``factory(config)`` with the connection keys translated for librdkafka (cluster
    ``alias``; a bad one raises ``ConfigError`` naming it) and the keys librdkafka rejects
    dropped (each warned about once)."""
    config = {**{k: v for k, v in config.items() if k not in TRANSLATED_KEYS},
              **librdkafka_connection(config, alias or what)}
    conf = {k: v for k, v in config.items() if k not in JAVA_ONLY_KEYS
            and k not in OWN_CONNECTION_KEYS
            and not (k == "partition.assignment.strategy" and "." in str(v))}
    for key in sorted(set(config) - set(conf) - OWN_CONNECTION_KEYS):
        _warn_once(key, what, "a Java client key or value librdkafka does not use")
    conf = with_log_config(conf)  # librdkafka's lines through Python logging, not raw stderr
    for _ in range(len(conf) + 1):
        try:
            return factory(dict(conf))
        except KafkaException as err:
            match = _UNKNOWN_RE.search(str(err))
            if not match or match.group(1) not in conf:
                raise
            conf.pop(match.group(1))
            _warn_once(match.group(1), what, "unknown to librdkafka")
    raise RuntimeError("unreachable")  # pragma: no cover


def _warn_once(key: str, what: str, why: str) -> None:
    if (key, what) not in _warned:
        _warned.add((key, what))
        log.warning("%s: ignoring client key %r (%s)", what, key, why)


def connection_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """Connection/security keys of a client config (the role-specific ones are dropped): for a
    helper client of another role (an admin or producer beside a consumer) on the same cluster."""
    keep = ("bootstrap.servers", "security.protocol", "ssl.", "sasl.", "client.dns.lookup",
            "socket.", "reconnect.", "request.timeout.ms", "retry.backoff.ms",
            "connections.max.idle.ms", "metadata.max.age.ms")
    return {k: v for k, v in config.items() if k.startswith(keep)}


def admin_client(config: Mapping[str, Any], *, what: str):
    """A confluent-kafka AdminClient."""
    from confluent_kafka.admin import AdminClient

    return build_client(AdminClient, config, what=what)


def list_topics(client: Any, topic: str | None = None, *, timeout_s: float = 30.0,
                slice_s: float = METADATA_SLICE_S) -> Any:
    """``client.list_topics(topic, timeout=timeout_s)`` (an AdminClient's or a Consumer's) asked
    in calls of at most ``slice_s``: librdkafka holds the calling thread for a whole call, and
    Python runs no signal handler until it returns, so Ctrl-C waited out whole timeouts on a
    cluster that does not answer. The last error is raised once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.list_topics(topic, timeout=max(min(slice_s,
                                                             deadline - time.monotonic()), 0.01))
        except KafkaException as err:
            if time.monotonic() >= deadline or err.args[0].code() not in NOT_ANSWERING:
                raise


def flush_sliced(producer: Any, timeout_s: float, slice_s: float = FLUSH_SLICE_S, *,
                 give_up: Callable[[], bool] | None = None) -> int:
    """``producer.flush(timeout_s)`` in slices of ``slice_s``; the records still queued. Ends
    early once ``give_up()`` says so (checked after each slice that left records queued).

    Ctrl-C during a flush is run as Python code inside one of the producer's callbacks (the
    loader's stats_cb comes every 200 ms), where librdkafka holds it until that flush returns,
    and then lets it out as a SystemError. With the brokers gone (Ctrl-C stops those started in
    the same process group: nothing left to deliver to) one flush waited out its whole timeout,
    two minutes for a load. Between slices the interrupt comes out."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = producer.flush(max(min(slice_s, deadline - time.monotonic()), 0))
        if (not remaining or time.monotonic() >= deadline
                or (give_up is not None and give_up())):
            return remaining
