"""Describe the machine a benchmark ran on (the ``machine`` object of ``bench_run`` records)."""

from __future__ import annotations

import collections
import os
import platform
import socket
import time

import psutil


def describe() -> dict:
    """hostname, cpus, python, platform, memory_bytes, plus cpu_model and logical/physical counts."""
    return {
        "hostname": socket.gethostname(),
        "cpus": os.cpu_count(),
        "cpus_physical": psutil.cpu_count(logical=False),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "memory_bytes": psutil.virtual_memory().total,
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


class _Slotted:
    __slots__ = ("a", "b", "c", "d")

    def __init__(self, a: int, b: int) -> None:
        self.a, self.b, self.c, self.d = a, b, None, 0


def python_reference_us(rounds: int = 5) -> float:
    """CPU microseconds this host's interpreter takes for a fixed piece of work shaped like the
    engine's per-batch Python (slotted objects made and read, a deque, dict lookups): best of
    ``rounds``. Figures such as "us per batch" differ 2-3x between the hosts sessions run on
    (the same code measured 6.3 and 15.6 us per batch in ``hotpath_micro.py``); dividing by this
    compares them across hosts. Not a benchmark of anything else."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        queue: collections.deque = collections.deque()
        index: dict[int, _Slotted] = {}
        total = 0
        for i in range(20_000):
            item = _Slotted(i, i & 7)
            queue.append(item)
            index[i & 255] = item
            if len(queue) > 64:
                old = queue.popleft()
                total += old.a + index[old.b].b
                old.d = total
        best = min(best, time.process_time() - start)
    return best * 1e6
