"""The one-call embedded API: ``mirror`` (blocking) and ``mirror_async``.

Both create missing target topics first — with the source topic's partition count and
``compression.type=producer`` (so the target broker keeps the forwarded batches as they are),
through confluent-kafka's AdminClient — then run a ``MirrorEngine`` until stopped, caught up, or
timed out, commit the source positions and return the final ``EngineStats``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shallowmirror.engine.batch import EngineStats
from shallowmirror.engine.discovery import TopicsSpec, topic_predicate
from shallowmirror.engine.engine import MirrorEngine, identity_mapper
from shallowmirror.engine.metrics import MetricsSink
from shallowmirror.net.config import librdkafka_connection

log = logging.getLogger(__name__)


def ensure_target_topics(source_config: Mapping[str, Any], target_config: Mapping[str, Any],
                         topics: TopicsSpec, topic_mapper: Callable[[str], str],
                         timeout_s: float = 30.0, *, source_alias: str = "source",
                         target_alias: str = "target") -> list[str]:
    """Create every mapped target topic that does not exist yet (source partition count,
    ``compression.type=producer``); return the names created."""
    from confluent_kafka.admin import AdminClient, NewTopic

    src = AdminClient(librdkafka_connection(source_config, source_alias))
    dst = AdminClient(librdkafka_connection(target_config, target_alias))
    wanted, _names = topic_predicate(topics)
    src_topics = src.list_topics(timeout=timeout_s).topics
    existing = set(dst.list_topics(timeout=timeout_s).topics)
    new = []
    for name, meta in sorted(src_topics.items()):
        if name.startswith("__") or meta.error is not None or not wanted(name):
            continue
        target = topic_mapper(name)
        if target not in existing:
            new.append(NewTopic(target, len(meta.partitions), -1,
                                config={"compression.type": "producer"}))
    if new:
        for name, future in dst.create_topics(new, operation_timeout=timeout_s).items():
            try:
                future.result(timeout_s)
            except Exception as err:  # noqa: BLE001 - a concurrent creator is fine
                if "exist" not in str(err).lower():
                    raise
            log.info("created target topic %s", name)
        deadline = time.monotonic() + timeout_s
        names = {t.topic for t in new}
        while time.monotonic() < deadline:
            md = dst.list_topics(timeout=timeout_s).topics
            if all(n in md and md[n].error is None and md[n].partitions for n in names):
                break
            time.sleep(0.1)
    return [t.topic for t in new]


async def mirror_async(source_config: Mapping[str, Any], target_config: Mapping[str, Any],
                       topics: Sequence[str] | str | Callable[[str], bool], *,
                       topic_mapper: Callable[[str], str] = identity_mapper,
                       stop: asyncio.Event | None = None, until_caught_up: bool = False,
                       timeout_s: float | None = None, create_topics: bool = True,
                       metrics_sink: MetricsSink | None = None,
                       source_alias: str = "source", target_alias: str = "target",
                       **settings: Any) -> EngineStats:
    """Mirror ``topics`` until ``stop`` is set, or (``until_caught_up``) every partition's
    committed position reaches the source high watermark, or ``timeout_s`` passes.

    ``settings`` are engine keys with dots written as underscores or as given
    (``fetch_max_bytes=...`` or ``**{"fetch.max.bytes": ...}``)."""
    engine_settings = {k.replace("_", "."): v for k, v in settings.items()}
    if create_topics:
        await asyncio.get_running_loop().run_in_executor(None, functools.partial(
            ensure_target_topics, source_config, target_config, topics, topic_mapper,
            source_alias=source_alias, target_alias=target_alias))
    engine = MirrorEngine(source_config, target_config, topics=topics, topic_mapper=topic_mapper,
                          source_alias=source_alias, target_alias=target_alias,
                          settings=engine_settings, metrics_sink=metrics_sink)
    own_stop = stop or asyncio.Event()
    task = asyncio.create_task(engine.run(own_stop))
    # Whichever comes first ends the run: the engine ends (its error), stop, caught up, timeout.
    watchers = {asyncio.ensure_future(own_stop.wait())}
    if until_caught_up:
        watchers.add(asyncio.ensure_future(_caught_up(engine)))
    try:
        await asyncio.wait({task, *watchers}, timeout=timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        own_stop.set()
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)   # run's error is task's
        await task
    return engine.stats()


async def _caught_up(engine: MirrorEngine) -> None:
    """Return once the engine is ready and every owned partition is caught up."""
    since = time.monotonic()         # what is on the source now is mirrored before stopping
    await engine.runtime.progress.wait_until(lambda: engine.ready)
    while not await engine.wait_caught_up(3600, since=since):
        pass


def mirror(source_config: Mapping[str, Any], target_config: Mapping[str, Any],
           topics: Sequence[str] | str | Callable[[str], bool], *,
           topic_mapper: Callable[[str], str] = identity_mapper,
           stop: threading.Event | None = None, until_caught_up: bool = False,
           timeout_s: float | None = None, **settings: Any) -> EngineStats:
    """Blocking ``mirror_async``: runs its own event loop; ``stop`` is a ``threading.Event``."""

    async def main() -> EngineStats:
        astop = asyncio.Event()
        if stop is not None:
            loop = asyncio.get_running_loop()

            def watch() -> None:
                stop.wait()
                loop.call_soon_threadsafe(astop.set)

            threading.Thread(target=watch, daemon=True).start()
        return await mirror_async(source_config, target_config, topics,
                                  topic_mapper=topic_mapper, stop=astop,
                                  until_caught_up=until_caught_up, timeout_s=timeout_s,
                                  **settings)

    return asyncio.run(main())
