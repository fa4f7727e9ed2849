"""Entry point of the `shallowmirror` command and `python -m shallowmirror`.

Each subcommand lives in its own module exposing ``add_parser(subparsers)`` (which registers the
subcommand and sets ``func``) so that ``--help`` lists exactly the subcommands that exist.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import select
import signal
import sys

from shallowmirror import __version__
from shallowmirror.cli.formatting import HelpFormatter, add_log_level, epilog
from shallowmirror.cli.stop_signals import StopSignals, outcome

#: Modules under shallowmirror.cli, in the order --help shows them.
SUBCOMMANDS = ["mirror", "legacy", "verify", "offsets", "load", "bench", "report", "brokers", "info"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shallowmirror",
        description="Mirror Kafka topics by forwarding compressed RecordBatches byte for byte.",
        formatter_class=HelpFormatter,
        epilog=epilog([
            ("shallowmirror brokers A B",
             "start two embedded test clusters and print their bootstrap addresses"),
            ("shallowmirror mirror mm2.properties --check",
             "validate a MirrorMaker 2 configuration without connecting"),
            ("shallowmirror mirror mm2.properties", "run its flows until SIGTERM/Ctrl-C"),
            ("shallowmirror COMMAND --help", "options and examples of one command"),
        ]),
    )
    parser.add_argument("--version", action="version", version=f"shallowmirror {__version__}")
    add_log_level(parser, default="INFO")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"shallowmirror.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"shallowmirror.cli.{name}":
                continue  # not written yet
            raise
        module.add_parser(sub)
    for subparser in _all_subparsers(sub):
        # One look for every command's help, and --log-level after the command name too
        # (and after an action's: `offsets translate ... --log-level DEBUG`).
        subparser.formatter_class = HelpFormatter
        add_log_level(subparser, default=argparse.SUPPRESS)
    return parser


def _all_subparsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    """The parsers of ``sub``'s commands and of their own actions, at any depth."""
    found = []
    for parser in sub.choices.values():
        found.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found.extend(_all_subparsers(action))
    return found


def _chosen_parser(parser: argparse.ArgumentParser,
                   args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command (and action) ``args`` were parsed for: ``parser`` itself when
    none was chosen."""
    while True:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = getattr(args, action.dest, None)
                if chosen in action.choices:
                    parser = action.choices[chosen]
                    break
        else:
            return parser


def main(argv: list[str] | None = None) -> int:
    try:
        # Importing every subcommand takes a tenth of a second: a Ctrl-C then is no crash.
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:
            # Said by the command's own parser: its usage line, not the top level's.
            _chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    except KeyboardInterrupt:
        print("shallowmirror: interrupted", file=sys.stderr)
        return 130
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    stops = StopSignals.install()
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that left (`| head`) is found here, not at exit
        stops.check()      # a Ctrl-C lost on its way still ends the command as one
        return code
    except KeyboardInterrupt as interrupt:
        return _interrupted(args.command, interrupt)
    except BrokenPipeError as err:
        if _reader_left():
            return 128 + signal.SIGPIPE
        return _unexpected(args.command, err)
    except Exception as err:  # noqa: BLE001 - the last line of defence: a message, not a trace
        interrupt = stops.received_interrupt()
        if interrupt is not None:
            logging.getLogger("shallowmirror").debug("after the stop signal", exc_info=err)
            return _interrupted(args.command, interrupt)
        return _unexpected(args.command, err)


def _reader_left() -> bool:
    """Whether standard output's reader has gone (``shallowmirror info | head -1``). If so, the
    command ends quietly with the status a shell gives a tool SIGPIPE ended, as Unix tools do,
    and the rest of its output goes nowhere (not into an error at exit). A pipe whose reader
    closed polls as an error; a broken pipe of a socket or a child leaves stdout as it was."""
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        if not any(events & select.POLLERR for _, events in poll.poll(0)):
            return False
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):   # no real stdout (embedded, captured)
        return False
    return True


def _interrupted(command: str, interrupt: KeyboardInterrupt) -> int:
    status, word = outcome(interrupt)
    print(f"shallowmirror {command}: {word}", file=sys.stderr)
    return status


def _unexpected(command: str, err: BaseException) -> int:
    """An error no command turned into a message: one line for the user, the traceback only in
    the DEBUG log (where a bug report can come from)."""
    from shallowmirror.errors import ShallowMirrorError

    logging.getLogger("shallowmirror").debug("traceback of the error below", exc_info=err)
    if isinstance(err, ShallowMirrorError):
        print(f"shallowmirror {command}: {err}", file=sys.stderr)
        return 2 if err.__class__.__name__ == "ConfigError" else 1
    try:
        text = str(err)
    except Exception:  # noqa: BLE001 - some exceptions cannot print themselves (py4j's)
        text = "(no description)"
    print(f"shallowmirror {command}: unexpected {type(err).__name__}: {text} (this is a bug; "
          "--log-level DEBUG shows where it happened)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
