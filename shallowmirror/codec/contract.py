"""The codec's contract: what the native (Cython) codec and its pure-Python twin both provide.

Both implementations expose the same functions with the same signatures and return objects with the
same attribute names and values; the differential suite (tests/unit/codec/test_records_differential.py)
holds them to it. Buffers handed out (``BatchView.buffer``, ``FetchPartition.records``, the body
returned by ``rewrite_for_produce``) are *views into the caller's buffer*, never copies.

Errors: malformed bytes raise ``shallowmirror.errors.CorruptDataError`` (``CrcMismatchError`` for a
bad CRC) whose ``where`` carries topic/partition (when the caller passed them), the offset of the
batch, and the byte position inside the buffer being parsed. Never a crash, never a silent skip.
Arguments are checked at the boundary, with the same errors in both implementations: TypeError
for a wrong type (an int argument must be an integer, a batch a ``BatchView`` of the same
implementation), ValueError for a value outside its wire range (e.g. int64 offsets), so no
argument can reach the native code unchecked.

Out of scope here: anything that decompresses records (see ``shallowmirror.codec.deep``), network
I/O, and requests other than Fetch/Produce (kafka-python's protocol classes encode those).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence, Sized
from typing import Any, Protocol, runtime_checkable

BufferLike = bytes | bytearray | memoryview
#: A batch ready to send: one or more buffer pieces whose concatenation is the RecordBatch.
BatchPieces = Sequence[BufferLike]
#: What one partition carries in a Produce request: a list of batches (one, unless enabled).
PartitionBatches = Sequence[BatchPieces]
#: (topic, [(partition, batches), ...]) in request order.
TopicBatches = tuple[str, Sequence[tuple[int, PartitionBatches]]]


@runtime_checkable
class BatchView(Protocol):
    """One RecordBatch (magic 2) or legacy message-set entry (magic 0/1) inside a record set.

    Header fields use Kafka's names. For legacy entries (``is_legacy``) only base_offset
    (the entry's offset field: the *last* inner offset for a compressed magic-1 wrapper),
    batch_length (the message size), crc, magic, attributes, compression and buffer are
    meaningful; the v2-only fields are -1.
    """

    position: int              # byte offset of this batch inside the record set
    base_offset: int
    batch_length: int          # bytes after the length field (size = batch_length + 12)
    partition_leader_epoch: int
    magic: int
    crc: int                   # as stored (unsigned 32-bit)
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def compression(self) -> int: ...          # 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd
    @property
    def timestamp_type(self) -> int: ...       # 0 CreateTime, 1 LogAppendTime
    @property
    def is_transactional(self) -> bool: ...
    @property
    def is_control(self) -> bool: ...
    @property
    def is_legacy(self) -> bool: ...           # magic 0 or 1
    @property
    def last_offset(self) -> int: ...          # base_offset + last_offset_delta
    @property
    def next_offset(self) -> int: ...          # last_offset + 1
    @property
    def size(self) -> int: ...                 # whole batch in bytes
    @property
    def buffer(self) -> memoryview: ...        # the whole batch, a view into the record set


@runtime_checkable
class SplitResult(Protocol):
    batches: list              # list[BatchView], in order
    consumed: int              # bytes covered by whole batches
    partial: bool              # True if bytes remain after the last whole batch (truncated tail)


@runtime_checkable
class FetchPartition(Protocol):
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int    # -1 when the version has none
    log_start_offset: int      # -1 when the version has none
    aborted_transactions: list  # list[tuple[int, int]]: (producer_id, first_offset); [] if none
    preferred_read_replica: int  # -1 when the version has none
    records: memoryview | None   # view into the response frame


@runtime_checkable
class FetchTopic(Protocol):
    topic: str
    partitions: list           # list[FetchPartition]


@runtime_checkable
class FetchResponse(Protocol):
    correlation_id: int
    throttle_time_ms: int
    error_code: int
    session_id: int
    topics: list               # list[FetchTopic]


@runtime_checkable
class ProducePartitionResponse(Protocol):
    partition: int
    error_code: int
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    record_errors: list        # list[tuple[int, str | None]]: (batch_index, message)
    error_message: str | None


@runtime_checkable
class ProduceResponse(Protocol):
    correlation_id: int
    throttle_time_ms: int
    topics: list               # list[tuple[str, list[ProducePartitionResponse]]]


class Codec(Protocol):
    """The functions each implementation module provides (``records`` + ``messages`` together)."""

    def split_batches(self, records: BufferLike, *, verify_crc: bool = True,
                      topic: str | None = None, partition: int | None = None) -> SplitResult:
        """Split a record set into batch views; stop cleanly at a trailing partial batch.

        Checks every header (length bounds, magic, known codec, record_count ==
        last_offset_delta + 1 for magic 2, CRC-32C over attributes..end when verify_crc)."""

    def filter_batches(self, batches: Sequence[BatchView], *, fetch_offset: int,
                       aborted_transactions: Sequence[tuple[int, int]] | None = None,
                       drop_control: bool = True) -> list:
        """Batches worth forwarding: drop control batches, batches of aborted transactions
        (read_committed semantics: producer id + first offset, ended by the ABORT marker), and
        batches wholly below fetch_offset. A batch straddling fetch_offset is kept (the caller
        trims it with ``deep.trim_batch``)."""

    def rewrite_for_produce(self, batch: BatchView, *, producer_id: int = -1,
                            producer_epoch: int = -1, base_sequence: int = -1,
                            transactional: bool = False,
                            clear_log_append_time: bool = False) -> tuple[bytes, memoryview]:
        """(new 61-byte header, view of the rest). base_offset 0 and partition_leader_epoch -1
        (outside the CRC); producer fields/attributes as given; the delete-horizon bit (KIP-534,
        set by the source's log cleaner) always cleared; CRC recomputed only if a covered byte
        changed. The payload is never decompressed."""

    def stamp_batches(self, picks: Iterable[tuple[Hashable, Any]], *, producer_id: int = -1,
                      producer_epoch: int = -1, generation: int,
                      sequences: dict[Hashable, int] | None = None,
                      clear_log_append_time: bool = False, headers: bool = True) -> int:
        """Stamp the batches of one Produce request, in one call. ``picks`` are ``(key,
        batch)`` pairs; a batch has ``view`` (a ``BatchView``), ``record_count`` and
        ``stamp_generation``. Each batch whose ``stamp_generation`` is not ``generation`` gets
        ``header, rest = rewrite_for_produce(view, ...)`` (not transactional) with base sequence
        ``sequences[key]`` (0 when absent), which then grows by ``record_count`` modulo 2**31
        (``sequences`` None: not idempotent, base sequence -1; an idempotent batch without
        records is a ValueError), and ``producer_id``, ``producer_epoch``, ``base_sequence``
        and ``stamp_generation`` set to what was stamped. Batches already of ``generation`` are
        left alone (a resend keeps its bytes). ``headers=False`` checks each batch as the
        rewrite would and sets the stamp fields, but makes no ``header``/``rest``:
        ``encode_produce_batches`` writes the header from them. Returns how many were stamped."""

    def decode_fetch_response(self, frame: BufferLike, version: int) -> FetchResponse:
        """Decode a Fetch response frame (after the 4-byte size prefix, starting with the
        correlation id) for versions 4..12."""

    def encode_produce_request(self, *, version: int, correlation_id: int, client_id: str | None,
                               transactional_id: str | None, acks: int, timeout_ms: int,
                               topics: Sequence[TopicBatches],
                               allow_multiple_batches: bool = False) -> list:
        """A complete framed Produce request (size prefix included) as a list of buffers for
        ``socket.sendmsg``; payload pieces are the caller's buffers, not copies. Versions 3..9
        (flexible from 9). Raises ValueError for two batches of one partition unless allowed,
        or a partition listed twice."""

    def encode_produce_batches(self, picks: Sequence[tuple[tuple[str, int], Any]], *,
                               version: int, correlation_id: int, client_id: str | None,
                               transactional_id: str | None, acks: int, timeout_ms: int,
                               clear_log_append_time: bool = False) -> tuple[Sequence, int]:
        """(request, the fewest bytes its answer can have) for one request's stamped picks:
        ``((topic, partition), batch)`` pairs, one batch per partition, where each batch has
        ``view`` and the stamp ``stamp_batches`` set (``stamp_generation`` >= 0, else a
        ValueError). The request is ``encode_produce_request`` of the picks grouped by topic
        in pick order, each batch as ``rewrite_for_produce(view, producer_id, producer_epoch,
        base_sequence, clear_log_append_time)`` computes it, written from the stamp: the bytes
        of a resend are those of its first send. It is a sequence of buffer pieces whose
        concatenation is the framed request (the native build's pieces are fewer, and made
        only when asked for: ``native/_csend.pyx`` writes it straight from its pointers);
        the answer bound is ``produce_response_min_bytes``'s."""

    def decode_produce_response(self, frame: BufferLike, version: int) -> ProduceResponse:
        """Decode a Produce response frame (after the size prefix) for versions 3..9."""

    def decode_produce_answer(self, frame: BufferLike, version: int) -> Any:
        """``decode_produce_response``'s checks and errors, its result read as the engine's
        settle loop reads it: the native build keeps the partitions' fields in C arrays and
        makes the ``ProduceResponse`` objects only when ``topics`` (or ``response()``) is read;
        the twin returns the ``ProduceResponse``. ``topics`` and ``correlation_id`` are the
        response's either way."""

    def produce_response_min_bytes(self, version: int,
                                   topics: Sequence[tuple[str, Sized]]) -> int:
        """The fewest bytes (size prefix included) a Produce response (v3..v9) to the request
        built from ``topics`` (as given to ``encode_produce_request``: each topic's name and
        number of partitions are read) can have: every partition answered without an error
        text or record errors. A real answer is never shorter."""

    def receive_buffer(self, size: int) -> bytearray:
        """A bytearray of ``size`` bytes to receive one response frame into. Its contents are
        unspecified (native: not zeroed; the frame is written over all of it before anyone reads
        it), so a multi-megabyte Fetch response costs no memset. ValueError if size < 0."""
