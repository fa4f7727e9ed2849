"""`shallowmirror load`: fill a topic with realistic, deterministic records (see testing.workload)."""

from __future__ import annotations

import argparse
import re
import sys
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    from shallowmirror.cli.formatting import epilog

    p = sub.add_parser(
        "load", help="load a topic with realistic JSON-like events (any codec)",
        description="Create a topic (or append to an existing one) and produce deterministic, "
                    "realistic JSON-like click events with confluent-kafka in the chosen codec: "
                    "test data for a mirror. Records carry the time they were produced.",
        epilog=epilog([
            ("shallowmirror load --bootstrap-servers 127.0.0.1:9092 --topic orders "
             "--records 200k --codec zstd",
             "create `orders` and write 200,000 zstd-compressed records"),
            ("shallowmirror load --bootstrap-servers 127.0.0.1:9092 --topic orders "
             "--existing-topic --records 1m --seed 2",
             "append a million more to every partition of the existing topic"),
        ]))
    p.add_argument("--bootstrap-servers", required=True, help="host:port[,host:port...]")
    p.add_argument("--topic", required=True)
    p.add_argument("--records", type=_count, default=100_000,
                   help="records to write: 20000, 20k, 1m")
    p.add_argument("--value-bytes", type=_count, default=300, help="bytes per value")
    p.add_argument("--keys", type=int, default=1_000, help="key cardinality; 0 for null keys")
    p.add_argument("--headers", type=int, default=2, help="headers per record")
    p.add_argument("--partitions", type=int,
                   help="partitions of the new topic (default 3); with --existing-topic, the "
                        "topic's own count, which this must match if given")
    p.add_argument("--codec", default="lz4", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    p.add_argument("--batch-bytes", type=_count, default=1_000_000,
                   help="librdkafka batch.size: 1000000, 256KiB")
    p.add_argument("--linger-ms", type=int, default=20)
    p.add_argument("--idempotent", action="store_true")
    p.add_argument("--transactional", action="store_true")
    p.add_argument("--transaction-records", type=int,
                   help="with --transactional: records per transaction (default 1000)")
    p.add_argument("--abort-every", type=int, default=0,
                   help="with --transactional: abort every Nth transaction")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--existing-topic", action="store_true",
                   help="append to an existing topic instead of creating it")
    p.add_argument("-X", dest="producer_config", action="append", default=[], metavar="KEY=VALUE",
                   help="extra librdkafka producer setting (repeatable)")
    p.set_defaults(func=run)


def _count(text: str) -> int:
    """A count as bench takes it: 20000, 20k, 1m, 256KiB."""
    from shallowmirror.bench.matrix import parse_list

    try:
        values = parse_list(text, int)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).replace("a count", "one count")) from None
    if len(values) != 1 or values[0] < 0:
        raise argparse.ArgumentTypeError(f"expected one count such as 20000, 20k, 1m or 256KiB, "
                                         f"got {text!r}")
    return values[0]


def _existing_partitions(bootstrap: str, topic: str, extra: dict[str, str],
                         timeout_s: float = 10.0) -> int | None:
    """The topic's partition count (None: no such topic); ``LoadError`` if the cluster does not
    answer Metadata, naming its address and what answers there (instead of librdkafka's noise
    and a bare timeout). Asked in short calls: Ctrl-C is seen between them."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from shallowmirror.mirror.clients import list_topics
    from shallowmirror.net.probe import listener_hint
    from shallowmirror.rdkafka_logs import with_log_config
    from shallowmirror.testing.workload import LoadError

    admin_keys = {k: v for k, v in extra.items() if k.startswith(("security.", "sasl.", "ssl."))}
    admin = AdminClient(with_log_config({"bootstrap.servers": bootstrap, **admin_keys}))
    try:
        metadata = list_topics(admin, timeout_s=timeout_s)
    except KafkaException as err:
        hint = listener_hint(bootstrap,
                             str(admin_keys.get("security.protocol", "PLAINTEXT")).upper())
        raise LoadError(f"the cluster at {bootstrap} did not answer within {timeout_s:.0f}s "
                        f"({err.args[0].str() if err.args else err}"
                        f"{'; ' + hint if hint else ''}); is it running, and is that its "
                        "address?") from err
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        return None
    return len(found.partitions)


def _partitions(args: argparse.Namespace, existing: int | None) -> int:
    """The partition count to write to; ``LoadError`` when the request and the topic disagree."""
    from shallowmirror.testing.workload import LoadError

    if not args.existing_topic:
        if existing is not None:
            raise LoadError(f"topic {args.topic!r} already exists ({existing} partitions): add "
                            "--existing-topic to append to it")
        return args.partitions if args.partitions is not None else 3
    if existing is None:
        raise LoadError(f"--existing-topic: there is no topic {args.topic!r} at "
                        f"{args.bootstrap_servers}")
    if args.partitions is not None and args.partitions != existing:
        raise LoadError(f"--partitions {args.partitions}: topic {args.topic!r} has {existing} "
                        "partitions; leave --partitions out to write to all of them")
    return existing


#: Kafka's rule for topic names (``org.apache.kafka.common.internals.Topic``); tansu accepts
#: any name, so the rule is checked here rather than left to the broker.
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def _message_max_bytes(producer_config: list[str]) -> int | None:
    """The producer's message.max.bytes: -X's, else librdkafka's default; None when -X gives
    no number (librdkafka reports that itself)."""
    for item in reversed(producer_config):
        key, _, value = item.partition("=")
        if key.strip() == "message.max.bytes":
            try:
                return int(value)
            except ValueError:
                return None
    return 1_000_000


def option_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the options, in their own names, before any broker is contacted."""
    problems = []
    if not _TOPIC_NAME.fullmatch(args.topic) or args.topic in (".", ".."):
        problems.append(f"--topic {args.topic!r}: Kafka topic names are 1 to 249 letters, "
                        "digits, '.', '_' or '-' (not '.' or '..')")
    if args.partitions is not None and args.partitions < 1:
        problems.append(f"--partitions must be at least 1, got {args.partitions}")
    for option in ("keys", "headers", "linger_ms"):
        if getattr(args, option) < 0:
            problems.append(f"--{option.replace('_', '-')} must not be negative, got "
                            f"{getattr(args, option)}")
    for option in ("records", "value_bytes", "batch_bytes"):
        if getattr(args, option) < 1:
            problems.append(f"--{option.replace('_', '-')} must be at least 1, got "
                            f"{getattr(args, option)}")
    if args.records >= 1 and args.value_bytes >= 1:
        from shallowmirror.testing.workload import plan_problem

        too_many = plan_problem(args.records, args.value_bytes)
        if too_many:
            problems.append(f"--records {args.records:,}: {too_many}")
    for item in args.producer_config:
        key = item.partition("=")[0].strip()
        if key in ("compression.type", "compression.codec"):
            problems.append(f"-X {item}: set the codec with --codec (it is {args.codec})")
    limit = _message_max_bytes(args.producer_config)
    if limit is not None and args.value_bytes >= limit:
        problems.append(f"--value-bytes {args.value_bytes} does not fit a record under the "
                        f"producer's message.max.bytes ({limit}; raise it with -X "
                        "message.max.bytes=N, and the topic's max.message.bytes with it)")
    if not args.transactional:
        given = [name for name, value in (("--transaction-records", args.transaction_records),
                                          ("--abort-every", args.abort_every or None))
                 if value is not None]
        if given:
            problems.append(f"{' and '.join(given)} only "
                            f"{'apply' if len(given) > 1 else 'applies'} with --transactional")
    if args.transaction_records is not None and args.transaction_records < 1:
        problems.append(f"--transaction-records must be at least 1, got "
                        f"{args.transaction_records}")
    if args.abort_every < 0:
        problems.append(f"--abort-every must not be negative, got {args.abort_every}")
    return problems


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaError, KafkaException

    from shallowmirror.errors import ShallowMirrorError
    from shallowmirror.net.config import parse_host_port
    from shallowmirror.testing.workload import Workload, load

    for entry in args.bootstrap_servers.split(","):
        try:
            parse_host_port(entry)
        except ValueError as err:
            print(f"shallowmirror load: --bootstrap-servers: {err}", file=sys.stderr)
            return 2
    extra = {}
    for item in args.producer_config:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"shallowmirror load: -X {item}: expected KEY=VALUE", file=sys.stderr)
            return 2
        extra[key] = value
    # A terminal gets one progress line redrawn in place (ended before any other line); a log
    # or a pipe a line every 5 s and one at the end.
    tty = sys.stderr.isatty()
    nl = "\n" if tty else ""
    problems = option_problems(args)
    if problems:
        print("shallowmirror load: " + "; ".join(problems), file=sys.stderr)
        return 2
    try:
        partitions = _partitions(args, _existing_partitions(args.bootstrap_servers, args.topic,
                                                            extra))
        workload = Workload(
            topic=args.topic, records=args.records, value_bytes=args.value_bytes, keys=args.keys,
            headers=args.headers, partitions=partitions, codec=args.codec,
            batch_bytes=args.batch_bytes, linger_ms=args.linger_ms, idempotent=args.idempotent,
            transactional=args.transactional,
            transaction_records=args.transaction_records or 1_000,
            abort_every=args.abort_every, seed=args.seed, create_topic=not args.existing_topic,
            producer_config=extra,
        )
        started = time.monotonic()
        last = [started, -1]        # time and count of the last line (not a terminal)

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            rate = done / max(now - started, 1e-6)
            if tty:
                print(f"\rloaded {done:,}/{total:,} records ({rate:,.0f}/s)", end="",
                      flush=True, file=sys.stderr)
            elif done != last[1] and (done >= total or now - last[0] >= 5.0):
                last[0], last[1] = now, done
                print(f"loaded {done:,}/{total:,} records ({rate:,.0f}/s)", flush=True,
                      file=sys.stderr)

        result = load(args.bootstrap_servers, workload, progress=progress)
    except KafkaException as err:      # librdkafka refused the producer's configuration
        error = err.args[0] if err.args else None
        print(f"{nl}shallowmirror load: the producer configuration was refused: "
              f"{error.str().strip() if isinstance(error, KafkaError) else err} (from -X or "
              "--batch-bytes/--linger-ms)", file=sys.stderr)
        return 2
    except ShallowMirrorError as err:
        print(f"{nl}shallowmirror load: {err}", file=sys.stderr)
        return 1
    except TimeoutError as err:  # a future of the admin client
        print(f"{nl}shallowmirror load: the cluster at {args.bootstrap_servers} stopped answering "
              f"({err or 'timed out'})", file=sys.stderr)
        return 1
    print(nl, end="", file=sys.stderr)
    ratio = f"{result.compression_ratio:.2f}x" if result.compression_ratio else "unknown"
    compressed = (f"{result.compressed_bytes:,}" if result.compressed_bytes is not None
                  else "unknown")
    print(f"topic {result.topic}: {result.committed_count:,} committed records "
          f"({result.record_count - result.committed_count:,} aborted) in "
          f"{len(result.committed)} partitions, {result.uncompressed_bytes:,} bytes uncompressed, "
          f"{compressed} bytes in {result.batches or '?'} batches ({args.codec}, ratio {ratio}), "
          f"{result.elapsed_s:.2f}s")
    return 0
