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
    source_config = {"bootstrap.servers": args.source, "group.id": args.group,
                     "auto.offset.reset": "earliest"}
    target_config = {"bootstrap.servers": args.target}
    common.emit("ready", time=time.time())
    mirror(source_config, target_config, list(args.topic),
           topic_mapper=lambda topic: topic + suffix, stop=stop, **dict(args.setting))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
