"""Shallow mirror: this project's engine, forwarding compressed RecordBatches byte for byte.

Runs a ``shallowmirror.engine.MirrorEngine`` from the start of the source topics until
SIGTERM/SIGINT. "ready" is reported when the engine says it is (connected to both clusters,
producer identity set up, partitions being taken) — the same point as the deep modes' (clients
connected, partitions assigned, nothing fetched yet). Target topics are the harness's to create,
as for every mode. ``--setting key=value`` (repeatable) passes engine settings through (keys of
``shallowmirror.engine.ENGINE_SETTINGS``), e.g. to try fetch sizes or requests in flight; the
harness checks them with ``setting_problems`` before any broker starts.
"""

from __future__ import annotations

import asyncio
import signal
import time

from shallowmirror.bench.modes import common


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _harness_settings(group: str) -> dict[str, str]:
    # One engine takes every partition (like the deep modes' assign()): no group rebalance
    # wait, which tansu stretches to session.timeout/2.
    return {"group.id": group, "partition.assignment": "all", "auto.offset.reset": "earliest"}


def setting_problems(texts: list[str]) -> list[str]:
    """What is wrong with ``--shallow-setting KEY=VALUE`` items, every problem at once: the
    syntax, keys the engine does not know (with the closest one it does), values its settings
    table refuses, and settings that disagree (resolved as the engine will, with the keys this
    mode sets itself). [] when the engine takes them."""
    from shallowmirror.engine.config import ENGINE_SETTINGS, resolve_settings
    from shallowmirror.errors import ConfigError

    problems = []
    raw: dict[str, str] = {}
    for text in texts:
        try:
            key, value = _setting(text)
        except ValueError as err:
            problems.append(f"--shallow-setting: {err}")
            continue
        if key not in ENGINE_SETTINGS:
            hint = ENGINE_SETTINGS.closest(key)
            problems.append(f"--shallow-setting {text!r}: unknown engine setting {key!r}"
                            + (f"; did you mean {hint!r}?" if hint else ""))
        elif key == "group.id":
            problems.append(f"--shallow-setting {text!r}: group.id is the harness's (a group of "
                            "its own per run, so every run reads the topic from its start)")
        else:
            raw[key] = value
    try:
        resolve_settings({**_harness_settings("bench"), **raw}, context="")
    except ConfigError as err:
        problems += [f"--shallow-setting {problem}" for problem in err.problems]
    return problems


async def _run(args) -> None:
    from shallowmirror.engine import MirrorEngine

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    suffix = args.target_suffix
    settings = {**_harness_settings(args.group), **dict(args.setting)}
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
