"""`shallowmirror verify mm2.properties`: compare a shallow mirror's target with its source,
batch by batch, without decompressing (``shallowmirror.mirror.verify``).

Exit status: 0 exact copy, 1 first mismatch printed (or nothing to compare), 2 configuration
error or unreachable cluster.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

EXAMPLES = [
    ("shallowmirror verify mm2.properties",
     "every mirrored topic of every enabled flow; exit 0 on an exact copy, 1 at the first "
     "difference"),
    ("shallowmirror verify mm2.properties --flow 'A->B' --topics 'orders.*' payments",
     "one flow, the source topics matching these regular expressions"),
]


def add_parser(sub: argparse._SubParsersAction) -> None:
    from shallowmirror.cli.formatting import epilog

    p = sub.add_parser(
        "verify", help="check that a shallow mirror's target topics equal their source, "
                       "batch by batch",
        description="Read every mirrored partition of the source and of the target (through the "
                    "flow's replication policy) and compare them batch by batch without "
                    "decompressing: record count, last offset delta, timestamps, codec and every "
                    "byte after the batch header. Control batches (and aborted transactions "
                    "under read_committed) are skipped as the mirror skips them; batches the "
                    "mirror re-packed (compacted batches with offset gaps) are compared record "
                    "by record. Prints the first mismatch with cluster, topic, partition and "
                    "offsets on both sides (exit 1), or a per-topic summary (exit 0); nothing "
                    "to compare is exit 1 too. Exit 2: "
                    "configuration error, or a cluster unreachable for 30 s (the cluster's "
                    "reconnect.deadline.ms, if set). Run it once the mirror has "
                    "caught up (`mirror --exit-when-caught-up`): a tail still in flight counts "
                    "as missing.",
        epilog=epilog(EXAMPLES))
    p.add_argument("config", metavar="mm2.properties", help="MirrorMaker 2 properties file")
    p.add_argument("--flow", metavar="A->B", help="verify only this enabled flow")
    p.add_argument("--topics", metavar="REGEX", nargs="+", default=[],
                   help="only source topics matching one of these regular expressions "
                        "(whole name)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--allow-unknown-keys", action="store_true",
                   help="warn about unknown configuration keys instead of refusing")
    p.set_defaults(func=run)


class ProgressLine:
    """A progress line on stderr at most every ``interval_s``: bytes compared, rate, where."""

    def __init__(self, stream: TextIO, interval_s: float = 2.0):
        self.stream, self.interval_s = stream, interval_s
        self.started = time.monotonic()
        self.last = self.started
        self.bytes = 0

    def __call__(self, flow: str, topic: str, partition: int, new_bytes: int) -> None:
        self.bytes += new_bytes
        now = time.monotonic()
        if now - self.last < self.interval_s:
            return
        self.last = now
        rate = self.bytes / max(now - self.started, 1e-9) / 1e6
        print(f"verify {flow}: {self.bytes / 1e6:,.0f} MB compared ({rate:,.0f} MB/s), at "
              f"{topic}-{partition}", file=self.stream, flush=True)


def keep_freed_fetch_buffers() -> None:
    """Ask glibc to serve the Fetch responses' megabyte buffers from its heap and keep what is
    freed, instead of a fresh mmap (zeroed pages, one page fault per 4 KiB) for each: 20 % less
    CPU per GB compared (benchmarks/RESULTS.md, section 6). Verify holds at most 32 MiB of them;
    no effect on other C libraries."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        return
    if mallopt is None:
        return
    mallopt(-3, 64 * 1024 * 1024)       # M_MMAP_THRESHOLD: heap below 64 MiB
    mallopt(-1, 256 * 1024 * 1024)      # M_TRIM_THRESHOLD: keep up to 256 MiB freed


def summary_lines(result) -> list[str]:
    lines = []
    for t in result.topics:
        s = t.tally
        repacked = f", {s.repacked:,} re-packed compared record by record" if s.repacked else ""
        dropped = (f", {s.dropped:,} control/aborted/empty source batches not mirrored"
                   if s.dropped else "")
        older = (f", {s.older:,} older target batches skipped (their records are gone from "
                 "the source's log)" if s.older else "")
        lines.append(f"{t.flow} {t.topic} -> {t.target_topic}: {t.partitions} partitions, "
                     f"{s.batches:,} batches, {s.records:,} records, {s.source_bytes:,} bytes "
                     f"compared{repacked}{dropped}{older}")
    return lines


def run(args: argparse.Namespace) -> int:
    import asyncio

    from shallowmirror.cli.stop_signals import python_sigint
    from shallowmirror.errors import BrokerError, ConfigError, ConnectionFailedError
    from shallowmirror.mirror.config import load_mm2
    from shallowmirror.mirror.verify import verify
    from shallowmirror.net.connection import AuthenticationFailedError

    keep_freed_fetch_buffers()
    try:
        config = load_mm2(args.config, allow_unknown_keys=args.allow_unknown_keys)
        progress = None if args.quiet else ProgressLine(sys.stderr)
        with python_sigint():        # Ctrl-C cancels the comparison rather than raising in it
            result = asyncio.run(verify(config, flow=args.flow, topic_patterns=args.topics,
                                        progress=progress))
    except ConfigError as err:
        print(f"shallowmirror verify: {err}", file=sys.stderr)
        return 2
    except (ConnectionFailedError, AuthenticationFailedError) as err:
        print(f"shallowmirror verify: cannot reach a cluster: {err}", file=sys.stderr)
        return 2
    except BrokerError as err:   # e.g. not authorized to read a topic: nothing was compared
        print(f"shallowmirror verify: a broker refused a request: {err}", file=sys.stderr)
        return 2
    for line in summary_lines(result):
        print(line)
    rate = result.source_bytes / max(result.elapsed_s, 1e-9) / 1e6
    if result.mismatch is not None:
        print(f"MISMATCH {result.mismatch}")
        return 1
    if not result.topics:
        if args.topics:
            print(f"shallowmirror verify: --topics {' '.join(args.topics)}: no mirrored topic "
                  "matches", file=sys.stderr)
            return 2
        # Nothing compared is no proof of a copy: not a success for a script either.
        print("shallowmirror verify: the flows mirror no topic yet (nothing compared)",
              file=sys.stderr)
        return 1
    print(f"verify: exact copy: {sum(t.tally.batches for t in result.topics):,} batches, "
          f"{result.source_bytes:,} source bytes in {result.elapsed_s:.2f} s ({rate:,.0f} MB/s; "
          f"CPU {result.cpu_s:.3f} s, {result.source_bytes / max(result.cpu_s, 1e-9) / 1e6:,.0f} "
          "MB per CPU second)")
    return 0
