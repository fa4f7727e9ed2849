"""The low-level embedded API: a program iterates fetched batches and decides, per batch, where it
goes (``forward``) or that it goes nowhere (``drop``).

Every fetched batch must be forwarded or dropped: the committed source position only moves past
a batch once it is acknowledged by the target or dropped, and the byte budget only frees its
fetch frame then (a program that keeps batches stalls fetching — that is the back-pressure).
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
import concurrent.futures
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from shallowmirror.engine.batch import EngineStats, FetchedBatch
from shallowmirror.engine.core import ClusterFactory, EngineCore, MembershipFactory
from shallowmirror.engine.discovery import TopicsSpec
from shallowmirror.engine.metrics import MetricsSink
from shallowmirror.engine.offsets import OffsetMap

log = logging.getLogger(__name__)

T = TypeVar("T")

AckCallback = Callable[[FetchedBatch, "int | None", "BaseException | None"], None]


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

    # ---- lifecycle ----
    async def start(self) -> None:
        self._runner = asyncio.create_task(self.run(self._stop))
        ready = asyncio.ensure_future(self.runtime.progress.wait_until(lambda: self.ready))
        await asyncio.wait({ready, self._runner}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():             # run() ended before the engine was ready: its error
            ready.cancel()
            await self._runner

    async def stop(self) -> None:
        """Stop fetching, wait for forwarded batches, commit, close."""
        self._stop.set()
        while not self._fetched.empty():       # never handed out: drop (not committed past)
            self._fetched.get_nowait().release()
        if self._runner is not None:
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
        getter = asyncio.ensure_future(self._fetched.get())
        assert self._runner is not None, "start() the forwarder first"
        done, _ = await asyncio.wait({getter, self._runner}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        await self._runner
        raise StopAsyncIteration

    async def next_batch(self, timeout_s: float | None = None) -> FetchedBatch | None:
        try:
            return await asyncio.wait_for(self._fetched.get(), timeout_s)
        except asyncio.TimeoutError:
            return None

    def forward(self, batch: FetchedBatch, topic: str, partition: int,
                callback: AckCallback | None = None) -> asyncio.Future:
        """Send ``batch`` unchanged to ``topic``/``partition`` on the target; the future resolves
        to the target base offset (None if the target did not say) or raises the error."""
        future = batch.future()
        if callback is not None:
            batch.add_done_callback(callback)
        self.route(batch, topic, partition)
        return future

    def drop(self, batch: FetchedBatch) -> None:
        """Do not forward ``batch``; its offsets count as done."""
        self.batch_dropped(batch)


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
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="shallowmirror-forwarder")
        self._thread.start()
        self._started = False
        self._closed = False

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
        """Run ``coro`` on the forwarder's loop and wait for its result."""
        if self._closed:
            coro.close()
            raise RuntimeError("the forwarder is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _stop_thread(self) -> None:
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    # ---- lifecycle ----
    def start(self) -> SyncBatchForwarder:
        """Connect, join, and start fetching (idempotent); returns self."""
        if not self._started:
            self._run(self.forwarder.start())
            self._started = True
        return self

    def close(self) -> None:
        """Stop fetching, wait for forwarded batches, commit, stop the thread (idempotent).
        Re-raises a fatal engine error."""
        if self._closed:
            return
        try:
            if self._started:
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
        self.start()

        async def next_or_none() -> FetchedBatch | None:
            fwd = self.forwarder
            if timeout_s is not None:
                return await fwd.next_batch(timeout_s)
            try:
                return await fwd.__anext__()
            except StopAsyncIteration:
                return None

        return self._run(next_or_none())

    def forward(self, batch: FetchedBatch, topic: str, partition: int,
                on_ack: AckCallback | None = None) -> concurrent.futures.Future:
        """Send ``batch`` unchanged to ``topic``/``partition`` on the target (does not block).
        The future resolves to the target base offset (None: the target did not say) or raises
        the error that stopped the batch's source partition."""
        result: concurrent.futures.Future = concurrent.futures.Future()

        def acked(b: FetchedBatch, target_base: int | None, error: BaseException | None) -> None:
            if on_ack is not None:
                try:
                    on_ack(b, target_base, error)
                except Exception:  # noqa: BLE001 - a program's callback must not stop the engine
                    log.exception("on_ack callback failed for %r", b)
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

        self._loop.call_soon_threadsafe(on_loop)
        return result

    def drop(self, batch: FetchedBatch) -> None:
        """Do not forward ``batch``; its offsets count as done (does not block)."""
        self._loop.call_soon_threadsafe(self.forwarder.drop, batch)

    # ---- queries ----
    def stats(self) -> EngineStats:
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
        return self._run(self.forwarder.wait_caught_up(timeout_s, since=time.monotonic()))
