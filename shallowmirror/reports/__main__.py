"""`python -m shallowmirror.reports RESULTS... --out DIR`: the same as `shallowmirror report`."""

from __future__ import annotations

import argparse
import sys

from shallowmirror.cli import report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shallowmirror.reports")
    report.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
