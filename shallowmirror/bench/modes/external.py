"""The ``external`` mode: any mirror command line (e.g. a user's MirrorMaker 2), run by ``sh -c``.

Placeholders in the template, filled by the harness: ``{source}`` and ``{target}`` (bootstrap
servers), ``{topic}`` (source topic), ``{target_topic}`` (where the harness waits for the
records), ``{latency_topic}`` and ``{target_latency_topic}`` (the probes' companion topic; a
command that does not mirror it just gets no latency samples), ``{topics_regex}`` (both source
topics, for tools that take an include pattern) and ``{group}`` (a group id unique to the run).
The command must keep running (or exit) after copying; the harness stops its process group with
SIGTERM once every record is on the target, so any exit status after that is accepted.
"""

from __future__ import annotations

import re
import string

PLACEHOLDERS = ("source", "target", "topic", "target_topic", "latency_topic",
                "target_latency_topic", "topics_regex", "group")


def check_template(template: str) -> list[str]:
    """Problems with a command template (unknown placeholders, bad braces); [] if usable."""
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name]
    except ValueError as err:
        return [f"bad braces in external command: {err}"]
    return [f"unknown placeholder {{{name}}} in external command (known: "
            f"{', '.join(PLACEHOLDERS)})" for name in fields if name not in PLACEHOLDERS]


def target_topic_of(template: str, topic: str) -> str:
    """``--external-target-topic`` may name the topic (``mirrored``) or derive it
    (``source.{topic}`` as MirrorMaker 2's default replication policy does)."""
    return template.format(topic=topic) if "{" in template else template


def command(template: str, **values: str) -> list[str]:
    values.setdefault("topics_regex", "|".join(
        re.escape(values[k]) for k in ("topic", "latency_topic") if k in values))
    return ["sh", "-c", template.format(**values)]
