"""Describe the machine a benchmark ran on (the ``machine`` object of ``bench_run`` records)."""

from __future__ import annotations

import os
import platform
import socket

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
