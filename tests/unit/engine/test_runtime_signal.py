"""``runtime.Signal``: waiting until engine state satisfies a condition wakes only when someone
notifies - the predicate is evaluated once per notification, never on a timer."""

from __future__ import annotations

import asyncio

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
