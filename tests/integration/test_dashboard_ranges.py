"""The dashboards' ranges (last hour, day, week) and the whole cluster's figures, from rows of the
job's tables written here (no Spark run): the job's minute buckets summed into buckets that give
a chart tens of points, and every readable queue's figures added up."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from consoles.models import DashboardRun, QueueBucketStats
from consoles.views import regroup
from queues.models import Queue

pytestmark = pytest.mark.django_db


def _minutes(queue: str, start, count: int) -> list[QueueBucketStats]:
    return [
        QueueBucketStats(
            queue=queue,
            bucket_seconds=60,
            bucket_start=start + timedelta(minutes=k),
            attempts=10,
            succeeded=9,
            failed=1,
            timed_out=0,
            abandoned=0,
            retries=1,
            failure_rate=0.1,
            retry_rate=0.1,
            throughput=9 / 60,
            wait_p50=float(k % 3),
            wait_p95=float(k % 7),
            wait_p99=float(k % 11),
        )
        for k in range(count)
    ]


def test_regroup_adds_counts_and_bounds_percentiles():
    start = timezone.now().replace(minute=0, second=0, microsecond=0)
    rows = _minutes("q", start, 30)
    (one,) = regroup(rows, 1800, ("attempts", "succeeded"), "attempts", ("wait_p50", "wait_p99"))
    assert one.bucket_start == start and one.attempts == 300 and one.succeeded == 270
    assert one.wait_p50 == pytest.approx(sum(k % 3 for k in range(30)) / 30)  # equal weights: the mean
    assert one.wait_p99 == 10.0  # the highest of the minutes'


def test_ranges_and_all_queues(admin_client):
    now = timezone.now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    for name in ("ranges-a", "ranges-b"):
        Queue.objects.create(name=name)
        # two hours of minutes up to now, and an hour three days ago (in the week, not the day)
        QueueBucketStats.objects.bulk_create(
            _minutes(name, hour - timedelta(hours=2), 120 + now.minute) + _minutes(name, hour - timedelta(days=3), 60)
        )
    DashboardRun.objects.create(
        status=DashboardRun.Status.SUCCEEDED, trigger="test", master="local[1]", source="django",
        bucket_seconds=60, window_start=hour - timedelta(days=7), finished_at=now,
    )  # fmt: skip

    def page(**query) -> str:
        r = admin_client.get("/admin/dashboards/", query)
        assert r.status_code == 200, r.content[:500]
        return r.content.decode()

    def buckets(html: str) -> list[list[str]]:
        body = html.split('id="buckets"', 1)[1].split("</table>", 1)[0]
        return [re.findall(r"<td>([^<]*)</td>", row)[:3] for row in body.split("<tr>")[3:]]

    # the last hour of one queue: the job's own minutes
    html = page(queue="ranges-a", range="hour")
    assert "60 s buckets" in html
    assert all(row[1:] == ["10", "9"] for row in buckets(html)), buckets(html)
    # the last day, every queue: half hours of both queues' minutes (a whole one: 2 x 30 x 10)
    html = page(queue="*", range="day")
    assert "1800 s buckets" in html and "All queues" in html and "added up" in html
    counts = [int(row[1]) for row in buckets(html)]
    assert max(counts) == 600 and len(counts) >= 4, counts
    # the last week: four-hour buckets, the day three days ago among them
    html = page(queue="*", range="week")
    assert "14400 s buckets" in html
    assert len(buckets(html)) >= 2
    # an unknown range is the default one
    assert "60 s buckets" in page(queue="ranges-b", range="year")


def test_a_week_of_minutes_shows_the_whole_week_newest_first(admin_client):
    # given one queue with a job bucket for every minute of the last week (10,080 of them)
    now = timezone.now()
    Queue.objects.create(name="ranges-week")
    QueueBucketStats.objects.bulk_create(
        _minutes("ranges-week", now - timedelta(days=7) + timedelta(minutes=1), 7 * 1440)
    )
    DashboardRun.objects.create(
        status=DashboardRun.Status.SUCCEEDED, trigger="test", master="local[1]", source="django",
        bucket_seconds=60, window_start=now - timedelta(days=7), finished_at=now,
    )  # fmt: skip
    # when the last week is shown
    r = admin_client.get("/admin/dashboards/", {"queue": "ranges-week", "range": "week"})
    assert r.status_code == 200
    body = r.content.decode().split('id="buckets"', 1)[1].split("</table>", 1)[0]
    counts = [int(row[1]) for row in (re.findall(r"<td>([^<]*)</td>", x)[:3] for x in body.split("<tr>")[3:])]
    # then the table lists its newest 30 four-hour buckets, each of 240 minutes of 10 attempts
    # (not the week's first day only, which is what a cut at a day's worth of rows would keep)
    assert len(counts) == 30, counts
    assert sum(c == 2400 for c in counts) >= 28, counts
