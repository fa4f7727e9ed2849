"""Run one engine as a process until SIGINT/SIGTERM (tests, benchmarks, quick manual runs)::

    python -m shallowmirror.engine.run --source 127.0.0.1:9092 --target 127.0.0.1:9093 \\
        --topics orders,payments [--prefix A] [--set group.id=g --set acks=all ...]

Prints ``engine ready`` once running and ``engine stopped <records> <batches>`` after the final
commit. The full mirror process (mm2.properties, flows, topic sync) is ``shallowmirror.mirror``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from shallowmirror.engine.engine import MirrorEngine, identity_mapper, prefix_mapper
from shallowmirror.engine.process_tuning import tune_for_mirroring
from shallowmirror.errors import ConfigError, ShallowMirrorError


def main(argv: list[str] | None = None) -> int:
    """Run until stopped; a refused setting (2) or a failed run (1) is one line on stderr, as
    the ``shallowmirror`` command says it, so the script driving this (a benchmark) can show it."""
    try:
        return _run(argv)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ShallowMirrorError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def _run(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shallowmirror.engine.run")
    parser.add_argument("--source", required=True, help="source bootstrap.servers")
    parser.add_argument("--target", required=True, help="target bootstrap.servers")
    parser.add_argument("--topics", required=True, help="comma list, or a regex with --regex")
    parser.add_argument("--regex", action="store_true")
    parser.add_argument("--prefix", help="target topic = <prefix>.<topic>")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    settings = dict(item.split("=", 1) for item in args.set)
    tune_for_mirroring()
    topics = args.topics if args.regex else [t for t in args.topics.split(",") if t]
    engine = MirrorEngine({"bootstrap.servers": args.source}, {"bootstrap.servers": args.target},
                          topics=topics,
                          topic_mapper=prefix_mapper(args.prefix) if args.prefix else
                          identity_mapper, settings=settings)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.create_task(engine.run(stop))
        ready = asyncio.ensure_future(engine.runtime.progress.wait_until(lambda: engine.ready))
        await asyncio.wait({ready, task}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if engine.ready:
            print("engine ready", flush=True)
        await task
        stats = engine.stats()
        print(f"engine stopped {stats.records} {stats.batches}", flush=True)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
