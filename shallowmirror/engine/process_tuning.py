"""Process-wide settings for a process whose work is mirroring: the garbage collector's first
generation and glibc malloc's thresholds.

**Garbage collector.** Every batch between fetch and acknowledgement holds a few objects the
cyclic garbage collector tracks (the ``FetchedBatch``, its codec view, the view of its payload),
and with a default ``buffer.memory`` thousands are in flight for about a second. CPython's
first-generation threshold (700 net container allocations) then runs a young collection every
~200 batches that walks those still in flight, and promotes them to the older generations, which
walk them again: about a tenth of a small batch's CPU in ``benchmarks/engine/hotpath_micro.py``.
Nothing the engine makes per batch forms a reference cycle (reference counting frees it on
acknowledgement), so a larger first-generation threshold costs only a later collection of
whatever cyclic garbage other code leaves, bounded by the threshold.

**malloc.** Each Fetch response of more than a few hundred KB is received into a buffer of its
own (batches are views of it until acknowledged). glibc serves such sizes with ``mmap`` or from
the heap top and gives them back to the kernel when freed (its dynamic mmap threshold and a trim
threshold of twice that), so every frame's pages were faulted in and zeroed by the kernel again:
about a tenth of the mirror's CPU at 16 KiB batches on Kafka (``perf``: page faults and
``clear_page``). Fixed thresholds keep freed frame memory in the heap for the next frame. RSS is
unchanged: fetched frames are bounded by ``buffer.memory`` either way.

Only entry points that own the process call this (``shallowmirror mirror``, ``python -m
shallowmirror.engine.run``); a program embedding the engine keeps its own settings.
"""

from __future__ import annotations

import ctypes
import gc
import sys

#: First-generation threshold for a mirror process (CPython's default is 700).
MIRROR_GEN0_THRESHOLD = 10_000
#: Allocations at least this large still get their own mapping (glibc's default is dynamic,
#: 128 KiB up to 32 MiB): above any Fetch frame the engine asks for by default.
MIRROR_MMAP_THRESHOLD_BYTES = 64 << 20
#: Free memory at the heap top kept rather than returned to the kernel.
MIRROR_TRIM_THRESHOLD_BYTES = 256 << 20
_M_TRIM_THRESHOLD = -1                # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3


def tune_for_mirroring() -> None:
    """Raise the first-generation threshold to ``MIRROR_GEN0_THRESHOLD`` (never lower it; the
    older generations' thresholds stay as they are) and fix glibc malloc's thresholds."""
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0 and gen0 < MIRROR_GEN0_THRESHOLD:    # 0: collection disabled by the user; keep it
        gc.set_threshold(MIRROR_GEN0_THRESHOLD, gen1, gen2)
    tune_malloc()


def tune_malloc() -> bool:
    """Set glibc's mmap and trim thresholds (``MIRROR_*_BYTES``); False where there is no glibc
    ``mallopt`` (musl, macOS): nothing changes there."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt         # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MIRROR_MMAP_THRESHOLD_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, MIRROR_TRIM_THRESHOLD_BYTES))
