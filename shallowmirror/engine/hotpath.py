"""The engine's per-batch loops: the native build (``native/_cloops.pyx``) or its twin.

Chosen once, at import, with the codec's rule (``shallowmirror.codec``): the twin when
``SHALLOWMIRROR_PURE_PYTHON=1`` or when the native build is missing, an ImportError instead when
``SHALLOWMIRROR_REQUIRE_NATIVE=1``. ``IMPLEMENTATION`` says which one runs.
"""

from __future__ import annotations

import os
from types import ModuleType

from shallowmirror.engine import loops as _twin


def _choose() -> tuple[str, ModuleType]:
    if os.environ.get("SHALLOWMIRROR_PURE_PYTHON") == "1":
        return "python", _twin
    try:
        from shallowmirror.engine import _cloops
    except ImportError as err:
        if os.environ.get("SHALLOWMIRROR_REQUIRE_NATIVE") == "1":
            raise ImportError(
                "shallowmirror: the native engine loops are required "
                f"(SHALLOWMIRROR_REQUIRE_NATIVE=1) but could not be imported: {err}. "
                "Reinstall with a C compiler: pip install -e .") from err
        return "python", _twin
    return "native", _cloops


IMPLEMENTATION, _loops = _choose()

prepare_usual = _loops.prepare_usual
plan_picks = _loops.plan_picks
request_topics = _loops.request_topics
settle_picks = _loops.settle_picks
ack_batches = _loops.ack_batches

__all__ = ["IMPLEMENTATION", "prepare_usual", "plan_picks", "request_topics", "settle_picks", "ack_batches"]
