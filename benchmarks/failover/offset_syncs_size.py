"""Offset-syncs bytes and hook CPU per million acknowledged batches (no broker: the writer's
records are collected as the producer would send them).

    python benchmarks/failover/offset_syncs_size.py

Three partitions of one topic named like a typical one (``orders``); each scenario feeds
1,000,000 ``BatchAck``s of 100 records through ``OffsetSyncWriter.on_batch_ack`` and writes the
end syncs every 1,000 batches (the writer does it every 0.2 s; compaction keeps one per
partition). Prints records and key+value bytes written, and CPU microseconds per batch.
"""

from __future__ import annotations

import time

from shallowmirror.engine.hooks import BatchAck
from shallowmirror.replication.offset_syncs import OffsetSyncWriter

BATCHES = 1_000_000


class Collect:
    failed = None

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0

    def write(self, key: bytes, value: bytes) -> None:
        self.records += 1
        self.bytes += len(key) + len(value)


def scenario(gap_every: int) -> tuple[int, int, int, float]:
    writer = OffsetSyncWriter({}, "mm2-offset-syncs.B.internal", alias="A")
    sink = writer._writer = Collect()
    source = [0, 0, 0]
    target = [0, 0, 0]
    ends_before = 0
    started = time.process_time()
    for n in range(BATCHES):
        p = n % 3
        if gap_every and n % gap_every == 0:
            source[p] += 1              # a control batch: one source offset not mirrored
        writer.on_batch_ack(BatchAck("orders", p, source[p], source[p] + 100, 100, "A.orders",
                                     p, target[p]))
        source[p] += 100
        target[p] += 100
        if n % 1000 == 999:
            writer.flush_ends()
    cpu = time.process_time() - started
    ends_before = writer.ends_written
    anchors_bytes = sink.bytes - ends_before * (len(b"orders") + 2 + 4 + 8 + 16)
    return writer.anchors_written, anchors_bytes, ends_before, cpu / BATCHES * 1e6


def main() -> None:
    for name, gap_every in (("no gaps", 0), ("a gap every 100 batches", 100),
                            ("a gap after every batch (transactions)", 1)):
        anchors, size, ends, us = scenario(gap_every)
        print(f"{name:42}: {anchors:>9,} anchor syncs, {size:>12,} bytes kept after "
              f"compaction (+ 3 end syncs); {ends:,} end syncs written before compaction; "
              f"{us:.2f} CPU us per batch")


if __name__ == "__main__":
    main()
