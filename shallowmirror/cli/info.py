"""`shallowmirror info`: version, codec implementation in use, the test broker, the config reference."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from shallowmirror.cli.formatting import epilog

    p = sub.add_parser("info", help="show version, codec implementation and broker binary",
                       description="Show what this installation runs with, or print the "
                                   "configuration reference generated from the settings tables.",
                       epilog=epilog([
                           ("shallowmirror info", "version, native or pure-Python codec, tansu"),
                           ("shallowmirror info --config-reference",
                            "every configuration key, type, default and meaning (Markdown)"),
                       ]))
    p.add_argument("--config-reference", action="store_true",
                   help="print every configuration key as Markdown (the README's reference)")
    p.add_argument("--write-readme", metavar="README",
                   help="rewrite the configuration reference block of this README in place")
    p.set_defaults(func=run)


def config_reference() -> str:
    """Mirror, engine and connection keys as Markdown, from the settings tables themselves."""
    from shallowmirror.mirror.config import config_reference_markdown
    from shallowmirror.net.config import CONNECTION_SETTINGS

    return config_reference_markdown().rstrip() + "\n\n" + CONNECTION_SETTINGS.markdown()


README_START = "<!-- config-reference:start (generated: shallowmirror info --write-readme README.md) -->"
README_END = "<!-- config-reference:end -->"


def readme_with_reference(text: str) -> str | None:
    """``text`` with the block between the reference markers replaced by the current reference;
    None when it has no such block."""
    head, start, rest = text.partition(README_START)
    _, end, tail = rest.partition(README_END)
    if not start or not end:
        return None
    return f"{head}{README_START}\n{config_reference()}{README_END}{tail}"


def write_readme(name: str) -> int:
    """``--write-readme``: rewrite the reference block of README ``name`` in place; the exit
    status, with a one-line reason on stderr when the file cannot be read or has no block."""
    import sys
    from pathlib import Path

    path = Path(name)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else \
            "not a UTF-8 text file"
        print(f"shallowmirror info: cannot read {name}: {reason}", file=sys.stderr)
        return 1
    new = readme_with_reference(text)
    if new is None:
        print(f"shallowmirror info: {name} has no configuration reference block to rewrite "
              f"(the lines {README_START!r} ... {README_END!r})", file=sys.stderr)
        return 1
    if new == text:
        print(f"the configuration reference in {path} is up to date")
        return 0
    try:
        path.write_text(new, encoding="utf-8")
    except OSError as err:
        print(f"shallowmirror info: cannot write {name}: {err.strerror or err}", file=sys.stderr)
        return 1
    print(f"updated the configuration reference in {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.write_readme:
        return write_readme(args.write_readme)
    if args.config_reference:
        print(config_reference(), end="")
        return 0
    from shallowmirror import __version__, codec
    from shallowmirror.engine import hotpath
    from shallowmirror.net import connection

    print(f"shallowmirror {__version__}")
    print(f"codec: {codec.IMPLEMENTATION}")
    # Each native module falls back to its twin on its own: a partial build shows here.
    print(f"engine loops: {hotpath.IMPLEMENTATION}")
    print(f"send path: {connection.SEND_IMPLEMENTATION}")
    try:
        from shallowmirror.testing.embedded import find_tansu

        print(f"tansu: {find_tansu()}")
    except Exception as err:  # noqa: BLE001 - info must always print something useful
        print(f"tansu: unavailable ({err})")
    try:
        from shallowmirror.testing.kafka import find_kafka_home

        print(f"kafka: {find_kafka_home()} (for brokers --broker kafka and bench mode mm2)")
    except Exception as err:  # noqa: BLE001
        print(f"kafka: not found: {err}")
    try:
        from shallowmirror.reports.spark import check_java

        java = check_java()
        print(f"java: {java.major} at {java.path} (for Spark reports)")
    except Exception as err:  # noqa: BLE001
        print(f"java: unavailable: {err}")
    return 0
