"""Shallow mirror: this project's engine, forwarding compressed RecordBatches byte for byte.

Runs ``shallowmirror.engine.mirror`` from the start of the source topics until SIGTERM/SIGINT.
``--setting key=value`` (repeatable) passes engine settings through (Kafka-style dotted keys as in
``shallowmirror.engine.ENGINE_SETTINGS``), e.g. to try fetch sizes or requests in flight.
"""

from __future__ import annotations

import time

from shallowmirror.bench.modes import common


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--setting", action="append", default=[], type=_setting,
                   help="engine setting key=value (repeatable)")
    args = p.parse_args(argv)
    stop = common.stop_on_signals()
    from shallowmirror.engine import mirror

    suffix = args.target_suffix
    # One engine takes every partition (like the deep modes' assign()): no group rebalance
    # wait, which tansu stretches to session.timeout/2.
    settings = {"group.id": args.group, "partition.assignment": "all",
                "auto.offset.reset": "earliest", **dict(args.setting)}
    common.emit("ready", time=time.time())
    mirror({"bootstrap.servers": args.source}, {"bootstrap.servers": args.target},
           list(args.topic), topic_mapper=lambda topic: topic + suffix, stop=stop, **settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
