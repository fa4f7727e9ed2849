"""``runtime.Signal``: waiting until engine state satisfies a condition wakes only when someone
notifies - the predicate is evaluated once per notification, never on a timer."""

from __future__ import annotations

import asyncio

import pytest

from shallowmirror.engine.runtime import Signal


def test_wait_until_wakes_on_notify_and_evaluates_only_then():
    async def main():
        signal = Signal()
        state = {"acked": 0}
        checks = []

        def done() -> bool:
            checks.append(state["acked"])
            return state["acked"] >= 3

        waiter = asyncio.ensure_future(signal.wait_until(done, timeout_s=30))
        await asyncio.sleep(0.2)                   # nothing notified: no re-evaluation
        assert checks == [0]
        for _ in range(3):
            state["acked"] += 1
            signal.notify()
            await asyncio.sleep(0)
        return await waiter, checks

    result, checks = asyncio.run(main())
    # One evaluation per wake-up at most (notifications close together may share one).
    assert result is True and checks[0] == 0 and checks[-1] == 3 and len(checks) <= 4


def test_wait_until_times_out_false_and_true_when_already_holding():
    async def main():
        signal = Signal()
        return (await signal.wait_until(lambda: False, timeout_s=0.05),
                await signal.wait_until(lambda: True, timeout_s=0))

    assert asyncio.run(main()) == (False, True)


def test_a_wait_cancelled_as_it_is_notified_is_cancelled():
    """``asyncio.wait_for`` (Python 3.11) dropped a cancellation that came on the loop turn the
    waiter was set: the cancelled waiter looked at its predicate, found it false, and waited
    again. A Ctrl-C of ``mirror(until_caught_up=True)`` then hung for ever in
    ``wait_caught_up(3600)``."""
    async def scenario() -> None:
        signal = Signal()
        waiting = asyncio.ensure_future(signal.wait_until(lambda: False, 3600))
        await asyncio.sleep(0)           # it waits on its waiter
        signal.notify()                  # the waiter is set ...
        waiting.cancel()                 # ... and the caller cancelled, on one turn
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, 5)

    asyncio.run(scenario())
