"""Admin calls of the replication tools (groups, internal topics) to one cluster: how a failure is
worded for an operator, and the retry of a group coordinator that is loading or moving.

A failed call names the cluster alias; when the cluster could not be reached at all it also
names the address tried (``bootstrap.servers``) and how long it waited, instead of librdkafka's
``KafkaError{code=_TIMED_OUT,...}`` text. A fresh Kafka cluster answers group requests with
COORDINATOR_NOT_AVAILABLE / COORDINATOR_LOAD_IN_PROGRESS / NOT_COORDINATOR for seconds while it
creates and loads ``__consumer_offsets``; ``retry_coordinator`` asks again with a doubling
backoff until the caller's deadline, then fails saying so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from shallowmirror.net.probe import listener_hint

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A group coordinator still being created, loading, or moved to another broker.
COORDINATOR_CODES = frozenset({KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                               KafkaError.COORDINATOR_NOT_AVAILABLE,
                               KafkaError.NOT_COORDINATOR})
#: librdkafka's local codes for "no broker of this cluster answered".
UNREACHABLE_CODES = frozenset({KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                               KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE})
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0


def kafka_error(err: BaseException | KafkaError | None) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` carries (or ``err`` itself)."""
    if isinstance(err, KafkaError):
        return err
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        return err.args[0]
    return None


def coordinator_busy(err: BaseException | KafkaError | None) -> bool:
    """True for the answers of a group coordinator that is loading or moving."""
    error = kafka_error(err)
    return error is not None and error.code() in COORDINATOR_CODES


def transient(err: BaseException | KafkaError | None) -> bool:
    """Worth asking again at once: a busy coordinator or an error Kafka flags retriable (not an
    unreachable cluster: each attempt would wait its whole timeout again)."""
    error = kafka_error(err)
    return error is not None and (error.code() in COORDINATOR_CODES
                                  or (error.retriable() and error.code() not in UNREACHABLE_CODES))


def unreachable(err: BaseException | KafkaError | None) -> bool:
    """True when no broker of the cluster answered (refused, timed out, unresolvable)."""
    error = kafka_error(err)
    return error is not None and error.code() in UNREACHABLE_CODES


def describe(err: BaseException | KafkaError) -> str:
    """``NAME: text`` of a Kafka error (not librdkafka's repr); ``str(err)`` otherwise."""
    error = kafka_error(err)
    return f"{error.name()}: {error.str()}" if error is not None else str(err)


def failure_message(alias: str, config: Mapping[str, Any], what: str,
                    err: BaseException | KafkaError, timeout_s: float) -> str:
    """One line for an operator: which cluster, and for an unreachable one which address."""
    if unreachable(err):
        address = config.get("bootstrap.servers", "?")
        error = kafka_error(err)
        assert error is not None
        # What answers there, if anything (librdkafka's error says the same for all of it).
        hint = listener_hint(str(address),
                             str(config.get("security.protocol", "PLAINTEXT")).upper())
        return (f"cannot reach cluster {alias} at {address}: no answer within {timeout_s:g}s "
                f"while {what} ({error.str()}{'; ' + hint if hint else ''}); is the cluster up "
                f"and {alias}.bootstrap.servers right?")
    return f"cluster {alias}: {what} failed: {describe(err)}"


class CoordinatorBusy(Exception):
    """Raised by a call whose answer carried ``transient`` per-partition errors: ask again."""

    def __init__(self, error: KafkaError):
        super().__init__(error)
        self.error = error


def retry_coordinator(call: Callable[[], T], *, timeout_s: float, what: str,
                      fail: Callable[[str], Exception],
                      sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, asked again with a doubling backoff (0.1 s up to 2 s) while the group
    coordinator is busy (a ``KafkaException`` with one of ``COORDINATOR_CODES`` or another
    ``transient`` error, or ``CoordinatorBusy``), for at most ``timeout_s``; then
    ``fail(message)`` is raised, saying how long it tried. Other errors propagate at once."""
    deadline = time.monotonic() + timeout_s
    delay = FIRST_BACKOFF_S
    attempts = 0
    while True:
        attempts += 1
        try:
            return call()
        except (KafkaException, CoordinatorBusy) as err:
            error = err.error if isinstance(err, CoordinatorBusy) else kafka_error(err)
            if not transient(error):
                raise
            assert error is not None
            if time.monotonic() + delay > deadline:
                busy = ("the group coordinator still answered" if coordinator_busy(error)
                        else "the cluster still answered")
                raise fail(f"{what} failed: {busy} {error.name()} after {attempts} attempts "
                           f"in {timeout_s:g}s (a cluster just started, or a coordinator "
                           f"moving); try again later") from err
            log.debug("%s: %s; asking again in %.1fs", what, error.name(), delay)
            sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
