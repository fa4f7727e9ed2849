"""The shallow mirror engine: fetch RecordBatches from a source cluster and produce them,
byte-for-byte, to a target cluster; track offsets, share partitions, report metrics."""

from .config import ENGINE_SETTINGS

__all__ = ["ENGINE_SETTINGS"]
