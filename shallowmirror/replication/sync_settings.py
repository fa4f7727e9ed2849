"""mm2.properties keys of consumer-group offset sync and reverse checkpointing (KIP-1098),
MM2's names and defaults; ``mirror/config.py`` adds them to the mirror's settings table and checks
the cross-flow rule (``reverse_checkpointing_problems``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shallowmirror.mirror.filters import pattern_problem
from shallowmirror.settings import Setting

#: The one topic filter class shallowmirror implements (MM2's default), by its MM2 names.
DEFAULT_TOPIC_FILTERS = ("org.apache.kafka.connect.mirror.DefaultTopicFilter",
                         "DefaultTopicFilter")


def _filter_class_problem(value: str) -> str | None:
    if not value or value in DEFAULT_TOPIC_FILTERS:
        return None
    return (f"unknown class {value!r}; shallowmirror implements "
            "org.apache.kafka.connect.mirror.DefaultTopicFilter (configure it with "
            "reverse.checkpointing.topic.filter.topics / .topics.exclude)")


GROUP_SYNC_SETTINGS = [
    Setting("sync.group.offsets.enabled", "bool", False,
            "Write the checkpointed (translated) offsets into the consumer groups on the target, "
            "as MM2: only groups with no active member there (an active group is logged once "
            "and left alone), and never moving a group's committed offset backwards.",
            scope="flow"),
    Setting("sync.group.offsets.interval.seconds", "float", 60.0,
            "How often checkpointed offsets are written to the target's consumer groups.",
            scope="flow", minimum=0.1),
]

REVERSE_CHECKPOINT_SETTINGS = [
    Setting("reverse.checkpointing.enabled", "bool", False,
            "KIP-1098, for A<->B: flow B->A also checkpoints what a group consumed on B's copies "
            "of A's topics (`A.orders` on B), translated back exactly with A->B's offset syncs, "
            "as a checkpoint of `orders` in `B.checkpoints.internal` on A (and, with "
            "sync.group.offsets.enabled, into the group on A): failing back to A resumes where "
            "the group stopped on B. Needs the opposite flow A->B enabled.", scope="flow"),
    Setting("reverse.checkpointing.topic.filter.class", "str", None,
            "Topic filter of reverse checkpointing; only MM2's DefaultTopicFilter is "
            "implemented. Unset: every topic on the source that came from the target (policy's "
            "topicSource) is reverse checkpointed.", scope="flow",
            validator=_filter_class_problem),
    Setting("reverse.checkpointing.topic.filter.topics", "list", None,
            "Topics (names on this flow's source, e.g. `A.orders` on B; regexes allowed) to "
            "reverse checkpoint; required with IdentityReplicationPolicy, which cannot tell "
            "where a topic came from.", scope="flow", validator=pattern_problem),
    Setting("reverse.checkpointing.topic.filter.topics.exclude", "list", [],
            "Topics never reverse checkpointed (names and/or regexes).", scope="flow",
            validator=pattern_problem),
]

SYNC_KEYS = frozenset(s.name for s in GROUP_SYNC_SETTINGS + REVERSE_CHECKPOINT_SETTINGS)


def reverse_checkpointing_problems(flows: Sequence[Any]) -> list[str]:
    """Cross-flow checks: reverse checkpointing of B->A needs A->B enabled, and a topic filter
    when the policy cannot tell where a topic came from."""
    problems: list[str] = []
    by_name = {(f.source, f.target): f for f in flows}
    for flow in flows:
        s = flow.settings
        if not s.get("reverse.checkpointing.enabled"):
            continue
        where = f"{flow.source}->{flow.target}.reverse.checkpointing.enabled"
        opposite = by_name.get((flow.target, flow.source))
        back = f"{flow.target}->{flow.source}"
        if opposite is None:
            problems.append(f"{where}: needs the opposite flow {back} enabled (its offset "
                            f"syncs translate back); set {back}.enabled = true")
        elif not (opposite.shallow and opposite.settings.get("emit.offset-syncs.enabled", True)):
            problems.append(f"{where}: the opposite flow {back} writes no offset syncs to "
                            "translate back with (it needs use.raw.bytes = true and "
                            "emit.offset-syncs.enabled = true)")
        if not flow.policy.detects_cycles and not s.get("reverse.checkpointing.topic.filter.topics"):
            problems.append(f"{where}: IdentityReplicationPolicy cannot tell which topics came "
                            f"from {flow.target}: set {flow.source}->{flow.target}."
                            "reverse.checkpointing.topic.filter.topics")
    return problems


def group_sync_warnings(flows: Sequence[Any]) -> list[str]:
    """Settings that do nothing: group offset sync and reverse checkpointing write what the
    flow checkpoints, so without ``emit.checkpoints.enabled`` there is nothing (as in MM2,
    whose checkpoint task does both)."""
    warnings: list[str] = []
    for flow in flows:
        s = flow.settings
        if s.get("emit.checkpoints.enabled", True):
            continue
        for key in ("sync.group.offsets.enabled", "reverse.checkpointing.enabled"):
            if s.get(key):
                warnings.append(f"{flow.source}->{flow.target}.{key} does nothing with "
                                "emit.checkpoints.enabled = false (it works on the flow's "
                                "checkpoints)")
    return warnings
