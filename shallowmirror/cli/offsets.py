"""`shallowmirror offsets translate | failover | failback`: exact consumer-group offset
translation along a flow and the tools that move a group between clusters with it
(``shallowmirror.replication``).

Exit status: 0 done (or dry run printed), 1 refused (active members, nothing to translate, no
offset translatable yet), 2 configuration error or a cluster that did not answer, 3 partly: some
partitions have no translatable offset (named on stderr), the others were translated (and
written with --execute).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from shallowmirror.cli.formatting import finite_float

if TYPE_CHECKING:
    from shallowmirror.replication.groups import CommittedOffset

EXAMPLES = [
    ("shallowmirror offsets translate mm2.properties --group billing --flow 'A->B'",
     "where group billing, at its committed offsets on A, resumes on B"),
    ("shallowmirror offsets failover mm2.properties --group billing --to B",
     "dry run: the offsets failover would write for billing on B (from B's checkpoints)"),
    ("shallowmirror offsets failover mm2.properties --group billing --to B --execute",
     "write them (refused while billing has members on B)"),
    ("shallowmirror offsets failback mm2.properties --group billing --to A --execute",
     "billing consumed A's topics on B; move it back to A where it stopped on B"),
]


class OffsetsCommandError(Exception):
    """A refusal or a usage problem: printed as one line, exit status ``code``."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def add_parser(sub: argparse._SubParsersAction) -> None:
    from shallowmirror.cli.formatting import epilog

    p = sub.add_parser(
        "offsets", help="translate consumer-group offsets exactly; fail a group over to the "
                        "target and back",
        description="Exact consumer-group offset translation along a flow, from the flow's "
                    "offset syncs (mm2-offset-syncs.<target>.internal) or checkpoints "
                    "(<source>.checkpoints.internal): a group moved with failover/failback "
                    "re-reads nothing and skips nothing. Exit status: 0 done, 1 refused, 2 "
                    "configuration error or a cluster that did not answer, 3 partly (some "
                    "partitions have no translatable offset yet; the others were translated).",
        epilog=epilog(EXAMPLES))
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("config", metavar="mm2.properties", help="MirrorMaker 2 properties file")
    common.add_argument("--group", required=True, type=_group_id, help="the consumer group")
    common.add_argument("--timeout", type=_timeout_s, default=30.0, metavar="SECONDS",
                        help="how long a cluster may take to answer (default 30, at most "
                             "3600)")
    common.add_argument("--allow-unknown-keys", action="store_true",
                        help="warn about unknown configuration keys instead of refusing")

    t = actions.add_parser("translate", parents=[common], epilog=epilog(EXAMPLES[:1]),
                           help="print the group's source offsets translated to the target",
                           description="Translate the group's committed offsets on the flow's "
                                       "source to the flow's target, exactly, from the offset "
                                       "syncs (the source must answer).")
    t.add_argument("--flow", metavar="A->B", help="the flow (needed when several are enabled)")
    t.set_defaults(func=run_translate)

    f = _move_action(actions, common, "failover", examples=EXAMPLES[1:3],
                     help="move the group to a flow's target cluster",
                     description="Commit on cluster --to the group's offsets translated from "
                                 "its source cluster: from the checkpoints on --to (default: "
                                 "works while the source is down) or, with --live, translated "
                                 "now from the source.",
                     to_help="the cluster to move to",
                     from_dest="source",
                     from_help="the source cluster (needed when several flows go to --to)")
    f.add_argument("--live", action="store_true",
                   help="translate the group's current source offsets instead of reading "
                        "checkpoints")
    f.add_argument("--execute", action="store_true", help="write the offsets")
    f.set_defaults(func=run_failover)

    b = _move_action(actions, common, "failback", examples=EXAMPLES[3:],
                     help="move the group back to the cluster its topics came from",
                     description="The group consumed a flow's remote topics on the flow's "
                                 "target; commit on the flow's source (--to) the source offsets "
                                 "where it stopped there, translated exactly through the flow's "
                                 "offset syncs.",
                     to_help="the cluster to move back to (the flow's source)",
                     from_dest="target",
                     from_help="the cluster the group runs on now (needed when several flows "
                               "leave --to)")
    b.add_argument("--execute", action="store_true", help="write the offsets")
    b.set_defaults(func=run_failback)
    p.set_defaults(func=lambda args: _usage(p))


def _move_action(actions: Any, common: argparse.ArgumentParser, name: str, *, help: str,
                 description: str, to_help: str, from_dest: str, from_help: str,
                 examples: list[tuple[str, str]]) -> argparse.ArgumentParser:
    """A subcommand that moves a group between clusters (failover, failback): its --to and
    --from, and the dry-run/active-members note both share in their description."""
    from shallowmirror.cli.formatting import epilog

    p = actions.add_parser(name, parents=[common], help=help, epilog=epilog(examples),
                           description=description + " A dry run unless --execute; refused "
                                                     "while the group has active members on "
                                                     "--to. Exit status 3: some partitions "
                                                     "have no translated offset; the others "
                                                     "were written (dry run: would be).")
    p.add_argument("--to", required=True, metavar="ALIAS", help=to_help)
    p.add_argument("--from", dest=from_dest, metavar="ALIAS", help=from_help)
    return p


def _group_id(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a consumer group id cannot be empty")
    return text


def _timeout_s(text: str) -> float:
    """Seconds a cluster may take to answer: more than 0, at most an hour (librdkafka's
    limit for a request)."""
    value = finite_float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"expected more than 0 and at most 3600 seconds, got "
                                         f"{text!r}")
    return value


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _pick_flow(config, *, name: str | None = None, source: str | None = None,
               target: str | None = None):
    flows = [f for f in config.flows
             if (name is None or f.name == name) and (source is None or f.source == source)
             and (target is None or f.target == target)]
    wanted = name or f"{source or '*'}->{target or '*'}"
    if not flows:
        enabled = ", ".join(f.name for f in config.flows) or "none"
        raise OffsetsCommandError(f"no enabled flow {wanted} (enabled flows: {enabled})", 2)
    if len(flows) > 1:
        raise OffsetsCommandError(f"several enabled flows match {wanted} "
                                  f"({', '.join(f.name for f in flows)}): name one", 2)
    return flows[0]


def _print_rows(rows, header: tuple[str, str]) -> None:
    print(f"{'partition':>30}  {header[0]:>14}  {header[1]:>14}")
    for r in rows:
        down = "-" if r.downstream is None else str(r.downstream)
        print(f"{r.from_topic + '-' + str(r.partition):>30}  {r.upstream:>14}  "
              f"{r.to_topic + '-' + str(r.partition)} {down}")


def _guarded(func):
    def run(args: argparse.Namespace) -> int:
        from shallowmirror.errors import ConfigError
        from shallowmirror.replication.groups import GroupError
        from shallowmirror.replication.internal_topics import InternalTopicError

        try:
            return func(args)
        except ConfigError as err:
            print(f"shallowmirror offsets: {err}", file=sys.stderr)
            return 2
        except OffsetsCommandError as err:
            print(f"shallowmirror offsets {args.action}: {err}", file=sys.stderr)
            return err.code
        except (GroupError, InternalTopicError) as err:
            print(f"shallowmirror offsets {args.action}: {err}", file=sys.stderr)
            return 2
    return run


@_guarded
def run_translate(args: argparse.Namespace) -> int:
    from shallowmirror.mirror.config import load_mm2
    from shallowmirror.replication.translate import translate_offsets

    flow = _pick_flow(load_mm2(args.config, allow_unknown_keys=args.allow_unknown_keys), name=args.flow)
    rows = _from_the_start(translate_offsets(flow, args.group, timeout_s=args.timeout))
    if not rows:
        raise OffsetsCommandError(f"group {args.group!r} has no committed offsets on cluster "
                                  f"{flow.source} for topics flow {flow.name} mirrors")
    print(f"group {args.group}, flow {flow.name}: committed on {flow.source} -> on "
          f"{flow.target}")
    _print_rows(rows, (f"offset on {flow.source}", f"on {flow.target}"))
    missing = [r for r in rows if r.downstream is None]
    if missing:
        print(_not_translatable(missing), file=sys.stderr)
    if len(missing) == len(rows):
        raise OffsetsCommandError(f"no offset of group {args.group!r} translates to "
                                  f"{flow.target} yet")
    return PARTLY if missing else 0


def _from_the_start(rows: list) -> list:
    """Rows where the group is at offset 0 with nothing of the partition mirrored yet translate
    to 0: the group has read none of it, and every record on the other side is a copy of one
    it has not read (or, failing back, one it never saw), so starting there skips nothing and
    re-reads nothing. Without this an empty partition, which a group commits 0 for, left every
    ordinary move 'partly' done."""
    return [dataclasses.replace(r, downstream=0) if r.downstream is None and r.upstream == 0
            else r for r in rows]


#: Exit status when some partitions had no translatable offset and the others were translated:
#: a script moving a group must not take a partial move for a whole one.
PARTLY = 3


def _not_translatable(rows) -> str:
    names = ", ".join(f"{r.from_topic}-{r.partition}" for r in rows)
    return f"not translatable yet (nothing mirrored): {names}"


def _checkpointed_rows(flow, group: str, timeout_s: float):
    from shallowmirror.replication.checkpoints import checkpoints_topic, read_checkpoints
    from shallowmirror.replication.translate import Translated, source_topic_name

    found = read_checkpoints(flow.target_admin, checkpoints_topic(flow), alias=flow.target,
                             group=group, timeout_s=timeout_s)
    return [Translated(group, source_topic_name(flow, c.topic) or c.topic, c.topic,
                       c.partition, c.upstream_offset, c.downstream_offset, c.metadata)
            for c in sorted(found.values(), key=lambda c: (c.topic, c.partition))]


def _commit(alias: str, admin: dict, group: str, rows, execute: bool,
            timeout_s: float) -> int:
    from shallowmirror.replication.groups import CommittedOffset, Groups

    groups = Groups(admin, alias=alias, timeout_s=timeout_s)
    members = groups.active_members(group)
    if members:
        raise OffsetsCommandError(f"group {group!r} is active on cluster {alias} ({members} "
                                  "member(s)): stop its consumers first (offsets of a running "
                                  "group would be overwritten by its next commit)")
    missing = [r for r in rows if r.downstream is None]
    if missing:
        print(_not_translatable(missing), file=sys.stderr)
    offsets = [CommittedOffset(r.to_topic, r.partition, r.downstream, r.metadata)
               for r in rows if r.downstream is not None]
    if not offsets:
        raise OffsetsCommandError(f"nothing to write for group {group!r}")
    if not execute:
        print(dry_run_summary(group, alias, offsets, groups.committed(group)))
        if missing:
            print(f"--execute would leave {_partitions(len(missing))} of group {group} on "
                  f"cluster {alias} as {'it is' if len(missing) == 1 else 'they are'} (no "
                  "translated offset: see above)", file=sys.stderr)
        return PARTLY if missing else 0
    groups.commit(group, offsets)
    print(f"wrote {_offsets(len(offsets))} of group {group} on cluster {alias}")
    if missing:
        print(f"partly done: {_partitions(len(missing))} of group {group} on cluster {alias} "
              f"{'was' if len(missing) == 1 else 'were'} not written (no translated offset: "
              "see above); where the group has no offset there, its consumers start where "
              "their auto.offset.reset says; run this again once the mirror has copied them",
              file=sys.stderr)
        return PARTLY
    return 0


def dry_run_summary(group: str, alias: str, offsets: list[CommittedOffset],
                    committed: list[CommittedOffset]) -> str:
    """What a dry run did (nothing) and what --execute would change, against what ``group``
    has committed on ``alias`` now (group offset sync may already have written it)."""
    now = {(c.topic, c.partition): c.offset for c in committed}
    same = sum(1 for o in offsets if now.get((o.topic, o.partition)) == o.offset)
    head = f"dry run, nothing written: group {group} on cluster {alias}"
    if same == len(offsets):
        return (f"{head} already has {_these(same)} (written by group offset sync or an "
                f"earlier --execute); --execute would change nothing")
    other = sum(1 for o in offsets if (o.topic, o.partition) in now) - same
    state = (f"{same} already committed, {other} committed at another offset, "
             f"{len(offsets) - same - other} with none")
    return f"{head}: --execute would commit {_these(len(offsets))} ({state})"


def _offsets(n: int) -> str:
    return f"{n} offset" if n == 1 else f"{n} offsets"


def _partitions(n: int) -> str:
    return f"{n} partition" if n == 1 else f"{n} partitions"


def _these(n: int) -> str:
    return f"this {_offsets(n)}" if n == 1 else f"these {_offsets(n)}"


@_guarded
def run_failover(args: argparse.Namespace) -> int:
    from shallowmirror.mirror.config import load_mm2
    from shallowmirror.replication.translate import translate_offsets

    flow = _pick_flow(load_mm2(args.config, allow_unknown_keys=args.allow_unknown_keys), source=args.source, target=args.to)
    if args.live:
        rows = translate_offsets(flow, args.group, timeout_s=args.timeout)
        how = f"translated now from {flow.source}"
    else:
        rows = _checkpointed_rows(flow, args.group, args.timeout)
        how = f"from the checkpoints on {flow.target}"
    rows = _from_the_start(rows)
    if not rows:
        raise OffsetsCommandError(f"no offsets for group {args.group!r} {how}")
    print(f"failover of group {args.group} to {flow.target} ({how}):")
    _print_rows(rows, (f"offset on {flow.source}", f"on {flow.target}"))
    return _commit(flow.target, flow.target_admin, args.group, rows, args.execute,
                   args.timeout)


@_guarded
def run_failback(args: argparse.Namespace) -> int:
    from shallowmirror.mirror.config import load_mm2
    from shallowmirror.replication.translate import translate_back

    flow = _pick_flow(load_mm2(args.config, allow_unknown_keys=args.allow_unknown_keys), source=args.to, target=args.target)
    rows = _from_the_start(translate_back(flow, args.group, timeout_s=args.timeout))
    if not rows:
        raise OffsetsCommandError(f"group {args.group!r} has no committed offsets on cluster "
                                  f"{flow.target} for topics flow {flow.name} mirrors")
    print(f"failback of group {args.group} from {flow.target} to {flow.source}:")
    _print_rows(rows, (f"offset on {flow.target}", f"on {flow.source}"))
    return _commit(flow.source, flow.source_admin, args.group, rows, args.execute,
                   args.timeout)
