"""The engine's settings: one table, Kafka's key names, validated all at once.

Client keys (``bootstrap.servers``, ``client.id``, ``security.protocol``, ``sasl.*``, ``ssl.*``)
belong to the source/target *client configs*, not to this table; every client reads them through
``shallowmirror.net.config`` (the net layer's ``client_settings``, the membership consumer's and
admin's ``librdkafka_connection``). This table holds what the engine itself decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shallowmirror.engine.offsets import DEFAULT_MAX_ROWS
from shallowmirror.errors import ConfigError
from shallowmirror.settings import Setting, SettingsTable

_MIB = 1024 * 1024


def _acks_problem(value: str) -> str | None:
    """acks=0 gets its reason; any other bad value the accepted ones."""
    if value == "0":
        return ("acks=0 is not supported: the target would not answer Produce requests, so "
                "source offsets could never be committed at acknowledged batches; use all "
                "(the default) or 1")
    if value not in ("all", "-1", "1"):
        return f"must be one of all, -1, 1, got {value!r}"
    return None


ENGINE_SETTINGS = SettingsTable(
    title="Engine (shallow mirror)",
    passthrough_prefixes=("ssl.", "sasl.", "security.", "bootstrap.", "client.", "socket."),
    settings=[
        Setting("group.id", "str", None,
                "Consumer group under which source offsets are committed and partitions shared "
                "between engine processes. Default: shallowmirror-<source alias>-<target alias>.",
                scope="flow"),
        Setting("partition.assignment", "str", "group",
                "group: share partitions with other engines of the same group.id through the "
                "consumer-group protocol; all: take every partition of the topics (one engine), "
                "still committing offsets under group.id. A second engine on the same group.id "
                "with all is found at a commit (an offset this one did not commit: as soon as "
                "their commits differ) and the run stops: both would copy every record.", choices=("group", "all")),
        Setting("group.protocol", "str", "auto",
                "How partitions are shared (partition.assignment=group). auto: consumer where "
                "the source cluster serves it for the group, classic otherwise (chosen at the "
                "first heartbeat; a group id a classic group holds stays classic). classic: "
                "JoinGroup/SyncGroup; a new group's first join waits the broker's "
                "group.initial.rebalance.delay.ms (3 s by default). consumer: KIP-848, the "
                "broker assigns at the first heartbeat, with no delay (first record in well "
                "under a second); needs Kafka 4.0+, or 3.7 with group.coordinator.rebalance."
                "protocols=classic,consumer, and a group.id not already used by a classic group. "
                "Its session timeout is the broker's group.consumer.session.timeout.ms; "
                "session.timeout.ms here is how long the mirror keeps partitions without a "
                "heartbeat answer. The deep path (--deep) always uses classic.",
                choices=("auto", "classic", "consumer"), scope="flow"),
        Setting("group.instance.id", "str", None,
                "Static group membership (KIP-345): a restart within session.timeout.ms gets "
                "its partitions back at once, without a rebalance (a new group's first join "
                "still waits the broker's group.initial.rebalance.delay.ms, 3 s by default). "
                "Unique per process; with tasks.max above 1 each task adds -<task index>. "
                "A stopped static member keeps its partitions until session.timeout.ms ends.",
                scope="flow"),
        Setting("session.timeout.ms", "int", 10000,
                "Group session timeout of the membership consumer (a dead engine's partitions "
                "move after this long).", minimum=1000),
        Setting("heartbeat.interval.ms", "int", 1000, "Group heartbeat interval.", minimum=100),
        Setting("isolation.level", "str", "read_uncommitted",
                "read_committed drops batches of aborted transactions (and control batches, "
                "which are never forwarded anyway).",
                choices=("read_uncommitted", "read_committed")),
        Setting("auto.offset.reset", "str", "earliest",
                "Where to start a partition without a committed offset, and after "
                "OFFSET_OUT_OF_RANGE.", choices=("earliest", "latest")),
        Setting("fetch.max.bytes", "int", 16 * _MIB, "Bytes asked for per Fetch request.",
                minimum=1024),
        Setting("max.partition.fetch.bytes", "int", 4 * _MIB,
                "Bytes asked for per partition in a Fetch request (tansu ignores it).",
                minimum=1024),
        Setting("fetch.max.wait.ms", "int", 500,
                "How long a broker may hold a Fetch with too little data (>= 100: tansu returns "
                "nothing at 0).", minimum=100),
        Setting("fetch.min.bytes", "int", 1, "Minimum bytes for a Fetch answer.", minimum=1),
        Setting("max.request.size", "int", 1 * _MIB,
                "Most bytes in one Produce request; partitions' batches are packed up to it. A "
                "single batch above it is an error naming the size and this limit.",
                minimum=1024),
        Setting("acks", "str", "all",
                "Produce acks: all (-1) or 1. 0 is refused: a target that does not answer "
                "leaves nothing to commit source offsets on.", validator=_acks_problem),
        Setting("enable.idempotence", "bool", True,
                "Stamp the mirror's own producer id/epoch/sequence (InitProducerId on the "
                "target) into every batch: retries never duplicate or reorder."),
        Setting("max.in.flight.requests.per.connection", "int", 5,
                "Produce requests in flight per target broker connection; also the limit per "
                "partition (<= 5 when idempotent).", minimum=1),
        Setting("target.connections.per.broker", "int", 2,
                "Produce connections to each target broker at most. A stock broker works on one "
                "request per connection at a time; more connections let it validate several at "
                "once. Each target partition is pinned to one connection (its batches stay in "
                "order): partitions whose batches are 32 KiB or more are spread over the "
                "connections, smaller-batch partitions share the first one, because spreading "
                "them only makes more, smaller requests, which cost the broker more CPU per byte. "
                "1: one connection per broker.", minimum=1,
                validator=lambda n: None if n <= 16 else f"at most 16, got {n}"),
        Setting("target.answers.per.wakeup", "int", 3,
                "Produce answers the mirror waits for before it wakes up, while at least that "
                "many requests are in flight on a target connection (Linux, plaintext: the "
                "socket's SO_RCVLOWAT is set to the size those answers must have at least). A "
                "wake-up costs more than handling a small request: on Kafka 3.7 with 16 KiB "
                "batches, waiting for 3 took 8% off the mirror's CPU per GB. At most "
                "max.in.flight.requests.per.connection - 1 are awaited, so the broker always "
                "has a request to work on meanwhile. 1: wake for every answer.", minimum=1,
                validator=lambda n: None if n <= 5 else f"at most 5, got {n}"),
        Setting("request.timeout.ms", "int", 30000,
                "Timeout of one Produce request, and how long a stop waits for the batches in "
                "flight. In the Python API, given only here it is the target connection's "
                "request.timeout.ms too, and given only in the target's client config it is "
                "this one (mm2.properties: one producer key sets both).", minimum=1000),
        Setting("retry.backoff.ms", "int", 100, "First backoff after a retriable error.",
                minimum=1),
        Setting("retry.backoff.max.ms", "int", 5000, "Longest backoff.", minimum=1),
        Setting("offset.commit.interval.ms", "int", 5000,
                "How often the committed positions are written to the source cluster.",
                minimum=10),
        Setting("resume.from.target", "bool", True,
                "Exact resume: each offset commit stores, in its metadata, the target position "
                "that goes with the committed source offset; on assignment (start, restart, "
                "rebalance) the target partition is read from there to its end and matched batch "
                "for batch with the source, and fetching starts after the last source batch "
                "already on the target - no duplicates after a crash. A target partition that "
                "does not match (another writer, a truncated target) stops with an error naming "
                "both sides. A first start commits its position with the target's end at once. "
                "Without metadata (commits by older versions; tansu, which keeps none) the "
                "committed offset is used, and committed at once with the target's end too, "
                "so a crash after it copies nothing twice. Off: at-least-once from the committed "
                "offset. Applies to mirrors that route partition i to partition i "
                "(shallowmirror mirror, MirrorEngine), not to BatchForwarder programs.",
                scope="flow"),
        Setting("metadata.max.age.ms", "int", 30000,
                "Refresh metadata (new topics/partitions) at least this often.", minimum=100),
        Setting("buffer.memory", "int", 64 * _MIB,
                "The byte budget: everything fetched but not yet acknowledged by the target. "
                "Fetching pauses while it is used up.", minimum=64 * 1024),
        Setting("offset.map.max.rows", "int", DEFAULT_MAX_ROWS,
                "Rows of exact source-to-target offset translation kept in memory per source "
                "partition (resume's commit metadata, BatchForwarder.offset_map). A row covers "
                "a run of batches without a gap, so a plain mirror needs one per partition; "
                "every transaction of a transactional source ends one (its commit marker is "
                "not forwarded). The oldest rows go first: ~90 bytes each, 0.9 MB per "
                "partition at this default. Long-term translation is the offset syncs topic's.",
                minimum=1),
        Setting("legacy.format", "str", "fail",
                "Magic 0/1 source entries: convert (deep conversion to a v2 batch) or fail "
                "(stop the partition with a clear error).", choices=("convert", "fail")),
        Setting("deep.max.decompression.ratio", "int", 64,
                "A batch rebuilt on the deep path (mid-batch first fetch, compaction gaps, "
                "legacy conversion) may decompress to at most this many times its size on the "
                "wire (never less than 1 MiB); beyond, its partition stops with an error naming "
                "the batch: a decompression bomb cannot exhaust the mirror's memory.",
                minimum=1),
        Setting("deep.max.decompressed.bytes", "int", 256 * _MIB,
                "Upper bound of what one batch may decompress to on the deep path, whatever "
                "deep.max.decompression.ratio allows.", minimum=_MIB),
        Setting("log.append.time", "str", "clear",
                "Batches with the LogAppendTime bit (from LogAppendTime source topics): clear "
                "the bit, so records carry the create times their producers set (what a Kafka "
                "3.6+ CreateTime topic turns such a batch into anyway); or keep it, which stock "
                "brokers reject (Kafka 3.0-3.5 always, 3.6+ on LogAppendTime target topics: "
                "INVALID_TIMESTAMP) - only for brokers that accept it.",
                choices=("clear", "keep")),
        Setting("fetch.session.enable", "bool", True,
                "Incremental Fetch sessions (KIP-227): after the first request a source broker "
                "is sent only the partitions whose position changed, so an idle partition "
                "costs nothing per fetch (thousands of partitions). Brokers without sessions "
                "(tansu) are fetched in full automatically."),
        Setting("crc.check", "bool", True, "Verify every source batch's CRC-32C before "
                "forwarding it (a bad one stops its partition, naming the offset). Off: a "
                "damaged batch still keeps a wrong CRC on its way (the stamp updates the CRC "
                "from the header's change, never over the records), so the target refuses it."),
        Setting("metrics.file", "str", None, "JSON-lines metrics file (flow + process "
                "records); none when empty."),
        Setting("metrics.interval.ms", "int", 1000,
                "Aggregate flow records per partition over this interval (0: one per batch).",
                minimum=0),
        Setting("exactly.once.source.support", "str", "disabled",
                "MirrorMaker 2's switch for exactly-once (KIP-618/656): enabled turns on "
                "exactly.once for every flow (see below) but one that sets "
                "`A->B.exactly.once = false`; preparing and disabled leave it off.",
                choices=("disabled", "preparing", "enabled")),
        Setting("exactly.once", "bool", False,
                "Transactional exactly-once, per flow (`A->B.exactly.once = true`): read_committed "
                "fetches; one transactional producer per source partition on the target "
                "(transactional.id `<group.id>:<flow>:<topic>:<partition>`, so whoever takes a "
                "partition over fences its previous owner); each transaction holds the mirrored "
                "batches and the source offsets, committed to group.id ON THE TARGET; a restart "
                "resumes from there (the first start takes the source group's offsets once). "
                "Consumers of the target see the records with isolation.level=read_committed."),
        Setting("transaction.max.bytes", "int", 16 * _MIB,
                "Exactly-once: close a source partition's transaction once it holds this many "
                "batch bytes (at most buffer.memory).", minimum=1),
        Setting("transaction.interval.ms", "int", 1000,
                "Exactly-once: close a source partition's transaction at the latest this long "
                "after it started (read_committed consumers see records this much later; "
                "below transaction.timeout.ms).", minimum=1),
        Setting("transaction.timeout.ms", "int", 60000,
                "Exactly-once: the transaction timeout given to the target's transaction "
                "coordinator (InitProducerId); a transaction open longer is aborted by the "
                "broker (at most the broker's transaction.max.timeout.ms, 15 min by default).",
                minimum=1000),
        Setting("producer.id", "int", -1,
                "Not for users: a fixed producer id (tests); -1 asks the target."),
    ],
)


def resolve_settings(raw: Mapping[str, Any] | None, *, context: str = "engine") -> dict[str, Any]:
    """Defaults overlaid with ``raw`` (strings or typed values), checked across keys."""
    values = ENGINE_SETTINGS.resolve(dict(raw or {}), context=context)
    problems = []
    if values["enable.idempotence"] and values["max.in.flight.requests.per.connection"] > 5:
        problems.append("max.in.flight.requests.per.connection must be <= 5 when "
                        "enable.idempotence=true (brokers track only the last 5 batches)")
    if values["enable.idempotence"] and acks_value(values) != -1:
        problems.append(f"acks={values['acks']} with enable.idempotence=true: idempotence needs "
                        "acks=all (a leader failover could lose acknowledged batches); set "
                        "acks=all or enable.idempotence=false")
    if values["fetch.max.bytes"] > values["buffer.memory"]:
        problems.append(f"fetch.max.bytes ({values['fetch.max.bytes']}) must not exceed "
                        f"buffer.memory ({values['buffer.memory']})")
    if values["retry.backoff.max.ms"] < values["retry.backoff.ms"]:
        problems.append("retry.backoff.max.ms must be >= retry.backoff.ms")
    problems.extend(_exactly_once_problems(values))
    if problems:
        # Named like the single-key problems: which flow (or engine) they are about.
        raise ConfigError([f"{context}: {p}" for p in problems])
    return values


def exactly_once(values: Mapping[str, Any]) -> bool:
    """Transactional exactly-once on: ``exactly.once`` or MM2's ``exactly.once.source.support``."""
    return bool(values.get("exactly.once")) or \
        values.get("exactly.once.source.support") == "enabled"


def _exactly_once_problems(values: dict[str, Any]) -> list[str]:
    """Exactly-once needs idempotent acks=all producers and read_committed fetches (set here:
    copying records of aborted source transactions into committed target ones would break the
    guarantee), and transactions that close well before the broker times them out. Exact resume
    from the target (deliverable 1) is not used: the target-side group offsets are the resume
    point, committed atomically with the records."""
    if not exactly_once(values):
        return []
    problems = []
    if not values["enable.idempotence"]:
        problems.append("exactly-once needs enable.idempotence=true (transactions are "
                        "idempotent); remove enable.idempotence=false or turn exactly-once off")
    if acks_value(values) != -1:
        problems.append(f"exactly-once needs acks=all, not acks={values['acks']}")
    if values["transaction.interval.ms"] * 2 > values["transaction.timeout.ms"]:
        problems.append(f"transaction.interval.ms ({values['transaction.interval.ms']}) must be "
                        "at most half of transaction.timeout.ms "
                        f"({values['transaction.timeout.ms']}): a transaction must be committed "
                        "well before the broker aborts it")
    if values["transaction.max.bytes"] > values["buffer.memory"]:
        problems.append(f"transaction.max.bytes ({values['transaction.max.bytes']}) must not "
                        f"exceed buffer.memory ({values['buffer.memory']}): a transaction's "
                        "batches stay in memory until it commits")
    values["isolation.level"] = "read_committed"
    if "resume.from.target" in values:
        values["resume.from.target"] = False
    return problems


def acks_value(values: Mapping[str, Any]) -> int:
    """The Produce request's acks field."""
    return -1 if str(values["acks"]) in ("all", "-1") else int(values["acks"])

