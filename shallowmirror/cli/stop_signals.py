"""Ctrl-C and SIGTERM for the commands that stop by unwinding (every command but ``mirror`` and
``brokers``, which install graceful stops of their own).

Python turns a signal into an exception wherever the main thread happens to be. When that is a
weakref callback or a ``__del__`` (an import's module-lock callback is one), the interpreter prints
"Exception ignored in ..." and carries on: the Ctrl-C is lost, and the command would finish and
exit 0 as if it had never come. So the handler also remembers the signal, and ``check()`` raises it
again at the command's next step and before it reports success.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be: every command then cleans up (brokers it started,
    temporary files, child processes) for ``kill`` and ``timeout`` as it does for Ctrl-C."""


class StopSignals:
    """The SIGINT/SIGTERM handlers of one command run: raise, and remember what was received."""

    def __init__(self) -> None:
        #: The first stop signal received, or None.
        self.received: int | None = None
        self._replaced: dict[int, Any] = {}

    @classmethod
    def install(cls) -> StopSignals:
        """Take over SIGINT and SIGTERM where they still have Python's defaults. A shell's
        "ignore" (a background job's SIGINT) and a handler someone installed stay as they are."""
        stops = cls()
        for signum, default in ((signal.SIGINT, signal.default_int_handler),
                                (signal.SIGTERM, signal.SIG_DFL)):
            if signal.getsignal(signum) is default:
                stops._replaced[signum] = signal.signal(signum, stops._raise)
        return stops

    def restore(self) -> None:
        """Put back the handlers ``install`` replaced."""
        for signum, previous in self._replaced.items():
            signal.signal(signum, previous)
        self._replaced.clear()

    def check(self) -> None:
        """Raise the stop signal received, if any: a no-op unless one was swallowed on its way."""
        if self.received is not None:
            raise _exception(self.received)

    def _raise(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        raise _exception(signum)


def _exception(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
