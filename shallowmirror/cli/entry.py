"""The console script's first moments: a Ctrl-C while the command's modules load is no crash.

``shallowmirror`` and ``python -m shallowmirror`` import this module, which imports nothing
heavy, so the window in which Python itself would print a ``KeyboardInterrupt`` traceback ends
a few milliseconds after the interpreter starts instead of after ``logging``, ``argparse`` and
the command modules have loaded (~35 ms). ``main.main`` handles interrupts from there on.
"""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from shallowmirror.cli.main import main as run
    except KeyboardInterrupt:
        print("shallowmirror: interrupted", file=sys.stderr)
        return 130
    return run()
