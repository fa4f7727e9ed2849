"""Topic and topic-config filters, as MirrorMaker 2's DefaultTopicFilter and
DefaultConfigPropertyFilter: comma-separated lists of names and/or regexes, each matched against
the *whole* name (Java ``Matcher.matches``), joined with ``|``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: DefaultTopicFilter.TOPICS_EXCLUDE_DEFAULT (Kafka 3.x).
TOPICS_EXCLUDE_DEFAULT = [r".*[\-\.]internal", r".*\.replica", r"__.*"]

#: DefaultConfigPropertyFilter.CONFIG_PROPERTIES_EXCLUDE_DEFAULT: cluster-local operational
#: settings that must not follow the data to another cluster.
CONFIG_PROPERTIES_EXCLUDE_DEFAULT = [
    r"follower\.replication\.throttled\.replicas",
    r"leader\.replication\.throttled\.replicas",
    r"message\.timestamp\.difference\.max\.ms",
    # Beyond MM2's list: a source topic's window (e.g. 7 days) would make the target reject a
    # backlog mirrored later than that window, records the source itself accepted.
    r"message\.timestamp\.before\.max\.ms",
    r"message\.timestamp\.after\.max\.ms",
    r"message\.timestamp\.type",
    r"unclean\.leader\.election\.enable",
    r"min\.insync\.replicas",
]

#: Never copied whatever the filter says: the mirror sets it itself (``producer``), because any
#: other value makes the target broker decompress and recompress every forwarded batch.
FORCED_TOPIC_CONFIGS = {"compression.type": "producer"}


_JAVA_CLASS = re.compile(r"\\[pP]\{(\w+)\}")


def java_only(regex: str) -> str | None:
    """What in ``regex`` Java's regexes take and Python's do not (a ``\\p{Alnum}`` class), said
    by name with what to write instead; None when there is none."""
    found = _JAVA_CLASS.search(regex)
    if found is None:
        return None
    return (f"{found.group(0)} is a Java character class, which Python's regexes lack; write "
            "the class out instead (\\p{Alnum} is [A-Za-z0-9], \\p{Alpha} [A-Za-z], "
            "\\p{Digit} [0-9])")


def regex_problem(regex: str, shown: str | None = None) -> str | None:
    """``bad regex '<shown>': <why>`` when ``regex`` does not compile here (a Java-only
    construct named as such), else None; ``shown`` (default ``regex``) is what the user wrote."""
    shown = regex if shown is None else shown
    java = java_only(regex)
    if java:
        return f"bad regex '{shown}': {java}"
    try:
        re.compile(regex)
    except re.error as err:
        return f"bad regex '{shown}': {err}"
    return None


def compile_pattern_list(patterns: Iterable[str]) -> re.Pattern[str] | None:
    """MirrorUtils.compilePatternList: ``a, b.*`` -> one regex; None for an empty list.

    Raises ``re.error`` naming the bad entry."""
    items = [p.strip() for p in patterns if p and p.strip()]
    if not items:
        return None
    for item in items:
        problem = regex_problem(item)
        if problem:
            raise re.error(problem)
    return re.compile("|".join(f"(?:{item})" for item in items))


def pattern_problem(patterns: Sequence[str]) -> str | None:
    """Settings validator: None if every entry compiles, else what is wrong."""
    try:
        compile_pattern_list(patterns)
    except re.error as err:
        return str(err)
    return None


def _matches(pattern: re.Pattern[str] | None, name: str) -> bool:
    return pattern is not None and pattern.fullmatch(name) is not None


@dataclass(frozen=True)
class TopicFilter:
    """Replicate topics matching ``topics`` and not matching ``topics.exclude``."""

    include: tuple[str, ...] = (".*",)
    exclude: tuple[str, ...] = tuple(TOPICS_EXCLUDE_DEFAULT)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_include", compile_pattern_list(self.include))
        object.__setattr__(self, "_exclude", compile_pattern_list(self.exclude))

    def should_replicate_topic(self, topic: str) -> bool:
        return _matches(self._include, topic) and not _matches(self._exclude, topic)


@dataclass(frozen=True)
class ConfigPropertyFilter:
    """Replicate topic config properties not matching ``config.properties.exclude``."""

    exclude: tuple[str, ...] = tuple(CONFIG_PROPERTIES_EXCLUDE_DEFAULT)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_exclude", compile_pattern_list(self.exclude))

    def should_replicate_config_property(self, name: str) -> bool:
        return name not in FORCED_TOPIC_CONFIGS and not _matches(self._exclude, name)

    def target_configs(self, source_configs: dict[str, str]) -> dict[str, str]:
        """What the remote topic should carry: the filtered source configs plus forced ones."""
        kept = {k: v for k, v in source_configs.items()
                if self.should_replicate_config_property(k)}
        kept.update(FORCED_TOPIC_CONFIGS)
        return kept
