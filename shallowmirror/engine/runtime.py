"""What every part of a running engine shares: settings, the supervisor, the byte budget, the
backoff policy, whether the engine is stopping, and how an unreachable cluster is reported.

The core creates one ``Runtime`` and hands it to the source side (``source.Sources``) and the
sink side (``sink.Sinks``); neither of them sees the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from shallowmirror.engine.backoff import Backoff
from shallowmirror.engine.budget import ByteBudget
from shallowmirror.engine.startup import StartupTimeline
from shallowmirror.engine.supervisor import Supervisor
from shallowmirror.errors import ReconnectDeadlineError
from shallowmirror.net import AuthenticationFailedError
from shallowmirror.net.cluster import RETRY_WARNING_INTERVAL_S

log = logging.getLogger(__name__)

#: A cluster that stays unreachable is logged at most this often: the pace of the connection
#: layer's own retry warnings, so every "cannot reach" line of a run keeps one rhythm.
UNREACHABLE_LOG_INTERVAL_S = RETRY_WARNING_INTERVAL_S


class Signal:
    """Wakes every waiter each time ``notify`` is called: waiting until a condition over engine
    state holds (``wait_until``) without polling. Whoever changes that state notifies."""

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future] = set()

    def notify(self) -> None:
        if not self._waiters:            # the usual case: called a few times per request
            return
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def wait_until(self, predicate: Callable[[], bool],
                         timeout_s: float | None = None) -> bool:
        """Wait until ``predicate()`` holds (True) or ``timeout_s`` passes (False)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not predicate():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.add(waiter)
            try:
                # Not ``wait_for``: on Python 3.11 it drops a cancellation that comes as the
                # waiter is set (a notify on the same turn), and a cancelled caller then waited
                # on, a Ctrl-C of ``mirror(until_caught_up=True)`` hanging for ever.
                await asyncio.wait((waiter,), timeout=left)
            finally:
                self._waiters.discard(waiter)
        return True


class Runtime:
    """Services shared by the core, the sources and the sinks of one engine."""

    def __init__(self, settings: Mapping[str, Any], *,
                 fail: Callable[[BaseException], None]) -> None:
        self.settings = settings
        #: Ends the engine's ``run`` with an error (first one wins; callable from any thread).
        self.fail = fail
        self.supervisor = Supervisor(fail, self.backoff)
        self.budget = ByteBudget(settings["buffer.memory"])
        #: Set once shutdown begins: fetch loops stop, nothing new is started.
        self.stopping = False
        #: The engine's event loop, once it runs (``wake_soon`` needs it from other threads).
        self.loop: asyncio.AbstractEventLoop | None = None
        #: Notified whenever batches are acknowledged, fail or are abandoned, a request ends, a
        #: fetch reports a high watermark, or the engine fails: what waits on progress waits on it.
        self.progress = Signal()
        #: Where the start-up time goes (reset when ``run`` begins; see engine.startup).
        self.startup = StartupTimeline()
        self._unreachable_logged: dict[str, float] = {}

    def wake_soon(self, event: asyncio.Event | Signal | None) -> None:
        """Set ``event`` (notify a ``Signal``) from the engine's loop or from any other thread
        (no-op before run)."""
        loop = self.loop
        if event is None or loop is None or loop.is_closed():
            return
        if isinstance(event, Signal):
            with contextlib.suppress(RuntimeError):     # loop closing
                loop.call_soon_threadsafe(event.notify)
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            with contextlib.suppress(RuntimeError):     # loop closing
                loop.call_soon_threadsafe(event.set)

    def backoff(self) -> Backoff:
        """A fresh backoff between ``retry.backoff.ms`` and ``retry.backoff.max.ms``."""
        return Backoff(self.settings["retry.backoff.ms"], self.settings["retry.backoff.max.ms"])

    def backoff_s(self, attempts: int) -> float:
        """The delay before retry number ``attempts`` (1 = the first retry)."""
        b = self.backoff()
        b.attempts = max(0, attempts - 1)
        return b.next_s()

    def note_unreachable(self, alias: str, err: BaseException) -> None:
        """A connection to cluster ``alias`` failed: log it now and then, and fail the engine on
        an authentication failure (retrying a wrong password only locks the account) or once a
        broker stayed unreachable for ``reconnect.deadline.ms`` (mid-run, the engine retried
        for ever after saying it gave up, and ``abort.on.send.failure`` never applied)."""
        if isinstance(err, ReconnectDeadlineError):
            self.fail(err)
            return
        now = time.monotonic()
        if now - self._unreachable_logged.get(alias, 0) > UNREACHABLE_LOG_INTERVAL_S:
            self._unreachable_logged[alias] = now
            log.warning("cluster %s unreachable or connection lost (%s); retrying with backoff",
                        alias, err)
        if isinstance(err, AuthenticationFailedError):
            self.fail(err)
