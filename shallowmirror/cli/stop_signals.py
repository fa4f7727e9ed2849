"""Ctrl-C and SIGTERM for the commands that stop by unwinding.

Both raise where the main thread is (SIGTERM as ``Terminated``, a ``KeyboardInterrupt``), so every
command cleans up the same way for ``kill`` as for Ctrl-C, and both are remembered, because an
exception raised there can be lost on its way:

- in a weakref callback or a ``__del__`` (an import's module-lock callback is one) the interpreter
  drops it: "Exception ignored in ...", and the command would carry on and exit 0;
- inside a confluent-kafka call it comes out as another error: ``SystemError: ... returned NULL
  without setting an exception`` from its log callback (confluent-kafka-python issue 1708),
  ``TypeError: expected header key to be unicode string`` from ``produce`` (seen by hand).

``check()`` raises a dropped interrupt again; ``received_interrupt()`` is the stop that an error
raised after a stop signal came stands for, whatever the error says. ``outcome`` is the exit
status and word every command ends such a stop with.

Around ``asyncio.run`` use ``python_sigint()``: asyncio installs its own Ctrl-C handler (cancel
the main task) only over Python's, and that is the better stop there.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be: every command then cleans up (brokers it started,
    temporary files, child processes) for ``kill`` and ``timeout`` as it does for Ctrl-C."""


class StopSignals:
    """One command run's SIGINT/SIGTERM handlers, and what they received."""

    def __init__(self) -> None:
        #: The first stop signal received, or None.
        self.received: int | None = None
        self._replaced: dict[int, Any] = {}
        self._previous_hook: Any = None

    @classmethod
    def install(cls) -> StopSignals:
        """Take over SIGINT and SIGTERM where they have Python's defaults: a shell's "ignore" (a
        background job's SIGINT) and a command's own graceful stop stay as they are."""
        stops = cls()
        for signum, default in ((signal.SIGINT, signal.default_int_handler),
                                (signal.SIGTERM, signal.SIG_DFL)):
            if signal.getsignal(signum) is default:
                stops._replaced[signum] = signal.signal(signum, stops._raise)
        stops._previous_hook = sys.unraisablehook
        sys.unraisablehook = stops._unraisable
        return stops

    def restore(self) -> None:
        """Put back what ``install`` replaced."""
        for signum, previous in self._replaced.items():
            signal.signal(signum, previous)
        self._replaced.clear()
        if self._previous_hook is not None and sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self._previous_hook
        self._previous_hook = None

    def check(self) -> None:
        """Raise the stop signal received, if any: a no-op unless it was lost on its way."""
        interrupt = self.received_interrupt()
        if interrupt is not None:
            raise interrupt

    def received_interrupt(self) -> KeyboardInterrupt | None:
        """The stop signal received so far, as its exception (None: none came). An error raised
        after one is that stop: the operator asked to stop, and what a library raises on the
        way out (often the interrupt in disguise) is not news."""
        return None if self.received is None else _exception(self.received)

    def _raise(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        raise _exception(signum)

    def _unraisable(self, unraisable: Any) -> None:
        interrupt = unraisable.exc_value
        if isinstance(interrupt, KeyboardInterrupt):
            # Raised again by check(), so no "Exception ignored" trace for the operator.
            if self.received is None:
                self.received = (signal.SIGTERM if isinstance(interrupt, Terminated)
                                 else signal.SIGINT)
            return
        self._previous_hook(unraisable)


@contextlib.contextmanager
def python_sigint() -> Iterator[None]:
    """Python's own SIGINT handler for the block (``asyncio.run`` then cancels its main task on
    Ctrl-C); whatever was installed before comes back after it."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN or previous is None:
        yield                # ignored (a background job) or not set from Python: leave it
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def outcome(interrupt: KeyboardInterrupt) -> tuple[int, str]:
    """(exit status, word) for a stop: 143 for SIGTERM (``kill``, ``timeout``), 130 for Ctrl-C."""
    if isinstance(interrupt, Terminated):
        return 143, "terminated (SIGTERM)"
    return 130, "interrupted"


def _exception(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
