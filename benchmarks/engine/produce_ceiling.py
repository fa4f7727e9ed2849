"""Produce-only ceiling: how fast the target broker ingests the source topic's batches when they are
sent with the engine's own Produce path and nothing is fetched while sending.

    .venv/bin/python benchmarks/engine/produce_ceiling.py --source HOST:PORT --target HOST:PORT \\
        --topic T [--target-topic T2] [--set max.request.size=1048576 ...]

1. Pre-fetch (untimed): every batch of ``--topic`` from offset 0 with raw Fetch requests, kept as
   views of the fetch frames (as the engine keeps them).
2. Send (timed): every batch is routed to the engine's ``Sink`` for ``--target-topic`` (same
   partition): the same planner (one batch per partition per request, up to max.request.size),
   the same producer-identity stamping (header rewrite + CRC), the same request encoder, the same
   requests in flight per connection and per partition. The clock stops when the last batch is
   acknowledged.

Prints ``ready`` after the pre-fetch (the caller starts its broker CPU sampling there) and then one
JSON line: wall seconds, bytes, batches, requests, process CPU seconds of the send phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from shallowmirror import codec
from shallowmirror.engine.batch import FetchedBatch
from shallowmirror.engine.core import EngineCore
from shallowmirror.net import Cluster
from shallowmirror.net.protocol import FETCH_API_KEY, fetch_request, versions


async def prefetch(cluster: Cluster, topic: str) -> dict[int, list]:
    """Every batch view of ``topic``, per partition, in order (frames kept alive by the views)."""
    await cluster.refresh_metadata([topic])
    out: dict[int, list] = {}
    for p in cluster.partitions(topic) or []:
        conn = await cluster.connection(cluster.leader(topic, p))
        version = conn.api_version(FETCH_API_KEY, versions(FETCH_API_KEY))
        position, high, views = 0, -1, []
        while high < 0 or position < high:
            req = fetch_request(version, [(topic, p, position, 16 << 20)], max_wait_ms=100,
                                min_bytes=1, max_bytes=16 << 20)
            frame = await conn.request_frame(req)
            response = codec.decode_fetch_response(frame, version)
            for t in response.topics:
                for part in t.partitions:
                    high = part.high_watermark
                    if part.records is None:
                        continue
                    for b in codec.split_batches(part.records).batches:
                        if b.next_offset > position:
                            views.append(b)
                            position = b.next_offset
        out[p] = views
    return out


def _never_fetched(batch: FetchedBatch) -> None:
    raise AssertionError("the produce-only core starts no source")


class ProduceOnlyCore(EngineCore):
    """The engine core without sources or membership: only the target side is started."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, router=_never_fetched, **kwargs)
        self.acked_batches = 0
        self.acked_bytes = 0
        self.expected = 0
        self.all_acked = asyncio.Event()
        self.failure: BaseException | None = None

    def batch_acked(self, batch: FetchedBatch, target_base: int | None) -> None:
        self.acked_batches += 1
        self.acked_bytes += batch.size
        batch._finish(target_base, None)
        if self.acked_batches == self.expected:
            self.all_acked.set()

    def batches_acked(self, acked: list[tuple[FetchedBatch, int | None]]) -> None:
        for batch, target_base in acked:
            self.batch_acked(batch, target_base)

    def batch_failed(self, batch: FetchedBatch, err: BaseException) -> None:
        self.failure = err
        self.all_acked.set()


async def run(args: argparse.Namespace) -> dict:
    settings = dict(item.split("=", 1) for item in args.set)
    source = Cluster({"bootstrap.servers": args.source}, "source")
    await source.start()
    views = await prefetch(source, args.topic)
    await source.close()
    core = ProduceOnlyCore({"bootstrap.servers": args.source},
                           {"bootstrap.servers": args.target}, topics=[args.topic],
                           settings=settings)
    core.target = Cluster(core.target_config, core.target_alias)
    await core.target.start()
    await core.sinks.start(core.target)
    target_topic = args.target_topic or args.topic
    await core.target.refresh_metadata([target_topic])
    batches = [FetchedBatch(args.topic, p, v, lease=None, source_base=v.base_offset,
                            next_offset=v.next_offset)
               for p, vs in sorted(views.items()) for v in vs]
    core.expected = len(batches)
    total = sum(b.size for b in batches)
    print("ready", flush=True)
    sys.stdin.readline()           # the caller has started its broker CPU sampling
    cpu0, t0 = time.process_time(), time.monotonic()
    # Interleave partitions, as fetch responses do, and hand every batch to the sinks at once.
    by_part: dict[int, list] = {}
    for b in batches:
        by_part.setdefault(b.partition, []).append(b)
    longest = max((len(v) for v in by_part.values()), default=0)
    for i in range(longest):
        for p in sorted(by_part):
            if i < len(by_part[p]):
                core.route(by_part[p][i], target_topic, p)
    await core.all_acked.wait()
    wall = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    if core.failure is not None:
        raise core.failure
    requests = sum(s.requests_sent for s in core.sinks.values())
    core.sinks.stop()
    await core.supervisor.cancel_all()
    await core.target.close()
    return {"wall_s": wall, "bytes": total, "acked_bytes": core.acked_bytes,
            "batches": len(batches), "requests": requests, "cpu_s": cpu}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--target-topic")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
