"""The low-level forwarder: the program sees every fetched batch and decides where it goes.

Batches of even partitions go to "audit" (partition 0), odd ones are dropped; each forward is
awaited for the target base offset, and a callback logs the acknowledgement.

Run: python shallowmirror/examples/forwarder_asyncio.py
"""

from __future__ import annotations

import asyncio

from _clusters import two_clusters, write_records

from shallowmirror.engine import BatchForwarder, ensure_target_topics


def on_ack(batch, target_offset, error) -> None:
    if error is None:
        print(f"  {batch.topic}-{batch.partition} @{batch.source_base} "
              f"({batch.record_count} records) -> audit-0 @{target_offset}")


async def main(source_bootstrap: str, target_bootstrap: str) -> None:
    src = {"bootstrap.servers": source_bootstrap}
    dst = {"bootstrap.servers": target_bootstrap}
    ensure_target_topics(src, dst, ["clicks"], lambda _topic: "audit")
    settings = {"partition.assignment": "all", "group.id": "forwarder-example"}
    forwarded = dropped = 0
    async with BatchForwarder(src, dst, topics=["clicks"], settings=settings) as fwd:
        pending = []
        while True:
            batch = await fwd.next_batch(timeout_s=2.0)
            if batch is None:              # nothing new for 2 s: done for this example
                break
            if batch.partition % 2 == 0:
                pending.append(fwd.forward(batch, "audit", 0, callback=on_ack))
                forwarded += batch.record_count
            else:
                fwd.drop(batch)
                dropped += batch.record_count
        offsets = await asyncio.gather(*pending)
    print(f"forwarded {forwarded} records in {len(offsets)} batches, dropped {dropped}")


with two_clusters() as (source, target):
    write_records(source.bootstrap, "clicks")
    asyncio.run(main(source.bootstrap, target.bootstrap))
