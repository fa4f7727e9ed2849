"""``StopSignals``: a Ctrl-C or SIGTERM the interpreter swallows is not lost, and Ctrl-C still
reaches asyncio.run as Python's own handler.

CI once saw `make demo`'s Ctrl-C land in an import's module-lock weakref callback: Python printed
"Exception ignored in ... _get_module_lock", the demo mirrored everything and exited 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import weakref

import pytest

from shallowmirror.cli import main as cli_main
from shallowmirror.cli.stop_signals import StopSignals, Terminated


@pytest.fixture
def stops():
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    hook = sys.unraisablehook
    installed = StopSignals.install()
    yield installed
    installed.restore()
    assert sys.unraisablehook is hook
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _signal_inside_weakref_callback(signum: int) -> None:
    """Deliver ``signum`` while Python runs a weakref callback, where a raised exception is
    handed to ``sys.unraisablehook`` and dropped."""

    class Thing:
        pass

    def callback(_ref) -> None:
        os.kill(os.getpid(), signum)
        for _ in range(10_000):   # the handler runs at one of these loop turns
            pass

    thing = Thing()
    ref = weakref.ref(thing, callback)
    del thing                     # the callback runs here, and its exception is dropped
    assert ref() is None


@pytest.mark.parametrize(("signum", "raised"), [
    (signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_a_swallowed_interrupt_is_raised_again_by_check(stops, signum, raised, capsys):
    _signal_inside_weakref_callback(signum)      # no exception escapes: the premise
    assert type(stops.swallowed) is raised
    assert "Exception ignored" not in capsys.readouterr().err
    with pytest.raises(raised) as info:
        stops.check()
    assert type(info.value) is raised


def test_check_is_silent_without_an_interrupt(stops):
    stops.check()
    assert stops.swallowed is None


def test_other_unraisable_errors_still_reach_the_previous_hook(stops, monkeypatch):
    seen = []
    monkeypatch.setattr(stops, "_previous_hook", seen.append)

    class Broken:
        def __del__(self):
            raise ValueError("from __del__")

    Broken()
    assert [type(u.exc_value) for u in seen] == [ValueError]
    assert stops.swallowed is None


def test_sigint_keeps_pythons_handler_so_asyncio_run_cancels_its_task(stops):
    """asyncio.run installs its Ctrl-C handler (cancel the main task) only over Python's own."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    cancelled = []

    async def main():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    assert cancelled == [True]


def test_sigterm_raises_terminated(stops):
    with pytest.raises(Terminated):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):
            pass


def test_a_handled_sigterm_is_left_alone():
    previous = signal.getsignal(signal.SIGTERM)

    def custom(_signum, _frame) -> None:
        pass

    try:
        signal.signal(signal.SIGTERM, custom)
        installed = StopSignals.install()
        assert signal.getsignal(signal.SIGTERM) is custom
        installed.restore()
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def cli_state():
    """What ``cli.main.main`` installs for the process's lifetime, put back after the test."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    hook = sys.unraisablehook
    yield
    sys.unraisablehook = hook
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _parser_running(func):
    parser = argparse.ArgumentParser()
    parser.set_defaults(func=func, command="try", log_level="WARNING")
    return parser


def test_the_cli_exits_130_for_an_interrupt_swallowed_during_its_command(
        cli_state, monkeypatch, capsys):
    def command(_args) -> int:
        _signal_inside_weakref_callback(signal.SIGINT)
        return 0                                   # would otherwise report success

    monkeypatch.setattr(cli_main, "build_parser", lambda: _parser_running(command))
    assert cli_main.main([]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "shallowmirror try: interrupted" and "Traceback" not in err


def test_ctrl_c_while_the_cli_loads_its_subcommands_is_no_traceback(
        cli_state, monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "build_parser", interrupted)
    assert cli_main.main([]) == 130
    assert capsys.readouterr().err.strip() == "shallowmirror: interrupted"
