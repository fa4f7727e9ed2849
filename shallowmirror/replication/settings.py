"""mm2.properties keys of the offset half (offset syncs and checkpoints), MM2's names and
defaults except where noted; ``mirror/config.py`` adds them to the mirror's settings table."""

from __future__ import annotations

from shallowmirror.mirror.filters import pattern_problem
from shallowmirror.settings import Setting

#: MM2's DefaultGroupFilter exclusions.
GROUPS_EXCLUDE_DEFAULT = ("console-consumer-.*", "connect-.*", "__.*")

OFFSET_SETTINGS = [
    Setting("emit.offset-syncs.enabled", "bool", True,
            "Write offset syncs (MM2's encoding) to `mm2-offset-syncs.<target>.internal`: one "
            "per change of the source->target offset delta (gaps) plus the end of what is "
            "mirrored per partition. They make translation exact, also after a restart.",
            scope="flow"),
    Setting("offset-syncs.topic.location", "str", "source",
            "Cluster holding the offset-syncs topic: `source` (MM2's default) or `target` "
            "(KIP-716, for a source the mirror may not write to).", scope="flow",
            choices=("source", "target")),
    Setting("offset-syncs.topic.replication.factor", "int", -1,
            "Replication factor of the offset-syncs topic when it is created; -1 takes the "
            "broker's default (MM2's default is 3).", scope="flow", minimum=-1),
    Setting("emit.checkpoints.enabled", "bool", True,
            "Write consumer-group checkpoints (MM2's encoding, exact offsets) to "
            "`<source>.checkpoints.internal` on the target, readable by MM2's "
            "`RemoteClusterUtils.translateOffsets`.", scope="flow"),
    Setting("emit.checkpoints.interval.seconds", "float", 60.0,
            "How often group offsets are translated and checkpointed.", scope="flow",
            minimum=0.1),
    Setting("checkpoints.topic.replication.factor", "int", -1,
            "Replication factor of the checkpoints topic when it is created; -1 takes the "
            "broker's default (MM2's default is 3).", scope="flow", minimum=-1),
    Setting("groups", "list", [".*"],
            "Consumer groups to checkpoint: names and/or regexes, each matching the whole "
            "name.", scope="flow", validator=pattern_problem),
    Setting("groups.exclude", "list", list(GROUPS_EXCLUDE_DEFAULT),
            "Consumer groups never checkpointed (names and/or regexes). The mirror's own group "
            "is never checkpointed either.", scope="flow", validator=pattern_problem),
    Setting("groups.blacklist", "list", None, "Deprecated name of `groups.exclude`.",
            scope="flow", validator=pattern_problem),
    Setting("refresh.groups.enabled", "bool", True,
            "Look for new consumer groups on the source periodically (otherwise the groups "
            "listed at start are checkpointed).", scope="flow"),
    Setting("refresh.groups.interval.seconds", "float", 600.0,
            "How often the source's consumer groups are listed.", scope="flow", minimum=0.1),
    Setting("replication.policy.internal.topic.separator.enabled", "bool", True,
            "Use `replication.policy.separator` in the internal topic names (offset syncs, "
            "checkpoints) too; false uses `.` there (MM2 before 3.0).", scope="flow"),
]

#: Keys this table implements (they leave the mirror's "accepted and ignored" list).
OFFSET_KEYS = frozenset(s.name for s in OFFSET_SETTINGS)
