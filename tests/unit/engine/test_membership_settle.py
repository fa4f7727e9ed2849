"""A commit future cancelled by a shutting-down engine must not kill the membership thread."""

import concurrent.futures

import pytest

from shallowmirror.engine.membership import settle


def test_settle_ignores_a_cancelled_future():
    future: concurrent.futures.Future = concurrent.futures.Future()
    assert future.cancel()
    settle(future, None)                       # used to raise InvalidStateError
    settle(future, RuntimeError("late"))
    assert future.cancelled()


def test_settle_completes_a_pending_future():
    ok: concurrent.futures.Future = concurrent.futures.Future()
    settle(ok, None)
    assert ok.result(0) is None
    failed: concurrent.futures.Future = concurrent.futures.Future()
    settle(failed, RuntimeError("commit failed"))
    with pytest.raises(RuntimeError, match="commit failed"):
        failed.result(0)
