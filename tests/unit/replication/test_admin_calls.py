"""The replication tools' admin-call policy (replication/admin_calls.py): which Kafka errors are
asked again, for how long, and how a failure reads. A SCRIPTED call stands in for the broker
here: a coordinator that answers NOT_COORDINATOR a given number of times cannot be made on
demand (a fresh Kafka cluster does it for a moment: tests/integration/test_group_sync.py)."""

from __future__ import annotations

import socket

import pytest
from confluent_kafka import KafkaError, KafkaException

from shallowmirror.replication.admin_calls import (
    CoordinatorBusy,
    failure_message,
    retry_coordinator,
)


class Scripted:
    """Raises the given errors in turn, then returns "done"; records the backoffs slept."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.slept: list[float] = []

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def _fail(message: str) -> Exception:
    return RuntimeError(message)


@pytest.mark.parametrize("code", [KafkaError.NOT_COORDINATOR,
                                  KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                  KafkaError.COORDINATOR_NOT_AVAILABLE])
def test_a_busy_coordinator_is_asked_again_with_a_doubling_backoff(code) -> None:
    call = Scripted(*(KafkaException(KafkaError(code)) for _ in range(3)),
                    CoordinatorBusy(KafkaError(code)))
    assert retry_coordinator(call, timeout_s=30, what="reading", fail=_fail,
                             sleep=call.slept.append) == "done"
    assert call.calls == 5
    assert call.slept == [0.1, 0.2, 0.4, 0.8]


def test_a_coordinator_busy_past_the_deadline_fails_saying_so() -> None:
    call = Scripted(*(KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS))
                      for _ in range(100)))
    with pytest.raises(RuntimeError) as raised:
        retry_coordinator(call, timeout_s=0.5, what="reading the offsets of group 'g'",
                          fail=_fail)
    message = str(raised.value)
    assert message.startswith("reading the offsets of group 'g' failed: the group coordinator "
                              "still answered COORDINATOR_LOAD_IN_PROGRESS after ")
    assert "attempts in 0.5s" in message
    assert 2 <= call.calls <= 5, call.calls      # 0.1 + 0.2 s of backoff fit in 0.5 s


def test_other_errors_are_not_retried() -> None:
    call = Scripted(KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)))
    with pytest.raises(KafkaException):
        retry_coordinator(call, timeout_s=30, what="reading", fail=_fail,
                          sleep=call.slept.append)
    unreachable = Scripted(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
    with pytest.raises(KafkaException):
        retry_coordinator(unreachable, timeout_s=30, what="reading", fail=_fail,
                          sleep=unreachable.slept.append)
    assert call.calls == unreachable.calls == 1


def test_failure_messages_name_the_cluster_and_an_unreachable_ones_address() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config = {"bootstrap.servers": f"127.0.0.1:{port}"}
    timed_out = KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed while waiting"))
    assert failure_message("A", config, "reading the offsets of group 'g'", timed_out, 30) == (
        f"cannot reach cluster A at 127.0.0.1:{port}: no answer within 30s while reading the "
        f"offsets of group 'g' (Failed while waiting; nothing listens at 127.0.0.1:{port}); is "
        "the cluster up and A.bootstrap.servers right?")
    refused = KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    assert failure_message("B", config, "describing group 'g'", refused, 30) == (
        "cluster B: describing group 'g' failed: GROUP_AUTHORIZATION_FAILED: "
        "Broker: Group authorization failed")
