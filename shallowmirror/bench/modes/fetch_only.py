"""Fetch-only baseline: read the source topics to their end and discard everything.

The ceiling for a mirror on this source: how fast the source serves the bytes to one process.

- ``--fetch-impl engine`` (default): the engine's own fetch-only reader
  (``shallowmirror.engine.rawfetch.fetch_all``: the engine's connections and Fetch path, batches
  split, nothing forwarded) — the fair ceiling for the shallow mode, which adds only producing.
- ``--fetch-impl raw``: raw Fetch v4 requests through one connection per leader, all
  partitions in each request (rotated so tansu, which gives the whole response budget to the first
  partition listed, serves each in turn), batches split and counted but never decompressed —
  the same work as the fetch side of a shallow mirror.
- ``--fetch-impl confluent``: a confluent-kafka Consumer (decompresses, makes Message objects):
  the baseline a Python consumer sees.

Stops reading when ``--records`` records were read, prints ``{"event": "done", "time": ...,
"records": ..., "bytes": ...}`` and waits for SIGTERM/SIGINT, then exits 0: the harness samples
the process's CPU at that line, as it does the mirrors' when the last record is on the target,
so interpreter teardown is not charged to reading.
"""

from __future__ import annotations

import os
import time

from shallowmirror.bench.modes import common


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--records", type=int, required=True, help="records to read in all")
    p.add_argument("--fetch-impl", choices=("engine", "raw", "confluent"), default="engine")
    p.add_argument("--max-bytes", type=int, default=16 << 20,
                   help="Fetch max_bytes (engine, raw)")
    args = p.parse_args(argv)
    stop = common.stop_on_signals()
    read = {"engine": _engine, "raw": _raw, "confluent": _confluent}[args.fetch_impl]
    records, nbytes = read(args, stop)
    common.emit("done", time=time.time(), records=records, bytes=nbytes, impl=args.fetch_impl)
    parent = os.getppid()
    # Until stopped; a harness that died without stopping it (SIGKILL) leaves no reader behind.
    while not stop.wait(1.0) and os.getppid() == parent:
        pass
    return 0


def _engine(args, stop) -> tuple[int, int]:
    import asyncio

    from shallowmirror.engine.rawfetch import fetch_all

    async def read_all() -> tuple[int, int]:
        # Topics concurrently, as the mirror fetches them; each to the end it sees.
        results = await asyncio.gather(*(
            fetch_all({"bootstrap.servers": args.source}, topic, keep=False,
                      max_bytes=args.max_bytes) for topic in args.topic))
        return (sum(totals.records for _, totals in results),
                sum(totals.bytes for _, totals in results))

    common.emit("ready", time=time.time())
    return asyncio.run(read_all())


def _raw(args, stop) -> tuple[int, int]:
    from shallowmirror import codec
    from shallowmirror.bench.watermarks import _Conn, partition_leaders

    records = nbytes = 0
    conns: dict = {}
    work: dict[tuple, dict[tuple[str, int], int]] = {}
    for topic in args.topic:
        for partition, address in partition_leaders(args.source, topic).items():
            work.setdefault(address, {})[(topic, partition)] = 0
    common.emit("ready", time=time.time())
    try:
        while records < args.records and not stop.is_set():
            for address, offsets in work.items():
                conn = conns.get(address) or conns.setdefault(address, _Conn(*address))
                for topic in args.topic:
                    mine = {p: o for (t, p), o in offsets.items() if t == topic}
                    if not mine:
                        continue
                    answers = conn.fetch(topic, mine, max_wait_ms=100, min_bytes=1,
                                         max_bytes=args.max_bytes)
                    for answer in answers:
                        if answer.error_code or answer.records is None:
                            continue
                        split = codec.split_batches(answer.records, verify_crc=False)
                        offset = offsets[(topic, answer.partition)]
                        for batch in split.batches:
                            if batch.next_offset > offset:
                                records += batch.next_offset - max(batch.base_offset, offset)
                                nbytes += batch.size
                                offset = batch.next_offset
                        offsets[(topic, answer.partition)] = offset
                    # Rotate: the partition served first this time goes last next time.
                    keys = [k for k in offsets if k[0] == topic]
                    if len(keys) > 1:
                        first = keys[0]
                        offsets[first] = offsets.pop(first)
    finally:
        for conn in conns.values():
            conn.close()
    return records, nbytes


def _confluent(args, stop) -> tuple[int, int]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": args.source,
        "group.id": args.group,
        "enable.auto.commit": False,
        "fetch.max.bytes": 64 << 20,
        "max.partition.fetch.bytes": 16 << 20,
        "queued.max.messages.kbytes": 256 * 1024,
    })
    md = consumer.list_topics(timeout=30)
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING)
                     for t in args.topic for p in md.topics[t].partitions])
    common.emit("ready", time=time.time())
    records = nbytes = 0
    try:
        while records < args.records and not stop.is_set():
            for msg in consumer.consume(10_000, 0.1):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                records += 1
                nbytes += len(msg.value() or b"") + len(msg.key() or b"")
    finally:
        consumer.close()
    return records, nbytes


if __name__ == "__main__":
    raise SystemExit(main())
