"""`shallowmirror info`: version, codec implementation in use, and where the test broker is."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="show version, codec implementation and broker binary")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from shallowmirror import __version__, codec

    print(f"shallowmirror {__version__}")
    print(f"codec: {codec.IMPLEMENTATION}")
    try:
        from shallowmirror.testing.embedded import find_tansu

        print(f"tansu: {find_tansu()}")
    except Exception as err:  # noqa: BLE001 - info must always print something useful
        print(f"tansu: unavailable ({err})")
    return 0
