"""The shallow mirror engine: fetch RecordBatches from a source cluster and produce them,
byte-for-byte, to a target cluster; track offsets, share partitions, report metrics.

``MirrorEngine`` routes by a topic mapper; ``BatchForwarder`` lets a program decide per batch;
``mirror``/``mirror_async`` are the one-call API. Settings: ``ENGINE_SETTINGS``. Later features
attach to ``engine.hooks`` (``EngineHooks``: batch acknowledged, offsets committed, partitions
assigned/revoked).
"""

from .api import ensure_target_topics, mirror, mirror_async
from .batch import BatchAbandonedError, EngineStats, FetchedBatch, PartitionStats
from .config import ENGINE_SETTINGS
from .engine import MirrorEngine, identity_mapper, prefix_mapper
from .forwarder import BatchForwarder, SyncBatchForwarder
from .hooks import BatchAck, EngineHooks, HookError
from .metrics import JsonLinesMetricsSink, ListMetricsSink, MetricsSink, NullMetricsSink
from .offsets import MapRow, OffsetMap
from .sink import MessageTooLargeError
from .supervisor import EngineTaskError
from .topic_names import TopicMapperError

__all__ = [
    "ENGINE_SETTINGS", "BatchAbandonedError", "BatchAck", "BatchForwarder", "EngineHooks", "EngineTaskError", "EngineStats", "FetchedBatch",
    "HookError", "JsonLinesMetricsSink", "ListMetricsSink", "MapRow", "MessageTooLargeError", "MetricsSink", "MirrorEngine",
    "NullMetricsSink", "OffsetMap", "PartitionStats", "TopicMapperError", "ensure_target_topics", "identity_mapper",
    "mirror", "mirror_async", "prefix_mapper", "SyncBatchForwarder",
]
