"""A source: the fetch loop for the partitions one source broker leads (franz-go's ``source``).

Each round sends one Fetch request for every fetchable partition of this leader, in an order that
rotates between requests (tansu gives the whole ~5 MiB response budget to the first partition
listed), decodes the frame with the codec, splits each partition's record set into batch views,
filters them (control batches; aborted transactions under read_committed), rebuilds the rare batch
that cannot go out as is (a mid-batch first fetch, compaction gaps, legacy magic), registers every
kept batch with the partition's offset tracker and hands it to the engine.

Memory: before each Fetch the loop waits until a useful amount of the byte budget is free (a
quarter of ``buffer.memory``, at most ``fetch.max.bytes``) and asks the broker for no more than
what is free: fetching goes on while produce requests are in flight, and the bytes held stay
within ``buffer.memory`` (plus what a broker returns beyond ``max_bytes``: Kafka's first batch,
tansu's ~5 MiB). The frame is charged to the budget until its last batch is acknowledged
(``FrameLease``). A trailing partial batch is simply
fetched again next round from the last whole batch.

Errors per partition: leader moved / unknown partition -> the engine refreshes metadata and moves
the partition; OFFSET_OUT_OF_RANGE -> the engine applies auto.offset.reset; a corrupt batch or a
legacy batch with ``legacy.format=fail`` stops *that* partition (nothing of it forwarded, offset
not advanced) while the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kafka.errors import OffsetOutOfRangeError
from kafka.protocol.consumer import ListOffsetsRequest

from shallowmirror import codec
from shallowmirror.codec import deep
from shallowmirror.codec.layout import TRANSACTIONAL_MASK
from shallowmirror.engine import hotpath
from shallowmirror.engine.backoff import Backoff
from shallowmirror.engine.batch import TP, FetchedBatch, SourcePartition, still_owned
from shallowmirror.engine.budget import ByteBudget, FrameLease
from shallowmirror.engine.fetch_session import FetchSession
from shallowmirror.engine.fetch_share import Sharers, fair_partition_bytes
from shallowmirror.engine.packing import Rotation
from shallowmirror.engine.runtime import Runtime
from shallowmirror.engine.startup import StartupTimeline
from shallowmirror.engine.supervisor import partitions_text, where_of
from shallowmirror.errors import (
    BrokerError,
    ConnectionFailedError,
    CorruptDataError,
    LocatedError,
    UnsupportedFormatError,
    Where,
    broker_error_info,
)
from shallowmirror.net import Cluster
from shallowmirror.net.protocol import FETCH_API_KEY, fetch_request, versions

log = logging.getLogger(__name__)


class Source:
    """Fetches for every partition led by one source broker."""

    def __init__(self, owner: Sources, node_id: int) -> None:
        self.owner = owner
        self.node_id = node_id
        self.partitions: dict[tuple[str, int], SourcePartition] = {}
        self.rotation: Rotation[tuple[str, int]] = Rotation()
        self.wake = asyncio.Event()
        self.fetches = 0
        settings = owner.settings
        self.max_wait_ms = settings["fetch.max.wait.ms"]
        self.min_bytes = settings["fetch.min.bytes"]
        self.max_bytes = settings["fetch.max.bytes"]
        self.partition_max_bytes = settings["max.partition.fetch.bytes"]
        #: Fetch once this much of the budget is free (asking for what is free, up to max_bytes):
        #: a fetcher that waited for a whole fetch.max.bytes would, with a small buffer.memory,
        #: wait for every byte to be acknowledged and never overlap fetch and produce.
        self.min_fetch_bytes = max(1, min(self.max_bytes, owner.budget.limit_bytes // 4))
        self.read_committed = settings["isolation.level"] == "read_committed"
        #: Partitions already warned about transactional data under read_uncommitted.
        self.warned_transactional: set = set()
        self.verify_crc = settings["crc.check"]
        #: KIP-227: only changed partitions are sent once the broker holds a session.
        self.session = FetchSession(settings["fetch.session.enable"])
        #: Between how many partitions a Fetch's bytes are shared (engine.fetch_share).
        self.sharers = Sharers()
        self.legacy_convert = settings["legacy.format"] == "convert"
        #: How far a batch rebuilt on the deep path may decompress (decompression bombs).
        self.deep_limit = deep.DecompressionLimit(
            ratio=settings["deep.max.decompression.ratio"],
            max_bytes=settings["deep.max.decompressed.bytes"])

    def _warn_transactional(self, sp: SourcePartition, first: Any) -> None:
        """Say once per partition that transactional data is forwarded whatever its outcome
        (``first``: the first transactional batch seen).

        The mirror drops transaction markers and clears the transactional bit, so under
        read_uncommitted the records of aborted (and still open) source transactions become
        ordinary data on the target, where no read_committed consumer can filter them out."""
        self.warned_transactional.add(sp.tp)
        log.warning(
            "cluster %s, topic-partition %s-%d, offset %d: transactional batches are mirrored "
            "with isolation.level=read_uncommitted, so records of aborted transactions become "
            "plain data on the target; set isolation.level=read_committed to mirror committed "
            "records only", self.owner.alias, sp.topic, sp.partition, first.base_offset)

    @property
    def budget(self) -> ByteBudget:
        return self.owner.budget

    def add(self, sp: SourcePartition) -> None:
        self.partitions[sp.tp] = sp
        self.rotation.add(sp.tp)
        if self.session.holds(sp.tp):
            # The broker's session still has it from before (revoked and assigned again): only
            # a full request makes the broker answer it while it is idle (engine.fetch_session).
            self.session.restart()
        self.wake.set()

    def remove(self, tp: tuple[str, int]) -> None:
        self.partitions.pop(tp, None)
        self.rotation.remove(tp)
        self.sharers.forget(tp)

    async def run(self) -> None:
        """The fetch loop (supervised by the engine: an error escaping it is not swallowed)."""
        backoff = self.owner.backoff()
        while not self.owner.stopping:
            # Whether any partition can be fetched (``any`` stops at the first that can);
            # ``_fetch_once`` picks them, after the waits below.
            order = self.rotation.next_order()
            partitions = self.partitions
            if not any(partitions[tp].fetchable for tp in order):
                self.wake.clear()
                await self.wake.wait()
                continue
            await self.budget.wait_room(self.min_fetch_bytes)
            if self.owner.stopping:
                return
            budget = self.budget
            ask = self.max_bytes if budget.in_use_bytes == 0 else min(
                self.max_bytes, budget.limit_bytes - budget.in_use_bytes)
            try:
                await self._fetch_once(order, ask)
                backoff.reset()
            except ConnectionFailedError as err:
                delay = backoff.next_s()
                log.warning("%s; fetch from source broker %d retried in %.1fs",
                            err, self.node_id, delay)
                self.owner.note_unreachable(err)
                await asyncio.sleep(delay)
                await self.owner.refresh_metadata()    # moves partitions that have a new leader

    def _request(self, version: int, asked: Mapping[TP, int],
                 max_bytes: int | None = None) -> Any:
        """The Fetch request for ``asked`` (tp -> fetch offset, in request order)."""
        max_bytes = self.max_bytes if max_bytes is None else max_bytes
        # The share is of fetch.max.bytes, then capped by this request's: a share that moved
        # with the budget's free room would change the session's limit on most Fetches.
        sharers = self.sharers.of(len(asked), time.monotonic())
        per_partition = min(max_bytes, fair_partition_bytes(self.max_bytes, sharers,
                                                            self.partition_max_bytes))
        isolation = 1 if self.read_committed else 0
        if version < 7 or not self.session.enabled:          # sessions: Fetch v7+
            return fetch_request(
                version, ((t, p, offset, per_partition) for (t, p), offset in asked.items()),
                max_wait_ms=self.max_wait_ms, min_bytes=self.min_bytes, max_bytes=max_bytes,
                isolation_level=isolation)
        session_id, epoch, send, forget = self.session.build(asked, per_partition)
        return fetch_request(
            version, ((t, p, offset, limit) for (t, p), offset, limit in send),
            max_wait_ms=self.max_wait_ms, min_bytes=self.min_bytes, max_bytes=max_bytes,
            isolation_level=isolation, session_id=session_id, session_epoch=epoch,
            forgotten=forget)

    async def _fetch_once(self, ready: list[tuple[str, int]],
                          max_bytes: int | None = None) -> None:
        """One Fetch for those of ``ready`` (in request order) that can be fetched now."""
        conn = await self.owner.connection(self.node_id)
        # Partitions revoked, stopped or moved while the loop waited for budget room or the
        # connection are not asked for (one revoked there once failed the fetch loop, KeyError).
        # One pass reads each position once: the request, the session and the answer's checks
        # all use ``asked`` (with 10,000 partitions owned, each pass over them was ~3-14 ms).
        asked = hotpath.fetch_positions(ready, self.partitions)
        if not asked:
            return
        version = conn.api_version(FETCH_API_KEY, versions(FETCH_API_KEY))
        incremental = self.session.active
        sent_at = time.monotonic()
        try:
            frame = await conn.request_frame(self._request(version, asked, max_bytes))
        except BaseException:
            self.session.reset()        # whether the broker saw that epoch is unknown
            raise
        self.fetches += 1
        if frame is None:
            self.session.reset()
            return
        response = codec.decode_fetch_response(frame, version)
        if not self.session.answered(response.error_code, response.session_id):
            log.info("source broker %d dropped the fetch session (error %d); fetching in full",
                     self.node_id, response.error_code)
            return
        if response.error_code:
            self.session.reset()
            raise BrokerError(response.error_code, Where(cluster=self.owner.alias),
                              "in a Fetch response")
        lease = FrameLease(self.budget, len(frame))
        fetched_at = time.monotonic()
        # KIP-74: the first partition of a full-size fetch gets its first batch whole (in a
        # session: the first partition the broker answered with records, in its own order).
        must_progress = None
        if max_bytes is None or max_bytes >= self.max_bytes:
            must_progress = _first_with_records(response) if incremental else next(iter(asked))
        try:
            for topic in response.topics:
                for part in topic.partitions:
                    tp = (topic.topic, part.partition)
                    sp = self.partitions.get(tp)
                    if sp is None or tp not in asked or sp.fetch_position != asked[tp]:
                        continue        # revoked or moved while the fetch was out
                    self._handle_partition(sp, part, lease, must_progress=tp == must_progress,
                                           fetched_at=fetched_at, asked_at=sent_at)
            if incremental:
                self._unchanged_since(sent_at, asked, response)
        finally:
            lease.drop()
            self.owner.runtime.progress.notify()     # high watermarks may have moved

    def _unchanged_since(self, sent_at: float, asked: Mapping[TP, int], response: Any) -> None:
        """An incremental Fetch leaves out the partitions whose high watermark did not change
        since the session last answered them (``fetch_session``): theirs still holds as of
        ``sent_at``."""
        answered = {(topic.topic, part.partition)
                    for topic in response.topics for part in topic.partitions}
        hotpath.mark_unchanged(asked, answered, self.partitions, sent_at)

    def _handle_partition(self, sp: SourcePartition, part: Any, lease: FrameLease, *,
                          must_progress: bool = False, fetched_at: float | None = None,
                          asked_at: float | None = None) -> None:
        """``must_progress``: the broker had to return this partition's first batch whole, so
        bytes without one complete batch are a corrupt or oversized batch, not a short read.
        ``fetched_at``: when the response came (``time.monotonic()``; now if not given);
        ``asked_at``: when its request was sent (the high watermark holds as of then)."""
        if part.error_code:
            info = broker_error_info(part.error_code)
            if part.error_code == OffsetOutOfRangeError.errno:
                self.owner.offset_out_of_range(sp)
            elif info.invalid_metadata or info.retriable:
                self.owner.leader_moved(sp, info.name)
            else:
                self.owner.stop_partition(sp, BrokerError(part.error_code, Where(
                    cluster=self.owner.alias, topic=sp.topic, partition=sp.partition,
                    offset=sp.fetch_position), "in a Fetch response"))
            return
        if part.high_watermark >= 0:
            sp.high_watermark = part.high_watermark
            if asked_at is not None:
                sp.high_watermark_at = asked_at
        if sp.skip_to_high_watermark:
            sp.skip_to_high_watermark = False
            straddled = _end_of_straddling_batch(part.records, sp.fetch_position)
            if straddled is not None:
                self.owner.skip_to(sp, straddled, "auto.offset.reset=latest")
                return
        records = part.records
        if records is None or len(records) == 0:
            return
        self.sharers.returned_records(sp.tp, time.monotonic() if fetched_at is None else fetched_at)
        startup = self.owner.startup
        if not startup.done:
            startup.mark("first fetch")
        position = sp.fetch_position
        where = Where(cluster=self.owner.alias, topic=sp.topic, partition=sp.partition,
                      offset=position)
        fault: LocatedError | None = None
        try:
            try:
                split = codec.split_batches(records, verify_crc=self.verify_crc, topic=sp.topic,
                                            partition=sp.partition)
            except CorruptDataError as err:
                # Forward the whole batches before the fault, then stop at it.
                fault = err
                cut = err.where.position or 0
                split = codec.split_batches(records[:cut], verify_crc=self.verify_crc,
                                            topic=sp.topic, partition=sp.partition)
            if not split.batches:
                if fault is not None:
                    raise fault
                if must_progress:
                    raise self._no_progress(records, where)
                return
            aborted = (list(part.aborted_transactions or []) if self.read_committed else None)
            kept = codec.filter_batches(split.batches, fetch_offset=position,
                                        aborted_transactions=aborted)
            if self.read_committed and part.last_stable_offset >= 0:
                kept = [b for b in kept if b.base_offset < part.last_stable_offset]
            end = split.batches[-1].next_offset
            if self.read_committed and part.last_stable_offset >= 0:
                end = min(end, max(part.last_stable_offset, position))
            batches = self._prepare(sp, kept, lease, where,
                                    time.monotonic() if fetched_at is None else fetched_at)
        except LocatedError as err:
            if isinstance(err, (CorruptDataError, UnsupportedFormatError)):
                self.owner.stop_partition(sp, err.at(cluster=self.owner.alias,
                                                    topic=sp.topic, partition=sp.partition),
                                         abandon_pending=False)
                return
            raise
        hotpath.add_batches(sp.offsets, batches)   # asserts source_base >= the fetched end
        sp.offsets.add_gap(end)
        self.owner.deliver_all(sp, batches)
        if fault is not None:
            self.owner.stop_partition(sp, fault.at(cluster=self.owner.alias,
                                                  topic=sp.topic, partition=sp.partition),
                                     abandon_pending=False)

    def _no_progress(self, records: Any, where: Where) -> CorruptDataError:
        """What the Java consumer reports as "Failed to make progress": fetching the same
        offset again would return the same bytes forever."""
        claimed = (f"claims {int.from_bytes(records[8:12], 'big', signed=True) + 12} bytes"
                   if len(records) >= 12 else "has no readable length")
        return CorruptDataError(
            f"no complete batch in the {len(records)} bytes fetched: the first batch {claimed} "
            f"(its batchLength is outside the CRC); corrupt, or larger than the broker returns "
            f"(fetch.max.bytes={self.max_bytes}, max.partition.fetch.bytes="
            f"{self.partition_max_bytes})", Where(**{**vars(where), "position": 0}))

    def _prepare(self, sp: SourcePartition, kept: list, lease: FrameLease,
                 where: Where, fetched_at: float) -> list[FetchedBatch]:
        """Batch views ready to forward; the rare ones rebuilt through the deep path.

        The usual batches (v2, at or past the position, no offset gaps, hence at least one
        record) are made in runs by ``hotpath.prepare_usual``: one FetchedBatch each, and the
        frame lease is held once for all of them. Under read_uncommitted the first transactional batch is noted on the way (warned
        once per partition)."""
        out: list[FetchedBatch] = []
        position = sp.fetch_position
        hw = sp.high_watermark
        topic, partition = sp.topic, sp.partition
        warn = not self.read_committed and sp.tp not in self.warned_transactional
        held = 0
        i = 0
        while i < len(kept):
            # Runs of usual batches in one call (hotpath); the view that ends a run here.
            made, i = hotpath.prepare_usual(kept, i, position, topic, partition, lease, hw,
                                            fetched_at, warn, FetchedBatch)
            out.extend(made)
            held += len(made)
            if i == len(kept):
                break
            view = kept[i]
            if warn and view.magic >= 2 and view.attributes & TRANSACTIONAL_MASK:
                warn = False
                self._warn_transactional(sp, view)
                continue            # warned: the next call takes it like any other
            i += 1
            if view.is_legacy:
                if not self.legacy_convert:
                    raise UnsupportedFormatError(
                        f"legacy message format (magic {view.magic}) cannot go into Produce "
                        "v3+; set legacy.format=convert to convert it (deep path)",
                        Where(cluster=self.owner.alias, topic=sp.topic,
                              partition=sp.partition, offset=view.base_offset))
                if view.next_offset <= position:
                    continue
                for data in deep.convert_legacy([view], limit=self.deep_limit):
                    out.extend(self._rebuilt(sp, data, position, "legacy", hw))
                continue
            if view.record_count == 0:
                continue            # emptied by compaction: a gap
            needs_trim = view.base_offset < position
            needs_repack = view.record_count != view.last_offset_delta + 1
            if needs_trim or needs_repack:
                try:
                    data = (deep.trim_batch(view, position, limit=self.deep_limit)
                            if needs_trim else bytes(view.buffer))
                except ValueError:
                    continue        # compaction left no record at or past the position: a gap
                record_offsets = None
                if view.record_count != view.last_offset_delta + 1 or needs_repack:
                    sub = codec.split_batches(data, verify_crc=False)
                    if sub.batches and (sub.batches[0].record_count
                                        != sub.batches[0].last_offset_delta + 1):
                        record_offsets = tuple(
                            r.offset for r in deep.decode_records(sub.batches[0],
                                                                  limit=self.deep_limit))
                        data = deep.repack_batch(sub.batches[0], limit=self.deep_limit)
                rebuilt = self._rebuilt(sp, data, position, "trim" if needs_trim else "repack",
                                        hw, next_offset=view.next_offset)
                if record_offsets is not None and len(rebuilt) == 1:
                    rebuilt[0].record_offsets = record_offsets
                out.extend(rebuilt)
                continue
            raise AssertionError(f"batch {view!r} is neither forwarded as is nor rebuilt")
        if held:
            lease.hold(held)
        return out

    def _rebuilt(self, sp: SourcePartition, data: bytes, position: int, why: str, hw: int,
                 next_offset: int | None = None) -> list[FetchedBatch]:
        sub = codec.split_batches(data, verify_crc=False, topic=sp.topic, partition=sp.partition)
        out = []
        for view in sub.batches:
            end = view.next_offset if next_offset is None else next_offset
            if view.next_offset <= position:
                continue
            log.info("%s-%d: batch at offset %d rebuilt (%s) before forwarding", sp.topic,
                     sp.partition, view.base_offset, why)
            out.append(FetchedBatch(sp.topic, sp.partition, view, lease=None,
                                    source_base=max(view.base_offset, position),
                                    next_offset=max(end, view.next_offset), rebuilt=why,
                                    high_watermark=hw))
        return out


async def list_offset(cluster: Cluster, tp: TP, timestamp: int, *, isolation_level: int = 0) -> int:
    """One ListOffsets for ``tp`` (-2 earliest, -1 latest) to its leader; BrokerError on an error
    code. Versions: net.protocol.API_VERSIONS, capped by what the broker announces."""
    conn = await cluster.leader_connection(*tp)
    req = ListOffsetsRequest(
        replica_id=-1, isolation_level=isolation_level,
        topics=[ListOffsetsRequest.ListOffsetsTopic(
            name=tp[0], partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=tp[1], current_leader_epoch=-1, timestamp=timestamp)])])
    req.API_VERSION = conn.api_version(ListOffsetsRequest.API_KEY,
                                       versions(ListOffsetsRequest.API_KEY))
    resp = await conn.request(req)
    part = resp.topics[0].partitions[0]
    if part.error_code:
        raise BrokerError(part.error_code, Where(cluster=cluster.alias, topic=tp[0],
                                                 partition=tp[1]), "in ListOffsets")
    return part.offset


async def log_start(cluster: Cluster, tp: TP, answered: int = -1) -> int:
    """Where ``tp``'s log starts, after a Fetch from offset 0 was answered OFFSET_OUT_OF_RANGE
    (retention or DeleteRecords moved the start): ``answered``, the answer's log start offset,
    where the broker gives one (tansu), else ListOffsets(earliest) (Kafka answers -1 beside the
    error)."""
    return answered if answered > 0 else await list_offset(cluster, tp, -2)


def _first_with_records(response: Any) -> tuple[str, int] | None:
    for topic in response.topics:
        for part in topic.partitions:
            if part.records is not None and len(part.records):
                return (topic.topic, part.partition)
    return None


Router = Callable[[FetchedBatch], None]
"""The routing decision: called with every kept batch, in fetch order per partition. It sends the
batch on (``EngineCore.route``), hands it to a program, or drops it; each batch once."""

def _end_of_straddling_batch(records: Any, position: int) -> int | None:
    """"latest" on tansu-safe terms. Kafka answers ListOffsets "latest" with a batch boundary (the
    high watermark, or the last stable offset under read_committed); tansu answers the last
    batch's base offset + 1, *inside* that batch. So when the first batch fetched from the
    "latest" position starts below it, its remaining records were already there at assignment:
    skip to the batch's end. Never further: records written since ListOffsets answered (a
    transaction that committed meanwhile) are after "latest" and must be mirrored."""
    if records is None or len(records) == 0:
        return None
    with contextlib.suppress(CorruptDataError):
        for view in codec.split_batches(records, verify_crc=False).batches:
            if view.next_offset > position:
                return view.next_offset if view.base_offset < position else None
    return None


class Sources:
    """The fetch side of one engine: a ``Source`` per source broker, and the fetch decisions that
    span brokers - which broker a partition is fetched from (attach; relocate when its leader
    moves), where it starts (its committed offset, else ``auto.offset.reset``), what
    OFFSET_OUT_OF_RANGE does, skipping ahead, and stopping a partition on a fault. Every kept
    batch goes to ``route``, the routing decision passed in."""

    def __init__(self, runtime: Runtime, partitions: Mapping[TP, SourcePartition],
                 route: Router, *, alias: str) -> None:
        self.runtime = runtime
        #: The partitions the engine owns (the core adds and removes them; read here).
        self.partitions = partitions
        self.route = route
        #: Optional: routes one source partition's batches (in order) to one place at once.
        self.route_all: Callable[[list[FetchedBatch]], None] | None = None
        self.alias = alias
        self.cluster: Cluster | None = None
        self.by_node: dict[int, Source] = {}
        self._moving: set[TP] = set()
        #: Partitions whose topic was found re-created, until they restart at its start.
        self._recreated: set[TP] = set()

    @property
    def settings(self) -> Mapping[str, Any]:
        return self.runtime.settings

    @property
    def budget(self) -> ByteBudget:
        return self.runtime.budget

    @property
    def startup(self) -> StartupTimeline:
        return self.runtime.startup

    @property
    def stopping(self) -> bool:
        return self.runtime.stopping

    def start(self, cluster: Cluster) -> None:
        """Fetch from ``cluster`` (started)."""
        self.cluster = cluster
        cluster.topic_recreated_listeners.append(self._topic_recreated)
        cluster.metadata_listeners.append(self.follow_leaders)

    def values(self) -> list[Source]:
        """The source of every broker fetched from so far."""
        return list(self.by_node.values())

    def wake_all(self) -> None:
        for source in self.by_node.values():
            source.wake.set()

    # ---- what a source asks for ----
    def backoff(self) -> Backoff:
        return self.runtime.backoff()

    def note_unreachable(self, err: BaseException) -> None:
        self.runtime.note_unreachable(self.alias, err)

    async def connection(self, node_id: int):
        assert self.cluster is not None
        return await self.cluster.connection(node_id)

    async def refresh_metadata(self) -> None:
        """Refresh the metadata of every owned topic (after a fetch failed)."""
        assert self.cluster is not None
        with contextlib.suppress(ConnectionFailedError):
            await self.cluster.refresh_metadata(sorted({tp[0] for tp in self.partitions}))

    def deliver_all(self, sp: SourcePartition, batches: list[FetchedBatch]) -> None:
        """Route each of ``batches`` (one partition's, in order): at once through ``route_all``
        when the router routes a partition's batches alike, else one by one."""
        if not batches:
            return
        if self.route_all is not None:
            self.route_all(batches)
            return
        route = self.route
        for batch in batches:
            route(batch)

    @property
    def _list_offsets_isolation(self) -> int:
        return 1 if self.settings["isolation.level"] == "read_committed" else 0

    async def list_offsets(self, tps: list[TP], timestamp: int) -> dict[TP, int]:
        """What ListOffsets answers for each of ``tps`` (-2 earliest, -1 latest): one request
        per leader, all leaders at once; the partitions answered with a retriable error (leader
        moved, connection lost) are asked again after a backoff and a metadata refresh.

        On assignment this is one round trip for a thousand partitions, where one request per
        partition (as before) cost a round trip each before the first fetch."""
        assert self.cluster is not None
        found: dict[TP, int] = {}
        todo = sorted(set(tps))
        backoff = self.backoff()
        while True:
            by_leader: dict[int | None, list[TP]] = {}
            for tp in todo:
                by_leader.setdefault(self.cluster.leader(*tp), []).append(tp)
            retry = by_leader.pop(None, [])
            answers = await asyncio.gather(*(
                self._list_offsets_at(node, part, timestamp) for node, part in by_leader.items()))
            for offsets, again in answers:
                found.update(offsets)
                retry.extend(again)
            if not retry:
                return found
            todo = sorted(retry)
            await asyncio.sleep(backoff.next_s())
            with contextlib.suppress(ConnectionFailedError):
                await self.cluster.refresh_metadata(sorted({t for t, _ in todo}))

    async def _list_offsets_at(self, node_id: int, tps: list[TP],
                               timestamp: int) -> tuple[dict[TP, int], list[TP]]:
        """One ListOffsets to broker ``node_id``: (offsets found, partitions to ask again).
        A non-retriable partition error is raised, naming the partition."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in tps:
            by_topic.setdefault(topic, []).append(partition)
        Topic = ListOffsetsRequest.ListOffsetsTopic
        # Under read_committed "latest" is the last stable offset (isolation_level=1, as the
        # Java consumer asks): past it, records of open transactions would be skipped.
        req = ListOffsetsRequest(
            replica_id=-1, isolation_level=self._list_offsets_isolation,
            topics=[Topic(name=topic, partitions=[
                Topic.ListOffsetsPartition(partition_index=p, current_leader_epoch=-1,
                                           timestamp=timestamp) for p in parts])
                for topic, parts in by_topic.items()])
        try:
            conn = await self.connection(node_id)
            # Versions: net.protocol.API_VERSIONS, capped by what the broker announces.
            req.API_VERSION = conn.api_version(ListOffsetsRequest.API_KEY,
                                               versions(ListOffsetsRequest.API_KEY))
            resp = await conn.request(req)
        except ConnectionFailedError as err:
            self.note_unreachable(err)
            return {}, list(tps)
        found: dict[TP, int] = {}
        for topic in resp.topics:
            for part in topic.partitions:
                tp = (topic.name, part.partition_index)
                if part.error_code == 0:
                    found[tp] = part.offset
                    continue
                err = BrokerError(part.error_code, self._where_obj(tp), "in ListOffsets")
                if not (err.retriable or broker_error_info(part.error_code).invalid_metadata):
                    raise err
        return found, [tp for tp in tps if tp not in found]

    async def list_offset(self, tp: TP, timestamp: int) -> int:
        """The offset ListOffsets answers for ``tp`` (see ``list_offsets``)."""
        return (await self.list_offsets([tp], timestamp))[tp]

    # ---- where a partition starts ----
    async def start_positions(self, tps: list[TP], committed: Mapping[TP, int | None],
                              group_id: str) -> dict[TP, tuple[int, bool]]:
        """Per partition (position, skip to the high watermark first): the committed offset,
        else ``auto.offset.reset`` through ListOffsets (batched per leader)."""
        starts: dict[TP, tuple[int, bool]] = {
            tp: (committed[tp], False) for tp in tps if committed.get(tp) is not None}  # type: ignore[misc]
        missing = [tp for tp in tps if tp not in starts]
        if not missing:
            return starts
        reset = self.settings["auto.offset.reset"]
        found = await self.list_offsets(missing, -2 if reset == "earliest" else -1)
        for tp in missing:
            starts[tp] = (found[tp], reset == "latest")
        shown = ", ".join(f"{t}-{p} at {found[(t, p)]}" for t, p in missing[:5])
        log.info("cluster %s: %d partitions have no committed offset under group %s; starting "
                 "at auto.offset.reset=%s (%s%s)", self.alias, len(missing), group_id, reset,
                 shown, ", ..." if len(missing) > 5 else "")
        return starts

    # ---- which broker fetches a partition ----
    def attach(self, sp: SourcePartition) -> None:
        """Fetch ``sp`` from its leader's source (started on first use); never a partition
        being revoked (``still_owned``): whatever task asks (a leader lookup or an offset reset
        that ended during a revocation, resume's start), it would get a second writer."""
        assert self.cluster is not None
        if sp.revoked:
            log.debug("%s: revoked; not fetched again", self._where(sp.tp))
            return
        leader = self.cluster.leader(*sp.tp)
        sp.leader = leader
        if leader is None:
            self.leader_moved(sp, "no leader")
            return
        topic_id = self.cluster.topic_id(sp.topic)
        if sp.topic_id is None:
            sp.topic_id = topic_id
        elif topic_id is not None and topic_id != sp.topic_id:
            self._restart_recreated(sp, topic_id)
            return
        source = self.by_node.get(leader)
        if source is None:
            source = self.by_node[leader] = Source(self, leader)
            self.runtime.supervisor.spawn_loop(
                source.run, what=lambda: (f"fetch loop of source broker {leader} (partitions "
                                          f"{partitions_text(source.partitions)})"),
                where=lambda: where_of(self.alias, source.partitions))
        source.add(sp)

    def detach(self, sp: SourcePartition) -> None:
        """Fetch ``sp`` no more (revoked, stopped, or moving)."""
        for source in self.by_node.values():
            source.remove(sp.tp)

    def follow_leaders(self) -> None:
        """After a Metadata answer: fetch each partition whose leader is now another broker
        from that broker. A broker that stopped or died leaves no partition error saying its
        partitions moved (its fetches fail on the connection), and a broker that came back and
        was made leader again (preferred leader election) is not told to a source that still
        gets answers from the former leader, now a follower (Fetch v11+ may read from
        followers): without this the first waited for the broker's return, the second stayed
        on the follower."""
        assert self.cluster is not None
        for source in list(self.by_node.values()):
            for sp in list(source.partitions.values()):
                leader = self.cluster.leader(*sp.tp)
                if leader is None or leader == source.node_id or sp.tp in self._moving:
                    continue
                log.info("%s: leader moved from broker %d to %d", self._where(sp.tp),
                         source.node_id, leader)
                self.detach(sp)
                self.attach(sp)

    def leader_moved(self, sp: SourcePartition, reason: str) -> None:
        self.detach(sp)
        sp.leader = None
        if sp.tp in self._moving:
            return
        self._moving.add(sp.tp)
        log.info("%s: %s; refreshing metadata", self._where(sp.tp), reason)
        self.runtime.supervisor.spawn(self._relocate(sp), what="leader lookup",
                                      where=self._where_obj(sp.tp))

    async def _relocate(self, sp: SourcePartition) -> None:
        assert self.cluster is not None
        backoff = self.backoff()
        try:
            while not self.stopping and still_owned(self.partitions, sp):
                await asyncio.sleep(backoff.next_s())
                with contextlib.suppress(ConnectionFailedError):
                    await self.cluster.refresh_metadata([sp.topic])
                if self.cluster.leader(*sp.tp) is not None:
                    self.attach(sp)
                    return
        finally:
            self._moving.discard(sp.tp)

    # ---- a source topic deleted and created again ----
    def _topic_recreated(self, topic: str, _old: str, new: str) -> None:
        """The source cluster gave ``topic`` a new id: restart its owned partitions."""
        for sp in list(self.partitions.values()):
            if sp.topic == topic and sp.topic_id is not None and sp.topic_id != new:
                self._restart_recreated(sp, new)

    def _restart_recreated(self, sp: SourcePartition, topic_id: str) -> None:
        """``sp``'s topic is a new one under the old name (deleted and created again between
        two metadata answers): its offsets start anew, so fetching on at the old position would
        skip the new topic's records below it without a word. Stop fetching it and restart it
        where ``auto.offset.reset`` says, as a first start would."""
        if sp.tp in self._recreated:
            return
        self._recreated.add(sp.tp)
        self.detach(sp)
        self.runtime.supervisor.spawn(self._restart_at_new_start(sp, topic_id),
                                      what="restart of a re-created topic",
                                      where=self._where_obj(sp.tp))

    async def _restart_at_new_start(self, sp: SourcePartition, topic_id: str) -> None:
        try:
            reset = self.settings["auto.offset.reset"]
            new = await self.list_offset(sp.tp, -2 if reset == "earliest" else -1)
            if not still_owned(self.partitions, sp):
                return
            old = sp.fetch_position
            log.warning("%s: source topic %s was deleted and created again (topic id %s, was "
                        "%s): its offsets start anew, so it restarts at %d (auto.offset.reset=%s) "
                        "instead of fetching on at %d; the old topic's copies stay on the "
                        "target, before the new one's", self._where(sp.tp), sp.topic, topic_id,
                        sp.topic_id, new, reset, old)
            # Batches fetched before (the old topic's) finish first: their offsets are forgotten.
            await self.runtime.progress.wait_until(lambda: not sp.offsets.pending)
            if not still_owned(self.partitions, sp):
                return
            sp.offsets.restart(new)
            sp.skip_to_high_watermark = reset == "latest"
            sp.topic_id = topic_id
        finally:
            self._recreated.discard(sp.tp)
        self.attach(sp)

    # ---- faults and skips ----
    def offset_out_of_range(self, sp: SourcePartition) -> None:
        """Apply ``auto.offset.reset`` to ``sp`` (ListOffsets, not the response's log start:
        the broker's answer to the reset is what counts)."""
        self.detach(sp)
        self.runtime.supervisor.spawn(self._reset_out_of_range(sp), what="auto.offset.reset",
                                      where=self._where_obj(sp.tp))

    async def _reset_out_of_range(self, sp: SourcePartition) -> None:
        reset = self.settings["auto.offset.reset"]
        old = sp.fetch_position
        new = await self.list_offset(sp.tp, -2 if reset == "earliest" else -1)
        if not still_owned(self.partitions, sp):
            return
        if new > old:
            log.warning("%s: OFFSET_OUT_OF_RANGE at %d; skipping %d..%d (%d offsets, "
                        "auto.offset.reset=%s)", self._where(sp.tp, old), old, old, new - 1,
                        new - old, reset)
        else:
            log.warning("%s: OFFSET_OUT_OF_RANGE at %d; the source log now ends below what was "
                        "mirrored (topic re-created or truncated?); restarting at %d "
                        "(auto.offset.reset=%s)", self._where(sp.tp, old), old, new, reset)
        # What was fetched below the new start must be acknowledged (or abandoned) first.
        await self.runtime.progress.wait_until(
            lambda: not (new < sp.offsets.end and sp.offsets.pending))
        sp.offsets.reset(new)
        sp.skip_to_high_watermark = reset == "latest"
        self.attach(sp)

    def skip_to(self, sp: SourcePartition, position: int, why: str) -> None:
        if position > sp.fetch_position:
            log.info("%s: skipping to %d (%s)", self._where(sp.tp), position, why)
            sp.offsets.add_gap(position)

    def stop_partition(self, sp: SourcePartition, err: BaseException, *,
                       abandon_pending: bool = True, taken_over: bool = False) -> None:
        """A partition-level fault: stop it, forward nothing more of it, keep its offset.

        ``abandon_pending=False`` (a fault found while fetching) lets the good batches fetched
        before the fault finish, so the position stops exactly at the faulty batch.
        ``taken_over``: another instance fenced it (exactly-once) and mirrors it now."""
        if sp.error is not None:
            return
        sp.taken_over = taken_over
        sp.errors += 1
        sp.error = str(err)
        self.detach(sp)
        if abandon_pending:
            sp.abandon_pending(error=lambda _batch: err)
        log.error("partition stopped, nothing more forwarded from it and its committed offset "
                  "stays at %d: %s", sp.offsets.committed, err)
        self.runtime.progress.notify()

    def _where_obj(self, tp: TP, offset: int | None = None) -> Where:
        return Where(cluster=self.alias, topic=tp[0], partition=tp[1], offset=offset)

    def _where(self, tp: TP, offset: int | None = None) -> str:
        return str(self._where_obj(tp, offset))
