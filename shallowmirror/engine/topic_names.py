"""Kafka's rule for topic names, and the check of what a ``topic_mapper`` returns.

A mapper is the embedder's code: what it returns goes into Produce requests and CreateTopics.
A result that is not a ``str`` failed deep inside confluent-kafka's ``NewTopic`` or the encoder,
and an illegal name was created as it was on tansu (Kafka refuses it), so it is checked once
per source topic, where the name is first asked for, and the error names both.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Iterable, Sequence

from shallowmirror.errors import ShallowMirrorError

#: What Kafka accepts as a topic name (``org.apache.kafka.common.internals.Topic.validate``).
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
RULE = "1-249 of a-z A-Z 0-9 . _ -, not . or .."


class TopicMapperError(ShallowMirrorError, ValueError):
    """A ``topic_mapper`` (or a ``topics`` predicate) raised, or returned what it may not: not
    a legal Kafka topic name (a predicate: not True or False)."""


@functools.lru_cache(maxsize=1024)
def legal_topic(name: str) -> bool:
    """A name Kafka accepts for a topic (cached: the forwarder asks it per batch)."""
    return _LEGAL_TOPIC.fullmatch(name) is not None and name not in (".", "..")


#: Kafka's own topics: a mapper's name may not be one of them (tansu took the records into
#: its __consumer_offsets; Kafka stopped every partition with a bare INVALID_TOPIC).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__cluster_metadata",
                             "__share_group_state"})


def callable_name(code: object) -> str:
    """How an error names the embedder's callable: its qualified name, quoted."""
    return repr(getattr(code, "__qualname__", code))


def closest_name(name: str, names: Iterable[str]) -> str | None:
    """The listed topic most like ``name`` (a typo, another case), or None."""
    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.75)
    return by_lower[close[0]] if close else None


def unmatched_names(include: Sequence[str], listed: Iterable[str], alias: str) -> list[str]:
    """For each entry of ``topics`` that is a plain topic name (no regex but the '.' of a
    name) and names no listed topic: what to say, with the closest listed name. A typo or a
    wrong case ('Orders') in a list whose other entries match was mirrored as nothing, without
    a word (only a list matching nothing at all is refused)."""
    names = list(listed)
    lines = []
    for entry in include:
        if not _PLAIN_NAME.fullmatch(entry) or any(
                re.fullmatch(entry, name) for name in names):
            continue
        close = closest_name(entry, names)
        hint = f"; did you mean {close!r}?" if close else ""
        lines.append(f"topics entry {entry!r} names no topic on cluster {alias} (it is "
                     f"mirrored once it is created){hint}")
    return lines


#: A topics entry that is a topic name as written (its '.' matches itself too).
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]+")


def mapped_topic(mapper: Callable[[str], str], topic: str) -> str:
    """``mapper(topic)``, refused with ``TopicMapperError`` unless it is a legal topic name (and
    not one of Kafka's own); what the mapper raises comes as a ``TopicMapperError`` too, naming
    the mapper and the source topic (its exception as the cause)."""
    try:
        target = mapper(topic)
    except Exception as err:
        raise TopicMapperError(f"topic_mapper {callable_name(mapper)} raised "
                               f"{type(err).__name__}: {err} for source topic {topic}") from err
    if not isinstance(target, str):
        raise TopicMapperError(
            f"topic_mapper {callable_name(mapper)} returned {type(target).__name__} "
            f"{target!r} for source topic {topic}: it must return the target topic's name, a "
            f"str ({RULE})")
    if target in INTERNAL_TOPICS:
        raise TopicMapperError(f"topic_mapper {callable_name(mapper)} returned {target!r} for "
                               f"source topic {topic}: that is one of Kafka's own topics")
    if not legal_topic(target):
        raise TopicMapperError(
            f"topic_mapper {callable_name(mapper)} returned {target!r} for source topic "
            f"{topic}: not a legal Kafka topic name ({RULE})")
    return target
