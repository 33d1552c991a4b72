"""The dashboards job: read the attempt log and the archive, run the transforms, write the results.

Kept thin on purpose: every computation is in :mod:`consoles.spark.transforms`. This module
only knows where data comes from and goes to.

* Reading (the attempt log, and the archive's acknowledged messages for end-to-end latency,
  each a :class:`Source`): on PostgreSQL, Spark reads through JDBC (the Debian driver jar,
  never a download), a query filtered on the window's time column and split on ``id`` into
  parallel reads, so on a cluster the executors read the database directly. Elsewhere (the
  embedded SQLite default) there is no driver: the rows are read with Django, in chunks, into
  frames of the same schema.
* Writing: the results are small (buckets x queues, workers, groups, a few fits), so they are
  collected and written with Django's ``bulk_create`` in one transaction; the learned
  estimates go to ``Queue.preprocess_estimate`` / ``process_estimate``, which nodes reload at
  every heartbeat and attach to messages that bring none.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Field, Max, Min, Model, QuerySet
from django.utils import timezone

from consoles.models import (
    DashboardRun,
    EstimateFit,
    GroupStats,
    LatencyBucketStats,
    QueueBucketStats,
    WorkerStats,
)
from consoles.spark import transforms as tf

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: ``progress(step, steps, text)``: called as each phase starts (the command draws it).
Progress = Callable[[int, int, str], None]
STEPS = 5
#: rows per chunk when reading with Django (and per frame handed to Spark)
DJANGO_CHUNK = 50_000
#: attempts per JDBC partition (parallel reads), at most SPARK_JDBC_PARTITIONS of them
ROWS_PER_JDBC_PARTITION = 100_000

_session_lock = threading.Lock()


@dataclass
class Options:
    bucket_seconds: int = field(default_factory=lambda: settings.DASHBOARDS_BUCKET)
    window_seconds: int = field(default_factory=lambda: settings.DASHBOARDS_WINDOW)
    min_samples: int = field(default_factory=lambda: settings.DASHBOARDS_MIN_SAMPLES)
    #: write the learned estimates to the queues (False: only record them)
    apply_estimates: bool = True
    #: the end of the window (tests and the bench pin it); None: now
    now: datetime | None = None

    def validate(self) -> None:
        if not isinstance(self.bucket_seconds, int) or self.bucket_seconds < 1:
            raise ValueError(f"bucket must be a whole number of seconds >= 1, not {self.bucket_seconds!r}")
        if self.bucket_seconds > 7 * 24 * 3600:
            raise ValueError(f"bucket must be at most a week (604800 s), not {self.bucket_seconds}")
        if not isinstance(self.window_seconds, int) or self.window_seconds < self.bucket_seconds:
            raise ValueError(
                f"window ({self.window_seconds!r} s) must be at least one bucket ({self.bucket_seconds} s)"
            )
        if not isinstance(self.min_samples, int) or self.min_samples < 2:
            raise ValueError(f"min-samples must be at least 2 (a line needs two points), not {self.min_samples!r}")


# --- the session ---------------------------------------------------------------------------------
def spark_session(master: str | None = None, shuffle_partitions: int | None = None) -> SparkSession:
    """This process's SparkSession, created on first use (JVM start-up costs seconds).

    Local mode unless ``SPARK_MASTER`` (or ``master``) names a cluster; shuffles in
    ``SPARK_SHUFFLE_PARTITIONS`` (or ``shuffle_partitions``) partitions. The PostgreSQL driver
    jar is shipped with ``spark.jars`` when it exists; nothing is ever fetched from Maven.
    """
    from pyspark.sql import SparkSession

    master = master or settings.SPARK_MASTER
    partitions = shuffle_partitions or settings.SPARK_SHUFFLE_PARTITIONS
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no DNS lookups of our own hostname
    with _session_lock:
        builder = (
            SparkSession.builder.master(master)
            .appName("mq-dashboards")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")  # stage bars: the caller shows its own progress
            .config("spark.sql.shuffle.partitions", str(partitions))
            .config("spark.driver.memory", settings.SPARK_DRIVER_MEMORY)
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.adaptive.enabled", "true")
            # percentile_approx keeps a sketch per group; past 128 groups a task would
            # switch to sort-based aggregation, which is several times slower here.
            .config("spark.sql.objectHashAggregate.sortBased.fallbackThreshold", "1000000")
        )
        if Path(settings.SPARK_JDBC_JAR).is_file():
            builder = builder.config("spark.jars", settings.SPARK_JDBC_JAR)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per call otherwise
        return spark


# --- reading -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """A table the job reads: which model, the rows of which window, into which frame.

    ``columns`` pairs each model field with its frame column (in the schema's order); the
    fields in ``times`` are timestamps, read as epoch seconds. ``window`` is the timestamp
    field the ``[since, until)`` window is on.
    """

    model: str
    window: str
    columns: tuple[tuple[str, str], ...]
    times: frozenset[str]
    schema: StructType

    def queryset(self, since: datetime, until: datetime | None) -> QuerySet[Model]:
        rows = self._model()._default_manager.filter(**{f"{self.window}__gte": since})
        return rows.filter(**{f"{self.window}__lt": until}) if until is not None else rows

    def attnames(self) -> list[str]:
        """The fields as Django reads them (a foreign key's ``<name>_id``)."""
        return [self._field(name).attname for name, _ in self.columns]

    def _model(self) -> type[Model]:
        from django.apps import apps

        return apps.get_model(self.model)

    def _field(self, name: str) -> Field[Any, Any]:
        field = self._model()._meta.get_field(name)
        assert isinstance(field, Field), f"{self.model}.{name} is a relation's other side, not a column"
        return field

    def sql(self, since: datetime, until: datetime | None) -> str:
        """The JDBC query (a derived table): the columns, times as epoch seconds, the window."""
        meta = self._model()._meta
        select: list[str] = []
        for name, alias in self.columns:
            column = f'"{self._field(name).column}"'
            select.append(
                f"EXTRACT(EPOCH FROM {column})::float8 AS {alias}" if name in self.times else f"{column} AS {alias}"
            )
        window = f'"{self._field(self.window).column}"'
        where = [f"{window} >= to_timestamp({since.timestamp()!r})"]
        if until is not None:
            where.append(f"{window} < to_timestamp({until.timestamp()!r})")
        return f"(SELECT {', '.join(select)} FROM {meta.db_table} WHERE {' AND '.join(where)}) AS rows"


#: the attempt log, by when each attempt was recorded
ATTEMPTS = Source(
    "workers.AttemptLog",
    "recorded_at",
    (
        ("id", "id"),
        ("queue", "queue"),
        ("group", "group"),
        ("worker", "worker"),
        ("attempt", "attempt"),
        ("outcome", "outcome"),
        ("size", "size"),
        ("enqueued_at", "enqueued_at"),
        ("preprocess_started_at", "preprocess_started_at"),
        ("preprocess_ended_at", "preprocess_ended_at"),
        ("process_started_at", "process_started_at"),
        ("process_ended_at", "process_ended_at"),
        ("recorded_at", "recorded_at"),
    ),
    frozenset(
        {
            "enqueued_at",
            "preprocess_started_at",
            "preprocess_ended_at",
            "process_started_at",
            "process_ended_at",
            "recorded_at",
        }
    ),
    tf.ATTEMPT_SCHEMA,
)

#: archived messages, by when they were acknowledged (unacknowledged ones have no latency yet)
ARCHIVED = Source(
    "archive.ArchivedMessage",
    "acked_at",
    (("id", "id"), ("queue", "queue"), ("enqueued_at", "enqueued_at"), ("acked_at", "acked_at")),
    frozenset({"enqueued_at", "acked_at"}),
    tf.ARCHIVE_SCHEMA,
)


def _epoch(dt: datetime | None) -> float | None:
    return dt.timestamp() if dt is not None else None


def read(spark: SparkSession, source: Source, since: datetime, until: datetime | None = None) -> tuple[DataFrame, str]:
    """The rows of ``source`` in ``[since, until)`` as a frame of its schema, and how they were
    read (``"jdbc"`` or ``"django"``)."""
    if connection.vendor == "postgresql" and Path(settings.SPARK_JDBC_JAR).is_file():
        return _read_jdbc(spark, source, since, until), "jdbc"
    return _read_django(spark, source, since, until), "django"


def read_attempts(spark: SparkSession, since: datetime, until: datetime | None = None) -> tuple[DataFrame, str]:
    """The attempts recorded in ``[since, until)`` (:data:`transforms.ATTEMPT_SCHEMA`)."""
    return read(spark, ATTEMPTS, since, until)


def read_archived(spark: SparkSession, since: datetime, until: datetime | None = None) -> tuple[DataFrame, str]:
    """The archived messages acknowledged in ``[since, until)`` (:data:`transforms.ARCHIVE_SCHEMA`)."""
    return read(spark, ARCHIVED, since, until)


def _read_jdbc(spark: SparkSession, source: Source, since: datetime, until: datetime | None) -> DataFrame:
    from pyspark.sql import functions as F

    bounds = source.queryset(since, until).aggregate(low=Min("id"), high=Max("id"))
    if bounds["low"] is None:
        return spark.createDataFrame([], source.schema)
    s = connection.settings_dict
    url = f"jdbc:postgresql://{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    span = bounds["high"] - bounds["low"] + 1
    partitions = max(1, min(settings.SPARK_JDBC_PARTITIONS, math.ceil(span / ROWS_PER_JDBC_PARTITION)))
    frame = (
        spark.read.format("jdbc")
        .option("url", url)
        .option("driver", "org.postgresql.Driver")
        .option("user", s.get("USER") or "")
        .option("password", s.get("PASSWORD") or "")
        .option("dbtable", source.sql(since, until))
        .option("fetchsize", 20_000)
        .option("partitionColumn", "id")
        .option("lowerBound", bounds["low"])
        .option("upperBound", bounds["high"] + 1)
        .option("numPartitions", partitions)
        .load()
    )
    return frame.select(*[F.col(f.name).cast(f.dataType) for f in source.schema])


def _read_django(spark: SparkSession, source: Source, since: datetime, until: datetime | None) -> DataFrame:
    """Rows through Django, ``DJANGO_CHUNK`` at a time, each chunk its own frame, then one union:
    the Python rows of a chunk can go once Spark has them."""
    fields = source.attnames()
    is_time = [name in source.times for name, _ in source.columns]
    frames: list[DataFrame] = []
    chunk: list[tuple[Any, ...]] = []  # a row of the source's columns, as its schema has them
    for r in source.queryset(since, until).order_by().values_list(*fields).iterator(chunk_size=5000):
        chunk.append(tuple(_epoch(v) if t else v for v, t in zip(r, is_time)))
        if len(chunk) >= DJANGO_CHUNK:
            frames.append(spark.createDataFrame(chunk, source.schema))
            chunk = []
    if chunk or not frames:
        frames.append(spark.createDataFrame(chunk, source.schema))
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    return frame


# --- the run -------------------------------------------------------------------------------------
@dataclass
class Results:
    """The job's collected results (plain rows), between the Spark part and the write."""

    buckets: list[Row] = field(default_factory=list)
    workers: list[Row] = field(default_factory=list)
    groups: list[Row] = field(default_factory=list)
    fits: list[Row] = field(default_factory=list)
    latency: list[Row] = field(default_factory=list)


def compute(prepared: DataFrame, bucket_seconds: int, since: float, min_samples: int) -> Results:
    """Run the transforms on a prepared (and cached) frame and collect their small results."""
    samples = tf.regression_samples(prepared).cache()
    try:
        return Results(
            buckets=tf.queue_bucket_stats(prepared, bucket_seconds, since).collect(),
            workers=tf.worker_stats(prepared).collect(),
            groups=tf.group_stats(prepared).collect(),
            fits=tf.fit_size_regression(samples, min_samples).collect(),
        )
    finally:
        samples.unpersist()


def run(
    options: Options | None = None,
    *,
    trigger: str = "command",
    progress: Progress | None = None,
    spark: SparkSession | None = None,
) -> DashboardRun:
    """One refresh: read the window, compute, write. Returns the run record (also on failure,
    which is recorded and then raised)."""
    options = options or Options()
    options.validate()
    say = progress or (lambda step, steps, text: None)
    now = options.now or timezone.now()
    # The window starts on a bucket boundary, so its first bucket is whole (as far as the
    # attempt log still holds it).
    start = math.floor((now.timestamp() - options.window_seconds) / options.bucket_seconds) * options.bucket_seconds
    since = datetime.fromtimestamp(start, tz=UTC)
    master = settings.SPARK_MASTER if spark is None else spark.sparkContext.master or ""
    record = DashboardRun.objects.create(
        trigger=trigger, master=master, bucket_seconds=options.bucket_seconds, window_start=since
    )
    prepared = None
    try:
        say(1, STEPS, f"starting Spark ({master})")
        spark = spark or spark_session()
        say(2, STEPS, f"reading attempts recorded since {since:%Y-%m-%d %H:%M:%S} UTC")
        t0 = time.perf_counter()
        attempts, record.source = read_attempts(spark, since, options.now)
        prepared = tf.prepare(attempts, options.bucket_seconds).cache()
        record.attempts_read = prepared.count()
        record.read_seconds = time.perf_counter() - t0
        say(3, STEPS, f"computing figures of {record.attempts_read:,} attempts")
        t1 = time.perf_counter()
        results = compute(prepared, options.bucket_seconds, start, options.min_samples)
        record.transform_seconds = time.perf_counter() - t1
        say(4, STEPS, f"end-to-end latency of archived messages acknowledged since {since:%Y-%m-%d %H:%M:%S} UTC")
        t3 = time.perf_counter()
        archived, _ = read_archived(spark, since, options.now)
        archived = archived.cache()
        try:
            record.archived_read = archived.count()
            record.read_seconds += time.perf_counter() - t3
            t4 = time.perf_counter()
            results.latency = tf.latency_bucket_stats(archived, options.bucket_seconds, start).collect()
            record.transform_seconds += time.perf_counter() - t4
        finally:
            archived.unpersist()
        say(
            5,
            STEPS,
            f"writing {len(results.buckets):,} buckets, {len(results.workers):,} workers, "
            f"{len(results.groups):,} groups, {len(results.fits)} fits, "
            f"{len(results.latency):,} latency buckets",
        )
        t2 = time.perf_counter()
        write(record, results, options)
        record.write_seconds = time.perf_counter() - t2
        record.status = DashboardRun.Status.SUCCEEDED
    except BaseException as exc:
        record.status = DashboardRun.Status.FAILED
        record.error = f"{type(exc).__name__}: {exc}"[:10_000]
        raise
    finally:
        if prepared is not None:
            prepared.unpersist()
        record.finished_at = timezone.now()
        record.save()
    return record


# --- writing -------------------------------------------------------------------------------------
def _time(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def _ts(epoch: float | None) -> datetime | None:
    return _time(epoch) if epoch is not None else None


def _figures(row: Row) -> dict[str, float | None]:
    return {name: row[name] for name in tf.FIGURE_COLUMNS}


def write(record: DashboardRun, results: Results, options: Options) -> None:
    """Replace the window's buckets, the per-worker and per-group figures, record the fits and
    move the queues' default estimates to the learned values; then forget old history."""
    from queues import service
    from queues.access import SYSTEM
    from queues.service.rows import queue_fields
    from workers.models import Consumer

    bucket = options.bucket_seconds
    names = dict(Consumer.objects.filter(pk__in={w["worker"] for w in results.workers}).values_list("pk", "name"))
    with transaction.atomic():
        QueueBucketStats.objects.filter(bucket_seconds=bucket, bucket_start__gte=record.window_start).delete()
        QueueBucketStats.objects.bulk_create(
            [
                QueueBucketStats(
                    run=record,
                    queue=r["queue"],
                    bucket_seconds=bucket,
                    bucket_start=_time(r["bucket_start"]),
                    throughput=r["throughput"],
                    **_figures(r),
                )
                for r in results.buckets
            ],
            batch_size=1000,
        )
        LatencyBucketStats.objects.filter(bucket_seconds=bucket, bucket_start__gte=record.window_start).delete()
        LatencyBucketStats.objects.bulk_create(
            [
                LatencyBucketStats(
                    run=record,
                    queue=r["queue"],
                    bucket_seconds=bucket,
                    bucket_start=_time(r["bucket_start"]),
                    **{name: r[name] for name in tf.LATENCY_COLUMNS},
                )
                for r in results.latency
            ],
            batch_size=1000,
        )
        WorkerStats.objects.exclude(run=record).delete()
        WorkerStats.objects.bulk_create(
            [
                WorkerStats(
                    run=record,
                    queue=r["queue"],
                    worker=r["worker"],
                    worker_name=names.get(r["worker"], ""),
                    busy_seconds=r["busy_seconds"],
                    first_seen=_ts(r["first_bucket"]),
                    last_seen=_ts(r["last_bucket"] + bucket if r["last_bucket"] is not None else None),
                    **_figures(r),
                )
                for r in results.workers
            ],
            batch_size=1000,
        )
        GroupStats.objects.exclude(run=record).delete()
        GroupStats.objects.bulk_create(
            [GroupStats(run=record, queue=r["queue"], group=r["group"], **_figures(r)) for r in results.groups],
            batch_size=1000,
        )
        fits: list[EstimateFit] = []
        for r in results.fits:
            column = f"{r['stage']}_estimate"
            estimate = round(r["estimate"], 6)
            if options.apply_estimates:
                # Through the service, as the service's own work: the same check and the same
                # row lock as any change of the queue's settings.
                previous = service.learn_estimate(r["queue"], r["stage"], estimate, caller=SYSTEM)
            else:
                found = queue_fields(r["queue"], column)
                previous = None if found is None else found[0]
            applied = previous is not None and options.apply_estimates
            fits.append(
                EstimateFit(
                    run=record,
                    queue=r["queue"],
                    stage=r["stage"],
                    n=r["n"],
                    intercept=r["intercept"],
                    slope=r["slope"],
                    r2=r["r2"],
                    rmse=r["rmse"],
                    median_size=r["median_size"],
                    estimate=estimate,
                    previous=previous,
                    applied=applied,
                    created_at=record.started_at,
                )
            )
        EstimateFit.objects.bulk_create(fits)
        record.queues = len({r["queue"] for r in [*results.buckets, *results.latency]})
        record.fits = len(fits)
        horizon = timezone.now() - timedelta(days=settings.DASHBOARDS_HISTORY_DAYS)
        QueueBucketStats.objects.filter(bucket_start__lt=horizon).delete()
        LatencyBucketStats.objects.filter(bucket_start__lt=horizon).delete()
        DashboardRun.objects.filter(started_at__lt=horizon).exclude(pk=record.pk).delete()
