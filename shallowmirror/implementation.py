"""Native build or pure-Python twin: the one rule every native module is chosen by, at import.

- ``SHALLOWMIRROR_PURE_PYTHON=1`` forces the twin;
- otherwise the native build is used if it was built, else the twin;
- ``SHALLOWMIRROR_REQUIRE_NATIVE=1`` turns that fallback into an ImportError (CI, production).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def choose(twin: T, load_native: Callable[[], T], what: str) -> tuple[str, T]:
    """("native", what ``load_native`` returns) or ("python", ``twin``), by the rule above;
    ``what`` names the build in the error."""
    if os.environ.get("SHALLOWMIRROR_PURE_PYTHON") == "1":
        return "python", twin
    try:
        return "native", load_native()
    except ImportError as err:
        if os.environ.get("SHALLOWMIRROR_REQUIRE_NATIVE") == "1":
            raise ImportError(
                f"shallowmirror: the native {what} is required (SHALLOWMIRROR_REQUIRE_NATIVE=1) "
                f"but could not be imported: {err}. Reinstall with a C compiler: "
                "pip install -e .") from err
        return "python", twin
