"""`shallowmirror legacy`: MirrorMaker 1 command-line flags, identity topic names."""

from __future__ import annotations

import argparse


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_parser(sub: argparse._SubParsersAction) -> None:
    from shallowmirror.cli.formatting import epilog
    from shallowmirror.cli.mirror import add_process_options

    p = sub.add_parser(
        "legacy", help="run with MirrorMaker 1 flags (--consumer.config, --producer.config, "
                       "--include)",
        description="Drop-in for kafka-mirror-maker.sh: mirror the topics matching --include "
                    "from the cluster of --consumer.config to the cluster of --producer.config, "
                    "keeping topic names. Remote topics are created with the source's "
                    "partition count and compression.type=producer.",
        epilog=epilog([
            ("shallowmirror legacy --consumer.config consumer.properties --producer.config "
             "producer.properties --include 'orders|payments.*'",
             "mirror the matching topics under the same names, as kafka-mirror-maker.sh did"),
            ("shallowmirror legacy --consumer.config c.properties --producer.config "
             "p.properties --include '.*' --check",
             "validate both files and print the resulting flow"),
        ]))
    p.add_argument("--consumer.config", "--consumer-config", dest="consumer_config", required=True, metavar="FILE",
                   help="source consumer properties (bootstrap.servers, group.id, ...)")
    p.add_argument("--producer.config", "--producer-config", dest="producer_config", required=True, metavar="FILE",
                   help="target producer properties (bootstrap.servers, ...)")
    p.add_argument("--include", metavar="REGEX",
                   help="topics to mirror (a regex, matched whole; commas mean '|'; Java-only "
                        "classes such as \\p{Alnum} are refused by name)")
    p.add_argument("--whitelist", metavar="REGEX", help="old name of --include")
    p.add_argument("--num.streams", "--num-streams", dest="num_streams", type=int, default=1, metavar="N",
                   help="engines sharing the partitions in this process (default 1)")
    p.add_argument("--offset.commit.interval.ms", "--offset-commit-interval-ms", dest="offset_commit_interval_ms", type=int,
                   metavar="MS", help="how often offsets are committed (default 5000 here; "
                                      "MirrorMaker 1's was 60000)")
    p.add_argument("--abort.on.send.failure", "--abort-on-send-failure", dest="abort_on_send_failure", type=_bool,
                   default=True, metavar="true|false",
                   help="stop the mirror when sending fails (default true, as MirrorMaker 1)")
    p.add_argument("--allow-unknown-keys", action="store_true",
                   help="warn about keys no Kafka consumer/producer knows instead of refusing "
                        "to start")
    add_process_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from shallowmirror.cli.mirror import check_conflicts, config_error, start
    from shallowmirror.errors import ConfigError
    from shallowmirror.mirror.config import load_properties, resolve_mm1

    try:
        problems = check_conflicts(args)
        if problems:
            raise ConfigError(problems)
        config = resolve_mm1(
            load_properties(args.consumer_config, "--consumer.config"),
            load_properties(args.producer_config, "--producer.config"),
            include=args.include, whitelist=args.whitelist, num_streams=args.num_streams,
            offset_commit_interval_ms=args.offset_commit_interval_ms,
            abort_on_send_failure=args.abort_on_send_failure, deep=args.deep,
            allow_unknown_keys=args.allow_unknown_keys,
            consumer_config_path=f"--consumer.config {args.consumer_config}",
            producer_config_path=f"--producer.config {args.producer_config}")
    except ConfigError as err:
        return config_error(err)
    return start(config, args)
