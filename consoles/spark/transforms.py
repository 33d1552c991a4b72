"""Pure transforms of the attempt log: DataFrame in, DataFrame out, no I/O, no Django.

Input is the *attempts frame* of :data:`ATTEMPT_SCHEMA`: one row per processing attempt, with
every time as epoch seconds (a double). Epoch seconds rather than timestamps because the two
readers (JDBC from PostgreSQL, Django rows from SQLite) then agree exactly, bucket arithmetic
is plain division, and no session time zone can shift a bucket.

The pipeline is::

    attempts --prepare--> prepared --queue_bucket_stats--> per queue and time bucket
                                   --worker_stats-------> per queue and worker
                                   --group_stats--------> per queue and message group
                                   --regression_samples--> fit_size_regression --> learned estimates
    archived --latency_bucket_stats--> per queue and time bucket of the ack: end-to-end latency

Percentiles are ``percentile_approx`` with :data:`PERCENTILE_ACCURACY` = 10,000: the answer is
a value of the column whose rank is within 1/10,000 of the asked rank (exact below 10,000 values
per group), for bounded memory on large groups.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

if TYPE_CHECKING:  # imported by the fit itself, when it runs: pyspark.ml is slow to import
    from pyspark.ml.feature import VectorAssembler as VectorAssemblerType
    from pyspark.ml.regression import LinearRegression as LinearRegressionType

#: One row per attempt; every ``*_at`` is epoch seconds (UTC), null when unknown.
ATTEMPT_SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("queue", T.StringType(), False),
        T.StructField("group", T.StringType(), True),
        T.StructField("worker", T.StringType(), True),
        T.StructField("attempt", T.IntegerType(), False),
        T.StructField("outcome", T.StringType(), False),
        T.StructField("size", T.LongType(), True),
        T.StructField("enqueued_at", T.DoubleType(), True),
        T.StructField("preprocess_started_at", T.DoubleType(), True),
        T.StructField("preprocess_ended_at", T.DoubleType(), True),
        T.StructField("process_started_at", T.DoubleType(), True),
        T.StructField("process_ended_at", T.DoubleType(), True),
        T.StructField("recorded_at", T.DoubleType(), False),
    ]
)

#: One row per acknowledged message of the archive (``archive.ArchivedMessage``): its queue (or
#: topic), when it was enqueued and when it was acknowledged (a topic's: by its last
#: subscription), epoch seconds.
ARCHIVE_SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("queue", T.StringType(), False),
        T.StructField("enqueued_at", T.DoubleType(), False),
        T.StructField("acked_at", T.DoubleType(), False),
    ]
)

#: ``percentile_approx`` accuracy: relative rank error 1/10,000, exact for smaller groups.
PERCENTILE_ACCURACY = 10_000
PERCENTILES = (0.5, 0.95, 0.99)
#: the measures whose percentiles every figure table carries
MEASURES = ("wait", "preprocess", "process")
#: the two stages whose time is regressed on ``size``
STAGES = ("preprocess", "process")
#: learned estimates are clamped to the Queue model's bounds for an estimate
ESTIMATE_MAX = 24 * 3600.0

#: the columns the figure aggregations add after their keys, in order
FIGURE_COLUMNS = [
    "attempts",
    "succeeded",
    "failed",
    "timed_out",
    "abandoned",
    "retries",
    "failure_rate",
    "retry_rate",
] + [f"{m}_p{round(p * 100)}" for m in MEASURES for p in PERCENTILES]


def _seconds(end: str, start: str) -> Column:
    """``end - start`` in seconds; null when either is unknown, never negative (a worker's
    clock a little behind the node's must not produce a negative wait)."""
    return F.when(F.col(end).isNotNull() & F.col(start).isNotNull(), F.greatest(F.lit(0.0), F.col(end) - F.col(start)))


def prepare(attempts: DataFrame, bucket_seconds: int) -> DataFrame:
    """Add what every aggregation needs: durations, flags and the time bucket.

    An attempt belongs to the bucket in which it *finished* (processing end, else the end of a
    failed pre-processing, else when the service recorded it, e.g. an abandoned attempt), so
    throughput counts work when it was done. ``bucket_start`` is epoch seconds, a multiple of
    ``bucket_seconds``.
    """
    if bucket_seconds <= 0:
        raise ValueError(f"bucket_seconds must be positive, not {bucket_seconds}")
    finished = F.coalesce(F.col("process_ended_at"), F.col("preprocess_ended_at"), F.col("recorded_at"))
    outcome = F.col("outcome")
    return attempts.select(
        "queue",
        F.when(F.col("group") != "", F.col("group")).alias("group"),
        "worker",
        "attempt",
        "outcome",
        "size",
        (F.floor(finished / bucket_seconds) * bucket_seconds).cast("long").alias("bucket_start"),
        _seconds("process_started_at", "enqueued_at").alias("wait"),
        _seconds("preprocess_ended_at", "preprocess_started_at").alias("preprocess"),
        _seconds("process_ended_at", "process_started_at").alias("process"),
        (outcome == "succeeded").cast("int").alias("is_succeeded"),
        (outcome == "failed").cast("int").alias("is_failed"),
        (outcome == "timed_out").cast("int").alias("is_timed_out"),
        (outcome == "abandoned").cast("int").alias("is_abandoned"),
        (F.col("attempt") > 1).cast("int").alias("is_retry"),
    )


def _figures(prepared: DataFrame, keys: list[str], extra: tuple[Column, ...] = ()) -> DataFrame:
    """Counts, rates and percentiles per ``keys``: the columns of :data:`FIGURE_COLUMNS`, then
    the ``extra`` aggregates (in the same pass over the data)."""
    aggregates = [
        F.count(F.lit(1)).alias("attempts"),
        F.sum("is_succeeded").alias("succeeded"),
        F.sum("is_failed").alias("failed"),
        F.sum("is_timed_out").alias("timed_out"),
        F.sum("is_abandoned").alias("abandoned"),
        F.sum("is_retry").alias("retries"),
    ] + [F.percentile_approx(m, list(PERCENTILES), PERCENTILE_ACCURACY).alias(f"_{m}") for m in MEASURES]
    grouped = prepared.groupBy(*keys).agg(*aggregates, *extra)
    extra_names = grouped.columns[len(keys) + len(aggregates) :]
    return grouped.select(
        *keys,
        "attempts",
        "succeeded",
        "failed",
        "timed_out",
        "abandoned",
        "retries",
        ((F.col("failed") + F.col("timed_out")) / F.col("attempts")).alias("failure_rate"),
        (F.col("retries") / F.col("attempts")).alias("retry_rate"),
        *[F.col(f"_{m}")[i].alias(f"{m}_p{round(p * 100)}") for m in MEASURES for i, p in enumerate(PERCENTILES)],
        *extra_names,
    )


def queue_bucket_stats(prepared: DataFrame, bucket_seconds: int, since: float | None = None) -> DataFrame:
    """Per queue and time bucket: the figures plus ``throughput`` (succeeded per second).

    ``since`` drops buckets that start before it: the job reads attempts *recorded* since then,
    so an earlier bucket would hold only the few that finished before and were recorded after.
    """
    stats = _figures(prepared, ["queue", "bucket_start"])
    if since is not None:
        stats = stats.where(F.col("bucket_start") >= F.lit(since))
    return stats.select(
        "queue",
        "bucket_start",
        *FIGURE_COLUMNS[:6],
        (F.col("succeeded") / F.lit(float(bucket_seconds))).alias("throughput"),
        *FIGURE_COLUMNS[6:],
    )


def worker_stats(prepared: DataFrame) -> DataFrame:
    """Per queue and worker over the whole window, plus the worker's busy seconds
    (pre-processing and processing summed) and its first and last bucket."""
    return _figures(
        prepared.where(F.col("worker").isNotNull()),
        ["queue", "worker"],
        (
            (F.coalesce(F.sum("preprocess"), F.lit(0.0)) + F.coalesce(F.sum("process"), F.lit(0.0))).alias(
                "busy_seconds"
            ),
            F.min("bucket_start").alias("first_bucket"),
            F.max("bucket_start").alias("last_bucket"),
        ),
    )


def group_stats(prepared: DataFrame) -> DataFrame:
    """Per queue and message group (messages without a group are left out)."""
    return _figures(prepared.where(F.col("group").isNotNull()), ["queue", "group"])


def regression_samples(prepared: DataFrame) -> DataFrame:
    """``(queue, stage, size, seconds)`` of succeeded attempts that declared a size.

    Failed attempts are left out: their time says when the error came, not how long the work
    takes. A stage that did not run (no pre-processing function) has no time and no sample.
    """
    done = prepared.where((F.col("is_succeeded") == 1) & F.col("size").isNotNull())
    per_stage = [
        done.select(
            "queue",
            F.lit(stage).alias("stage"),
            F.col("size").cast("double").alias("size"),
            F.col(stage).alias("seconds"),
        ).where(F.col("seconds").isNotNull())
        for stage in STAGES
    ]
    out = per_stage[0]
    for frame in per_stage[1:]:
        out = out.unionByName(frame)
    return out


#: A row of FIT_SCHEMA, as the fit computes it.
FitRow = tuple[str, str, int, float, float, float | None, float, float, float]
FIT_SCHEMA = T.StructType(
    [
        T.StructField("queue", T.StringType(), False),
        T.StructField("stage", T.StringType(), False),
        T.StructField("n", T.LongType(), False),
        T.StructField("intercept", T.DoubleType(), False),
        T.StructField("slope", T.DoubleType(), False),
        T.StructField("r2", T.DoubleType(), True),
        T.StructField("rmse", T.DoubleType(), True),
        T.StructField("median_size", T.DoubleType(), False),
        T.StructField("estimate", T.DoubleType(), False),
    ]
)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


#: the normal-equation solver takes at most 4,096 features; each (queue, stage) uses two
GROUPS_PER_FIT = 2000


def fit_size_regression(samples: DataFrame, min_samples: int = 20) -> DataFrame:
    """A least-squares line ``seconds = intercept + slope * size`` per queue and stage, for those
    with at least ``min_samples`` samples, fitted with pyspark.ml's ``LinearRegression``.

    ``estimate`` is the line's value at the queue's median size, clamped to 0..24 h: the time
    a typical message takes, which becomes the queue's default estimate. When every sample has
    the same size there is no slope to learn: the line is flat at the mean time. ``r2`` is
    null when the times do not vary (there is nothing to explain).

    All (queue, stage) lines come from *one* fit (per 2,000 of them): each gets its own
    intercept column (1 for its rows, else 0) and slope column (its centred, scaled size, else
    0), no global intercept. That is exactly the separate least-squares lines, at the cost of
    one pass over the data instead of one Spark job per queue. Centring on the median makes the
    intercept column's coefficient the estimate itself, and scaling by the size's spread keeps
    the normal equations well conditioned whatever unit ``size`` is in.
    """
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.regression import LinearRegression

    spark = samples.sparkSession
    stats = (
        samples.groupBy("queue", "stage")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.stddev_pop("size").alias("size_std"),
            F.stddev_pop("seconds").alias("seconds_std"),
            F.percentile_approx("size", 0.5, PERCENTILE_ACCURACY).alias("median_size"),
        )
        .where(F.col("n") >= min_samples)
        .orderBy("queue", "stage")
        .collect()
    )
    rows: list[FitRow] = []
    for first in range(0, len(stats), GROUPS_PER_FIT):
        rows += _fit_groups(spark, samples, stats[first : first + GROUPS_PER_FIT], VectorAssembler, LinearRegression)
    return spark.createDataFrame(rows, FIT_SCHEMA)


def _fit_groups(
    spark: SparkSession,
    samples: DataFrame,
    stats: list[Row],
    VectorAssembler: type[VectorAssemblerType],
    LinearRegression: type[LinearRegressionType],
) -> list[FitRow]:
    """One least-squares fit for the (queue, stage) groups of ``stats``; their FIT_SCHEMA rows."""
    groups = spark.createDataFrame(
        [(s.queue, s.stage, k, float(s.median_size), float(s.size_std or 0.0)) for k, s in enumerate(stats)],
        "queue string, stage string, g int, median double, spread double",
    )
    data = samples.join(F.broadcast(groups), ["queue", "stage"])
    columns, names = [], []
    for k, s in enumerate(stats):
        mine = F.col("g") == k
        columns.append(F.when(mine, 1.0).otherwise(0.0).alias(f"c{k}"))
        names.append(f"c{k}")
        if s.size_std:  # a constant size gives no slope column: it would repeat the intercept's
            columns.append(
                F.when(mine, (F.col("size") - F.col("median")) / F.col("spread")).otherwise(0.0).alias(f"s{k}")
            )
            names.append(f"s{k}")
    # VectorAssembler (not an array cast) writes sparse vectors, two non-zeros a row, and the
    # vector size into the column's metadata, which spares the fit a pass to find it.
    data = (
        VectorAssembler(inputCols=names, outputCol="features")
        .transform(data.select("g", "seconds", *columns))
        .select("g", "seconds", "features")
    )
    model = LinearRegression(
        featuresCol="features",
        labelCol="seconds",
        fitIntercept=False,
        solver="normal",
        regParam=0.0,
        standardization=False,
    ).fit(data)
    coefficients = model.coefficients.toArray()
    residuals = {
        r.g: r.sse
        for r in model.transform(data)
        .groupBy("g")
        .agg(F.sum((F.col("seconds") - F.col("prediction")) ** 2).alias("sse"))
        .collect()
    }
    rows: list[FitRow] = []
    column = 0
    for k, s in enumerate(stats):
        at_median = float(coefficients[column])
        column += 1
        slope = 0.0
        if s.size_std:
            slope = float(coefficients[column]) / s.size_std
            column += 1
        sse = max(0.0, residuals.get(k, 0.0))
        sst = s.n * (s.seconds_std or 0.0) ** 2
        r2 = _finite(1.0 - sse / sst) if sst > 0 else None
        rmse = math.sqrt(sse / s.n)
        estimate = min(ESTIMATE_MAX, max(0.0, at_median))
        rows.append(
            (s.queue, s.stage, s.n, at_median - slope * s.median_size, slope, r2, rmse, float(s.median_size), estimate)
        )
    return rows


LATENCY_COLUMNS = ["acked"] + [f"latency_p{round(p * 100)}" for p in PERCENTILES]


def latency_bucket_stats(archived: DataFrame, bucket_seconds: int, since: float | None = None) -> DataFrame:
    """Per queue and time bucket of the ack: messages acknowledged, and percentiles of their
    end-to-end latency (ack time - enqueue time, never negative), from the archive.

    The attempt log times the work of each attempt; this is what a producer sees: how long a
    message lived, every redelivery and wait included. ``since`` drops earlier buckets.
    """
    if bucket_seconds <= 0:
        raise ValueError(f"bucket_seconds must be positive, not {bucket_seconds}")
    stats = (
        archived.select(
            "queue",
            (F.floor(F.col("acked_at") / bucket_seconds) * bucket_seconds).cast("long").alias("bucket_start"),
            F.greatest(F.lit(0.0), F.col("acked_at") - F.col("enqueued_at")).alias("latency"),
        )
        .groupBy("queue", "bucket_start")
        .agg(
            F.count(F.lit(1)).alias("acked"),
            F.percentile_approx("latency", list(PERCENTILES), PERCENTILE_ACCURACY).alias("_latency"),
        )
    )
    if since is not None:
        stats = stats.where(F.col("bucket_start") >= F.lit(since))
    return stats.select(
        "queue",
        "bucket_start",
        "acked",
        *[F.col("_latency")[i].alias(f"latency_p{round(p * 100)}") for i, p in enumerate(PERCENTILES)],
    )
