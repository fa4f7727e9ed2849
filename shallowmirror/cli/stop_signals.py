"""Ctrl-C and SIGTERM for the commands that stop by unwinding (every command but ``mirror`` and
``brokers``, which install graceful stops of their own).

SIGTERM raises ``Terminated`` (a ``KeyboardInterrupt``) where Ctrl-C would raise, so every command
cleans up the same way for both. SIGINT keeps Python's own handler, so ``asyncio.run`` still turns
a Ctrl-C into the cancellation of its main task.

Python raises a signal's exception wherever the main thread happens to be. When that is a weakref
callback or a ``__del__`` (an import's module-lock callback is one), the interpreter prints
"Exception ignored in ..." and carries on: the Ctrl-C is lost, and the command would finish and
exit 0 as if it had never come. ``StopSignals`` catches that case through ``sys.unraisablehook``
and ``check()`` raises the interrupt again at the command's next step and before it reports
success.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be: every command then cleans up (brokers it started,
    temporary files, child processes) for ``kill`` and ``timeout`` as it does for Ctrl-C."""


class StopSignals:
    """One command run's SIGTERM handler and its watch for interrupts the interpreter dropped."""

    def __init__(self) -> None:
        #: An interrupt the interpreter swallowed (``KeyboardInterrupt`` or ``Terminated``).
        self.swallowed: KeyboardInterrupt | None = None
        self._replaced: dict[int, Any] = {}
        self._previous_hook: Any = None

    @classmethod
    def install(cls) -> StopSignals:
        """SIGTERM raises ``Terminated`` unless someone already handles it (commands with a
        graceful stop install theirs later and replace this one); swallowed interrupts are
        remembered from now on."""
        stops = cls()
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            stops._replaced[signal.SIGTERM] = signal.signal(signal.SIGTERM, _raise_terminated)
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
        """Raise the interrupt the interpreter swallowed, if any (else a no-op)."""
        if self.swallowed is not None:
            raise type(self.swallowed)()

    def _unraisable(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # Raised again by check(): no "Exception ignored" trace for the operator.
            if self.swallowed is None:
                self.swallowed = unraisable.exc_value
            return
        self._previous_hook(unraisable)


def _raise_terminated(_signum: int, _frame: FrameType | None) -> None:
    raise Terminated()
