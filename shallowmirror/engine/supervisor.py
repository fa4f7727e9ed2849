"""Supervision of every task the engine starts: no task dies silently.

Three kinds of work, one rule each:
- **loops** (a source's fetch loop, a sink's produce loop, topic discovery, offset commits,
  metrics): a *transient* error (a connection lost, a retriable broker error, a timeout) ends the
  attempt; the loop is logged and started again after a backoff. Any other error fails the engine.
- **one-shot tasks** (an in-flight Produce request, a partition relocation, an offset reset, a
  producer-identity reset): the task handles what it can retry itself; anything that escapes it
  fails the engine.
- **threads** (the membership consumer) report an error that ended them through
  ``thread_failed``, from their own thread.
- **callbacks** (a Produce request sent on an open connection is answered in its response
  future's done callback, no task) report what no retry fixes through ``work_failed``.

A failure reaches ``on_fatal`` once per task as an ``EngineTaskError`` that names the task and
where it ran (cluster, topic, partition), chained to the original error (``__cause__``), which
``.error`` also holds; a ``HookError`` (an embedder's hook callback raised) or
``TopicMapperError`` (its topic mapper returned no legal name) reaches it as it is, since it
names the embedder's code and the work it interrupted is not what failed. Tasks
still running when the engine stops are cancelled by ``cancel_all``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from shallowmirror.engine.backoff import Backoff
from shallowmirror.engine.hooks import HookError
from shallowmirror.engine.topic_names import TopicMapperError
from shallowmirror.errors import (
    BrokerError,
    ConnectionFailedError,
    LocatedError,
    ShallowMirrorError,
    Where,
    broker_error_info,
)

log = logging.getLogger(__name__)

#: Errors of the embedder's own code (a hook callback, a topic mapper): they name that code, and
#: the engine's work they interrupted is not what failed, so they end the run as they are.
EMBEDDER_ERRORS = (HookError, TopicMapperError)

Describe = str | Callable[[], str]


class EngineTaskError(LocatedError):
    """An engine task (or thread) ended with an error no retry can fix."""

    def __init__(self, what: str, error: BaseException, where: Where | None = None) -> None:
        self.what = what
        self.error = error
        super().__init__(f"{what} failed: {type(error).__name__}: {error}", where)


def is_transient(err: BaseException) -> bool:
    """Whether retrying the same work later can succeed (Kafka's ``retriable`` flag)."""
    if isinstance(err, ConnectionFailedError | TimeoutError):
        return True
    return isinstance(err, BrokerError) and (
        err.retriable or broker_error_info(err.code).invalid_metadata)


def where_of(cluster: str, partitions: Iterable[tuple[str, int]]) -> Where:
    """The location of work on ``partitions`` of ``cluster``: topic and partition when it is one."""
    tps = list(partitions)
    if len(tps) == 1:
        return Where(cluster=cluster, topic=tps[0][0], partition=tps[0][1])
    return Where(cluster=cluster)


def partitions_text(partitions: Iterable[tuple[str, int]], limit: int = 10) -> str:
    """``t-0, t-1, ... (+n more)`` for messages."""
    tps = sorted(partitions)
    text = ", ".join(f"{t}-{p}" for t, p in tps[:limit])
    return text + (f" (+{len(tps) - limit} more)" if len(tps) > limit else "") or "none"


class Supervisor:
    """Starts the engine's tasks and turns their failures into one fatal engine error."""

    def __init__(self, on_fatal: Callable[[BaseException], None],
                 backoff: Callable[[], Backoff]) -> None:
        self._on_fatal = on_fatal
        self._backoff = backoff
        self._tasks: set[asyncio.Task] = set()
        self.restarts = 0

    def spawn(self, coro: Awaitable[Any], *, what: Describe,
              where: Where | Callable[[], Where] | None = None) -> asyncio.Task:
        """Run a one-shot task; an exception escaping it fails the engine."""
        return self._track(asyncio.ensure_future(coro), what, where)

    def spawn_loop(self, make: Callable[[], Awaitable[None]], *, what: Describe,
                   where: Where | Callable[[], Where] | None = None) -> asyncio.Task:
        """Run a loop; restart it after a backoff on a transient error, fail the engine
        otherwise. ``make()`` starts one attempt; returning ends the loop."""
        return self._track(asyncio.ensure_future(self._restarting(make, what, where)), what,
                           where)

    def work_failed(self, err: BaseException, *, what: Describe,
                    where: Where | Callable[[], Where] | None = None) -> None:
        """Work that runs in no task of its own (a future's done callback) ended with ``err``,
        which no retry fixes: fail the engine exactly as that work failing in a ``spawn``-ed
        task would (asyncio only logs what escapes a callback, so it must come here)."""
        if self._embedder_failed(err):
            return
        if not isinstance(err, EngineTaskError):
            cause = err
            err = EngineTaskError(_text(what), cause, _where(where))
            err.__cause__ = cause
        log.error("%s", err, exc_info=_traceback_for(err.__cause__ or err))
        self._on_fatal(err)

    def thread_failed(self, err: BaseException, *, what: str, where: Where | None = None) -> None:
        """A supervised thread ended with ``err`` (callable from any thread)."""
        if self._embedder_failed(err):
            return
        log.error("%s failed: %s", what, err, exc_info=_traceback_for(err))
        self._on_fatal(EngineTaskError(what, err, where))

    def _embedder_failed(self, err: BaseException) -> bool:
        """The embedder's own code failed (``EMBEDDER_ERRORS``): fail the engine with its error
        as it is (it names that code; the work it interrupted, "produce request to ...", is not
        what failed), logged with its cause's traceback, the embedder's code. False otherwise."""
        if not isinstance(err, EMBEDDER_ERRORS):
            return False
        log.error("%s", err, exc_info=err.__cause__)
        self._on_fatal(err)
        return True

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait for them to end."""
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.difference_update(tasks)

    @property
    def running(self) -> int:
        return len(self._tasks)

    # ---- internals ----
    async def _restarting(self, make: Callable[[], Awaitable[None]], what: Describe,
                          where: Where | Callable[[], Where] | None) -> None:
        backoff = self._backoff()
        while True:
            started = time.monotonic()
            try:
                await make()
                return
            except Exception as err:
                if not is_transient(err):
                    raise
                if time.monotonic() - started > backoff.max_ms / 1000:
                    backoff.reset()         # it ran well for a while: start the backoff over
                delay = backoff.next_s()
                self.restarts += 1
                log.warning("%s (%s) stopped on a transient error, restarted in %.1fs: %s",
                            _text(what), _where(where), delay, err)
                await asyncio.sleep(delay)

    def _track(self, task: asyncio.Task, what: Describe,
               where: Where | Callable[[], Where] | None) -> asyncio.Task:
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                return
            err = t.exception()
            if err is not None:
                self.work_failed(err, what=what, where=where)

        task.add_done_callback(done)
        return task


def _text(what: Describe) -> str:
    return what() if callable(what) else what


def _where(where: Where | Callable[[], Where] | None) -> Where | None:
    return where() if callable(where) else where


def _traceback_for(err: BaseException) -> BaseException | None:
    """A traceback only for what is a bug: the project's own errors (a refused setting, a broker
    error, corrupt data) already name what went wrong and where, and an operator reads them."""
    return None if isinstance(err, ShallowMirrorError) else err
