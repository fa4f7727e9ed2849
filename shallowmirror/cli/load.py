"""`shallowmirror load`: fill a topic with realistic, deterministic records (see testing.workload)."""

from __future__ import annotations

import argparse
import sys
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("load", help="load a topic with realistic JSON-like events (any codec)")
    p.add_argument("--bootstrap-servers", required=True, help="host:port[,host:port...]")
    p.add_argument("--topic", required=True)
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--value-bytes", type=int, default=300)
    p.add_argument("--keys", type=int, default=1_000, help="key cardinality; 0 for null keys")
    p.add_argument("--headers", type=int, default=2, help="headers per record")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--codec", default="lz4", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    p.add_argument("--batch-bytes", type=int, default=1_000_000, help="librdkafka batch.size")
    p.add_argument("--linger-ms", type=int, default=20)
    p.add_argument("--idempotent", action="store_true")
    p.add_argument("--transactional", action="store_true")
    p.add_argument("--transaction-records", type=int, default=1_000)
    p.add_argument("--abort-every", type=int, default=0,
                   help="with --transactional: abort every Nth transaction")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--existing-topic", action="store_true",
                   help="append to an existing topic instead of creating it")
    p.add_argument("-X", dest="producer_config", action="append", default=[], metavar="KEY=VALUE",
                   help="extra librdkafka producer setting (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from shallowmirror.errors import ShallowMirrorError
    from shallowmirror.testing.workload import Workload, load

    extra = {}
    for item in args.producer_config:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"-X {item}: expected KEY=VALUE", file=sys.stderr)
            return 2
        extra[key] = value
    try:
        workload = Workload(
            topic=args.topic, records=args.records, value_bytes=args.value_bytes, keys=args.keys,
            headers=args.headers, partitions=args.partitions, codec=args.codec,
            batch_bytes=args.batch_bytes, linger_ms=args.linger_ms, idempotent=args.idempotent,
            transactional=args.transactional, transaction_records=args.transaction_records,
            abort_every=args.abort_every, seed=args.seed, create_topic=not args.existing_topic,
            producer_config=extra,
        )
        started = time.monotonic()

        def progress(done: int, total: int) -> None:
            rate = done / max(time.monotonic() - started, 1e-6)
            print(f"\rloaded {done:,}/{total:,} records ({rate:,.0f}/s)", end="", flush=True,
                  file=sys.stderr)

        result = load(args.bootstrap_servers, workload, progress=progress)
    except ShallowMirrorError as err:
        print(f"\nshallowmirror load: {err}", file=sys.stderr)
        return 1
    print(file=sys.stderr)
    ratio = f"{result.compression_ratio:.2f}x" if result.compression_ratio else "unknown"
    compressed = (f"{result.compressed_bytes:,}" if result.compressed_bytes is not None
                  else "unknown")
    print(f"topic {result.topic}: {result.committed_count:,} committed records "
          f"({result.record_count - result.committed_count:,} aborted) in "
          f"{len(result.committed)} partitions, {result.uncompressed_bytes:,} bytes uncompressed, "
          f"{compressed} bytes in {result.batches or '?'} batches ({args.codec}, ratio {ratio}), "
          f"{result.elapsed_s:.2f}s")
    return 0
