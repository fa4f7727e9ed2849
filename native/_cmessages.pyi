"""Type stub for the native message codec; same interface as ``shallowmirror.codec.messages``."""

from collections.abc import Sequence, Sized

from shallowmirror.codec.contract import BufferLike, TopicBatches

FETCH_VERSIONS: tuple[int, int]
PRODUCE_VERSIONS: tuple[int, int]
FETCH_FIRST_FLEXIBLE: int
PRODUCE_FIRST_FLEXIBLE: int
PRODUCE_API_KEY: int

class FetchPartition:
    _fields: tuple[str, ...]
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: list[tuple[int, int]]
    preferred_read_replica: int
    records: memoryview | None
    def __init__(self, partition: int, error_code: int, high_watermark: int,
                 last_stable_offset: int, log_start_offset: int,
                 aborted_transactions: list[tuple[int, int]], preferred_read_replica: int,
                 records: memoryview | None) -> None: ...

class FetchTopic:
    _fields: tuple[str, ...]
    topic: str
    partitions: list[FetchPartition]
    def __init__(self, topic: str, partitions: list[FetchPartition]) -> None: ...

class FetchResponse:
    _fields: tuple[str, ...]
    correlation_id: int
    throttle_time_ms: int
    error_code: int
    session_id: int
    topics: list[FetchTopic]
    def __init__(self, correlation_id: int, throttle_time_ms: int, error_code: int,
                 session_id: int, topics: list[FetchTopic]) -> None: ...

class ProducePartitionResponse:
    _fields: tuple[str, ...]
    partition: int
    error_code: int
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    record_errors: list[tuple[int, str | None]]
    error_message: str | None
    def __init__(self, partition: int, error_code: int, base_offset: int,
                 log_append_time_ms: int, log_start_offset: int,
                 record_errors: list[tuple[int, str | None]],
                 error_message: str | None) -> None: ...

class ProduceResponse:
    _fields: tuple[str, ...]
    correlation_id: int
    throttle_time_ms: int
    topics: list[tuple[str, list[ProducePartitionResponse]]]
    def __init__(self, correlation_id: int, throttle_time_ms: int,
                 topics: list[tuple[str, list[ProducePartitionResponse]]]) -> None: ...

def decode_fetch_response(frame: BufferLike, version: int) -> FetchResponse: ...
def decode_produce_response(frame: BufferLike, version: int) -> ProduceResponse: ...
def receive_buffer(size: int) -> bytearray: ...
def produce_response_min_bytes(version: int, topics: Sequence[tuple[str, Sized]]) -> int: ...
def encode_produce_request(*, version: int, correlation_id: int, client_id: str | None,
                           transactional_id: str | None, acks: int, timeout_ms: int,
                           topics: Sequence[TopicBatches],
                           allow_multiple_batches: bool = False) -> list[BufferLike]: ...
def join_request(buffers: Sequence[BufferLike]) -> bytes: ...
