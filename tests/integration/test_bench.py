"""The benchmark harness end to end on a tiny workload: every mode, real clusters, real records.

Checks each ``bench_run`` record is complete and plausible (records moved equal the workload,
bytes, CPU, RSS and wall time positive, latency probes arrived) and that the targets really hold
the source's records (keys, values, headers, timestamps). No timing thresholds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from confluent_kafka import KafkaException

from shallowmirror.bench import topics as bench_topics
from shallowmirror.bench.matrix import expand
from shallowmirror.bench.runner import BenchConfig, run_bench
from shallowmirror.codec.layout import COMPRESSION_ZSTD
from shallowmirror.engine.rawfetch import fetch_all
from shallowmirror.metrics_schema import BENCH_RUN, BENCH_RUN_FIELDS
from shallowmirror.testing.embedded import BrokerStartError
from shallowmirror.testing.kafka import find_kafka_home, kafka_clusters
from shallowmirror.testing.topics import compare_topics, read_topic

pytestmark = pytest.mark.integration

RECORDS, PARTITIONS, PROBES = 2000, 2, 5


def _engine_ready() -> bool:
    try:
        from shallowmirror.engine import mirror  # noqa: F401
    except ImportError:
        return False
    return True


#: The external mode runs a real command line through every placeholder: our own deep mirror
#: module, writing to "<topic>.copy" as a user's tool with its own naming would.
EXTERNAL = (f"{sys.executable} -m shallowmirror.bench.modes.deep_confluent --source {{source}} "
            "--target {target} --topic {topic} --topic {latency_topic} --group {group} "
            "--target-suffix .copy --codec zstd")


def test_bench_runs_every_mode_on_a_tiny_workload(source_cluster, target_cluster):
    modes = ["fetch-only", "deep-kafka-python", "deep-confluent"]
    modes += ["shallow"] if _engine_ready() else []
    modes += ["external"]
    workloads = expand(["lz4", "zstd"], [200], [16384], [PARTITIONS], [RECORDS])
    config = BenchConfig(
        workloads=workloads, modes=modes, repeats=1,
        source_bootstrap=source_cluster.bootstrap, target_bootstrap=target_cluster.bootstrap,
        external_cmd=EXTERNAL, external_target_topic="{topic}.copy", latency_probes=PROBES,
        run_timeout_s=60, progress=False,
    )
    emitted: list[dict] = []
    records = run_bench(config, emitted.append)
    assert records == emitted
    assert [(r["workload"]["codec"], r["mode"]) for r in records] == [
        (w.codec, m) for w in workloads for m in modes]

    for r in records:
        where = f"{r['mode']} {r['workload_id']}: {r['error']}"
        assert r["ok"] is True, where
        assert r["error"] is None
        assert r["kind"] == BENCH_RUN and set(BENCH_RUN_FIELDS) <= set(r)
        assert r["records"] == RECORDS, where
        assert r["uncompressed_bytes"] > r["compressed_bytes"] > 0
        assert r["wall_s"] > 0 and r["process_wall_s"] >= r["wall_s"]
        assert r["cpu_user_s"] + r["cpu_sys_s"] > 0, where
        assert r["process_cpu_s"] >= r["cpu_user_s"] + r["cpu_sys_s"] - 1e-6
        assert r["peak_rss_bytes"] > 10 << 20          # a Python process with Kafka clients
        assert r["rss_samples"] and max(s[1] for s in r["rss_samples"]) == r["peak_rss_bytes"]
        assert r["progress_samples"][-1][1] == RECORDS
        assert r["machine"]["cpus"] >= 1 and r["machine"]["memory_bytes"] > 0
        assert r["codec_impl"] in ("native", "python") and r["version"]
        assert r["workload"] == {"codec": r["workload_id"].split("-")[0], "value_bytes": 200,
                                 "batch_bytes": 16384, "partitions": PARTITIONS,
                                 "records": RECORDS}
        # Every mode's CPU is read when its last record is in (fetch-only: its "done" line),
        # not after its teardown (fetch-only's was: 3 cores' worth of CPU on 2 cores).
        assert r["cpu_basis"] == "tree-sampled-at-catch-up", where
        if r["mode"] == "fetch-only":
            assert r["target_topic"] is None and r["latency_ms_samples"] == []
            assert r["fetch_impl"] == "engine"
        else:
            assert len(r["latency_ms_samples"]) == PROBES, where
            assert all(x > 0 for x in r["latency_ms_samples"])
        if r["mode"] != "external":  # sh -c may die of the SIGTERM itself: any status goes
            assert r["exit_code"] == 0, where
    assert records[-1]["target_topic"].endswith(".copy")

    # The last runs' targets are still there: compare them with the source record by record.
    last = records[-len(modes):]
    source_topic = last[-1]["command"][2].split("--topic ")[1].split()[0]
    expected = read_topic(source_cluster, source_topic)
    compared = []
    for r in last:
        if r["mode"] in ("deep-confluent", "shallow", "external") and r is _last_of(last, r):
            got = read_topic(target_cluster, r["target_topic"])
            assert sum(map(len, got.values())) == RECORDS
            assert compare_topics(expected, got, topic=r["target_topic"]) == [], r["mode"]
            compared.append(r["mode"])
    assert compared == [modes[-2], "external"]


def test_the_kafka_python_mode_mirrors_snappy(source_cluster, target_cluster):
    """kafka-python reads snappy only through python-snappy, which is not installed: every
    snappy workload of mode deep-kafka-python failed ("Libraries for snappy compression codec
    not found")."""
    config = BenchConfig(
        workloads=expand(["snappy"], [200], [16384], [PARTITIONS], [1000]),
        modes=["deep-kafka-python"], repeats=1, source_bootstrap=source_cluster.bootstrap,
        target_bootstrap=target_cluster.bootstrap, latency_probes=0, run_timeout_s=60,
        progress=False,
    )
    [r] = run_bench(config, lambda record: None)
    assert r["ok"], r.get("error")
    got = read_topic(target_cluster, r["target_topic"])
    source_topic = r["command"][r["command"].index("--topic") + 1]
    assert compare_topics(read_topic(source_cluster, source_topic), got,
                          topic=r["target_topic"]) == []


def test_a_run_the_timeout_stopped_says_so(source_cluster, target_cluster):
    """It said "not all records arrived (0/1000); mode process exited with status -15": the
    harness's own SIGTERM, blamed on the mode."""
    # 200k records: on a fast host the deep mode copied 20k within the 0.2 s and the run was ok.
    config = BenchConfig(
        workloads=expand(["lz4"], [200], [16384], [PARTITIONS], [200_000]),
        modes=["deep-confluent"], repeats=1, source_bootstrap=source_cluster.bootstrap,
        target_bootstrap=target_cluster.bootstrap, latency_probes=0, run_timeout_s=0.2,
        progress=False,
    )
    [r] = run_bench(config, lambda record: None)
    assert r["ok"] is False
    assert r["error"].startswith("timed out after 0.2 s (--run-timeout): not all records "
                                 "arrived ("), r["error"]
    assert "exited with status" not in r["error"], r["error"]


def test_one_cluster_under_two_addresses_is_mirrored_beside_its_topic(source_cluster):
    """Source 127.0.0.1:PORT and target localhost:PORT are one cluster: the run re-created its
    target topic, which was the source topic itself, emptied before it was read (the runs then
    failed or waited out --run-timeout). Only equal address strings were recognised."""
    host, port = source_cluster.bootstrap.rsplit(":", 1)
    assert host == "127.0.0.1"
    config = BenchConfig(
        workloads=expand(["lz4"], [200], [16384], [PARTITIONS], [2000]),
        modes=["shallow"], repeats=1, source_bootstrap=source_cluster.bootstrap,
        target_bootstrap=f"localhost:{port}", latency_probes=0, progress=False,
    )
    [r] = run_bench(config, lambda record: None)
    assert r["ok"], r.get("error")
    assert r["target_topic"].endswith(".mirror"), r["target_topic"]
    source_topic = r["target_topic"].removesuffix(".mirror")
    expected = read_topic(source_cluster, source_topic)
    assert sum(map(len, expected.values())) == 2000          # the source is intact
    got = read_topic(source_cluster, r["target_topic"])
    assert compare_topics(expected, got, topic=r["target_topic"]) == []


def test_an_external_command_that_ends_first_is_named_with_its_status(source_cluster,
                                                                       target_cluster):
    """An external tool that exited (a typo in its command line, a refused configuration) was
    reported as "not all records arrived (0/N)" only: its exit status, the first thing to know,
    was not said."""
    config = BenchConfig(
        workloads=expand(["lz4"], [200], [16384], [PARTITIONS], [1000]),
        modes=["external"], repeats=1, source_bootstrap=source_cluster.bootstrap,
        target_bootstrap=target_cluster.bootstrap, latency_probes=0, progress=False,
        external_cmd="echo 'no such option: --topics {topic}' >&2; exit 3",
        external_target_topic="{topic}.copy",
    )
    [r] = run_bench(config, lambda record: None)
    assert r["ok"] is False
    assert r["error"].startswith("not all records arrived (0/1000); the mode's process exited "
                                 "first, with status 3"), r["error"]
    assert "no such option: --topics" in r["error"]      # its stderr's tail
    assert r["error"].count("status 3") == 1, r["error"]


def _last_of(records: list[dict], r: dict) -> dict:
    """Only the last run writing to a target topic left it intact (later runs re-create it)."""
    return [x for x in records if x["target_topic"] == r["target_topic"]][-1]


def _admin_threads() -> int:
    """librdkafka's background thread ("rdk:bg"): one per live AdminClient in this process."""
    import os

    names = []
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as comm:
            names.append(comm.read().strip())
    return names.count("rdk:bg")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_recreating_a_topic_leaves_no_admin_client_alive(target_cluster, unique_topic):
    """The first delete of a topic that does not exist fails with UNKNOWN_TOPIC, which recreate
    expects. Raised from its future, that error kept the AdminClient alive in a reference
    cycle until the garbage collector ran; tansu then waited 5 s for its connection at stop,
    and an interrupted bench lingered. Now the client goes when the call returns."""
    topic = unique_topic("bench-recreate")
    gc.collect()
    before = _admin_threads()
    gc.disable()                        # a collection must not be what frees it
    try:
        bench_topics.recreate(target_cluster.bootstrap, topic, 2)   # delete: UNKNOWN_TOPIC
        bench_topics.recreate(target_cluster.bootstrap, topic, 2)   # delete: a real one
        deadline = time.monotonic() + 5    # librdkafka joins its threads on destroy
        while _admin_threads() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _admin_threads() == before
    finally:
        gc.enable()
    with pytest.raises(KafkaException) as failed:      # errors still raise, as themselves
        bench_topics.create(target_cluster.bootstrap, topic, 2)
    assert failed.value.args[0].code() == 36, failed.value     # TOPIC_ALREADY_EXISTS


def test_bad_configuration_is_reported_before_anything_runs():
    config = BenchConfig(workloads=expand(["lz4"], [10], [1024], [1], [10]),
                         modes=["shallow", "deep-java", "external"], repeats=0,
                         source_bootstrap="127.0.0.1:1")
    problems = config.problems()
    assert any("deep-java" in p for p in problems)
    assert any("--external-cmd" in p for p in problems)
    assert any("both source and target" in p for p in problems)
    assert any("repeats" in p for p in problems)
    with pytest.raises(ValueError):
        run_bench(config, lambda record: None)


@pytest.fixture
def kafka_pair(request: pytest.FixtureRequest) -> Iterator[tuple]:
    """Two Apache Kafka clusters: the session's when it runs on Kafka, else a pair started here
    from ``KAFKA_HOME``; skipped when there is no distribution (or no Java)."""
    try:
        find_kafka_home()
    except BrokerStartError as err:
        pytest.skip(f"mode mm2 runs MirrorMaker 2 from a Kafka distribution: {err}")
    session = request.getfixturevalue("clusters")
    if session[0].flavor == "kafka":
        pair = session[0], session[1]
        before = [_topics(cluster) for cluster in pair]
        try:
            yield pair
        finally:
            for cluster, had in zip(pair, before, strict=True):
                _delete_mm2_leftovers(cluster, had)
        return
    with kafka_clusters("mm2-source", "mm2-target") as (source, target):
        yield source, target


def _topics(cluster) -> set[str]:
    return set(bench_topics.admin(cluster.bootstrap).list_topics(timeout=10).topics)


def _delete_mm2_leftovers(cluster, had: set[str]) -> None:
    """Delete the heartbeats and internal topics MirrorMaker 2 left on a session cluster. Every
    flow replicates a ``heartbeats`` topic whatever its filter (as MM2 does), so one left on the
    shared source made later tests on that worker mirror it: a flow matching no topic found
    one, a deep run's lag counted its records (seen on Kafka whenever this file ran first)."""
    for topic in sorted(_topics(cluster) - had):
        if topic == "heartbeats" or topic.endswith((".heartbeats", ".internal")):
            bench_topics.delete(cluster.bootstrap, topic)


@pytest.mark.needs_real_kafka("MirrorMaker 2 runs on Kafka clusters")
def test_mm2_mode_mirrors_a_tiny_workload_and_reports_its_start_up(kafka_pair):
    source_cluster, target_cluster = kafka_pair
    config = BenchConfig(
        workloads=expand(["zstd"], [200], [16384], [PARTITIONS], [RECORDS]), modes=["mm2"],
        repeats=1, source_bootstrap=source_cluster.bootstrap,
        target_bootstrap=target_cluster.bootstrap, latency_probes=PROBES, run_timeout_s=90,
        progress=False,
    )
    [r] = run_bench(config, lambda record: None)
    assert r["ok"] is True, r["error"]
    assert r["records"] == RECORDS and r["exit_code"] in (0, 143)  # 143: JVM stopped by SIGTERM
    assert r["command"][0].endswith("bin/connect-mirror-maker.sh")
    # Start-up (launch to the first record on the target) is reported apart from steady state.
    assert r["startup_s"] > 0 and r["startup_cpu_s"] > 0 and r["startup_records"] >= 1
    assert r["process_wall_s"] == pytest.approx(r["startup_s"] + r["wall_s"])
    assert r["process_cpu_s"] >= r["startup_cpu_s"] + r["cpu_user_s"] + r["cpu_sys_s"] - 1e-6
    assert r["cpu_basis"] == "tree-sampled-at-catch-up"
    assert r["peak_rss_bytes"] > 100 << 20                # a JVM
    assert len(r["latency_ms_samples"]) == PROBES

    # The remote topic under MirrorMaker 2's default policy holds the source's records, written
    # by a producer compressing with the source's codec.
    source_topic = r["target_topic"].removeprefix("A.")
    assert r["target_topic"] == f"A.{source_topic}"
    got = read_topic(target_cluster, r["target_topic"])
    assert compare_topics(read_topic(source_cluster, source_topic), got,
                          topic=r["target_topic"]) == []
    batches, _ = asyncio.run(fetch_all(target_cluster.client_config(), r["target_topic"]))
    assert {b.compression for part in batches.values() for b in part} == {COMPRESSION_ZSTD}
    # Its Connect worker topics were the run's own (not the defaults) and went with the run.
    for cluster in kafka_pair:
        left = [t for t in bench_topics.admin(cluster.bootstrap).list_topics(timeout=10).topics
                if t.startswith(("mm2-offsets", "mm2-configs", "mm2-status"))]
        assert left == [], cluster.alias


def test_mm2_needs_kafka_clusters():
    config = BenchConfig(workloads=expand(["lz4"], [10], [1024], [1], [10]), modes=["mm2"],
                         broker="tansu")
    assert [p for p in config.problems() if "mode mm2 runs MirrorMaker 2" in p
            and "--kafka-home" in p]


#: The tester's reproductions: Ctrl-C while the workload loads (the loader's flush held the
#: thread for up to 120 s) and while a mode runs (the harness gave the mode, whose brokers had
#: died of the same Ctrl-C, 30 s to stop). Ctrl-C comes that many seconds after the line.
# (the line after which to wait, how long, bench arguments). The load's own progress bar says
# when it is loading: a fixed wait after the brokers came up outlasted the whole bench on a fast
# host (300k gzip records loaded and mirrored in under 6 s).
CTRL_C_CASES = {
    "load": ("load gzip-", 0.5,
             ["--codecs", "gzip", "--records", "300k", "--modes", "fetch-only", "--progress"]),
    "run": ("shallowmirror.bench.runner: loaded", 1.0,
            ["--codecs", "gzip", "--records", "100k", "--modes", "deep-confluent,shallow"]),
}


@pytest.mark.harness_tansu          # its own embedded brokers, in its process group
@pytest.mark.parametrize("phase", list(CTRL_C_CASES))
def test_ctrl_c_ends_the_bench_at_once_recording_nothing_of_the_interrupted_run(tmp_path,
                                                                                phase):
    """Ctrl-C as a terminal sends it (SIGINT to the whole process group): the embedded
    brokers die first. The bench must end within seconds with status 130 and "interrupted",
    append nothing for the run it cut short (not a FAILED run: the brokers' death is the
    interrupt's doing), and leave no process or broker folder behind."""
    after_line, delay_s, args = CTRL_C_CASES[phase]
    out = tmp_path / "results.jsonl"
    earlier = '{"kind": "bench_run", "from": "an earlier bench"}\n'
    out.write_text(earlier)
    proc = subprocess.Popen(
        [sys.executable, "-m", "shallowmirror", "bench", "--broker", "tansu", "--repeats", "1",
         "--batch-bytes", "16KiB", "--partitions", "2", "--no-progress", "--out", str(out),
         *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # SIG_DFL for SIGINT, as a terminal's command has: a background job (CI run under
        # nohup, `make test &`) passes on "ignore", and the bench leaves an ignored SIGINT be.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if after_line in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    children: list[psutil.Process] = []
    try:
        assert seen.wait(180), "".join(lines)
        time.sleep(delay_s)
        children = psutil.Process(proc.pid).children(recursive=True)
        names = [child.name() for child in children]
        assert names.count("tansu") == 2, names
        os.killpg(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        proc.wait(60)
        ended_s = time.monotonic() - sent
    finally:
        with contextlib.suppress(ProcessLookupError):     # a failed test leaves nothing either
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(10)
        _, alive = psutil.wait_procs(children, timeout=5)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                child.kill()
        folders = {Path(m) for m in re.findall(r"log (/\S+)/tansu-[^ ]+\.log\)",
                                               "".join(lines))}
        left = [folder for folder in folders if folder.exists()]
        for folder in left:
            shutil.rmtree(folder, ignore_errors=True)
    stderr = "".join(lines)
    assert proc.returncode == 130, stderr
    assert stderr.rstrip().endswith("shallowmirror bench: interrupted"), stderr
    assert "FAILED" not in stderr and "Traceback" not in stderr, stderr
    assert ended_s < 15, stderr
    assert out.read_text() == earlier
    assert alive == [], alive
    assert len(folders) == 2 and left == [], stderr


def test_a_broker_the_bench_started_that_dies_ends_the_bench_with_its_name(tmp_path):
    """Its broker killed mid-run, the bench went on for minutes: the mode waited out its
    reconnect deadline (120 s), with tracebacks, and every later run would have failed too."""
    from shallowmirror.testing import embedded

    config = BenchConfig(
        workloads=expand(["lz4"], [200], [16384], [PARTITIONS], [150_000]),
        modes=["deep-confluent", "shallow"], repeats=2, latency_probes=0, run_timeout_s=120,
        progress=False, broker="tansu",
    )
    outcome: dict = {}

    def bench() -> None:
        try:
            outcome["records"] = run_bench(config, lambda record: None)
        except Exception as err:  # noqa: BLE001 - what the test looks at
            outcome["error"] = err

    thread = threading.Thread(target=bench)
    thread.start()
    began = time.monotonic()
    # Once a mode runs (its process started after the load), the source broker is killed.
    while time.monotonic() - began < 120 and "error" not in outcome:
        modes = [p for p in psutil.Process().children(recursive=True)
                 if "shallowmirror.bench.modes" in " ".join(p.cmdline())]
        if modes:
            break
        time.sleep(0.05)
    source = next(c for c in embedded._LIVE.values() if c.alias == "bench-source")
    os.kill(source.pid, signal.SIGKILL)
    killed = time.monotonic()
    thread.join(120)
    assert not thread.is_alive()
    error = outcome.get("error")
    assert type(error).__name__ == "BrokerGone", outcome
    assert f"the broker of the source cluster the bench started (pid {source.pid}) exited; " \
           f"its log: {source.log_path}" in str(error)
    assert "the bench stops (1 run(s) recorded, the last one failed)" in str(error)
    assert time.monotonic() - killed < 60        # not the mode's reconnect deadline (120 s)
