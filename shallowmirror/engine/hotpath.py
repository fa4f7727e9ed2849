"""The engine's per-batch loops: the native build (``native/_cloops.pyx``) or its twin.

Chosen once, at import, by the codec's rule (``shallowmirror.implementation.choose``).
``IMPLEMENTATION`` says which one runs.
"""

from __future__ import annotations

from shallowmirror.engine import loops as _twin
from shallowmirror.implementation import choose


def _load_native():
    from shallowmirror.engine import _cloops

    return _cloops


IMPLEMENTATION, _loops = choose(_twin, _load_native, "engine loops")

prepare_usual = _loops.prepare_usual
add_batches = _loops.add_batches
enqueue_run = _loops.enqueue_run
plan_picks = _loops.plan_picks
settle_picks = _loops.settle_picks
ack_batches = _loops.ack_batches
fetch_positions = _loops.fetch_positions
mark_unchanged = _loops.mark_unchanged
changed_positions = _loops.changed_positions

__all__ = ["IMPLEMENTATION", "prepare_usual", "add_batches", "enqueue_run", "plan_picks",
           "settle_picks", "ack_batches", "fetch_positions",
           "mark_unchanged", "changed_positions"]
