"""The dashboards end to end, on PostgreSQL + Redis: traffic through a real node and a worker
pipeline, then ``refresh_dashboards`` (Spark reading the attempt log over JDBC), then the admin.

The job reads only committed rows (JDBC has its own connection), so these tests commit
(``transaction=True``). One SparkSession serves the whole test process.
"""

from __future__ import annotations

import io
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from pyspark.testing import assertDataFrameEqual

from archive import archiver
from archive.models import ArchivedMessage
from consoles.charts import format_value
from consoles.models import DashboardRun, EstimateFit, LatencyBucketStats, QueueBucketStats, WorkerStats
from mq_client import Client, NewMessage
from queues.kv.redis import RedisStore
from queues.models import Queue
from tests.launcher import wait_until
from workers.handlers import Handler
from workers.models import AttemptLog
from workers.pipeline import Pipeline

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: processing takes BASE + PER_UNIT * size seconds: the slope the regression must find
BASE, PER_UNIT = 0.004, 0.001
PRE_PER_UNIT = 0.0002
MESSAGES = 60


def _handler(queue: str, failed_once: set[str]) -> Handler:
    """Time grows with ``size``; a message with ``{"flaky": true}`` fails its first delivery."""

    def preprocess(message):
        time.sleep(PRE_PER_UNIT * message.size)
        return message.size

    def process(message, prepared):
        assert prepared == message.size
        if (message.attributes or {}).get("flaky") and message.receive_count == 1:
            failed_once.add(message.id)
            raise RuntimeError("flaky on first delivery")
        time.sleep(BASE + PER_UNIT * message.size)

    return Handler(queue, process, preprocess)


def _median_process(attempts, bucket) -> float:
    """The lower median of the processing time of ``attempts`` that finished in ``bucket``."""
    start = bucket.bucket_start
    end = start + timedelta(seconds=bucket.bucket_seconds)
    durations = sorted(
        (a.process_ended_at - a.process_started_at).total_seconds()
        for a in attempts
        if a.process_ended_at and a.process_started_at and start <= a.process_ended_at < end
    )
    assert durations, "the busiest bucket holds processed attempts"
    return durations[(len(durations) - 1) // 2]


def test_traffic_then_refresh_shows_figures_and_learns_estimates(
    node, token, unique_name, admin_client, spark, redis_client
):
    # given a queue with default estimates (0 s) and 60 messages of sizes 1..60 (3 of them flaky),
    # processed by a worker pipeline through a real node
    queue = unique_name("dash")
    client = Client(node.url, token)
    client.create_queue(queue, partitions=2, archive="all")
    wait_until(lambda: all(p.owner for p in client.partitions(queue)), 20, "the node to own the partitions")
    client.enqueue_many(
        queue,
        [
            NewMessage(f"m{k}", size=k, group=f"g{k % 3}", attributes={"flaky": True} if k in (10, 30, 50) else None)
            for k in range(1, MESSAGES + 1)
        ],
    )
    failed_once: set[str] = set()
    pipeline = Pipeline(
        client,
        {queue: _handler(queue, failed_once)},
        concurrency=2,
        visibility_timeout=30,
        heartbeat_every=1.0,
        wait=0.5,
        retry_backoff=1.0,
        name="dash-worker",
    ).start()
    try:
        wait_until(
            lambda: AttemptLog.objects.filter(queue=queue, outcome="succeeded").count() == MESSAGES,
            60,
            "every message processed and logged",
        )
    finally:
        pipeline.stop()
    assert len(failed_once) == 3
    # every attempt the service logged (a worker's report, or "abandoned" when it found a
    # visibility run out before the report came in), as the figures must count them
    logged = AttemptLog.objects.filter(queue=queue)
    total = logged.count()
    assert total >= MESSAGES + 3 and logged.filter(outcome="failed").count() == 3
    assert Queue.objects.get(name=queue).process_estimate == 0.0
    # and the archiver copied the queue's journal (every message, its ack time)
    archiver.run(queue, store=RedisStore(redis_client).within(settings.KV_PREFIX))
    assert ArchivedMessage.objects.filter(queue=queue, acked_at__isnull=False).count() == MESSAGES

    # when the dashboards are refreshed
    out = io.StringIO()
    call_command("refresh_dashboards", "--bucket", "60", stdout=out)

    # then the run read the attempts over JDBC and computed the queue's figures
    run = DashboardRun.objects.get()
    assert run.status == "succeeded" and run.source == "jdbc" and run.attempts_read == total, out.getvalue()
    assert "5/5" in out.getvalue() and "Done in" in out.getvalue()
    buckets = list(QueueBucketStats.objects.filter(queue=queue))
    assert sum(b.attempts for b in buckets) == total
    assert sum(b.succeeded for b in buckets) == MESSAGES
    assert sum(b.failed for b in buckets) == 3 and sum(b.retries for b in buckets) == 3
    busiest = max(buckets, key=lambda b: b.attempts)
    assert busiest.failure_rate == pytest.approx(busiest.failed / busiest.attempts)
    # the bucket's median processing time is the median of the attempts that finished in it (a
    # run that straddles a minute splits the sizes between two buckets, so no fixed bound holds);
    # percentile_approx answers the lower median, an element of the data
    assert busiest.process_p50 == pytest.approx(_median_process(logged, busiest), abs=1e-3)
    assert BASE <= busiest.process_p50 < 0.09 and busiest.process_p50 <= busiest.process_p95 <= busiest.process_p99
    assert busiest.wait_p50 is not None and busiest.wait_p50 >= 0
    # and the end-to-end latency of every message, from the archive
    assert run.archived_read >= MESSAGES
    latency = list(LatencyBucketStats.objects.filter(queue=queue))
    assert sum(b.acked for b in latency) == MESSAGES
    slowest = max(latency, key=lambda b: b.acked)
    assert 0 < slowest.latency_p50 <= slowest.latency_p95 <= slowest.latency_p99 < 60
    worker = WorkerStats.objects.get(queue=queue)
    assert (
        worker.worker == pipeline.consumer_id
        and worker.attempts == logged.filter(worker_id=pipeline.consumer_id).count()
        and worker.succeeded == MESSAGES
    )

    # and the regression found the slope and moved the queue's defaults to the time at the median size
    fit = EstimateFit.objects.get(queue=queue, stage="process")
    assert fit.n == MESSAGES and fit.median_size == 30 and fit.applied and fit.previous == 0.0
    assert fit.slope == pytest.approx(PER_UNIT, rel=0.25) and fit.r2 > 0.8
    learned = Queue.objects.get(name=queue)
    assert learned.process_estimate == pytest.approx(fit.estimate)
    assert 0.025 < learned.process_estimate < 0.09
    assert (
        learned.preprocess_estimate == pytest.approx(EstimateFit.objects.get(queue=queue, stage="preprocess").estimate)
        and learned.preprocess_estimate > 0
    )

    # and the admin's dashboards page shows the charts, the figures and the learned estimates
    page = admin_client.get("/admin/dashboards/", {"queue": queue})
    html = page.content.decode()
    assert page.status_code == 200
    assert html.count('<svg class="chart"') >= 7 and "<circle" in html
    assert "End-to-end latency" in html and 'id="latency"' in html
    assert f"<td>{slowest.acked}</td>" in html and format_value(slowest.latency_p50, "s") in html
    assert f">{queue}</a></td><td>{total}</td><td>{MESSAGES}</td>" in html
    assert 'id="estimates"' in html and format_value(learned.process_estimate, "s") in html
    assert "dash-worker" in html and 'id="groups"' in html and "<td>g0</td>" in html
    assert "/admin/dashboards/" in admin_client.get("/admin/").content.decode()

    # and the node attaches the learned estimates to new messages that bring none
    def learned_on_new_message() -> bool:
        client.enqueue(queue, "after", size=5)
        got = client.dequeue(queue, 10, visibility_timeout=30)
        if got:
            client.ack(queue, got)
        return any(m.estimates.process == pytest.approx(learned.process_estimate) for m in got)

    wait_until(learned_on_new_message, 10, "the node to attach the learned estimates")
    client.close()


def _log_rows(queue: str) -> list[AttemptLog]:
    t = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)
    rows = []
    for k in range(6):
        start = t + timedelta(seconds=10 * k, microseconds=123_456)
        rows.append(
            AttemptLog(
                message_id=f"{queue}/0/00000000-abcdef/{k}",
                queue=queue,
                partition=0,
                group="g" if k % 2 else "",
                worker_id=None if k == 5 else "w-1",
                attempt=1 + (k == 4),
                size=None if k == 3 else 100 * k,
                enqueued_at=None if k == 2 else start - timedelta(seconds=1.5),
                preprocess_started_at=start - timedelta(seconds=1),
                preprocess_ended_at=start - timedelta(seconds=0.75),
                process_started_at=start,
                process_ended_at=start + timedelta(seconds=k / 4),
                outcome="failed" if k == 1 else "succeeded",
            )
        )
    return rows


def _read_both_ways(read, spark, since, settings, queue: str):
    """``read`` over JDBC (PostgreSQL) and through Django (the embedded default's path): the
    two frames, restricted to ``queue``, after checking each reader was the one used."""
    jdbc, how = read(spark, since)
    assert how == "jdbc"
    settings.SPARK_JDBC_JAR = "/nonexistent/postgresql.jar"
    rows, how = read(spark, since)
    assert how == "django"
    mine = f"queue = '{queue}'"
    return jdbc.where(mine), rows.where(mine)


def test_jdbc_and_django_readers_agree(spark, unique_name, settings):
    # given attempt records with and without sizes, groups, workers and enqueue times
    from consoles.spark import job

    queue = unique_name("read")
    AttemptLog.objects.bulk_create(_log_rows(queue))
    since = datetime(2000, 1, 1, tzinfo=UTC)
    # when the log is read over JDBC (PostgreSQL) and through Django (the embedded default's path)
    jdbc, rows = _read_both_ways(job.read_attempts, spark, since, settings, queue)
    # then both give the same frame, times as epoch seconds to the microsecond
    assertDataFrameEqual(jdbc, rows, atol=1e-6)
    first = rows.orderBy("id").first()
    assert first.process_started_at == pytest.approx(datetime(2026, 1, 5, 12, 0, 0, 123_456, tzinfo=UTC).timestamp())
    assert first.enqueued_at == pytest.approx(first.process_started_at - 1.5)


def test_jdbc_and_django_read_the_archive_alike(spark, unique_name, settings):
    # given archived messages, four acknowledged (one before the window) and two not
    from consoles.spark import job

    queue = unique_name("arch")
    t = datetime(2026, 1, 5, 12, 0, 0, 250_000, tzinfo=UTC)
    ArchivedMessage.objects.bulk_create(
        [
            ArchivedMessage(
                message_id=f"{queue}/0/00000000-abcdef0123456789/{k}",
                queue=queue,
                partition=0,
                body=f"m{k}",
                enqueued_at=t + timedelta(seconds=k),
                acked_at=None if k >= 4 else t + timedelta(seconds=k + 0.5 * k, days=-30 if k == 0 else 0),
            )
            for k in range(6)
        ]
    )
    since = datetime(2026, 1, 1, tzinfo=UTC)
    # when the archive is read over JDBC and through Django
    jdbc, rows = _read_both_ways(job.read_archived, spark, since, settings, queue)
    # then both hold the three acknowledged in the window, times as epoch seconds
    assertDataFrameEqual(jdbc, rows, atol=1e-6)
    got = sorted((r.enqueued_at, r.acked_at) for r in rows.collect())
    assert got == [
        ((t + timedelta(seconds=k)).timestamp(), (t + timedelta(seconds=1.5 * k)).timestamp()) for k in (1, 2, 3)
    ]


def test_bad_options_are_refused_before_anything_runs():
    for args, text in (
        (["--bucket", "0"], "at least 1"),
        (["--bucket", "x"], "whole number"),
        (["--bucket", "120", "--window", "60"], "at least one bucket"),
        (["--min-samples", "1"], "at least 2"),
    ):
        with pytest.raises(CommandError, match=text):
            call_command("refresh_dashboards", *args, stdout=io.StringIO())
    assert not DashboardRun.objects.exists()


def test_beat_task_steps_aside_while_a_run_is_in_progress(settings):
    from consoles.tasks import refresh_dashboards

    assert settings.CELERY_BEAT_SCHEDULE["dashboards"]["task"] == "consoles.refresh_dashboards"
    DashboardRun.objects.create(bucket_seconds=60, window_start=datetime(2026, 1, 1, tzinfo=UTC))
    assert refresh_dashboards.run() is None
    assert DashboardRun.objects.count() == 1


def test_a_failed_run_is_recorded_and_shown(admin_client, monkeypatch, spark):
    from consoles.spark import job

    def broken(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(job, "read_attempts", broken)
    with pytest.raises(CommandError, match="database went away"):
        call_command("refresh_dashboards", stdout=io.StringIO())
    run = DashboardRun.objects.get()
    assert run.status == "failed" and "database went away" in run.error and run.finished_at is not None
    html = admin_client.get("/admin/dashboards/").content.decode()
    assert "failed" in html and "database went away" in html
