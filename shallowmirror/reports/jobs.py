"""The report computations: plain DataFrame -> DataFrame functions over the metrics JSON lines.

Inputs are the records of :mod:`shallowmirror.metrics_schema` (``flow``, ``process``,
``bench_run``), read with one explicit schema so a file with a missing or oddly typed field gives
nulls, not a different inferred schema per file. Every function here is pure: it only builds a
query plan, so it can be tested on a local session with a few hand-checked rows.

Units, everywhere: MB = 10**6 bytes, GB = 10**9 bytes, times in seconds, latency in ms,
``cpu_s`` = user + system CPU seconds. Percentiles are exact with linear interpolation between
the closest ranks (numpy's default), so they can be checked by hand.

Ratios between a baseline mode and shallow mirroring are oriented so that bigger means shallow is
better: ``cpu_per_gb_ratio`` and ``peak_rss_ratio`` are baseline / shallow, ``throughput_ratio``
is shallow / baseline.

Out of scope: reading anything other than these JSON lines, and plotting (see ``html.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from shallowmirror import metrics_schema as ms

MB = 1e6
GB = 1e9
PERCENTILES = (0.5, 0.95, 0.99)

#: Per-run numbers that the repeat summary reports as median, min and max.
RUN_METRICS = (
    "wall_s", "cpu_s", "mb_s_compressed", "mb_s_uncompressed", "records_s",
    "cpu_s_per_gb_compressed", "cpu_s_per_gb_uncompressed", "peak_rss_bytes",
)

#: Goal thresholds from the issue: deep-confluent CPU per GB / shallow CPU per GB, at least.
CPU_RATIO_GOALS: Mapping[str, float] = {"lz4": 10.0, "zstd": 30.0, "gzip": 30.0}
#: Shallow peak RSS counts as flat when max/min across codecs stays at or under this.
RSS_FLAT_MAX_RATIO = 1.25
#: Deep peak RSS "grows with the compression ratio" when their correlation is at least this.
DEEP_RSS_MIN_CORRELATION = 0.5
#: Shallow throughput / fetch-only throughput, at least.
FETCH_ONLY_MIN_RATIO = 0.8

_WORKLOAD = T.StructType([
    T.StructField("codec", T.StringType()),
    T.StructField("value_bytes", T.LongType()),
    T.StructField("batch_bytes", T.LongType()),
    T.StructField("partitions", T.LongType()),
    T.StructField("records", T.LongType()),
])
_MACHINE = T.StructType([
    T.StructField("hostname", T.StringType()),
    T.StructField("cpus", T.LongType()),
    T.StructField("python", T.StringType()),
    T.StructField("platform", T.StringType()),
    T.StructField("memory_bytes", T.LongType()),
])

#: The union of the three record kinds; fields shared by kinds have the same type in each.
RECORD_SCHEMA = T.StructType([
    T.StructField("kind", T.StringType()),
    # flow and process
    T.StructField("time", T.DoubleType()),
    T.StructField("run_id", T.StringType()),
    T.StructField("flow", T.StringType()),
    T.StructField("source_cluster", T.StringType()),
    T.StructField("target_cluster", T.StringType()),
    T.StructField("topic", T.StringType()),
    T.StructField("partition", T.LongType()),
    T.StructField("target_topic", T.StringType()),
    T.StructField("mode", T.StringType()),
    T.StructField("codec", T.StringType()),
    T.StructField("batches", T.LongType()),
    T.StructField("records", T.LongType()),
    T.StructField("compressed_bytes", T.LongType()),
    T.StructField("uncompressed_bytes", T.LongType()),
    T.StructField("latency_ms", T.DoubleType()),
    T.StructField("latency_ms_max", T.DoubleType()),
    T.StructField("offset_lag", T.LongType()),
    T.StructField("pid", T.LongType()),
    T.StructField("cpu_user_s", T.DoubleType()),
    T.StructField("cpu_sys_s", T.DoubleType()),
    T.StructField("rss_bytes", T.LongType()),
    T.StructField("budget_bytes_in_use", T.LongType()),
    # bench_run
    T.StructField("started_at", T.DoubleType()),
    T.StructField("repeat", T.LongType()),
    T.StructField("workload_id", T.StringType()),
    T.StructField("workload", _WORKLOAD),
    T.StructField("wall_s", T.DoubleType()),
    # Process start -> the mode's "ready" event; wall_s counts from there.
    T.StructField("startup_s", T.DoubleType()),
    T.StructField("peak_rss_bytes", T.LongType()),
    T.StructField("latency_ms_samples", T.ArrayType(T.DoubleType())),
    T.StructField("progress_samples", T.ArrayType(T.ArrayType(T.DoubleType()))),
    T.StructField("rss_samples", T.ArrayType(T.ArrayType(T.DoubleType()))),
    T.StructField("ok", T.BooleanType()),
    T.StructField("error", T.StringType()),
    T.StructField("machine", _MACHINE),
    T.StructField("version", T.StringType()),
    T.StructField("codec_impl", T.StringType()),
    # Lines that are not JSON, kept so the report can say how many it skipped.
    T.StructField("_corrupt_record", T.StringType()),
])


# --- helpers ---------------------------------------------------------------------------------

def _div(num: Column, den: Column) -> Column:
    """num / den, or null when den is null or not positive (Spark 4's ANSI mode raises on /0)."""
    return F.when(den > 0, num / den)


def nearest_rank(col: str, pct: int) -> Column:
    """The nearest-rank percentile of ``col`` (an aggregate): the smallest sample with at least
    ``pct`` percent of the samples at or below it, ``sorted[ceil(n * pct / 100)]``. It is
    always a measured value, and it is the method of ``shallowmirror bench``'s own table
    (``bench.summary.percentile``), so the report and the table agree."""
    n = F.count(F.col(col))
    rank = F.greatest(F.lit(1), F.ceil(n * F.lit(pct) / F.lit(100)).cast("int"))
    return F.when(n > 0, F.element_at(F.sort_array(F.collect_list(F.col(col))), rank))


def _percentile_cols(col: str, prefix: str = "latency") -> list[Column]:
    """Nearest-rank percentile aggregates named ``{prefix}_p50``, ``_p95``, ``_p99``."""
    return [nearest_rank(col, round(p * 100)).alias(f"{prefix}_p{round(p * 100)}")
            for p in PERCENTILES]


# --- loading ---------------------------------------------------------------------------------

def read_records(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """All records of all kinds from JSON-lines files, with :data:`RECORD_SCHEMA`."""
    return (
        spark.read.schema(RECORD_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .json(list(paths))
    )


def flow_records(records: DataFrame) -> DataFrame:
    """The engine's per-batch / per-interval ``flow`` records."""
    return records.where(F.col("kind") == ms.FLOW).select(*ms.FLOW_FIELDS)


def process_records(records: DataFrame) -> DataFrame:
    """The ``process`` CPU/RSS samples."""
    return records.where(F.col("kind") == ms.PROCESS).select(*ms.PROCESS_FIELDS)


def bench_runs(records: DataFrame) -> DataFrame:
    """The harness's ``bench_run`` records, one per mirror run."""
    return records.where(F.col("kind") == ms.BENCH_RUN).select(*ms.BENCH_RUN_FIELDS)


def malformed_count(records: DataFrame) -> DataFrame:
    """One row: lines that were not JSON objects, and records with an unknown ``kind``."""
    # Heartbeat records (mirror process) are known; the reports do not use them yet.
    known = F.coalesce(F.col("kind").isin(ms.FLOW, ms.PROCESS, ms.BENCH_RUN, ms.HEARTBEAT),
                       F.lit(False))
    corrupt = F.col("_corrupt_record").isNotNull()
    return records.agg(
        F.sum(F.when(corrupt, 1).otherwise(0)).alias("malformed_lines"),
        F.sum(F.when(~corrupt & ~known, 1).otherwise(0)).alias("unknown_records"),
    )


# --- benchmark runs --------------------------------------------------------------------------

def run_metrics(runs: DataFrame) -> DataFrame:
    """Per bench run: throughput, CPU per GB, peak RSS and compression ratio.

    Peak RSS is the harness's ``peak_rss_bytes``, or the largest of ``rss_samples`` when that is
    null. ``mb_s_uncompressed`` and ``cpu_s_per_gb_uncompressed`` are null when the run does not
    know its uncompressed bytes.
    """
    cpu_s = F.col("cpu_user_s") + F.col("cpu_sys_s")
    sampled_peak = F.array_max(F.transform("rss_samples", lambda s: s[1])).cast("long")
    return runs.select(
        "run_id", "mode", "repeat", "workload_id",
        F.col("workload.codec").alias("codec"),
        F.col("workload.value_bytes").alias("value_bytes"),
        F.col("workload.batch_bytes").alias("batch_bytes"),
        F.col("workload.partitions").alias("partitions"),
        F.col("workload.records").alias("workload_records"),
        F.coalesce(F.col("ok"), F.lit(False)).alias("ok"),
        "error", "codec_impl", "wall_s", "records", "compressed_bytes", "uncompressed_bytes",
        cpu_s.alias("cpu_s"),
        _div(F.col("compressed_bytes") / MB, F.col("wall_s")).alias("mb_s_compressed"),
        _div(F.col("uncompressed_bytes") / MB, F.col("wall_s")).alias("mb_s_uncompressed"),
        _div(F.col("records").cast("double"), F.col("wall_s")).alias("records_s"),
        _div(cpu_s, F.col("compressed_bytes") / GB).alias("cpu_s_per_gb_compressed"),
        _div(cpu_s, F.col("uncompressed_bytes") / GB).alias("cpu_s_per_gb_uncompressed"),
        F.coalesce(F.col("peak_rss_bytes"), sampled_peak).alias("peak_rss_bytes"),
        _div(F.col("uncompressed_bytes").cast("double"), F.col("compressed_bytes"))
        .alias("compression_ratio"),
    )


_GROUP = ("workload_id", "codec", "mode")
_SHAPE = ("value_bytes", "batch_bytes", "partitions", "workload_records")


def run_latency(runs: DataFrame) -> DataFrame:
    """Per bench run: end-to-end latency percentiles from ``latency_ms_samples``."""
    return (
        runs.select(
            "run_id", "mode", "workload_id", F.col("workload.codec").alias("codec"),
            F.explode("latency_ms_samples").alias("latency_ms"),
        )
        .groupBy("run_id", *_GROUP)
        .agg(F.count("latency_ms").alias("latency_samples"), *_percentile_cols("latency_ms"),
             F.max("latency_ms").alias("latency_max"))
    )


def repeat_summary(metrics: DataFrame, runs: DataFrame) -> DataFrame:
    """Per (workload, codec, mode): median, min and max of each run metric over the ok repeats.

    The median keeps the metric's name; ``_min`` and ``_max`` suffixes give the spread. Latency
    percentiles pool the samples of all ok repeats (a percentile of percentiles means nothing).
    """
    ok = metrics.where("ok")
    aggs: list[Column] = [F.count("*").alias("runs")]
    for name in RUN_METRICS:
        aggs += [
            F.percentile(F.col(name), 0.5).alias(name),
            F.min(name).alias(f"{name}_min"),
            F.max(name).alias(f"{name}_max"),
        ]
    aggs.append(F.percentile(F.col("compression_ratio"), 0.5).alias("compression_ratio"))
    # Shape columns are fixed per workload_id; first() carries them along for the goals.
    aggs += [F.first(c, ignorenulls=True).alias(c) for c in _SHAPE]
    summary = ok.groupBy(*_GROUP).agg(*aggs)
    ok_ids = ok.select("run_id")
    latency = (
        runs.join(ok_ids, "run_id", "left_semi")
        .select("mode", "workload_id", F.col("workload.codec").alias("codec"),
                F.explode("latency_ms_samples").alias("latency_ms"))
        .groupBy(*_GROUP)
        .agg(*_percentile_cols("latency_ms"))
    )
    return summary.join(latency, list(_GROUP), "left")


def failed_runs(metrics: DataFrame) -> DataFrame:
    """Runs the harness marked not ok, with their error, so the report can list them."""
    return metrics.where(~F.col("ok")).select("run_id", *_GROUP, "repeat", "error")


def shallow_ratios(summary: DataFrame) -> DataFrame:
    """Shallow mirroring against each other mode of the same workload (medians of repeats).

    ``cpu_per_gb_ratio`` = baseline CPU s/GB / shallow CPU s/GB (compressed bytes: the same bytes
    both modes moved); ``peak_rss_ratio`` = baseline / shallow; ``throughput_ratio`` = shallow
    MB/s / baseline MB/s.
    """
    cols = ["cpu_s_per_gb_compressed", "peak_rss_bytes", "mb_s_compressed"]
    shallow = summary.where(F.col("mode") == "shallow").select(
        "workload_id", "codec", *[F.col(c).alias(f"shallow_{c}") for c in cols])
    baseline = summary.where(F.col("mode") != "shallow").select(
        "workload_id", "codec", F.col("mode").alias("baseline_mode"),
        *[F.col(c).alias(f"baseline_{c}") for c in cols])
    return shallow.join(baseline, ["workload_id", "codec"]).select(
        "workload_id", "codec", "baseline_mode",
        *[F.col(f"shallow_{c}") for c in cols], *[F.col(f"baseline_{c}") for c in cols],
        _div(F.col("baseline_cpu_s_per_gb_compressed"), F.col("shallow_cpu_s_per_gb_compressed"))
        .alias("cpu_per_gb_ratio"),
        _div(F.col("baseline_peak_rss_bytes").cast("double"), F.col("shallow_peak_rss_bytes"))
        .alias("peak_rss_ratio"),
        _div(F.col("shallow_mb_s_compressed"), F.col("baseline_mb_s_compressed"))
        .alias("throughput_ratio"),
    )


def bench_throughput_series(runs: DataFrame) -> DataFrame:
    """Per bench run, throughput between consecutive ``progress_samples`` (the later time).

    Each sample is ``[t_since_process_start_s, records_on_target, compressed_bytes_on_target]``.
    Nothing is on the target before the mode is ready (``startup_s``), so when the first sample
    is later than that an anchor ``[startup_s, 0, 0]`` is put before it (a fetch-only run
    reports a single sample at its end). ``run_t_s`` is the time since the mode was ready: the
    run's ``wall_s`` counts from there too, so ``run_t_s / wall_s`` runs from 0 to 1.
    """
    samples = F.col("progress_samples")
    ready = F.coalesce(F.col("startup_s").cast("double"), F.lit(0.0))
    zero = F.array(F.array(ready, F.lit(0.0), F.lit(0.0)))
    anchored = F.when(F.coalesce(F.size(samples) > 0, F.lit(False)) & (samples[0][0] > ready),
                      F.concat(zero, samples)).otherwise(samples)
    points = runs.select(
        "run_id", "mode", "repeat", "workload_id", F.col("workload.codec").alias("codec"),
        "wall_s", ready.alias("startup_s"), F.posexplode(anchored).alias("i", "s"),
    ).select(
        "run_id", "mode", "repeat", "workload_id", "codec", "wall_s", "i",
        F.col("s")[0].alias("t_s"), (F.col("s")[0] - F.col("startup_s")).alias("run_t_s"),
        F.col("s")[1].alias("records"), F.col("s")[2].alias("bytes"),
    )
    w = Window.partitionBy("run_id").orderBy("i")
    dt = F.col("t_s") - F.lag("t_s").over(w)
    return (
        points.select(
            "run_id", "mode", "repeat", "workload_id", "codec", "wall_s", "t_s", "run_t_s",
            _div((F.col("bytes") - F.lag("bytes").over(w)) / MB, dt).alias("mb_s_compressed"),
            _div(F.col("records") - F.lag("records").over(w), dt).alias("records_s"),
        )
        .where(F.col("mb_s_compressed").isNotNull())
    )


def bench_rss_series(runs: DataFrame) -> DataFrame:
    """Per bench run, RSS over time from ``rss_samples``; ``run_t_s`` is the time since the
    mode was ready (negative during start-up, beyond ``wall_s`` while the harness finishes)."""
    ready = F.coalesce(F.col("startup_s").cast("double"), F.lit(0.0))
    return runs.select(
        "run_id", "mode", "repeat", "workload_id", F.col("workload.codec").alias("codec"),
        "wall_s", ready.alias("startup_s"), F.explode("rss_samples").alias("s"),
    ).select(
        "run_id", "mode", "repeat", "workload_id", "codec", "wall_s",
        F.col("s")[0].alias("t_s"), (F.col("s")[0] - F.col("startup_s")).alias("run_t_s"),
        F.col("s")[1].cast("long").alias("rss_bytes"),
    )


# --- goals -----------------------------------------------------------------------------------

def _goal_rows(df: DataFrame, goal: str, scope: Column, codec: Column, measured: Column,
               threshold: Column, at_least: bool, note: Column | None = None) -> DataFrame:
    """Goal rows with PASS/MISS and the margin (positive = headroom, negative = missed by);
    ``note`` says why a row has NO DATA (its measurement null)."""
    margin = measured - threshold if at_least else threshold - measured
    passed = measured >= threshold if at_least else measured <= threshold
    return df.select(
        F.lit(goal).alias("goal"), scope.alias("scope"), codec.alias("codec"),
        measured.cast("double").alias("measured"), threshold.cast("double").alias("threshold"),
        F.lit(">=" if at_least else "<=").alias("comparison"),
        F.when(measured.isNull(), "NO DATA").when(passed, "PASS").otherwise("MISS")
        .alias("status"),
        margin.cast("double").alias("margin"),
        _div(margin, F.abs(threshold)).alias("margin_fraction"),
        (note if note is not None else F.lit(None)).cast("string").alias("note"),
    )


def goals(
    summary: DataFrame,
    ratios: DataFrame,
    cpu_ratio_goals: Mapping[str, float] = CPU_RATIO_GOALS,
    rss_flat_max_ratio: float = RSS_FLAT_MAX_RATIO,
    deep_rss_min_correlation: float = DEEP_RSS_MIN_CORRELATION,
    fetch_only_min_ratio: float = FETCH_ONLY_MIN_RATIO,
) -> DataFrame:
    """The issue's goals, one row per goal and workload (or workload shape), PASS or MISS.

    - ``cpu_per_gb``: deep-confluent CPU/GB over shallow CPU/GB, at least the codec's threshold.
    - ``shallow_rss_flat``: shallow peak RSS max/min across codecs of one workload shape.
    - ``deep_rss_grows``: correlation of deep-confluent peak RSS with the compression ratio
      across codecs of one workload shape.
    - ``fetch_only_throughput``: shallow MB/s over fetch-only MB/s of the same workload.
    """
    spark = summary.sparkSession
    thresholds = spark.createDataFrame(
        [(c, float(v)) for c, v in cpu_ratio_goals.items()], "codec string, threshold double")
    cpu = ratios.where(F.col("baseline_mode") == "deep-confluent").join(thresholds, "codec")
    cpu_goal = _goal_rows(cpu, "cpu_per_gb", F.col("workload_id"), F.col("codec"),
                          F.col("cpu_per_gb_ratio"), F.col("threshold"), at_least=True)

    fetch = ratios.where(F.col("baseline_mode") == "fetch-only")
    fetch_goal = _goal_rows(fetch, "fetch_only_throughput", F.col("workload_id"), F.col("codec"),
                            F.col("throughput_ratio"), F.lit(fetch_only_min_ratio), at_least=True)

    shape = F.concat_ws(
        " ", F.concat(F.lit("value="), F.coalesce(F.col("value_bytes").cast("string"), F.lit("?")),
                      F.lit("B")),
        F.concat(F.lit("batch="), F.coalesce(F.col("batch_bytes").cast("string"), F.lit("?")),
                 F.lit("B")),
        F.concat(F.lit("partitions="), F.coalesce(F.col("partitions").cast("string"), F.lit("?"))),
        F.concat(F.lit("records="),
                 F.coalesce(F.col("workload_records").cast("string"), F.lit("?"))),
    )
    by_shape = summary.withColumn("shape", shape)
    flat = (
        by_shape.where(F.col("mode") == "shallow").groupBy("shape")
        .agg(F.countDistinct("codec").alias("codecs"),
             _div(F.max("peak_rss_bytes"), F.min("peak_rss_bytes")).alias("spread"),
             F.concat_ws(",", F.sort_array(F.collect_set("codec"))).alias("codec_list"))
        .where(F.col("codecs") >= 2)
    )
    flat_goal = _goal_rows(flat, "shallow_rss_flat", F.col("shape"), F.col("codec_list"),
                           F.col("spread"), F.lit(rss_flat_max_ratio), at_least=False)
    grows = (
        by_shape.where(F.col("mode") == "deep-confluent").groupBy("shape")
        .agg(F.countDistinct("codec").alias("codecs"),
             F.corr("compression_ratio", "peak_rss_bytes").alias("correlation"),
             F.concat_ws(",", F.sort_array(F.collect_set("codec"))).alias("codec_list"))
        .where(F.col("codecs") >= 2)
    )
    # Two points always correlate at +1 or -1: the goal is judged from three codecs on.
    enough = F.col("codecs") >= 3
    grows_goal = _goal_rows(grows, "deep_rss_grows", F.col("shape"), F.col("codec_list"),
                            F.when(enough, F.col("correlation")),
                            F.lit(deep_rss_min_correlation), at_least=True,
                            note=F.when(~enough, F.lit(
                                "needs 3 codecs or more of this shape (a correlation of two "
                                "points is always +1 or -1)")))
    return cpu_goal.unionByName(flat_goal).unionByName(grows_goal).unionByName(fetch_goal)


# --- engine flow and process metrics ---------------------------------------------------------

def _sum_if_all_known(col: str) -> Column:
    """Sum of ``col``, or null when any row lacks it (a partial uncompressed sum would mislead)."""
    return F.when(F.count(col) == F.count("*"), F.sum(col))


def flow_windows(flow: DataFrame, window_s: float = 1.0,
                 by: Iterable[str] = ("run_id", "flow", "topic")) -> DataFrame:
    """Throughput per time window of ``window_s`` seconds, grouped by ``by``.

    A record counts in the window its ``time`` falls into: ``[k*window_s, (k+1)*window_s)``.
    ``t_s`` is the window start relative to the first record of the same run.
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, got {window_s}")
    keys = list(by)
    start = F.floor(F.col("time") / window_s) * window_s
    run_start = F.min("time").over(Window.partitionBy("run_id"))
    return (
        flow.withColumn("window_start", start.cast("double"))
        .withColumn("run_start", F.floor(run_start / window_s) * window_s)
        .groupBy(*keys, "window_start")
        .agg(
            F.min("run_start").alias("run_start"),
            F.sum("batches").alias("batches"), F.sum("records").alias("records"),
            F.sum("compressed_bytes").alias("compressed_bytes"),
            _sum_if_all_known("uncompressed_bytes").alias("uncompressed_bytes"),
        )
        .select(
            *keys, "window_start", (F.col("window_start") - F.col("run_start")).alias("t_s"),
            "batches", "records", "compressed_bytes", "uncompressed_bytes",
            (F.col("compressed_bytes") / MB / window_s).alias("mb_s_compressed"),
            (F.col("uncompressed_bytes") / MB / window_s).alias("mb_s_uncompressed"),
            (F.col("records") / window_s).alias("records_s"),
        )
    )


def flow_totals(flow: DataFrame, by: Iterable[str] = ("run_id", "flow", "topic")) -> DataFrame:
    """Overall totals and throughput per ``by`` group, with latency percentiles.

    Overall throughput is total bytes / (last record time - first record time); null when all
    records share one time. Latency percentiles are over the records' ``latency_ms`` (one value
    per batch, or the mean of an aggregate record); ``latency_max`` uses ``latency_ms_max``.
    """
    keys = list(by)
    span = F.col("last_time") - F.col("first_time")
    return (
        flow.groupBy(*keys)
        .agg(
            F.concat_ws(",", F.sort_array(F.collect_set("mode"))).alias("modes"),
            F.concat_ws(",", F.sort_array(F.collect_set("codec"))).alias("codecs"),
            F.min("time").alias("first_time"), F.max("time").alias("last_time"),
            F.sum("batches").alias("batches"), F.sum("records").alias("records"),
            F.sum("compressed_bytes").alias("compressed_bytes"),
            _sum_if_all_known("uncompressed_bytes").alias("uncompressed_bytes"),
            *_percentile_cols("latency_ms"),
            F.max(F.coalesce("latency_ms_max", "latency_ms")).alias("latency_max"),
            F.max_by("offset_lag", "time").alias("final_offset_lag"),
        )
        .select(
            "*", span.alias("span_s"),
            _div(F.col("compressed_bytes") / MB, span).alias("mb_s_compressed"),
            _div(F.col("uncompressed_bytes") / MB, span).alias("mb_s_uncompressed"),
            _div(F.col("records").cast("double"), span).alias("records_s"),
        )
    )


def process_series(process: DataFrame) -> DataFrame:
    """Per process sample: cumulative CPU, CPU cores in use since the previous sample, RSS."""
    w = Window.partitionBy("run_id", "pid").orderBy("time")
    cpu = F.col("cpu_user_s") + F.col("cpu_sys_s")
    return process.select(
        "run_id", "pid", "time",
        (F.col("time") - F.min("time").over(Window.partitionBy("run_id", "pid"))).alias("t_s"),
        cpu.alias("cpu_s"),
        _div(cpu - F.lag(cpu).over(w), F.col("time") - F.lag("time").over(w)).alias("cpu_cores"),
        "rss_bytes", "budget_bytes_in_use",
    )


def process_summary(process: DataFrame) -> DataFrame:
    """Per (run, pid): CPU seconds spent between first and last sample, mean cores, peak RSS."""
    cpu = F.col("cpu_user_s") + F.col("cpu_sys_s")
    return (
        process.groupBy("run_id", "pid")
        .agg(
            F.count("*").alias("samples"),
            F.min("time").alias("first_time"), F.max("time").alias("last_time"),
            (F.max_by(cpu, "time") - F.min_by(cpu, "time")).alias("cpu_s"),
            F.max("rss_bytes").alias("peak_rss_bytes"),
            F.max("budget_bytes_in_use").alias("peak_budget_bytes_in_use"),
        )
        .select("*", _div(F.col("cpu_s"), F.col("last_time") - F.col("first_time"))
                .alias("mean_cpu_cores"))
    )


def engine_cpu_per_gb(processes: DataFrame, flow: DataFrame) -> DataFrame:
    """Per (run, pid): the process's CPU seconds per GB its run mirrored (from flow records)."""
    moved = flow.groupBy("run_id").agg(
        F.sum("compressed_bytes").alias("compressed_bytes"),
        _sum_if_all_known("uncompressed_bytes").alias("uncompressed_bytes"),
    )
    return processes.join(moved, "run_id").select(
        "run_id", "pid", "cpu_s", "compressed_bytes", "uncompressed_bytes",
        _div(F.col("cpu_s"), F.col("compressed_bytes") / GB).alias("cpu_s_per_gb_compressed"),
        _div(F.col("cpu_s"), F.col("uncompressed_bytes") / GB)
        .alias("cpu_s_per_gb_uncompressed"),
    )
