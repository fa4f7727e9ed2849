"""Checks of the public API's arguments, at the call (``TypeError``/``ValueError``).

The same mistake found deep inside the engine said much less: a bootstrap string for a config
map was "dictionary update sequence element #0 has length 1", an int for topics "'int' object is
not iterable". ``mirror``/``mirror_async``, ``ensure_target_topics``, ``MirrorEngine`` and the
forwarders check with these.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Collection, Mapping
from typing import Any


def check_configs(call: str, source_config: Any, target_config: Any) -> None:
    """Both client configs are mappings of client settings."""
    for name, config in (("source_config", source_config), ("target_config", target_config)):
        if not isinstance(config, Mapping):
            raise TypeError(f"{call}(): {name} must be a mapping of client settings such as "
                            f"{{'bootstrap.servers': 'host:9092'}}, not "
                            f"{type(config).__name__} {config!r}")


def check_topics(call: str, topics: Any, *, allow_empty: bool = False) -> None:
    """A list of topic names, a regex (str) or a predicate (an empty list only if allowed: an
    engine's topics may be set later, ``set_topics``)."""
    if isinstance(topics, str):
        try:
            re.compile(topics)
        except re.error as err:
            raise ValueError(f"{call}(): topics {topics!r} is not a valid regular expression: "
                             f"{err}") from err
        return
    if callable(topics):
        return
    if isinstance(topics, bytes | Mapping) or not isinstance(topics, Collection):
        raise TypeError(f"{call}(): topics must be a list of topic names, a regex (str) or "
                        f"a predicate, not {type(topics).__name__} {topics!r}")
    bad = [t for t in topics if not isinstance(t, str) or not t]
    if bad:
        raise TypeError(f"{call}(): topics must be non-empty topic names (str); got {bad!r}")
    if not topics and not allow_empty:
        raise ValueError(f"{call}(): topics is empty: nothing to mirror")


def check_mapper(call: str, topic_mapper: Any) -> None:
    if not callable(topic_mapper):
        raise TypeError(f"{call}(): topic_mapper must be a function from source to target topic "
                        f"name, not {type(topic_mapper).__name__} {topic_mapper!r}")


def check_settings(call: str, settings: Any) -> None:
    """Engine settings: a mapping (or None)."""
    if settings is not None and not isinstance(settings, Mapping):
        raise TypeError(f"{call}(): settings must be a mapping of engine settings such as "
                        f"{{'fetch.max.bytes': 52428800}} or None, not "
                        f"{type(settings).__name__} {settings!r}")


def check_seconds(call: str, name: str, value: Any) -> None:
    """A number of seconds >= 0, or None."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{call}(): {name} must be a number of seconds or None, not "
                        f"{type(value).__name__} {value!r}")
    if math.isnan(value) or value < 0:
        raise ValueError(f"{call}(): {name} must be >= 0 seconds, not {value!r}")


def check_engine_arguments(call: str, source_config: Any, target_config: Any, topics: Any,
                           settings: Any) -> None:
    """What an engine (``MirrorEngine``, the forwarders) is built from; its topics may be
    empty (set later)."""
    check_configs(call, source_config, target_config)
    check_topics(call, topics, allow_empty=True)
    check_settings(call, settings)
