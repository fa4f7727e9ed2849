"""Deep mirror with confluent-kafka: Consumer -> Producer, the mirror a Python user would write.

Every record is decompressed by the consumer and recompressed by the producer (same
``compression.type``, ``batch.size`` and ``linger.ms`` as the workload's producer). Keys, values,
headers, timestamps and partitions are preserved. Offsets are committed only after the producer
delivered everything consumed so far (flush, then commit), about once a second.

Tuned reasonably, not heroically: large fetches, a deep producer queue, batches of 10k messages
per ``consume`` call. Partitions are ``assign``ed rather than ``subscribe``d because tansu holds
JoinGroup for session.timeout/2 (seconds of idle time that would count as mirror time).
"""

from __future__ import annotations

import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from shallowmirror.bench.modes import common

_COMMIT_INTERVAL_S = 1.0


def main(argv: list[str] | None = None) -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    stop = common.stop_on_signals()
    consumer = Consumer({
        "bootstrap.servers": args.source,
        "group.id": args.group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 64 << 20,
        "max.partition.fetch.bytes": 16 << 20,
        "fetch.wait.max.ms": 100,
        "queued.max.messages.kbytes": 256 * 1024,
        "enable.partition.eof": False,
    })
    producer = Producer({
        "bootstrap.servers": args.target,
        "compression.type": args.codec,
        "batch.size": args.batch_bytes,
        "linger.ms": args.linger_ms,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 512 * 1024,
        "message.max.bytes": max(1_000_000, args.batch_bytes * 2),
        "acks": "all",
    })
    failures: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failures.append(str(err))

    md = consumer.list_topics(timeout=30)
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING)
                     for t in args.topic for p in md.topics[t].partitions])
    targets = {t: t + args.target_suffix for t in args.topic}
    produce = producer.produce
    common.emit("ready", time=time.time())
    next_commit = time.monotonic() + _COMMIT_INTERVAL_S
    consumed_since_commit = False
    while not stop.is_set():
        for msg in consumer.consume(10_000, 0.1):
            if msg.error() is not None:
                raise KafkaException(msg.error())
            while True:
                try:
                    produce(targets[msg.topic()], msg.value(), msg.key(),
                            partition=msg.partition(), timestamp=msg.timestamp()[1],
                            headers=msg.headers(), on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.01)
            consumed_since_commit = True
        producer.poll(0)
        if failures:
            raise KafkaException(f"delivery failed: {failures[:3]}")
        if consumed_since_commit and time.monotonic() >= next_commit:
            _commit_after_delivery(consumer, producer)
            consumed_since_commit = False
            next_commit = time.monotonic() + _COMMIT_INTERVAL_S
    _commit_after_delivery(consumer, producer)
    consumer.close()
    return 0


def _commit_after_delivery(consumer: Consumer, producer: Producer) -> None:
    producer.flush()
    try:
        consumer.commit(asynchronous=False)
    except KafkaException as err:
        # Nothing consumed since the last commit is not an error worth dying for.
        if "NO_OFFSET" not in str(err):
            raise


if __name__ == "__main__":
    raise SystemExit(main())
