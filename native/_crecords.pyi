"""Interface of the native record-set codec (``shallowmirror.codec._crecords``).

Identical to the pure-Python twin ``shallowmirror.codec.records``; see
``shallowmirror.codec.contract`` for the contract both satisfy.
"""

from collections.abc import Sequence

from shallowmirror.codec.contract import BufferLike

LAYOUT: dict[str, int]

class BatchView:
    _records: memoryview
    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    @property
    def compression(self) -> int: ...
    @property
    def timestamp_type(self) -> int: ...
    @property
    def is_transactional(self) -> bool: ...
    @property
    def is_control(self) -> bool: ...
    @property
    def is_legacy(self) -> bool: ...
    @property
    def last_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def buffer(self) -> memoryview: ...

class SplitResult:
    batches: list[BatchView]
    consumed: int
    partial: bool

def split_batches(records: BufferLike, *, verify_crc: bool = True, topic: str | None = None,
                  partition: int | None = None) -> SplitResult: ...
def filter_batches(batches: Sequence[BatchView], *, fetch_offset: int,
                   aborted_transactions: Sequence[tuple[int, int]] | None = None,
                   drop_control: bool = True) -> list[BatchView]: ...
def rewrite_for_produce(batch: BatchView, *, producer_id: int = -1, producer_epoch: int = -1,
                        base_sequence: int = -1, transactional: bool = False,
                        clear_log_append_time: bool = False) -> tuple[bytes, memoryview]: ...

def updated_crc(old_crc: int, old_covered_head: BufferLike, new_covered_head: BufferLike,
                tail_bytes: int) -> int: ...
