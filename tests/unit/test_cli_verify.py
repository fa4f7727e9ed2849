"""`shallowmirror verify`'s progress line and summary (the comparison itself is tested against
real brokers in tests/integration/test_verify.py)."""

from __future__ import annotations

import io

from shallowmirror.cli.verify import ProgressLine, summary_lines
from shallowmirror.mirror.verify import PartitionTally, TopicResult, VerifyResult


def test_progress_line_says_how_much_how_fast_and_where():
    out = io.StringIO()
    progress = ProgressLine(out, interval_s=0)
    progress("A->B", "orders", 3, 5_000_000)
    progress("A->B", "orders", 4, 7_000_000)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("verify A->B: 12 MB compared (") and lines[1].endswith(
        "MB/s), at orders-4")


def test_progress_line_is_rate_limited():
    out = io.StringIO()
    progress = ProgressLine(out, interval_s=3600)
    for p in range(10):
        progress("A->B", "orders", p, 1_000_000)
    assert out.getvalue() == ""
    assert progress.bytes == 10_000_000


def test_summary_names_repacked_and_dropped_batches():
    result = VerifyResult([TopicResult("A->B", "orders", "A.orders", 3, PartitionTally(
        batches=10, records=1000, source_bytes=123_456, target_bytes=123_456, repacked=2,
        dropped=4))])
    assert summary_lines(result) == [
        "A->B orders -> A.orders: 3 partitions, 10 batches, 1,000 records, 123,456 bytes compared, "
        "2 re-packed compared record by record, 4 control/aborted/empty source batches not "
        "mirrored"]


def _unreachable_mm2(tmp_path, *extra: str):
    from shallowmirror.testing.embedded import free_port

    port = free_port()                     # nothing listens there: connections are refused
    path = tmp_path / "mm2.properties"
    path.write_text("\n".join(["clusters = A, B", f"A.bootstrap.servers = 127.0.0.1:{port}",
                               f"B.bootstrap.servers = 127.0.0.1:{port}", "A->B.enabled = true",
                               *extra]) + "\n")
    return path


def test_verify_gives_up_on_an_unreachable_cluster_sooner_than_a_mirror(tmp_path, monkeypatch):
    """verify's own deadline (30 s, shortened here) applies unless the config sets one."""
    import asyncio

    import pytest

    from shallowmirror.errors import ConnectionFailedError
    from shallowmirror.mirror import verify as verify_module
    from shallowmirror.mirror.config import load_mm2

    monkeypatch.setattr(verify_module, "RECONNECT_DEADLINE_MS", 300)
    with pytest.raises(ConnectionFailedError, match=r"reconnect\.deadline\.ms=300\b"):
        asyncio.run(verify_module.verify(load_mm2(str(_unreachable_mm2(tmp_path)))))
    configured = _unreachable_mm2(tmp_path, "A.reconnect.deadline.ms = 600")
    with pytest.raises(ConnectionFailedError, match=r"reconnect\.deadline\.ms=600\b"):
        asyncio.run(verify_module.verify(load_mm2(str(configured))))
