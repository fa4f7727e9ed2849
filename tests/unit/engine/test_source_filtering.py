"""The fetch side without a broker: read_committed drops aborted transactions and control batches
(synthetic aborted lists: tansu reports none), a mid-batch fetch trims, legacy and corrupt batches
stop only their partition. The source side (``Sources``) here is a small scripted fake, named as
such."""

from __future__ import annotations

import struct
from typing import Any

from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from shallowmirror.codec import layout as L
from shallowmirror.engine.batch import SourcePartition
from shallowmirror.engine.budget import ByteBudget, FrameLease
from shallowmirror.engine.config import resolve_settings
from shallowmirror.engine.offsets import OffsetMap
from shallowmirror.engine.source import Source
from shallowmirror.engine.startup import StartupTimeline


def batch(base: int, count: int, *, pid: int = -1, txn: bool = False, control_abort=None,
          compression: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(2, compression, txn, pid, 0 if pid >= 0 else -1,
                                        0 if pid >= 0 else -1, 1 << 20)
    if control_abort is None:
        for i in range(count):
            builder.append(i, 1_700_000_000_000 + i, None, b"v%d" % (base + i), [])
    else:
        builder.append(0, 1_700_000_000_000, struct.pack(">hh", 0, 0 if control_abort else 1),
                       struct.pack(">hi", 0, 0), [])
    out = bytearray(builder.build())
    struct.pack_into(">q", out, 0, base)
    if control_abort is not None:
        attrs = struct.unpack_from(">h", out, L.ATTRIBUTES_OFFSET)[0] | L.CONTROL_MASK
        struct.pack_into(">h", out, L.ATTRIBUTES_OFFSET, attrs)
        struct.pack_into(">I", out, L.CRC_OFFSET, crc32c(memoryview(out)[L.ATTRIBUTES_OFFSET:]))
    return bytes(out)


class FakeCore:
    """Scripted stand-in for ``source.Sources``: records what the source tells it."""

    def __init__(self, **settings: Any) -> None:
        self.settings = resolve_settings(settings)
        self.budget = ByteBudget(1 << 20)
        self.alias = "A"
        self.delivered: list = []
        self.stopped: list = []
        self.stopping = False
        self.startup = StartupTimeline()

    def deliver_all(self, sp, batches) -> None:
        self.delivered.extend(batches)

    def stop_partition(self, sp, err, abandon_pending=True) -> None:
        sp.error = str(err)
        self.stopped.append(err)


class Part:
    def __init__(self, records: bytes, aborted=(), hw: int = 100, lso: int = -1) -> None:
        self.error_code = 0
        self.high_watermark = hw
        self.last_stable_offset = lso
        self.log_start_offset = 0
        self.aborted_transactions = list(aborted)
        self.records = memoryview(records)


def run(core: FakeCore, records: bytes, position: int = 0, **kw) -> SourcePartition:
    source = Source(core, 1)   # type: ignore[arg-type]
    sp = SourcePartition("t", 0, position, OffsetMap())
    lease = FrameLease(core.budget, len(records))
    source._handle_partition(sp, Part(records, **kw), lease)
    lease.drop()
    return sp


def test_read_committed_drops_aborted_and_control_batches() -> None:
    records = (batch(0, 3, pid=7, txn=True) + batch(3, 2) + batch(5, 1, pid=7, txn=True,
                                                                   control_abort=True)
               + batch(6, 2, pid=8, txn=True) + batch(8, 1, pid=8, txn=True,
                                                      control_abort=False))
    core = FakeCore(**{"isolation.level": "read_committed"})
    sp = run(core, records, aborted=[(7, 0)])
    assert [(b.source_base, b.record_count) for b in core.delivered] == [(3, 2), (6, 2)]
    assert sp.fetch_position == 9          # control and aborted offsets are fetched gaps
    for b in core.delivered:
        sp.offsets.ack(b.entry, b.source_base + 100)
    assert sp.offsets.committed == 9

    core = FakeCore()                       # read_uncommitted: only control batches dropped
    run(core, records, aborted=[(7, 0)])
    assert [(b.source_base, b.record_count) for b in core.delivered] == [(0, 3), (3, 2), (6, 2)]


def test_mid_batch_first_fetch_is_trimmed() -> None:
    core = FakeCore()
    original = batch(0, 10, compression=3)
    sp = run(core, original + batch(10, 5), position=4)
    first = core.delivered[0]
    assert (first.source_base, first.record_count, first.rebuilt) == (4, 6, "trim")
    assert first.compression == original[L.ATTRIBUTES_OFFSET + 1] & L.COMPRESSION_MASK
    assert sp.offsets.pending == 2


def test_corrupt_batch_forwards_what_precedes_it_and_stops() -> None:
    good = batch(0, 3)
    bad = bytearray(batch(3, 3))
    bad[-1] ^= 1
    core = FakeCore()
    sp = run(core, good + bytes(bad) + batch(6, 3))
    assert [b.source_base for b in core.delivered] == [0]
    assert len(core.stopped) == 1 and "offset 3" in str(core.stopped[0])
    assert "cluster A" in str(core.stopped[0]) and "t-0" in str(core.stopped[0])
    assert sp.fetch_position == 3


def test_legacy_batch_fails_or_converts_by_config() -> None:
    b = LegacyRecordBatchBuilder(1, 0, 1 << 20)
    b.append(0, timestamp=1_700_000_000_000, key=None, value=b"old")
    legacy = bytes(b.build())
    core = FakeCore()
    run(core, legacy)
    assert core.stopped and "legacy.format=convert" in str(core.stopped[0])
    core = FakeCore(**{"legacy.format": "convert"})
    run(core, legacy)
    assert [(b.record_count, b.rebuilt) for b in core.delivered] == [(1, "legacy")]
