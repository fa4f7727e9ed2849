"""librdkafka's own log lines, through Python logging instead of raw ``%3|...|FAIL|`` on stderr.

librdkafka writes every failed connection attempt to stderr (about 16 lines a second for one
unreachable broker), whatever ``--log-level`` says. Every confluent-kafka client shallowmirror
builds gets ``log_config()``: its lines go to the ``librdkafka`` logger at DEBUG, and librdkafka
produces them only when that logger would show them. What they say that a user must know
(a cluster that cannot be reached, a request that failed) shallowmirror reports itself, once,
naming the cluster and address.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError

LOGGER_NAME = "librdkafka"
#: A connection attempt that failed (transport, name resolution).
_CANNOT_CONNECT = frozenset({KafkaError._TRANSPORT, KafkaError._RESOLVE})
#: What an outage of the whole cluster repeats: said once per outage.
_OUTAGE_CODES = _CANNOT_CONNECT | {KafkaError._ALL_BROKERS_DOWN}
_log = logging.getLogger(LOGGER_NAME)


class _DebugLogger:
    """What confluent-kafka's ``logger`` config needs (``.log(level, fmt, *args)``): every
    librdkafka line, whatever its syslog level, at DEBUG."""

    def log(self, _level: int, msg: str, *args: Any) -> None:
        _log.debug(msg, *args)


def log_config() -> dict[str, Any]:
    """Client config keys that route librdkafka's logs through Python logging."""
    if _log.isEnabledFor(logging.DEBUG):
        return {"logger": _DebugLogger(), "log_level": 7}
    # Below DEBUG nobody reads them: librdkafka does not even format them (0 = emergencies).
    return {"logger": _DebugLogger(), "log_level": 0}


def with_log_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` plus ``log_config()``, unless the caller set its own logger."""
    out = dict(config)
    if "logger" not in out:
        out.update(log_config())
    return out


class ClientErrors:
    """A librdkafka client's ``error_cb``: its client-level errors (a broker down or refusing
    connections, all brokers down, authentication) as warnings naming the client. librdkafka
    reports a lost broker on every reconnect attempt (about every 100 ms), so each kind of error
    is a warning at most once per ``interval_s`` and a debug line otherwise; while every
    broker is down, a connection error is a warning once per outage. ``last_error``:
    the latest text."""

    def __init__(self, logger: logging.Logger, client: str, interval_s: float, *,
                 level: int = logging.WARNING) -> None:
        self._logger = logger
        self.client = client
        self._interval_s = interval_s
        #: The level of the errors' lines and of "reachable again" (``logging.DEBUG``: a client
        #: whose cluster another part already reports on only follows the outage).
        self._level = level
        #: Error code -> ``time.monotonic()`` of its last warning.
        self._warned_at: dict[Any, float] = {}
        self.last_error: str | None = None
        #: Since when (``time.monotonic()``) every broker has been down, and the latest error
        #: that said so or came while it lasted (``down_for_s``).
        self._down_since: float | None = None
        self._down_seen: float = 0.0
        #: The connection-kind errors already warned about in the current outage.
        self._said_in_outage: set[Any] = set()

    def __call__(self, err: Any) -> None:
        text = err.str() if hasattr(err, "str") else str(err)
        self.last_error = text
        code = err.code() if hasattr(err, "code") else None
        now = time.monotonic()
        if code == KafkaError._ALL_BROKERS_DOWN:
            if self._down_since is None:
                self._down_since = now
            self._down_seen = now
        elif self._down_since is not None and code in _CANNOT_CONNECT:
            self._down_seen = now
        if self._down_since is not None and code in _OUTAGE_CODES:
            # While every broker is down, librdkafka repeats these at each reconnect attempt;
            # the outage was said once (and the status line and the cluster's own retry line
            # keep saying it): the repeats are debug until the cluster answers again.
            if code in self._said_in_outage:
                self._logger.debug("%s: %s", self.client, text)
                return
            self._said_in_outage.add(code)
        elif now - self._warned_at.get(code, -self._interval_s) < self._interval_s:
            self._logger.debug("%s: %s", self.client, text)
            return
        self._warned_at[code] = now
        self._logger.log(self._level, "%s: %s", self.client, text)

    def reached(self) -> None:
        """The client has just had an answer from its cluster (a group assignment, a commit, a
        delivery acknowledged): its brokers are no longer all down. Only answers received after
        the outage began may say so, never records fetched before it and still queued."""
        since = self._down_since
        if since is not None:
            self._down_since = None
            self._said_in_outage.clear()
            self._logger.log(min(logging.INFO, self._level), "%s: reachable again after %.1f s",
                             self.client, time.monotonic() - since)

    def down_for_s(self, quiet_s: float = 15.0) -> float | None:
        """Seconds every broker of the client's cluster has been down, or None when it is not
        known to be. librdkafka says when all brokers go down, but not when one comes back:
        the caller says so with ``reached`` when an answer proves it. Without one, while the
        brokers are down every reconnect attempt fails with an error (at least every
        ``reconnect.backoff.max.ms``, 10 s by default), so ``quiet_s`` without one ends it."""
        if self._down_since is None:
            return None
        now = time.monotonic()
        if now - self._down_seen > quiet_s:
            self._down_since = None
            self._said_in_outage.clear()
            return None
        return now - self._down_since
