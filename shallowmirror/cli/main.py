"""Entry point of the `shallowmirror` command and `python -m shallowmirror`.

Each subcommand lives in its own module exposing ``add_parser(subparsers)`` (which registers the
subcommand and sets ``func``) so that ``--help`` lists exactly the subcommands that exist.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from shallowmirror import __version__

#: Modules under shallowmirror.cli, in the order --help shows them.
SUBCOMMANDS = ["mirror", "legacy", "load", "bench", "report", "brokers", "info"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shallowmirror",
        description="Mirror Kafka topics by forwarding compressed RecordBatches byte for byte.",
    )
    parser.add_argument("--version", action="version", version=f"shallowmirror {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"shallowmirror.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"shallowmirror.cli.{name}":
                continue  # not written yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
