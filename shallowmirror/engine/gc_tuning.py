"""Garbage-collector settings for a process whose work is mirroring.

Every batch between fetch and acknowledgement holds a few objects the cyclic garbage collector
tracks (the ``FetchedBatch``, its codec view, the view of its payload), and with a default
``buffer.memory`` thousands are in flight for about a second. CPython's first-generation
threshold (700 net container allocations) then runs a young collection every ~200 batches that
walks those still in flight, and promotes them to the older generations, which walk them again:
about a tenth of a small batch's CPU in ``benchmarks/engine/hotpath_micro.py``. Nothing the
engine makes per batch forms a reference cycle (reference counting frees it on acknowledgement),
so a larger first-generation threshold costs only a later collection of whatever cyclic garbage
other code leaves, bounded by the threshold.

Only entry points that own the process call this (``shallowmirror mirror``, ``python -m
shallowmirror.engine.run``); a program embedding the engine keeps its own settings.
"""

from __future__ import annotations

import gc

#: First-generation threshold for a mirror process (CPython's default is 700).
MIRROR_GEN0_THRESHOLD = 10_000


def tune_for_mirroring() -> None:
    """Raise the first-generation threshold to ``MIRROR_GEN0_THRESHOLD`` (never lower it); the
    older generations' thresholds stay as they are."""
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0 and gen0 < MIRROR_GEN0_THRESHOLD:    # 0: collection disabled by the user; keep it
        gc.set_threshold(MIRROR_GEN0_THRESHOLD, gen1, gen2)
