"""Both codec implementations for parametrized tests: the twin always, the native build when built."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def native_module(name: str) -> ModuleType | None:
    """``shallowmirror.codec.<name>`` (a native extension), or None when it is not built.

    Under ``SHALLOWMIRROR_REQUIRE_NATIVE=1`` (make test, CI) a missing build is an error, so the
    native half of the differential suite can never be skipped silently."""
    try:
        return importlib.import_module(f"shallowmirror.codec.{name}")
    except ImportError:
        if os.environ.get("SHALLOWMIRROR_REQUIRE_NATIVE") == "1":
            raise
        return None
