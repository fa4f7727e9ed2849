"""One call mirrors a topic, batch for batch, and returns when the target has caught up.

Run: python shallowmirror/examples/mirror_one_call.py
``mirror`` creates the missing target topic (same partition count, compression.type=producer).
"""

from __future__ import annotations

from _clusters import two_clusters, write_records

from shallowmirror.engine import mirror, prefix_mapper

with two_clusters() as (source, target):
    write_records(source.bootstrap, "orders")
    stats = mirror(
        {"bootstrap.servers": source.bootstrap}, {"bootstrap.servers": target.bootstrap},
        ["orders"], topic_mapper=prefix_mapper("A"),         # target topic "A.orders"
        until_caught_up=True, timeout_s=60,
        **{"partition.assignment": "all", "acks": "all"})
    print(f"mirrored {stats.records} records in {stats.batches} batches "
          f"({stats.bytes} compressed bytes, never decompressed)")
    for (topic, partition), p in stats.partitions.items():
        print(f"  {topic}-{partition}: position {p.position}, lag {p.lag}")
