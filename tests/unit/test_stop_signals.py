"""``StopSignals``: a Ctrl-C or SIGTERM lost on its way (dropped by the interpreter, or turned into
another error by a C extension) still stops the command; asyncio.run keeps its own Ctrl-C.

CI once saw `make demo`'s Ctrl-C land in an import's module-lock weakref callback: Python printed
"Exception ignored in ... _get_module_lock", the demo mirrored everything and exited 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from shallowmirror.cli import main as cli_main
from shallowmirror.cli.stop_signals import StopSignals, Terminated, python_sigint


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
    assert stops.received == signum
    assert "Exception ignored" not in capsys.readouterr().err
    with pytest.raises(raised) as info:
        stops.check()
    assert type(info.value) is raised


def test_check_is_silent_without_a_signal(stops):
    stops.check()
    assert stops.received is None


def test_the_first_signal_is_the_one_remembered(stops):
    for signum, raised in ((signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)):
        with pytest.raises(raised):
            os.kill(os.getpid(), signum)
            for _ in range(10_000):
                pass
    with pytest.raises(Terminated):
        stops.check()


def test_an_error_after_a_stop_signal_is_that_stop(stops):
    """confluent-kafka turns a Ctrl-C inside its calls into other errors (issue 1708): "SystemError:
    <built-in method poll of cimpl.Producer object> returned NULL without setting an exception",
    or produce's "TypeError: expected header key to be unicode string"."""
    assert stops.received_interrupt() is None            # no signal came: a real error
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):
            pass
    # Whatever the error, after the Ctrl-C it stands for that Ctrl-C.
    assert type(stops.received_interrupt()) is KeyboardInterrupt


def test_other_unraisable_errors_still_reach_the_previous_hook(stops, monkeypatch):
    seen = []
    monkeypatch.setattr(stops, "_previous_hook", seen.append)

    class Broken:
        def __del__(self):
            raise ValueError("from __del__")

    Broken()
    assert [type(u.exc_value) for u in seen] == [ValueError]
    assert stops.received is None


def test_python_sigint_lets_asyncio_run_cancel_its_main_task(stops):
    """asyncio.run installs its Ctrl-C handler (cancel the main task) only over Python's own."""
    assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    cancelled = []

    async def main():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    ours = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), python_sigint():
        asyncio.run(main())
    assert cancelled == [True]
    assert signal.getsignal(signal.SIGINT) == ours


def test_an_ignored_or_handled_signal_is_left_alone():
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def custom(_signum, _frame) -> None:
        pass

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a shell's background job
        signal.signal(signal.SIGTERM, custom)
        installed = StopSignals.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is custom
        with python_sigint():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        installed.restore()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@pytest.fixture
def cli_state():
    """A fresh process's handlers (an earlier test in this worker may have left others, as
    PySpark did); what ``cli.main.main`` installs for the process's lifetime is put back."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
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


def test_the_cli_says_interrupted_for_a_system_error_behind_a_ctrl_c(
        cli_state, monkeypatch, capsys):
    def command(_args) -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):
                pass
        except KeyboardInterrupt:
            pass                                   # as confluent-kafka loses it...
        raise SystemError("<built-in method flush of cimpl.Producer object at 0x7f> returned "
                          "NULL without setting an exception")   # ...and says this instead

    monkeypatch.setattr(cli_main, "build_parser", lambda: _parser_running(command))
    assert cli_main.main([]) == 130
    assert capsys.readouterr().err.strip() == "shallowmirror try: interrupted"


def test_ctrl_c_while_the_console_script_imports_the_cli_is_no_traceback():
    """The console script's module imports nothing heavy: an interrupt while the CLI's modules
    load (``logging``, ``argparse``, the commands: ~35 ms) is the usual one-line message."""
    script = (
        "import builtins, sys\n"
        "from shallowmirror.cli import entry\n"
        "assert 'shallowmirror.cli.main' not in sys.modules and 'logging' not in sys.modules\n"
        "real = builtins.__import__\n"
        "def interrupted(name, *args, **kwargs):\n"
        "    if name == 'shallowmirror.cli.main':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = interrupted\n"
        "sys.exit(entry.main())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stderr.strip()) == (130, "shallowmirror: interrupted")


def test_the_console_script_and_python_m_enter_through_the_light_module():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert 'shallowmirror = "shallowmirror.cli.entry:main"' in pyproject
    done = subprocess.run([sys.executable, "-m", "shallowmirror", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("shallowmirror ")
