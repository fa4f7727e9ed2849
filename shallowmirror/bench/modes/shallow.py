"""Shallow mirror: this project's engine, forwarding compressed RecordBatches byte for byte.

Runs a ``shallowmirror.engine.MirrorEngine`` from the start of the source topics until
SIGTERM/SIGINT. "ready" is reported when the engine says it is (connected to both clusters,
producer identity set up, partitions being taken) — the same point as the deep modes' (clients
connected, partitions assigned, nothing fetched yet). Target topics are the harness's to create,
as for every mode. ``--setting key=value`` (repeatable) passes engine settings through (keys of
``shallowmirror.engine.ENGINE_SETTINGS``), e.g. to try fetch sizes or requests in flight.
"""

from __future__ import annotations

import asyncio
import signal
import time

from shallowmirror.bench.modes import common


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


async def _run(args) -> None:
    from shallowmirror.engine import MirrorEngine

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    suffix = args.target_suffix
    # One engine takes every partition (like the deep modes' assign()): no group rebalance
    # wait, which tansu stretches to session.timeout/2.
    settings = {"group.id": args.group, "partition.assignment": "all",
                "auto.offset.reset": "earliest", **dict(args.setting)}
    engine = MirrorEngine({"bootstrap.servers": args.source}, {"bootstrap.servers": args.target},
                          topics=list(args.topic), topic_mapper=lambda topic: topic + suffix,
                          settings=settings)
    task = asyncio.create_task(engine.run(stop))
    while not engine.ready and not task.done():
        await asyncio.sleep(0.005)
    common.emit("ready", time=time.time())
    await task


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--setting", action="append", default=[], type=_setting,
                   help="engine setting key=value (repeatable)")
    asyncio.run(_run(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
