"""The low-level embedded API: a program iterates fetched batches and decides, per batch, where it
goes (``forward``) or that it goes nowhere (``drop``).

Every fetched batch must be forwarded or dropped: the committed source position only moves past
a batch once it is acknowledged by the target or dropped, and the byte budget only frees its
fetch frame then (a program that keeps batches stalls fetching — that is the back-pressure).
Each batch is decided once: a second ``forward``/``drop`` of it, a partition that is not an
``int`` >= 0 or a topic that is not a legal name raise ``ValueError``/``TypeError`` at the call,
never inside the engine. A start cancelled or interrupted stops everything it started.
``forward`` returns an awaitable resolving to the target base offset and takes an optional
callback ``fn(batch, target_base_offset, error)``; plain (non-asyncio) code uses
``SyncBatchForwarder``, which runs a ``BatchForwarder`` on a private event loop in a background
thread and gives back ``concurrent.futures.Future`` results.

Example (asyncio)::

    async with BatchForwarder(src_cfg, dst_cfg, topics=["orders"]) as fwd:
        async for batch in fwd:
            if batch.topic == "orders":
                fwd.forward(batch, "orders-copy", batch.partition)
            else:
                fwd.drop(batch)

Example (plain code)::

    with SyncBatchForwarder(src_cfg, dst_cfg, topics=["orders"]) as fwd:
        while (batch := fwd.next_batch(timeout_s=2.0)) is not None:
            fwd.forward(batch, "orders-copy", batch.partition, on_ack=print)
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from shallowmirror.engine.arguments import check_engine_arguments, check_seconds
from shallowmirror.engine.batch import EngineStats, FetchedBatch
from shallowmirror.engine.core import ClusterFactory, EngineCore, MembershipFactory
from shallowmirror.engine.discovery import TopicsSpec
from shallowmirror.engine.metrics import MetricsSink
from shallowmirror.engine.offsets import OffsetMap
from shallowmirror.engine.topic_names import legal_topic

log = logging.getLogger(__name__)

T = TypeVar("T")

AckCallback = Callable[[FetchedBatch, "int | None", "BaseException | None"], None]

#: How long closing waits for the forwarder thread's last tasks to end once cancelled.
_CANCEL_WAIT_S = 10.0


def check_destination(batch: object, topic: object, partition: object,
                      callback: object = None) -> None:
    """``TypeError``/``ValueError`` at the call for a forward the engine cannot carry out: not a
    batch, a topic that is not a legal name, a partition that is not an int >= 0."""
    if not isinstance(batch, FetchedBatch):
        raise TypeError(f"forward(): expected a FetchedBatch handed out by the forwarder, not "
                        f"{type(batch).__name__} {batch!r}")
    if not isinstance(topic, str):
        raise TypeError(f"forward(): the target topic must be a str, not "
                        f"{type(topic).__name__} {topic!r}")
    if not legal_topic(topic):
        raise ValueError(f"forward(): {topic!r} is not a legal Kafka topic name (1-249 of "
                         "a-z A-Z 0-9 . _ -)")
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise TypeError(f"forward(): the target partition must be an int, not "
                        f"{type(partition).__name__} {partition!r}")
    if partition < 0:
        raise ValueError(f"forward(): the target partition must be >= 0, not {partition}")
    if callback is not None and not callable(callback):
        raise TypeError(f"forward(): the callback must be callable, not "
                        f"{type(callback).__name__} {callback!r}")


def check_undecided(batch: object, action: str) -> None:
    """``ValueError`` when ``batch`` was already forwarded or dropped: each batch is decided
    once (a second decision used to break the engine's bookkeeping for its partition)."""
    if not isinstance(batch, FetchedBatch):
        raise TypeError(f"{action}(): expected a FetchedBatch handed out by the forwarder, not "
                        f"{type(batch).__name__} {batch!r}")
    if batch.target_topic is not None:
        raise ValueError(f"{action}(): {batch!r} was already forwarded (to "
                         f"{batch.target_topic}-{batch.target_partition}); each batch is "
                         "forwarded or dropped once")
    if batch.done:
        raise ValueError(f"{action}(): {batch!r} was already dropped; each batch is forwarded "
                         "or dropped once")


class BatchForwarder(EngineCore):
    """An engine whose routing decision is the program's (see the module docstring)."""

    def __init__(self, source_config: Mapping[str, Any], target_config: Mapping[str, Any], *,
                 topics: TopicsSpec, settings: Mapping[str, Any] | None = None,
                 metrics_sink: MetricsSink | None = None, source_alias: str = "source",
                 target_alias: str = "target", flow: str | None = None,
                 cluster_factory: ClusterFactory | None = None,
                 membership_factory: MembershipFactory | None = None) -> None:
        self._fetched: asyncio.Queue[FetchedBatch] = asyncio.Queue()
        # The router hands every fetched batch to the program (the queue this iterates).
        super().__init__(source_config, target_config, topics=topics, flow=flow,
                         source_alias=source_alias, target_alias=target_alias,
                         settings=settings, metrics_sink=metrics_sink,
                         router=self._fetched.put_nowait,
                         cluster_factory=cluster_factory,
                         membership_factory=membership_factory)
        self._stop = asyncio.Event()
        self._runner: asyncio.Task | None = None
        #: Batches taken off the queue by a wait that was cancelled before handing them out:
        #: handed out first by the next wait, in the queue's order.
        self._held: collections.deque[FetchedBatch] = collections.deque()

    # ---- lifecycle ----
    async def start(self) -> None:
        """Connect, join, start fetching; returns once ready. A ``stop()`` meanwhile ends it at
        once, nothing raised; a start-up error is raised. Cancelled (a timeout around it,
        Ctrl-C), it stops what it started before the cancellation goes on."""
        if self._stop.is_set():
            # Started again after stop() (or stopped before it ever started): run() would end
            # at once and next_batch() return None, nothing said.
            raise RuntimeError("the forwarder was stopped: a stopped BatchForwarder does not "
                               "start again; make a new one")
        if self._runner is None:
            self._runner = asyncio.create_task(self.run(self._stop))
        ready = asyncio.ensure_future(self.runtime.progress.wait_until(lambda: self.ready))
        try:
            await asyncio.wait({ready, self._runner}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            ready.cancel()
            await self._end_run()
            raise
        if not ready.done():             # run() ended before the engine was ready: its error
            ready.cancel()
            await self._runner

    async def stop(self) -> None:
        """Stop fetching, wait for forwarded batches, commit, close."""
        self._stop.set()
        self._release_unhanded()
        if self._runner is not None:
            await self._runner

    def _release_unhanded(self) -> None:
        """Batches fetched but never handed out: dropped, not committed past."""
        while self._held:
            self._held.popleft().release()
        while not self._fetched.empty():
            self._fetched.get_nowait().release()

    async def _end_run(self) -> None:
        """Stop the engine and wait for ``run`` to end, its error dropped: the caller is leaving
        with another exception (a cancellation) already."""
        self._stop.set()
        self._release_unhanded()
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner

    async def __aenter__(self) -> BatchForwarder:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- the program's side ----
    def __aiter__(self) -> AsyncIterator[FetchedBatch]:
        return self

    async def __anext__(self) -> FetchedBatch:
        batch = await self.next_batch()
        if batch is None:
            raise StopAsyncIteration
        return batch

    async def next_batch(self, timeout_s: float | None = None) -> FetchedBatch | None:
        """The next fetched batch; None after ``timeout_s`` without one, or once the forwarder
        has stopped (a fatal engine error is raised). Cancelled, it loses no batch."""
        check_seconds(f"{type(self).__name__}.next_batch", "timeout_s", timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            batch = await self._next_fetched(left)
            if batch is None or not batch.abandoned:
                return batch
            # Its partition was revoked (or stopped) while it waited here: not handed out, the
            # partition's next owner mirrors it.
            batch.release()

    async def _next_fetched(self, timeout_s: float | None) -> FetchedBatch | None:
        if self._held:
            return self._held.popleft()
        if not self._fetched.empty():
            return self._fetched.get_nowait()
        runner = self._runner
        if runner is None:
            raise RuntimeError("start() the forwarder first")
        if not runner.done():
            getter = asyncio.ensure_future(self._fetched.get())
            try:
                await asyncio.wait({getter, runner}, timeout=timeout_s,
                                   return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                if getter.done() and not getter.cancelled():
                    self._held.appendleft(getter.result())   # taken, never handed out
                else:
                    getter.cancel()
                raise
            if getter.done():
                return getter.result()
            getter.cancel()
            if not runner.done():
                return None              # timed out
        await runner                     # stopped: its error, if it ended with one
        return None

    def route(self, batch: FetchedBatch, target_topic: str, target_partition: int) -> None:
        """Queue ``batch`` for the target, unless it was abandoned after it was handed out (its
        partition revoked or stopped): then its future fails with ``batch.BatchAbandonedError``
        at once. Queued, it was dropped unsent and its future never resolved."""
        if batch.abandoned:
            batch.target_topic, batch.target_partition = target_topic, target_partition
            batch._finish(None, self._abandoned(
                "its partition was revoked or stopped after the batch was handed out; the "
                "partition's next owner mirrors it again from the last commit")(batch))
            return
        super().route(batch, target_topic, target_partition)

    def forward(self, batch: FetchedBatch, topic: str, partition: int,
                callback: AckCallback | None = None) -> asyncio.Future:
        """Send ``batch`` unchanged to ``topic``/``partition`` on the target; the future resolves
        to the target base offset (None if the target did not say) or raises the error.
        ``TypeError``/``ValueError`` at the call: not a batch, not a legal topic name or
        partition, a batch already forwarded or dropped, another forwarder's batch."""
        check_destination(batch, topic, partition, callback)
        check_undecided(batch, "forward")
        self.check_handed_out(batch, "forward")
        self._check_running("forward")
        future = batch.future()
        if callback is not None:
            batch.add_done_callback(_guarded(callback, "callback"))
        self.route(batch, topic, partition)
        return future

    def drop(self, batch: FetchedBatch) -> None:
        """Do not forward ``batch``; its offsets count as done. ``ValueError`` for a batch
        already forwarded or dropped."""
        check_undecided(batch, "drop")
        self.check_handed_out(batch, "drop")
        self._check_running("drop")
        self.batch_dropped(batch)

    def check_handed_out(self, batch: FetchedBatch, action: str) -> None:
        """``ValueError`` for a batch this forwarder did not hand out (another forwarder's):
        its acknowledgement would reach no partition of this one (the other's commits then
        stopped at it for good) or another ownership's offsets. A batch of a partition revoked
        since is this one's (``route`` tells its future)."""
        if not isinstance(batch, FetchedBatch) or batch.abandoned:
            return                      # (not a batch: the TypeError of the other checks)
        sp = self.partitions.get((batch.topic, batch.partition))
        if batch.offsets is None or sp is None or batch.offsets is not sp.offsets:
            raise ValueError(f"{action}(): {batch!r} was not handed out by this forwarder "
                             "(another forwarder's batch?); forward or drop each batch with the "
                             "forwarder whose next_batch() gave it")

    def _check_running(self, what: str) -> None:
        """``RuntimeError`` once ``stop()`` was called: nothing forwarded after it would be
        acknowledged (its future never resolved) or committed."""
        if self._stop.is_set():
            raise RuntimeError(f"the forwarder is stopped: cannot {what} a batch after stop() "
                               "(its records are fetched again by the next start from the "
                               "last commit)")


def _guarded(fn: AckCallback, what: str) -> AckCallback:
    """``fn`` as an acknowledgement callback whose exception is logged, not raised: it runs
    inside the engine's produce loop, which an exception there stopped (and the error then
    blamed a produce request)."""
    def call(batch: FetchedBatch, target_base: int | None, error: BaseException | None) -> None:
        try:
            fn(batch, target_base, error)
        except Exception:  # noqa: BLE001 - a program's callback must not stop the engine
            log.exception("%s failed for %r", what, batch)
    return call


class SyncBatchForwarder:
    """``BatchForwarder`` for plain (non-asyncio) code: the forwarder runs on a private event loop
    in a background thread; this object blocks where the asyncio one awaits.

    ``forward`` does not block: it returns a ``concurrent.futures.Future`` resolving to the target
    base offset, and ``on_ack(batch, target_base_offset, error)`` runs on the forwarder's thread
    (keep it short; an exception it raises is logged, never propagated into the engine).
    ``forward`` and ``drop`` calls reach the engine in the order they were made, so batches of one
    source partition forwarded to one target partition keep their order.

    ``close`` (or leaving the ``with`` block) stops fetching, waits for forwarded batches to be
    acknowledged, commits the source positions and stops the thread. A batch handed out but
    neither forwarded nor dropped is never committed past."""

    def __init__(self, source_config: Mapping[str, Any], target_config: Mapping[str, Any], *,
                 topics: TopicsSpec, settings: Mapping[str, Any] | None = None,
                 metrics_sink: MetricsSink | None = None, source_alias: str = "source",
                 target_alias: str = "target", flow: str | None = None) -> None:
        check_engine_arguments("SyncBatchForwarder", source_config, target_config, topics,
                               settings)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="shallowmirror-forwarder")
        self._started = False
        self._closed = False
        #: Held by ``close`` (and a failed start's clean-up): one of them stops the thread.
        self._closing = threading.RLock()
        #: Batches forwarded or dropped by the program whose decision has not reached the
        #: forwarder's loop yet (then the batch itself says it): each is decided once.
        self._claimed: dict[FetchedBatch, str] = {}
        self._claim_lock = threading.Lock()
        self._thread.start()

        async def make() -> BatchForwarder:
            return BatchForwarder(source_config, target_config, topics=topics,
                                  settings=settings, metrics_sink=metrics_sink,
                                  source_alias=source_alias, target_alias=target_alias,
                                  flow=flow)

        try:
            self.forwarder = self._run(make())
        except BaseException:
            self._stop_thread()
            raise

    # ---- plumbing ----
    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the forwarder's loop and wait for its result. Interrupted (Ctrl-C) or
        timed out, the coroutine is cancelled; a forwarder closed meanwhile by another thread
        raises ``RuntimeError`` instead of leaving the caller waiting for ever."""
        if self._closed:
            coro.close()
            raise RuntimeError("the forwarder is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while True:
                wait_s = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                try:
                    return future.result(max(0.0, wait_s))
                except concurrent.futures.TimeoutError:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise
                    if not self._thread.is_alive():
                        raise RuntimeError("the forwarder is closed") from None
        except BaseException:
            future.cancel()
            raise

    def _stop_thread(self) -> None:
        """Cancel what still runs on the forwarder's loop (a caller waiting on it in another
        thread gets ``CancelledError``, not a wait for ever), then stop the loop and its thread."""
        with self._closing:
            if self._closed and not self._thread.is_alive():
                return
            self._closed = True

            async def cancel_the_rest() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            try:
                if self._thread.is_alive():
                    with contextlib.suppress(Exception):
                        asyncio.run_coroutine_threadsafe(cancel_the_rest(), self._loop).result(
                            _CANCEL_WAIT_S)
            finally:
                if self._thread.is_alive():
                    self._loop.call_soon_threadsafe(self._loop.stop)
                    self._thread.join()
                self._loop.close()

    # ---- lifecycle ----
    def start(self) -> SyncBatchForwarder:
        """Connect, join, and start fetching (idempotent); returns self.

        ``close()`` from another thread meanwhile ends it at once (it returns; the forwarder is
        closed, nothing raised). A start-up error, or an interruption (``KeyboardInterrupt``),
        closes the forwarder (engine and thread) before it is raised."""
        if self._started:
            return self
        if self._closed:
            raise RuntimeError("the forwarder is closed")
        try:
            self._run(self.forwarder.start())
        except BaseException as err:
            if self._closed and isinstance(err, concurrent.futures.CancelledError | RuntimeError):
                return self              # closed by another thread while it was starting
            self._abandon()
            raise
        self._started = True
        return self

    def _abandon(self) -> None:
        """After a failed or interrupted start: end the engine (it may still be starting) and
        the thread, their errors dropped (the caller raises its own)."""
        with self._closing:
            if self._closed:
                return
            try:
                with contextlib.suppress(Exception):
                    self._run(self.forwarder._end_run())
            finally:
                self._stop_thread()

    def close(self) -> None:
        """Stop fetching, wait for forwarded batches, commit, stop the thread (idempotent; from
        any thread but the forwarder's, also while ``start()`` waits for a cluster, which it
        ends). Re-raises a fatal engine error."""
        with self._closing:
            if self._closed:
                return
            try:
                self._run(self.forwarder.stop())
            finally:
                self._stop_thread()

    def __enter__(self) -> SyncBatchForwarder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the program's side ----
    def __iter__(self) -> Iterator[FetchedBatch]:
        """Blocking iteration over fetched batches; ends when the forwarder stops."""
        while True:
            batch = self.next_batch()
            if batch is None:
                return
            yield batch

    def next_batch(self, timeout_s: float | None = None) -> FetchedBatch | None:
        """The next fetched batch; None after ``timeout_s`` without one, or once stopped."""
        check_seconds(f"{type(self).__name__}.next_batch", "timeout_s", timeout_s)
        self.start()
        return self._run(self.forwarder.next_batch(timeout_s))

    def _claim(self, batch: FetchedBatch, action: str) -> None:
        """Record the program's decision on ``batch`` (``ValueError``: it was decided before)."""
        if self._closed:
            raise RuntimeError("the forwarder is closed")
        with self._claim_lock:
            check_undecided(batch, action)
            before = self._claimed.get(batch)
            if before is not None:
                raise ValueError(f"{action}(): {batch!r} was already {before}; each batch is "
                                 "forwarded or dropped once")
            self._claimed[batch] = "forwarded" if action == "forward" else "dropped"

    def forward(self, batch: FetchedBatch, topic: str, partition: int,
                on_ack: AckCallback | None = None) -> concurrent.futures.Future:
        """Send ``batch`` unchanged to ``topic``/``partition`` on the target (does not block).
        The future resolves to the target base offset (None: the target did not say) or raises
        the error that stopped the batch's source partition. ``TypeError``/``ValueError`` at the
        call: not a batch, not a legal topic name or partition, a batch already forwarded or
        dropped, another forwarder's batch."""
        check_destination(batch, topic, partition, on_ack)
        self.forwarder.check_handed_out(batch, "forward")
        self._claim(batch, "forward")
        result: concurrent.futures.Future = concurrent.futures.Future()

        guarded = None if on_ack is None else _guarded(on_ack, "on_ack callback")

        def acked(b: FetchedBatch, target_base: int | None, error: BaseException | None) -> None:
            if guarded is not None:
                guarded(b, target_base, error)
            if not result.done() and result.set_running_or_notify_cancel():
                if error is None:
                    result.set_result(target_base)
                else:
                    result.set_exception(error)

        def on_loop() -> None:
            try:
                batch.add_done_callback(acked)
                self.forwarder.route(batch, topic, partition)
            except BaseException as err:  # noqa: BLE001 - handed to the caller's future
                if not result.done():
                    result.set_exception(err)
            finally:
                self._claimed.pop(batch, None)   # the batch says it from now on

        self._loop.call_soon_threadsafe(on_loop)
        return result

    def drop(self, batch: FetchedBatch) -> None:
        """Do not forward ``batch``; its offsets count as done (does not block). ``ValueError``
        for a batch already forwarded or dropped."""
        self.forwarder.check_handed_out(batch, "drop")
        self._claim(batch, "drop")

        def on_loop() -> None:
            try:
                self.forwarder.batch_dropped(batch)
            finally:
                self._claimed.pop(batch, None)

        self._loop.call_soon_threadsafe(on_loop)

    # ---- queries ----
    def stats(self) -> EngineStats:
        """The engine's statistics; after ``close`` its last ones (as ``BatchForwarder.stats``
        gives them after ``stop``), read here since no loop runs any more."""
        if self._closed and not self._thread.is_alive():
            return self.forwarder.stats()

        async def stats() -> EngineStats:
            return self.forwarder.stats()
        return self._run(stats())

    def offset_map(self, topic: str, partition: int) -> OffsetMap:
        """The source->target offset map of one source partition (updated by the forwarder's
        thread: read ``rows()`` once the batches of interest are acknowledged)."""
        return self.forwarder.offset_map(topic, partition)

    def commit(self) -> None:
        """Commit every acknowledged position now (otherwise every offset.commit.interval.ms)."""
        self._run(self.forwarder.commit_now())

    def wait_caught_up(self, timeout_s: float) -> bool:
        """True once every owned partition's committed position reaches its high watermark, as
        fetched after this call: every record on the source when it was made is forwarded."""
        check_seconds(f"{type(self).__name__}.wait_caught_up", "timeout_s", timeout_s)
        return self._run(self.forwarder.wait_caught_up(timeout_s, since=time.monotonic()))
