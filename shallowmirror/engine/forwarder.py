"""The low-level embedded API: a program iterates fetched batches and decides, per batch, where it
goes (``forward``) or that it goes nowhere (``drop``).

Every fetched batch must be forwarded or dropped: the committed source position only moves past
a batch once it is acknowledged by the target or dropped, and the byte budget only frees its
fetch frame then (a program that keeps batches stalls fetching — that is the back-pressure).
``forward`` returns an awaitable resolving to the target base offset and takes an optional
callback ``fn(batch, target_base_offset, error)``; plain (non-asyncio) code uses ``run_forwarder``
which drives the loop in a thread and gives back ``concurrent.futures`` results.

Example (asyncio)::

    async with BatchForwarder(src_cfg, dst_cfg, topics=["orders"]) as fwd:
        async for batch in fwd:
            if batch.topic == "orders":
                fwd.forward(batch, "orders-copy", batch.partition)
            else:
                fwd.drop(batch)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from shallowmirror.engine.batch import FetchedBatch, SourcePartition
from shallowmirror.engine.core import EngineCore, TopicsSpec
from shallowmirror.engine.metrics import MetricsSink

AckCallback = Callable[[FetchedBatch, "int | None", "BaseException | None"], None]


class BatchForwarder(EngineCore):
    """An engine whose routing decision is the program's (see the module docstring)."""

    def __init__(self, source_config: Mapping[str, Any], target_config: Mapping[str, Any], *,
                 topics: TopicsSpec, settings: Mapping[str, Any] | None = None,
                 metrics_sink: MetricsSink | None = None, source_alias: str = "source",
                 target_alias: str = "target", flow: str | None = None) -> None:
        super().__init__(source_config, target_config, topics=topics, flow=flow,
                         source_alias=source_alias, target_alias=target_alias,
                         settings=settings, metrics_sink=metrics_sink)
        self._fetched: asyncio.Queue[FetchedBatch] = asyncio.Queue()
        self._stop = asyncio.Event()
        self._runner: asyncio.Task | None = None

    def deliver(self, sp: SourcePartition, batch: FetchedBatch) -> None:
        self._fetched.put_nowait(batch)

    # ---- lifecycle ----
    async def start(self) -> None:
        self._runner = asyncio.create_task(self.run(self._stop))
        while not self.ready:
            if self._runner.done():
                await self._runner
            await asyncio.sleep(0.02)

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
