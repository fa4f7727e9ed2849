"""What every subcommand's ``--help`` shares: the formatter, examples, and ``--log-level``.

One formatter for all subcommands: descriptions are re-wrapped to the terminal, epilogs (examples
and settings references, which are laid out by hand) are kept as written, and an option's default
is shown only when it has one and its help does not already say it.
"""

from __future__ import annotations

import argparse
import textwrap

#: Log levels ``--log-level`` accepts (any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class HelpFormatter(argparse.HelpFormatter):
    """Wrapped descriptions, verbatim epilogs, ``(default: X)`` only where it says something."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is argparse.SUPPRESS
                or default == [] or isinstance(default, bool)
                or action.option_strings == [] or "%(default)" in text):
            return text
        return text + " (default: %(default)s)"

    def add_text(self, text: str | None) -> None:
        # The epilog is laid out by hand (examples, settings): argparse would join its lines.
        if text and text.startswith(_VERBATIM):
            self._add_item(lambda t: t[len(_VERBATIM):] + "\n", [text])
            return
        super().add_text(text)


_VERBATIM = "\x00verbatim\x00"


def epilog(examples: list[tuple[str, str]], extra: str = "") -> str:
    """An epilog of ``examples`` (command, what it does), then ``extra``, kept as laid out."""
    lines = ["examples:"]
    for command, what in examples:
        lines += _shell_lines(command)
        lines += textwrap.wrap(what, width=96, initial_indent="      ",
                               subsequent_indent="      ")
    text = "\n".join(lines)
    if extra:
        text += "\n\n" + extra.rstrip()
    return _VERBATIM + text


def _shell_lines(command: str, width: int = 94) -> list[str]:
    """A long command line split at spaces with shell continuations, as a user would paste it."""
    lines, current = [], "  "
    for word in command.split(" "):
        if len(current) + len(word) + 1 > width and current.strip():
            lines.append(current + " \\")
            current = "      "
        current += ("" if current.endswith(" ") else " ") + word
    return lines + [current]


def finite_float(text: str) -> float:
    """A number of seconds (or any float option), parsed as a settings key's float is
    (``settings.parse_float``): nan and inf are refused, nan slips past every bound and never
    ends a wait."""
    from shallowmirror.settings import parse_float

    try:
        return parse_float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def log_level(text: str) -> str:
    """``--log-level`` values, case-insensitive; anything else is refused by argparse."""
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid level {text!r} (choose from {', '.join(LOG_LEVELS)})")
    return level


def add_log_level(parser: argparse.ArgumentParser, *, default: object) -> None:
    """``--log-level`` on ``parser``; subcommands pass SUPPRESS so that the option works before
    and after the subcommand name."""
    parser.add_argument("--log-level", type=log_level, default=default, metavar="LEVEL",
                        help=f"log level: {', '.join(LOG_LEVELS)} (default INFO)")
