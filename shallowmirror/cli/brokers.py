"""`shallowmirror brokers`: run embedded Kafka-protocol clusters (tansu) for trying things out."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    from shallowmirror.cli.formatting import epilog

    p = sub.add_parser(
        "brokers",
        help="run embedded test clusters (tansu) on 127.0.0.1 until Ctrl-C",
        description="Start one embedded single-broker cluster per alias on a free 127.0.0.1 port "
                    "and print its bootstrap address; stop them all on Ctrl-C or SIGTERM. "
                    "Storage is in memory only. The address lines paste into "
                    "mm2.properties as they are.",
        epilog=epilog([
            ("shallowmirror brokers A B",
             "two clusters; prints `A.bootstrap.servers = 127.0.0.1:PORT` and the same for B"),
            ("shallowmirror brokers --kafka-home $KAFKA_HOME A B",
             "two real Apache Kafka clusters (single-node KRaft) from that distribution"),
        ]),
    )
    p.add_argument("aliases", nargs="*", default=["source", "target"],
                   help="cluster aliases (default: source target)")
    p.add_argument("--broker", choices=("tansu", "kafka"), default=None,
                   help="tansu (embedded, the default) or kafka (Apache Kafka from KAFKA_HOME "
                        "or --kafka-home)")
    p.add_argument("--kafka-home", metavar="DIR", default=None,
                   help="an unpacked Apache Kafka 3.x distribution; implies --broker kafka")
    p.set_defaults(func=run)


def alias_problems(aliases: list[str]) -> list[str]:
    """The aliases land in `ALIAS.bootstrap.servers` lines for mm2.properties: refuse what
    `shallowmirror mirror` would refuse there."""
    from shallowmirror.mirror.config import ALIAS_RE

    problems = [f"alias {a!r} may hold only letters, digits, '_' and '-' (it becomes "
                f"{a}.bootstrap.servers in mm2.properties)" for a in aliases
                if not ALIAS_RE.match(a)]
    duplicates = sorted({a for a in aliases if aliases.count(a) > 1})
    if duplicates:
        problems.append(f"alias given twice: {', '.join(duplicates)}")
    return problems


def run(args: argparse.Namespace) -> int:
    from shallowmirror.testing.clusters import serve_until_signal

    problems = alias_problems(args.aliases)
    if problems:
        print("shallowmirror brokers: " + "; ".join(problems), file=sys.stderr)
        return 2
    flavor = "kafka" if args.kafka_home else (args.broker or "tansu")
    return serve_until_signal(args.aliases, flavor=flavor, kafka_home=args.kafka_home)
