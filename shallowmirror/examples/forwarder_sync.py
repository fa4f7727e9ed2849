"""The low-level forwarder from plain (non-asyncio) code: ``SyncBatchForwarder``.

Batches of partitions 0-2 of "page-views" go to the same partition of "page-views-copy";
partition 3 carries test traffic and its batches are dropped (its offsets still count as done).
Each forward returns a ``concurrent.futures.Future``; an ``on_ack`` callback prints every
acknowledgement with the target base offset.

Run: python shallowmirror/examples/forwarder_sync.py
"""

from __future__ import annotations

import concurrent.futures

from _clusters import two_clusters, write_records

from shallowmirror.engine import SyncBatchForwarder, ensure_target_topics

TEST_PARTITION = 3


def on_ack(batch, target_offset, error) -> None:
    if error is None:
        print(f"  ack {batch.topic}-{batch.partition} @{batch.source_base} "
              f"({batch.record_count} records) -> page-views-copy-{batch.partition} "
              f"@{target_offset}")
    else:
        print(f"  FAILED {batch}: {error}")


def main(source_bootstrap: str, target_bootstrap: str) -> None:
    src = {"bootstrap.servers": source_bootstrap}
    dst = {"bootstrap.servers": target_bootstrap}
    ensure_target_topics(src, dst, ["page-views"], lambda _topic: "page-views-copy")
    settings = {"partition.assignment": "all", "group.id": "forwarder-sync-example"}
    forwarded = dropped = batches_dropped = 0
    pending: list[concurrent.futures.Future] = []
    with SyncBatchForwarder(src, dst, topics=["page-views"], settings=settings) as fwd:
        while (batch := fwd.next_batch(timeout_s=2.0)) is not None:   # 2 s idle: done
            if batch.partition == TEST_PARTITION:
                fwd.drop(batch)
                dropped += batch.record_count
                batches_dropped += 1
            else:
                pending.append(fwd.forward(batch, "page-views-copy", batch.partition,
                                           on_ack=on_ack))
                forwarded += batch.record_count
        offsets = [future.result(timeout=30) for future in pending]
    print(f"forwarded {forwarded} records in {len(offsets)} batches, "
          f"dropped {dropped} records in {batches_dropped} batches")


if __name__ == "__main__":
    with two_clusters() as (source, target):
        write_records(source.bootstrap, "page-views")
        main(source.bootstrap, target.bootstrap)
