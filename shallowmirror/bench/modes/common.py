"""Arguments and shutdown handling shared by the mode processes."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--source", required=True, help="source bootstrap servers")
    p.add_argument("--target", default=None, help="target bootstrap servers")
    p.add_argument("--topic", action="append", required=True, help="source topic (repeatable)")
    p.add_argument("--target-suffix", default="", help="target topic = source topic + suffix")
    p.add_argument("--group", default="shallowmirror-bench", help="consumer group id")
    p.add_argument("--codec", default="lz4", help="compression.type for deep producers")
    p.add_argument("--batch-bytes", type=int, default=256 * 1024, help="producer batch.size")
    p.add_argument("--linger-ms", type=int, default=5, help="producer linger.ms")
    return p


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM/SIGINT: the mode finishes its current step and shuts down."""
    stop = threading.Event()

    def handler(_signum, _frame) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def emit(event: str, **fields) -> None:
    """One JSON line on stdout for the harness."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()
