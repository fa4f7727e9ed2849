"""The JSON-lines records the engine and the benchmark harness write, and the reports read.

One JSON object per line, each with a ``kind``. Times are UNIX epoch seconds (float). Byte counts
are integers. A field whose value is unknown is ``null`` (e.g. uncompressed bytes on the shallow
path, which never decompresses). Writers may add fields; readers ignore what they do not know.

kind = "flow"  — written by the engine (``shallowmirror.engine.metrics``), one per acknowledged
batch or per (interval, partition) aggregate (``batches`` says how many batches it sums):
    time, run_id, flow ("A->B"), source_cluster, target_cluster, topic, partition, target_topic,
    mode ("shallow" | "deep"), codec ("none"|"gzip"|"snappy"|"lz4"|"zstd"|"mixed"),
    batches, records, compressed_bytes, uncompressed_bytes (null if unknown),
    latency_ms (fetch -> target ack of the batch or mean over the aggregate), latency_ms_max,
    offset_lag (source high watermark - committed position after this batch)

kind = "process" — written by the engine and the harness every ``interval_s`` seconds:
    time, run_id, pid, cpu_user_s, cpu_sys_s (cumulative for the process tree), rss_bytes,
    budget_bytes_in_use (engine only, else null)

kind = "heartbeat" — written by the mirror process (``emit.heartbeats.enabled``), one per MM2
heartbeat a flow mirrored and read back on its target:
    time, flow ("A->B"), source_cluster, target_cluster, heartbeat ("X->A": its emitter pair),
    heartbeat_time (when it was written on the source), latency_ms (written -> readable on the
    target)

kind = "bench_run" — written by the benchmark harness, one per mirror run:
    run_id, started_at, mode ("shallow"|"deep-confluent"|"deep-kafka-python"|"external"|
    "fetch-only"), repeat (0-based), workload_id,
    workload {codec, value_bytes, batch_bytes, partitions, records},
    wall_s (the mode's "ready" -> last record on target), startup_s (process start -> "ready";
    progress_samples and rss_samples count from process start), cpu_user_s, cpu_sys_s (mirror's process
    tree), peak_rss_bytes (sampled), records, compressed_bytes, uncompressed_bytes,
    latency_ms_samples [float] (end-to-end: source append -> target append),
    progress_samples [[t_since_start_s, records_on_target, compressed_bytes_on_target]],
    rss_samples [[t_since_start_s, rss_bytes]],
    ok (bool), error (str | null: what went wrong, then ``STDERR_TAIL`` and the end of the
    mode's stderr when it said anything),
    machine {hostname, cpus, python, platform, memory_bytes}, version, codec_impl ("native"|"python")
"""

FLOW = "flow"
PROCESS = "process"
BENCH_RUN = "bench_run"
HEARTBEAT = "heartbeat"

FLOW_FIELDS = (
    "time", "run_id", "flow", "source_cluster", "target_cluster", "topic", "partition",
    "target_topic", "mode", "codec", "batches", "records", "compressed_bytes",
    "uncompressed_bytes", "latency_ms", "latency_ms_max", "offset_lag",
)
PROCESS_FIELDS = (
    "time", "run_id", "pid", "cpu_user_s", "cpu_sys_s", "rss_bytes", "budget_bytes_in_use",
)
BENCH_RUN_FIELDS = (
    "run_id", "started_at", "mode", "repeat", "workload_id", "workload", "wall_s", "startup_s",
    "cpu_user_s",
    "cpu_sys_s", "peak_rss_bytes", "records", "compressed_bytes", "uncompressed_bytes",
    "latency_ms_samples", "progress_samples", "rss_samples", "ok", "error", "machine", "version",
    "codec_impl",
)
#: In a bench_run's ``error``: what follows is the end of the mode's stderr (the report folds it).
STDERR_TAIL = "; stderr tail: "
MODES = ("shallow", "deep-confluent", "deep-kafka-python", "external", "fetch-only", "mm2")
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
