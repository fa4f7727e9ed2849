"""Stop signals during a bench: noted, so that a run an interrupt cut short is never a result.

Ctrl-C reaches the whole process group, and the embedded brokers are in it: they die with the
harness's interrupt. The run in flight then fails for want of brokers, a moment before or after
the ``KeyboardInterrupt`` reaches the harness's own frames, and the interrupt itself can be lost
on its way (raised inside a confluent-kafka callback it comes out as another error, see
``shallowmirror.cli.stop_signals``). A failed run recorded then would be the interrupt, not a
measurement.

``StopSignalLog`` wraps the Python handlers of SIGINT and SIGTERM for the length of a bench and
notes every signal before passing it on; ``check()`` raises the interrupt again if one came,
whatever became of its exception. Signals ignored or left to the system (a background job's
SIGINT, SIGTERM outside the ``shallowmirror`` command) are left as they are.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class BenchmarkFailed(RuntimeError):
    """A benchmark could not measure what it was asked to (the mirror under test did not start,
    exited early, never caught up): ``run_script`` ends with its message and status 1, not a
    traceback, since the cause is the setting or the cluster named, not the script."""


class StopSignalLog:
    """A context manager; ``received`` is the first stop signal seen inside it (or None)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignalLog:
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may set handlers (and only it runs them)
        for signum in _SIGNALS:
            previous = signal.getsignal(signum)
            if callable(previous):
                self._previous[signum] = previous
                signal.signal(signum, self._note)
        return self

    def __exit__(self, _type: type[BaseException] | None, _value: BaseException | None,
                 _tb: TracebackType | None) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        self._previous[signum](signum, frame)

    def interrupt(self) -> KeyboardInterrupt | None:
        """The stop received, as the exception the command ends with (None: none came)."""
        if self.received is None:
            return None
        from shallowmirror.cli.stop_signals import Terminated

        return Terminated() if self.received == signal.SIGTERM else KeyboardInterrupt()

    def check(self) -> None:
        """Raise the stop received, if any."""
        interrupt = self.interrupt()
        if interrupt is not None:
            raise interrupt


def run_script(main: Callable[[], int | None]) -> int:
    """Run a benchmark script's ``main`` with SIGTERM (``kill``, ``timeout``) unwinding it as
    Ctrl-C does, so the clusters and children it started are stopped by the code that started
    them: with Python's default a SIGTERM ended the script at once and left its Kafka JVMs
    running. A stop ends with one line and 143 (SIGTERM) or 130 (Ctrl-C), not a traceback."""
    from shallowmirror.cli.stop_signals import StopSignals, outcome

    stops = StopSignals.install()
    try:
        return main() or 0
    except BenchmarkFailed as failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupt:
        status, word = outcome(stops.received_interrupt() or interrupt)
        print(word, file=sys.stderr)
        return status
    finally:
        stops.restore()
