"""What the dashboards' Spark job writes and the admin reads.

The job recomputes the figures of a window of the attempt log (``DASHBOARDS_WINDOW``) at each
run: per-bucket rows in that window are replaced, older ones are kept, so the charts reach
back further than the attempt log does. End-to-end latency comes from the archive (messages
acknowledged in the window), per bucket too. Per-worker and per-group figures describe the last
run's window only. Learned estimates are a history: one row per queue, stage and run.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class DashboardRun(models.Model):
    """One run of the dashboards job: when, over what, how long each phase took, and how it ended."""

    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    started_at = models.DateTimeField(default=timezone.now, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    trigger = models.CharField(max_length=32, blank=True, help_text="command, beat, ...")
    master = models.CharField(max_length=200, blank=True, help_text="the Spark master it ran on")
    source = models.CharField(max_length=16, blank=True, help_text="how the attempt log was read: jdbc or django")
    bucket_seconds = models.PositiveIntegerField()
    window_start = models.DateTimeField(help_text="attempts recorded since this time were read")
    attempts_read = models.BigIntegerField(default=0)
    archived_read = models.BigIntegerField(default=0, help_text="acknowledged archived messages read (latency)")
    queues = models.PositiveIntegerField(default=0)
    fits = models.PositiveIntegerField(default=0, help_text="regressions fitted (queue x stage)")
    read_seconds = models.FloatField(null=True, blank=True)
    transform_seconds = models.FloatField(null=True, blank=True)
    write_seconds = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        #: the console's dashboards page: its own permission (being staff is not enough), and then
        #: it shows the queues the user may read.
        permissions = [("view_dashboards", "Can view the dashboards page")]

    def __str__(self) -> str:
        return f"run {self.pk} {self.status} at {self.started_at:%Y-%m-%d %H:%M:%S}"

    @property
    def total_seconds(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


class Figures(models.Model):
    """Counts, rates and percentiles (seconds) of a set of attempts; null when nothing was measured."""

    attempts = models.BigIntegerField()
    succeeded = models.BigIntegerField()
    failed = models.BigIntegerField()
    timed_out = models.BigIntegerField()
    abandoned = models.BigIntegerField()
    retries = models.BigIntegerField(help_text="attempts after the first of their message")
    failure_rate = models.FloatField(help_text="(failed + timed out) / attempts")
    retry_rate = models.FloatField(help_text="retries / attempts")
    wait_p50 = models.FloatField(null=True, blank=True)
    wait_p95 = models.FloatField(null=True, blank=True)
    wait_p99 = models.FloatField(null=True, blank=True)
    preprocess_p50 = models.FloatField(null=True, blank=True)
    preprocess_p95 = models.FloatField(null=True, blank=True)
    preprocess_p99 = models.FloatField(null=True, blank=True)
    process_p50 = models.FloatField(null=True, blank=True)
    process_p95 = models.FloatField(null=True, blank=True)
    process_p99 = models.FloatField(null=True, blank=True)

    class Meta:
        abstract = True


class Bucket(models.Model):
    """A queue's row for one time bucket; the run that wrote it last (kept when runs go)."""

    run = models.ForeignKey(DashboardRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    queue = models.CharField(max_length=80)
    bucket_seconds = models.PositiveIntegerField()
    bucket_start = models.DateTimeField()

    class Meta:
        abstract = True


class QueueBucketStats(Figures, Bucket):
    """A queue's figures in one time bucket (attempts that finished in it)."""

    throughput = models.FloatField(help_text="succeeded attempts per second")

    class Meta:
        ordering = ["queue", "bucket_start"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "bucket_seconds", "bucket_start"], name="queue_bucket_unique")
        ]
        indexes = [models.Index(fields=["bucket_seconds", "bucket_start"], name="bucket_time")]
        verbose_name_plural = "queue bucket stats"

    def __str__(self) -> str:
        return f"{self.queue} @ {self.bucket_start:%Y-%m-%d %H:%M:%S}"


class LatencyBucketStats(Bucket):
    """A queue's (or topic's) end-to-end latency in one time bucket: messages acknowledged in it,
    and percentiles of enqueue-to-ack seconds, read from the archive (queues that archive)."""

    acked = models.BigIntegerField()
    latency_p50 = models.FloatField(null=True, blank=True)
    latency_p95 = models.FloatField(null=True, blank=True)
    latency_p99 = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["queue", "bucket_start"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "bucket_seconds", "bucket_start"], name="latency_bucket_unique")
        ]
        indexes = [models.Index(fields=["bucket_seconds", "bucket_start"], name="latency_bucket_time")]
        verbose_name_plural = "latency bucket stats"

    def __str__(self) -> str:
        return f"{self.queue} @ {self.bucket_start:%Y-%m-%d %H:%M:%S}"


class WorkerStats(Figures):
    """A worker's figures on one queue over the run's window."""

    run = models.ForeignKey(DashboardRun, on_delete=models.CASCADE, related_name="worker_stats")
    queue = models.CharField(max_length=80)
    worker = models.CharField(max_length=64, help_text="the consumer's ID")
    worker_name = models.CharField(max_length=200, blank=True)
    busy_seconds = models.FloatField(help_text="pre-processing plus processing time")
    first_seen = models.DateTimeField(null=True, blank=True)
    last_seen = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["queue", "-attempts"]
        verbose_name_plural = "worker stats"

    def __str__(self) -> str:
        return f"{self.queue}: {self.worker_name or self.worker}"


class GroupStats(Figures):
    """A message group's figures on one queue over the run's window."""

    run = models.ForeignKey(DashboardRun, on_delete=models.CASCADE, related_name="group_stats")
    queue = models.CharField(max_length=80)
    group = models.CharField(max_length=128)

    class Meta:
        ordering = ["queue", "-attempts"]
        verbose_name_plural = "group stats"

    def __str__(self) -> str:
        return f"{self.queue}: {self.group}"


class EstimateFit(models.Model):
    """One regression of a stage's time on the message ``size`` for one queue, and what became
    of the queue's default estimate."""

    class Stage(models.TextChoices):
        PREPROCESS = "preprocess"
        PROCESS = "process"

    run = models.ForeignKey(DashboardRun, on_delete=models.CASCADE, related_name="estimate_fits")
    queue = models.CharField(max_length=80)
    stage = models.CharField(max_length=16, choices=Stage.choices)
    n = models.BigIntegerField(help_text="samples: succeeded attempts that declared a size")
    intercept = models.FloatField(help_text="seconds")
    slope = models.FloatField(help_text="seconds per unit of size")
    r2 = models.FloatField(null=True, blank=True)
    rmse = models.FloatField(null=True, blank=True, help_text="seconds")
    median_size = models.FloatField()
    estimate = models.FloatField(help_text="the line at the median size, clamped to 0..24 h: the learned default")
    previous = models.FloatField(null=True, blank=True, help_text="the queue's default before this run")
    applied = models.BooleanField(default=False, help_text="written to the queue (false: the queue is gone)")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "queue", "stage"]

    def __str__(self) -> str:
        return f"{self.queue} {self.stage} {self.estimate:.3f}s (n={self.n})"
