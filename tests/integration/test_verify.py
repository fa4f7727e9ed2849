"""`shallowmirror verify` as a subprocess against the session clusters.

An exact copy made by `shallowmirror mirror` passes. The failing cases need a target that differs
from its source in one known place, so the test writes those remote topics itself: every source
data batch forwarded through the engine's raw produce path (``rewrite_for_produce`` +
``encode_produce_request``, as the mirror does), then one byte flipped / the last batch left out /
one batch added. tansu stores a batch as sent, so the flipped byte is sent; Apache Kafka checks
CRCs on produce, so there the batch goes in intact and its last byte is flipped in the segment
file afterwards (a broker serves fetches from the file without checking).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from engine_support import (
    NO_DELETE_RECORDS,
    _flip_last_byte_on_disk,
    delete_records_before,
    three_batches,
)
from kafka.record.default_records import DefaultRecordBatchBuilder
from test_mirror_cli import group_timings, mm2_properties, run_cli, run_until_caught_up

from shallowmirror import codec
from shallowmirror.engine.pairing import PartitionReader
from shallowmirror.net import Cluster
from shallowmirror.testing.workload import Workload, create_topic, load

pytestmark = pytest.mark.integration

#: partition -> the batches to produce (each the bytes of one whole batch); edited in place.
Tamper = Callable[[dict[int, list[bytearray]]], None]


def _load_multi_codec(cluster, topic: str, partitions: int = 2) -> None:
    """Batches of every codec in one topic (each load appends)."""
    for i, name in enumerate(("lz4", "zstd", "gzip", "snappy", "none")):
        load(cluster, Workload(topic, records=600, partitions=partitions, codec=name,
                               value_bytes=150, batch_bytes=16_000, linger_ms=5,
                               create_topic=i == 0, seed=i))


async def _source_batches(cluster, topic: str) -> dict[int, list[bytearray]]:
    """Every data batch of ``topic`` as the mirror would send it (base offset 0, no producer)."""
    c = Cluster(cluster.client_config(), "A")
    await c.start()
    out: dict[int, list[bytearray]] = {}
    try:
        await c.refresh_metadata([topic])
        for p in c.partitions(topic) or []:
            reader = PartitionReader(c, topic, p, read_committed=False, drop_aborted=False)
            out[p] = []
            async for chunk in reader.chunks():
                for view in chunk:
                    header, rest = codec.rewrite_for_produce(view)
                    out[p].append(bytearray(bytes(header) + bytes(rest)))
    finally:
        await c.close()
    return out


async def _produce(cluster, topic: str, batches: dict[int, list[bytearray]]) -> dict[int, list[int]]:
    """Produce each batch alone (acks=all); the base offsets the broker assigned. A topic just
    created may not have its leader yet (Kafka: NOT_LEADER_OR_FOLLOWER): asked again then."""
    c = Cluster(cluster.client_config(), "B")
    await c.start()
    offsets: dict[int, list[int]] = {}
    try:
        for p, items in batches.items():
            offsets[p] = [await _produce_one(c, topic, p, bytes(data)) for data in items]
    finally:
        await c.close()
    return offsets


async def _produce_one(c: Cluster, topic: str, partition: int, data: bytes) -> int:
    for _ in range(100):
        conn = await c.leader_connection(topic, partition)
        version = conn.api_version(0, (3, 9))
        cid = conn.next_correlation_id()
        buffers = codec.encode_produce_request(
            version=version, correlation_id=cid, client_id="test-verify", transactional_id=None,
            acks=-1, timeout_ms=10000, topics=[(topic, [(partition, [[data]])])])
        response = codec.decode_produce_response(await conn.send_raw(buffers, cid), version)
        (_, parts), = response.topics
        if parts[0].error_code in (3, 6):          # UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER
            await asyncio.sleep(0.1)
            await c.refresh_metadata([topic])
            continue
        assert parts[0].error_code == 0, f"produce to {topic}-{partition}: {parts[0]}"
        return parts[0].base_offset
    raise AssertionError(f"{topic}-{partition} got no leader in 10 s")


def _copy(source, topic: str, target, remote: str, tamper: Tamper | None = None
          ) -> dict[int, list[int]]:
    batches = asyncio.run(_source_batches(source, topic))
    if tamper is not None:
        tamper(batches)
    create_topic(target.client_config(), Workload(topic=remote, partitions=len(batches)))
    return asyncio.run(_produce(target, remote, batches))


def _source_offsets(source, topic: str) -> dict[int, list[int]]:
    """Base offsets of the source's data batches per partition."""
    async def read() -> dict[int, list[int]]:
        c = Cluster(source.client_config(), "A")
        await c.start()
        try:
            await c.refresh_metadata([topic])
            out = {}
            for p in c.partitions(topic) or []:
                reader = PartitionReader(c, topic, p, read_committed=False, drop_aborted=False)
                out[p] = [v.base_offset async for chunk in reader.chunks() for v in chunk]
            return out
        finally:
            await c.close()
    return asyncio.run(read())


def _config(tmp_path: Path, source, target, topics: str, **keys: str) -> Path:
    return mm2_properties(tmp_path / "mm2.properties", source, target,
                          **{"A->B.enabled": "true", "topics": topics, **keys})


def _verify(config: Path, *args: str):
    result = run_cli("verify", str(config), *args)
    assert "Traceback" not in result.stderr, result.stderr
    return result


# -- an exact copy ------------------------------------------------------------------------------


def test_verify_passes_on_a_mirrored_multi_codec_topic_with_transactions(
        source_cluster, target_cluster, tmp_path, unique_topic):
    topic = unique_topic("verify-ok")
    _load_multi_codec(source_cluster, topic)
    # Transactions, one in three aborted: control batches the mirror drops; read_uncommitted
    # forwards the aborted data.
    load(source_cluster, Workload(topic, records=1500, partitions=2, codec="lz4",
                                  value_bytes=100, transactional=True, transaction_records=250,
                                  abort_every=3, create_topic=False, seed=9))
    config = _config(tmp_path, source_cluster, target_cluster, topic)
    run_until_caught_up("mirror", str(config))

    result = _verify(config, "--flow", "A->B", "--topics", "verify-ok.*")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = [line for line in result.stdout.splitlines() if f"A.{topic}" in line]
    assert len(summary) == 1, result.stdout
    assert "2 partitions" in summary[0] and "4,500 records" in summary[0], summary
    assert "control/aborted/empty source batches not mirrored" in summary[0], summary
    assert "exact copy" in result.stdout


def _aborted_mirrored_and_verified(tmp_path: Path, source, target, topic: str, records: int,
                                   partitions: int, **keys: str) -> Path:
    """Load ``records`` in transactions (every third aborted), mirror them with ``keys``, and
    check that verify calls the copy exact, counting only the committed records."""
    loaded = load(source, Workload(topic, records=records, partitions=partitions, codec="zstd",
                                   value_bytes=100, transactional=True,
                                   transaction_records=300, abort_every=3))
    assert 0 < loaded.committed_count < records
    config = _config(tmp_path, source, target, topic, **keys)
    run_until_caught_up("mirror", str(config))
    result = _verify(config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{loaded.committed_count:,} records" in result.stdout, result.stdout
    return config


@pytest.mark.needs_real_kafka("tansu never reports aborted_transactions in Fetch")
def test_verify_under_read_committed_skips_aborted_transactions(source_cluster, target_cluster,
                                                                 tmp_path, unique_topic):
    topic = unique_topic("verify-rc")
    _aborted_mirrored_and_verified(tmp_path, source_cluster, target_cluster, topic, 3000, 2,
                                   **{"isolation.level": "read_committed"})
    # The same target read as if the aborted batches were mirrored: they are missing there.
    uncommitted = _config(tmp_path, source_cluster, target_cluster, topic)
    result = _verify(uncommitted)
    assert result.returncode == 1 and "MISMATCH" in result.stdout, result.stdout


@pytest.mark.needs_real_kafka("tansu never reports aborted_transactions in Fetch")
def test_verify_reads_an_exactly_once_flow_as_its_engine_does(source_cluster, target_cluster,
                                                               tmp_path, unique_topic):
    """Exactly-once fetches read_committed whatever isolation.level says; verify read the
    source read_uncommitted and called a correct copy a MISMATCH (exit 1)."""
    _aborted_mirrored_and_verified(tmp_path, source_cluster, target_cluster,
                                   unique_topic("verify-eos"), 1200, 1,
                                   **{"exactly.once": "true"})


def test_a_batch_with_offset_gaps_is_compared_record_by_record(source_cluster, target_cluster,
                                                               tmp_path, unique_topic):
    """A compacted source batch (record_count != last_offset_delta + 1) is re-packed by the
    mirror's deep path, so verify compares its records. tansu stores such a produced batch as
    it is; Apache Kafka renumbers it on produce (only its log cleaner makes them)."""
    if source_cluster.flavor != "tansu":
        pytest.skip("Apache Kafka renumbers a produced batch with offset gaps")
    topic = unique_topic("verify-gaps")
    load(source_cluster, Workload(topic, records=300, partitions=1, codec="lz4",
                                  value_bytes=100, batch_bytes=8_000, linger_ms=5))
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=4, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for delta in (0, 3, 4, 9):
        builder.append(delta, timestamp=1_700_000_000_000 + delta, key=b"k%d" % delta,
                       value=b"kept-%d" % delta, headers=[])
    asyncio.run(_produce(source_cluster, topic, {0: [bytearray(builder.build())]}))
    load(source_cluster, Workload(topic, records=100, partitions=1, codec="zstd",
                                  value_bytes=100, create_topic=False, seed=2))
    config = _config(tmp_path, source_cluster, target_cluster, topic)
    run_until_caught_up("mirror", str(config))

    result = _verify(config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "404 records" in result.stdout and "1 re-packed compared record by record" \
        in result.stdout, result.stdout


# -- differences --------------------------------------------------------------------------------


def test_verify_finds_a_flipped_byte_in_one_target_batch(source_cluster, target_cluster,
                                                         tmp_path, unique_topic):
    topic = unique_topic("verify-flip")
    _load_multi_codec(source_cluster, topic)
    on_disk = target_cluster.flavor == "kafka"

    def flip(batches: dict[int, list[bytearray]]) -> None:
        if not on_disk:
            batches[1][-1][-1] ^= 0xFF

    target_offsets = _copy(source_cluster, topic, target_cluster, f"A.{topic}", flip)
    if on_disk:
        _flip_last_byte_on_disk(target_cluster, f"A.{topic}", 1)
    source_offsets = _source_offsets(source_cluster, topic)
    config = _config(tmp_path, source_cluster, target_cluster, topic)

    result = _verify(config)
    assert result.returncode == 1, result.stdout + result.stderr
    mismatch = [line for line in result.stdout.splitlines() if line.startswith("MISMATCH")]
    size = len(asyncio.run(_source_batches(source_cluster, topic))[1][-1])
    assert mismatch == [
        f"MISMATCH flow A->B: source A {topic}-1 offset {source_offsets[1][-1]} / target B "
        f"A.{topic}-1 offset {target_offsets[1][-1]}: records section differs at byte "
        f"{size - 1} of the batch ({size} bytes on the source, {size} on the target)"], \
        result.stdout
    # Partition 0 was compared in full before it and is equal.
    assert f"{topic} -> A.{topic}: 2 partitions" in result.stdout


def test_verify_reports_a_missing_tail_and_an_extra_batch(source_cluster, target_cluster,
                                                          tmp_path, unique_topic):
    short, extra = unique_topic("verify-short"), unique_topic("verify-extra")
    for topic in (short, extra):
        load(source_cluster, Workload(topic, records=2000, partitions=2, codec="zstd",
                                      value_bytes=150, batch_bytes=16_000, linger_ms=5))
    short_offsets = _copy(source_cluster, short, target_cluster, f"A.{short}",
                          lambda b: b[0].pop())
    extra_offsets = _copy(source_cluster, extra, target_cluster, f"A.{extra}",
                          lambda b: b[1].append(bytearray(b[1][0])))
    source_short = _source_offsets(source_cluster, short)
    config = _config(tmp_path, source_cluster, target_cluster, f"{short},{extra}")

    result = _verify(config, "--topics", short)
    assert result.returncode == 1, result.stdout + result.stderr
    # No control batches: the copy's offsets are the source's, so the target ends where the
    # missing batch starts.
    assert short_offsets[0] == source_short[0][:-1]
    assert (f"MISMATCH flow A->B: source A {short}-0 offset {source_short[0][-1]} / target B "
            f"A.{short}-0 offset {source_short[0][-1]}: missing on the target: 1 source "
            "batches") \
        in result.stdout, result.stdout

    result = _verify(config, "--topics", extra)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (f"target B A.{extra}-1 offset {extra_offsets[1][-1]}: extra on the target: "
            f"1 batches") in result.stdout, result.stdout
    assert f"source A {extra}-0" not in result.stdout     # partition 0 is equal


@pytest.mark.needs_real_kafka(NO_DELETE_RECORDS)
def test_verify_skips_what_the_source_log_no_longer_has(source_cluster, target_cluster,
                                                          tmp_path, unique_topic):
    """Retention (or DeleteRecords) moved the source's log start: the target's first batches
    copy records the source no longer has. Verify reads the target up to the copy of the
    source's first batch and compares from there - whole where the mirror copied it before the
    cut (also when the cut is inside it), record by record where the mirror came after a cut
    inside a batch and re-packed it. Kafka answers an out-of-range fetch with log start -1: the
    start comes from ListOffsets."""
    before, after = unique_topic("verify-cut"), unique_topic("verify-cut-late")
    headless = unique_topic("verify-headless")
    for topic in (before, after, headless):
        three_batches(source_cluster, topic)
    delete_records_before(source_cluster, after, 150)       # before mirroring, mid-batch
    config = _config(tmp_path, source_cluster, target_cluster, f"{before},{after},{headless}")
    run_until_caught_up("mirror", str(config))

    def summary(result, topic: str) -> str:
        lines = [line for line in result.stdout.splitlines() if f"-> A.{topic}:" in line]
        assert len(lines) == 1, result.stdout + result.stderr
        return lines[0]

    for cut, batches, records, older in ((100, 2, 200, 1), (150, 2, 200, 1)):
        delete_records_before(source_cluster, before, cut)
        result = _verify(config, "--topics", before)
        assert result.returncode == 0, result.stdout + result.stderr
        line = summary(result, before)
        assert f"{batches} batches, {records} records" in line, line
        assert f"{older} older target batches skipped" in line and "re-packed" not in line, line

    result = _verify(config, "--topics", after)
    assert result.returncode == 0, result.stdout + result.stderr
    line = summary(result, after)
    assert "2 batches, 150 records" in line and "1 re-packed" in line, line
    assert "older" not in line, line

    # The other way round, a target that lost its head: said as such, not as the first pair's
    # differing timestamps.
    delete_records_before(target_cluster, f"A.{headless}", 100)
    result = _verify(config, "--topics", headless)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (f"A.{headless}-0 offset 100: the target's first batch is the copy of source offset "
            "100: the 1 source batches (100 records) from offset 0 before it are not on the "
            "target") in result.stdout, result.stdout

    # A target trimmed past the source's cut has no copy of its first batch: a mismatch.
    delete_records_before(target_cluster, f"A.{before}", 200)
    result = _verify(config, "--topics", before)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (f"MISMATCH flow A->B: source A {before}-0 offset 100 / target B A.{before}-0: no "
            "copy of the source's first batch (offset 100; the source log starts at 150"
            ) in result.stdout, result.stdout


# -- errors ---------------------------------------------------------------------------------


def test_a_topic_never_mirrored_is_a_mismatch(source_cluster, target_cluster, tmp_path,
                                              unique_topic):
    topic = unique_topic("verify-none")
    load(source_cluster, Workload(topic, records=100, partitions=1, codec="lz4"))
    result = _verify(_config(tmp_path, source_cluster, target_cluster, topic))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"remote topic A.{topic} does not exist on B" in result.stdout, result.stdout


def test_nothing_to_compare_is_no_success(source_cluster, target_cluster, tmp_path):
    """A flow whose topics match nothing yet: 'nothing compared' exited 0, as an exact copy."""
    config = _config(tmp_path, source_cluster, target_cluster, "nothing-here-at-all")
    result = _verify(config)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the flows mirror no topic yet (nothing compared)" in result.stderr
    assert "exact copy" not in result.stdout


def test_unknown_keys_are_warnings_with_the_flag_mirror_takes(source_cluster, target_cluster,
                                                              tmp_path):
    """verify told the user to pass --allow-unknown-keys and then refused it: a configuration
    that `mirror --allow-unknown-keys` runs could not be verified."""
    config = _config(tmp_path, source_cluster, target_cluster, "nothing-here-at-all",
                     **{"bogus.key": "1"})
    result = _verify(config)
    assert result.returncode == 2 and "unknown configuration key 'bogus.key'" in result.stderr
    result = _verify(config, "--allow-unknown-keys")
    assert result.returncode == 1, result.stderr          # ran: nothing to compare
    assert "unknown configuration key 'bogus.key'" in result.stderr
    assert "nothing compared" in result.stderr


def test_config_errors_and_unreachable_clusters_exit_2(source_cluster, target_cluster, tmp_path):
    config = _config(tmp_path, source_cluster, target_cluster, "nothing-here")
    result = _verify(config, "--flow", "B->A")
    assert result.returncode == 2 and "--flow B->A: no enabled flow" in result.stderr

    result = _verify(config, "--topics", "(")
    assert result.returncode == 2 and "not a regular expression" in result.stderr

    result = _verify(tmp_path / "missing.properties")
    assert result.returncode == 2 and "missing.properties" in result.stderr

    deep = mm2_properties(tmp_path / "deep.properties", source_cluster, target_cluster,
                          **{"A->B.enabled": "true", "use.raw.bytes": "false"})
    result = _verify(deep)
    assert result.returncode == 2 and "flow A->B is deep" in result.stderr

    down = tmp_path / "down.properties"
    down.write_text("clusters = A, B\nA.bootstrap.servers = 127.0.0.1:1\n"
                    f"B.bootstrap.servers = {target_cluster.bootstrap}\n"
                    "reconnect.deadline.ms = 1000\nA->B.enabled = true\n"
                    + "".join(f"{k} = {v}\n" for k, v in group_timings(source_cluster).items()))
    result = _verify(down)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot reach a cluster" in result.stderr and "127.0.0.1:1" in result.stderr
