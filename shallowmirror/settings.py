"""Typed settings tables: one place that names, types, defaults, documents and validates a key.

Engine (``shallowmirror.engine.config``) and mirror process (``shallowmirror.mirror.config``)
each declare a ``SettingsTable``. The same table parses Kafka-style string properties, reports
*every* problem at once (``ConfigError``), warns about unknown keys with the closest known key,
and renders the README's configuration reference and ``--help`` text.

Keys follow Kafka's dotted convention (``bootstrap.servers``); where MirrorMaker 2 has a name for
a setting, that name is used.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shallowmirror.errors import ConfigError

log = logging.getLogger(__name__)

#: A validator returns None when the value is fine, else a message saying what is wrong.
Validator = Callable[[Any], "str | None"]


def _parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true or false (or yes/no, on/off, 1/0), got {raw!r}")


def _parse_list(raw: Any) -> list[str]:
    if isinstance(raw, (list, tuple)):
        return [str(item).strip() for item in raw if str(item).strip()]
    return [item.strip() for item in str(raw).split(",") if item.strip()]


def _parse_int(raw: Any) -> int:
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ValueError(f"expected a whole number, got {raw!r}") from None


def parse_float(raw: Any) -> float:
    """A finite float from a raw value; ValueError (with the reason) otherwise."""
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ValueError(f"expected a number, got {raw!r}") from None
    if not math.isfinite(value):
        # nan passes every minimum check (all its comparisons are false) and an interval of
        # nan seconds busy-loops: a finite number is the only meaningful value.
        raise ValueError(f"expected a finite number, got {raw!r}")
    return value


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "str": lambda raw: str(raw).strip(),
    "int": _parse_int,
    "float": parse_float,
    "bool": _parse_bool,
    "list": _parse_list,
}


@dataclass(frozen=True)
class Setting:
    """One configuration key: name, type (str/int/float/bool/list), default, doc, validation."""

    name: str
    type: str
    default: Any
    doc: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    validator: Validator | None = None
    #: Where the key belongs in MM2-style configs ("flow", "cluster", "process"); informational.
    scope: str = "process"

    def parse(self, raw: Any) -> Any:
        """Convert a raw (usually string) value; raise ValueError with a reason if it is bad."""
        value = _PARSERS[self.type](raw)
        if self.choices is not None and str(value) not in self.choices:
            raise ValueError(f"must be one of {', '.join(self.choices)}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be at least {self.minimum:g}, got {value!r}")
        if self.validator is not None:
            problem = self.validator(value)
            if problem:
                raise ValueError(problem)
        return value


@dataclass
class SettingsTable:
    """An ordered set of settings with parsing, validation and documentation."""

    title: str
    settings: list[Setting] = field(default_factory=list)
    #: Prefixes passed through untouched (e.g. "ssl.", "sasl." client keys), never warned about.
    passthrough_prefixes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._by_name = {s.name: s for s in self.settings}

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Setting:
        return self._by_name[name]

    def names(self) -> list[str]:
        return list(self._by_name)

    def extend(self, settings: Iterable[Setting]) -> None:
        for setting in settings:
            self.settings.append(setting)
            self._by_name[setting.name] = setting

    def is_passthrough(self, key: str) -> bool:
        return key.startswith(self.passthrough_prefixes)

    def closest(self, key: str) -> str | None:
        """The known key most like ``key``, for 'did you mean' messages."""
        match = difflib.get_close_matches(key, self._by_name, n=1, cutoff=0.6)
        return match[0] if match else None

    def resolve(self, raw: Mapping[str, Any], *, context: str = "",
                warn_unknown: bool = True) -> dict[str, Any]:
        """Defaults overlaid with parsed ``raw`` values; every bad value reported at once.

        Unknown keys are kept as strings (they may be client keys passed through to librdkafka)
        and, unless passthrough, logged with the closest known key."""
        values = {s.name: s.default for s in self.settings}
        problems: list[str] = []
        where = f" ({context})" if context else ""
        for key, value in raw.items():
            setting = self._by_name.get(key)
            if setting is None:
                if warn_unknown and not self.is_passthrough(key):
                    hint = self.closest(key)
                    log.warning("unknown configuration key %r%s%s", key, where,
                                f"; did you mean {hint!r}?" if hint else "")
                values[key] = value
                continue
            try:
                values[key] = setting.parse(value)
            except (ValueError, TypeError) as err:
                problems.append(f"{key}{where}: {err}")
        if problems:
            raise ConfigError(problems)
        return values

    def markdown(self, exclude: Iterable[str] = ()) -> str:
        """The configuration reference as a Markdown table (for README), without ``exclude``
        (keys another table already documents)."""
        rows = [f"### {self.title}", "", "| key | type | default | description |",
                "|---|---|---|---|"]
        skip = set(exclude)
        for s in self.settings:
            if s.name in skip:
                continue
            default = "" if s.default is None else s.default
            if isinstance(default, list):
                default = ",".join(default)
            doc = s.doc + (f" One of: {', '.join(s.choices)}." if s.choices else "")
            rows.append(f"| `{s.name}` | {s.type} | `{default}` | {doc} |")
        return "\n".join(rows) + "\n"

    def help_text(self) -> str:
        """Plain-text reference for ``--help`` epilogs."""
        import textwrap

        lines = [f"{self.title}:"]
        for s in self.settings:
            default = "none" if s.default is None else s.default
            if isinstance(default, list):
                default = ", ".join(default) or "empty"
            lines += textwrap.wrap(f"{s.name} ({s.type}, default {default})", width=96,
                                   initial_indent="  ", subsequent_indent="      ")
            doc = s.doc.replace("`", "") + (f" One of: {', '.join(s.choices)}."
                                            if s.choices else "")
            lines += textwrap.wrap(doc, width=96, initial_indent="      ",
                                   subsequent_indent="      ")
        return "\n".join(lines)
