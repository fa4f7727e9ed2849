"""Deep mirror with kafka-python: KafkaConsumer -> KafkaProducer, in pure Python.

Same contract as ``deep_confluent``: records decompressed and recompressed with the workload's
codec and batching; keys, values, headers, timestamps and partitions preserved; offsets committed
after ``flush`` about once a second; partitions assigned, not subscribed.
"""

from __future__ import annotations

import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

# Imported for its side effect: kafka-python reads and writes snappy only through python-snappy,
# which this project does not install; the codec gives kafka.codec cramjam in its place (every
# snappy workload of this mode failed with "Libraries for snappy compression codec not found").
import shallowmirror.codec.compression  # noqa: F401
from shallowmirror.bench.modes import common

_COMMIT_INTERVAL_S = 1.0


def main(argv: list[str] | None = None) -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    stop = common.stop_on_signals()
    consumer = KafkaConsumer(
        bootstrap_servers=args.source, group_id=args.group, enable_auto_commit=False,
        auto_offset_reset="earliest", fetch_max_bytes=64 << 20,
        max_partition_fetch_bytes=16 << 20, max_poll_records=10_000,
    )
    producer = KafkaProducer(
        bootstrap_servers=args.target,
        compression_type=None if args.codec == "none" else args.codec,
        batch_size=args.batch_bytes, linger_ms=args.linger_ms, acks="all",
        max_request_size=max(1_048_576, args.batch_bytes * 2),
    )
    partitions = [TopicPartition(t, p) for t in args.topic
                  for p in sorted(consumer.partitions_for_topic(t) or ())]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    targets = {t: t + args.target_suffix for t in args.topic}
    common.emit("ready", time=time.time())
    failures: list[BaseException] = []
    next_commit = time.monotonic() + _COMMIT_INTERVAL_S
    pending = False
    while not stop.is_set():
        for tp, msgs in consumer.poll(timeout_ms=100).items():
            topic = targets[tp.topic]
            for msg in msgs:
                producer.send(topic, msg.value, msg.key, headers=msg.headers or None,
                              partition=tp.partition,
                              timestamp_ms=msg.timestamp).add_errback(failures.append)
            pending = True
        if failures:
            raise RuntimeError(f"delivery failed: {failures[:3]}")
        if pending and time.monotonic() >= next_commit:
            producer.flush()
            consumer.commit()
            pending = False
            next_commit = time.monotonic() + _COMMIT_INTERVAL_S
    producer.flush()
    if pending:
        consumer.commit()
    producer.close()
    consumer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
