"""A one-line progress bar on stderr (tqdm is not a dependency).

Redraws at most every ``min_interval_s`` and only when stderr is a terminal, unless forced; when
not drawing it stays silent so logs and CI output are not flooded.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, label: str, total: int, *, unit: str = "rec", stream: TextIO | None = None,
                 enabled: bool | None = None, width: int = 28, min_interval_s: float = 0.2):
        self.label, self.total, self.unit = label, max(total, 1), unit
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.width, self.min_interval_s = width, min_interval_s
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._drawn = False

    def update(self, done: int, extra: str = "") -> None:
        now = time.monotonic()
        if not self.enabled or (now - self._last_draw < self.min_interval_s and done < self.total):
            return
        self._last_draw = now
        self.stream.write("\r" + self.render(done, now - self.started, extra))
        self.stream.flush()
        self._drawn = True

    def render(self, done: int, elapsed_s: float, extra: str = "") -> str:
        frac = min(max(done / self.total, 0.0), 1.0)
        filled = int(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        return (f"{self.label} [{bar}] {frac * 100:5.1f}% {_short(done)}/{_short(self.total)} "
                f"{self.unit} {elapsed_s:6.1f}s {extra}").rstrip()

    def close(self, final: str = "") -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K" if not final else "\r\x1b[K" + final + "\n")
            self.stream.flush()


def _short(n: int) -> str:
    for factor, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= factor:
            return f"{n / factor:.1f}{suffix}"
    return str(n)
