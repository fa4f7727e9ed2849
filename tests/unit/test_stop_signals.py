"""``StopSignals``: a Ctrl-C or SIGTERM the interpreter swallows is not lost.

CI once saw `make demo`'s Ctrl-C land in an import's module-lock weakref callback: Python printed
"Exception ignored in ... _get_module_lock", the demo mirrored everything and exited 0.
"""

from __future__ import annotations

import os
import signal
import sys
import weakref

import pytest

from shallowmirror.cli.stop_signals import StopSignals, Terminated


@pytest.fixture
def stops():
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    installed = StopSignals.install()
    yield installed
    installed.restore()
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _signal_inside_weakref_callback(signum: int, swallowed: list) -> None:
    """Deliver ``signum`` while Python runs a weakref callback, where a raised exception is
    reported to ``sys.unraisablehook`` and dropped."""

    class Thing:
        pass

    def callback(_ref) -> None:
        os.kill(os.getpid(), signum)
        for _ in range(10_000):   # the handler runs at one of these loop turns
            pass

    thing = Thing()
    ref = weakref.ref(thing, callback)
    hook, sys.unraisablehook = sys.unraisablehook, swallowed.append
    try:
        del thing
    finally:
        sys.unraisablehook = hook
    assert ref() is None


@pytest.mark.parametrize(("signum", "raised"), [
    (signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_swallowed_signal_is_raised_again_by_check(stops, signum, raised):
    swallowed: list = []
    _signal_inside_weakref_callback(signum, swallowed)
    # The premise: the handler's exception really was dropped by the interpreter...
    assert [type(u.exc_value) for u in swallowed] == [raised]
    assert stops.received == signum
    # ...and check() raises it where the command can act on it.
    with pytest.raises(raised) as info:
        stops.check()
    assert type(info.value) is raised


def test_check_is_silent_without_a_signal(stops):
    stops.check()
    assert stops.received is None


def test_the_first_signal_is_the_one_remembered(stops):
    with pytest.raises(Terminated):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):
            pass
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):
            pass
    with pytest.raises(Terminated):
        stops.check()


def test_an_ignored_or_custom_handler_is_left_alone():
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def custom(_signum, _frame) -> None:
        pass

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a shell's background job
        signal.signal(signal.SIGTERM, custom)
        installed = StopSignals.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is custom
        installed.restore()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
