"""The supervisor's rules on plain asyncio tasks (no broker needed: it only sees exceptions).
What each engine task does under it is tested against real brokers in
tests/integration/test_engine_supervision.py."""

from __future__ import annotations

import asyncio
import threading

import pytest

from shallowmirror.engine.backoff import Backoff
from shallowmirror.engine.supervisor import EngineTaskError, Supervisor, is_transient
from shallowmirror.errors import BrokerError, ConnectionFailedError, Where

UNSUPPORTED_VERSION = 35
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7


def _supervisor(fatal: list[BaseException]) -> Supervisor:
    return Supervisor(fatal.append, lambda: Backoff(1, 5))


def test_transient_errors_are_the_retriable_ones():
    assert is_transient(ConnectionFailedError("gone"))
    assert is_transient(BrokerError(REQUEST_TIMED_OUT))
    assert is_transient(BrokerError(NOT_LEADER_OR_FOLLOWER))
    assert is_transient(TimeoutError())
    assert not is_transient(BrokerError(UNSUPPORTED_VERSION))
    assert not is_transient(RuntimeError("bug"))


def test_a_loop_is_restarted_after_transient_errors_and_may_end_normally():
    async def main():
        fatal: list[BaseException] = []
        sup = _supervisor(fatal)
        attempts = []

        async def loop() -> None:
            attempts.append(1)
            if len(attempts) < 3:
                raise BrokerError(REQUEST_TIMED_OUT, Where(cluster="a"))

        task = sup.spawn_loop(loop, what="test loop")
        await asyncio.wait({task})
        return fatal, attempts, sup

    fatal, attempts, sup = asyncio.run(main())
    assert len(attempts) == 3 and sup.restarts == 2 and fatal == [] and sup.running == 0


def test_a_loop_failing_for_good_fails_the_engine_naming_task_and_place():
    async def main():
        fatal: list[BaseException] = []
        sup = _supervisor(fatal)

        async def loop() -> None:
            raise BrokerError(UNSUPPORTED_VERSION, Where(cluster="src"), "in a Fetch response")

        task = sup.spawn_loop(loop, what=lambda: "fetch loop of source broker 1 (partitions t-0)",
                              where=lambda: Where(cluster="src", topic="t", partition=0))
        await asyncio.wait({task})
        return fatal

    (err,) = asyncio.run(main())
    assert isinstance(err, EngineTaskError)
    assert isinstance(err.__cause__, BrokerError) and err.error is err.__cause__
    text = str(err)
    assert "fetch loop of source broker 1" in text and "UNSUPPORTED_VERSION" in text
    assert "cluster src" in text and "topic-partition t-0" in text


def test_a_one_shot_task_is_not_restarted_even_on_a_transient_error():
    async def main():
        fatal: list[BaseException] = []
        sup = _supervisor(fatal)
        runs = []

        async def once() -> None:
            runs.append(1)
            raise ConnectionFailedError("gone")

        await asyncio.wait({sup.spawn(once(), what="produce request")})
        return fatal, runs

    fatal, runs = asyncio.run(main())
    assert runs == [1] and len(fatal) == 1 and "produce request failed" in str(fatal[0])


def test_cancel_all_ends_every_task_without_a_fatal_error():
    async def main():
        fatal: list[BaseException] = []
        sup = _supervisor(fatal)
        forever = asyncio.Event()
        sup.spawn(forever.wait(), what="waits")
        sup.spawn_loop(forever.wait, what="loop")
        await asyncio.sleep(0)
        assert sup.running == 2
        await sup.cancel_all()
        return fatal, sup.running

    assert asyncio.run(main()) == ([], 0)


def test_a_thread_reports_its_failure_from_its_own_thread():
    fatal: list[BaseException] = []
    sup = _supervisor(fatal)

    def body() -> None:
        try:
            raise RuntimeError("consumer gone")
        except RuntimeError as err:
            sup.thread_failed(err, what="membership thread of group g",
                              where=Where(cluster="src"))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    (err,) = fatal
    assert "membership thread of group g failed: RuntimeError: consumer gone" in str(err)
    assert "cluster src" in str(err)


@pytest.mark.parametrize("error", [RuntimeError("bug"), BrokerError(UNSUPPORTED_VERSION)])
def test_a_failure_is_reported_once(error):
    async def main():
        fatal: list[BaseException] = []
        sup = _supervisor(fatal)

        async def once() -> None:
            raise error

        await asyncio.wait({sup.spawn(once(), what="x")})
        await asyncio.sleep(0)
        return fatal

    assert len(asyncio.run(main())) == 1


def test_work_outside_a_task_fails_the_engine_as_a_failing_task_would():
    # A Produce response is applied in a future's done callback, in no task: what it cannot
    # handle comes to work_failed and must read exactly as if a spawned task had raised it.
    def run(report) -> BaseException:
        async def main():
            fatal: list[BaseException] = []
            await report(_supervisor(fatal))
            return fatal

        (err,) = asyncio.run(main())
        return err

    cause = BrokerError(UNSUPPORTED_VERSION, Where(cluster="tgt"), "in a Produce response")
    what = lambda: "produce request to target broker 1 (partitions t-0)"  # noqa: E731
    where = lambda: Where(cluster="tgt", topic="t", partition=0)  # noqa: E731

    async def in_a_callback(sup: Supervisor) -> None:
        future = asyncio.get_running_loop().create_future()

        def callback(_f: asyncio.Future) -> None:
            sup.work_failed(cause, what=what, where=where)

        future.add_done_callback(callback)
        future.set_result(None)
        await asyncio.sleep(0)

    async def in_a_task(sup: Supervisor) -> None:
        async def fails() -> None:
            raise cause

        await asyncio.wait({sup.spawn(fails(), what=what, where=where)})

    from_callback, from_task = run(in_a_callback), run(in_a_task)
    assert isinstance(from_callback, EngineTaskError) and from_callback.error is cause
    assert from_callback.__cause__ is cause
    assert str(from_callback) == str(from_task)
    assert "produce request to target broker 1" in str(from_callback)
    assert "topic-partition t-0" in str(from_callback)
    already = EngineTaskError("x", cause)
    assert run(lambda sup: _report_async(sup, already)) is already    # not wrapped twice


async def _report_async(sup: Supervisor, err: BaseException) -> None:
    sup.work_failed(err, what="y")


def test_a_hook_error_fails_the_engine_as_it_is():
    """A hook callback that raised was wrapped in an EngineTaskError blaming the work it
    interrupted (a produce request); the HookError names the hook and callback itself."""
    from shallowmirror.engine.hooks import HookError

    cause = ValueError("store down")
    hook_error = HookError("batch acknowledged hook 'mine' failed: ValueError: store down")
    hook_error.__cause__ = cause
    fatal: list[BaseException] = []
    sup = Supervisor(fatal.append, lambda: None)
    sup.work_failed(hook_error, what="produce request to target broker 1")
    sup.thread_failed(hook_error, what="membership")
    assert fatal == [hook_error, hook_error]
