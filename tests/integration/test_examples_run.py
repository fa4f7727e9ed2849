"""Every file in ``shallowmirror/examples/`` runs as a subprocess against the session's clusters
(through ``SHALLOWMIRROR_SOURCE_BOOTSTRAP``/``..._TARGET_BOOTSTRAP``, which the examples'
``_clusters.py`` prefers over starting its own brokers), succeeds, and mirrored what it says it
mirrored."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from shallowmirror.testing import embedded
from shallowmirror.testing.topics import assert_same_records, read_topic

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "shallowmirror" / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


def _check_mirror_one_call(out: str, source, target) -> None:
    src = read_topic(source.client_config(), "orders")
    dst = read_topic(target.client_config(), "A.orders")
    assert_same_records(src, dst, topic="A.orders")
    mirrored = int(re.search(r"mirrored (\d+) records", out).group(1))
    assert mirrored == sum(len(rs) for rs in src.values()) == 10_000


def _check_forwarder_asyncio(out: str, source, target) -> None:
    m = re.search(r"forwarded (\d+) records in (\d+) batches, dropped (\d+)", out)
    forwarded, batches, dropped = (int(g) for g in m.groups())
    src = read_topic(source.client_config(), "clicks")
    dst = read_topic(target.client_config(), "audit")
    even = [r.value for p, rs in src.items() if p % 2 == 0 for r in rs]
    odd = [r for p, rs in src.items() if p % 2 for r in rs]
    assert forwarded == len(even) == len(dst[0]) and dropped == len(odd)
    assert sorted(r.value for r in dst[0]) == sorted(even)     # two partitions interleaved
    assert out.count("-> audit-0 @") == batches


def _check_forwarder_sync(out: str, source, target) -> None:
    m = re.search(r"forwarded (\d+) records in (\d+) batches, dropped (\d+) records", out)
    forwarded, batches, dropped = (int(g) for g in m.groups())
    src = read_topic(source.client_config(), "page-views")
    dst = read_topic(target.client_config(), "page-views-copy")
    assert dst[3] == [] and dropped == len(src[3])
    assert_same_records({p: src[p] for p in (0, 1, 2)}, {p: dst[p] for p in (0, 1, 2)},
                        topic="page-views-copy")
    assert forwarded == sum(len(dst[p]) for p in (0, 1, 2))
    acked = re.findall(r"ack page-views-(\d) @(\d+) \((\d+) records\) -> \S+ @(\d+)", out)
    assert len(acked) == batches
    for p, source_base, _count, target_base in acked:     # fresh target: same offsets
        assert source_base == target_base and p != "3"


#: example file -> what it must have mirrored (topics are fixed names: fresh clusters only).
CHECKS: dict[str, tuple[list[str], Callable[[str, object, object], None]]] = {
    "mirror_one_call.py": (["orders"], _check_mirror_one_call),
    "forwarder_asyncio.py": (["clicks"], _check_forwarder_asyncio),
    "forwarder_sync.py": (["page-views"], _check_forwarder_sync),
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_and_mirrors_what_it_says(script, source_cluster, target_cluster):
    where = f"shallowmirror/examples/{script}"
    assert script in CHECKS, f"{where} has no check in {__file__}: add one"
    topics, check = CHECKS[script]
    existing = AdminClient(source_cluster.client_config()).list_topics(timeout=10).topics
    if any(t in existing for t in topics):
        pytest.skip(f"{where} writes fixed topic names {topics} that already exist on this "
                    "source cluster (a reused external cluster)")
    env = {**os.environ, embedded.SOURCE_ENV: source_cluster.bootstrap,
           embedded.TARGET_ENV: target_cluster.bootstrap}
    proc = subprocess.run([sys.executable, script], cwd=EXAMPLES, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"{where} failed:\n{proc.stdout}\n{proc.stderr}"
    check(proc.stdout, source_cluster, target_cluster)
