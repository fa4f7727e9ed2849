"""``benchmarks/engine/request_floor.c``, the request floor without an interpreter, still measures
what RESULTS.md says it does: every answer read and checked, and with ``native/N`` one wake-up
per N answers, as the mirror's connection takes them (``target.answers.per.wakeup``). A floor
client that woke for every answer overstated the kernel's share of a request (RESULTS.md
section 7, session 33); benchmarks that nothing runs break unnoticed."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from engine_support import benchmark_script

from shallowmirror.bench import topics as bench_topics

pytestmark = pytest.mark.integration

PARTITIONS = 4
IN_FLIGHT = 5


@pytest.mark.skipif(shutil.which("cc") is None, reason="the native floor client needs cc")
def test_native_floor_client_wakes_once_per_n_answers(target_cluster, tmp_path):
    floor = benchmark_script("request_floor")
    bootstrap = target_cluster.bootstrap
    bench_topics.recreate(bootstrap, floor.TOPIC, PARTITIONS)
    batches = [floor.lz4_batch(16384, 300, seed=p) for p in range(PARTITIONS)]
    # The asyncio client waits for the leaders, checks its answers' error codes, and learns
    # the Produce version the C client's request is encoded in.
    probe = asyncio.run(floor.measure(bootstrap, batches, 1, IN_FLIGHT))
    assert probe["requests"] >= 200
    binary = floor.build_native_client(str(tmp_path))
    rows = {n: floor.measure_native(binary, bootstrap, batches, 1, IN_FLIGHT,
                                    probe["produce_version"], str(tmp_path), coalesce=n)
            for n in (1, 3)}
    requests = rows[1]["requests"]
    assert requests >= 200 and rows[3]["requests"] == requests
    assert rows[1]["batches"] == requests * PARTITIONS
    # One read per answer, then one per three: the first answer takes two (its size, then its
    # rest: every later one must have that size), then each wake-up reads three, and the last
    # ones come as they drain.
    assert round(rows[1]["reads_per_request"] * requests) == requests + 1
    assert round(rows[3]["reads_per_request"] * requests) == 2 + -(-(requests - 1) // 3)
    # The kernel's side of it: the thread sleeps about once per answer, or once per three
    # (measured 1.0 and 0.33 per request on Kafka 3.7).
    assert rows[3]["voluntary_switches_per_request"] < 0.6
    assert rows[3]["voluntary_switches_per_request"] < rows[1]["voluntary_switches_per_request"]
    assert all(row["cpu_s"] >= 0 and row["wall_s"] > 0 for row in rows.values())


@pytest.mark.skipif(shutil.which("cc") is None, reason="the native floor client needs cc")
def test_native_floor_client_refuses_bad_arguments(tmp_path):
    import subprocess

    binary = benchmark_script("request_floor").build_native_client(str(tmp_path))
    request = tmp_path / "request.bin"
    request.write_bytes(b"\0" * 16)
    for args in (["1", "5", "0"], ["0", "5"], ["10", "0"]):
        done = subprocess.run([binary, "127.0.0.1", "9", str(request), *args],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, (args, done.stderr)
        assert "at least 1" in done.stderr
