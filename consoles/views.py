"""The admin's dashboards page: the Spark job's figures over time, per queue.

Everything on it is read from the tables the job writes (and the queues' current estimates
from the ``Queue`` rows); nothing is computed here beyond sums for the overview. The charts
are SVG rendered on the server (:mod:`consoles.charts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypedDict

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Max, Sum
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.safestring import SafeString

from consoles.charts import Series, format_value, line_chart
from consoles.models import (
    Bucket,
    DashboardRun,
    EstimateFit,
    GroupStats,
    LatencyBucketStats,
    QueueBucketStats,
    WorkerStats,
)
from queues import service
from queues.access import Caller

#: the job's buckets read for one queue's chart at most (a week of 60 s buckets); the newest
#: are kept when a range holds more
MAX_JOB_BUCKETS = 7 * 1440
#: buckets listed in the table
TABLE_BUCKETS = 30
TABLE_GROUPS = 25

#: The ranges an operator may choose: (label, seconds shown, bucket seconds), so that a chart has
#: tens of points whatever the range. The job's own buckets (60 s by default) are summed into
#: these; a range whose bucket is not above the job's shows the job's buckets as they are.
RANGES = {
    "hour": ("last hour", 3600, 60),
    "day": ("last day", 86400, 1800),
    "week": ("last week", 7 * 86400, 4 * 3600),
}
DEFAULT_RANGE = "hour"
#: ``?queue=`` for the figures of every queue the user may read, added up (the whole cluster).
ALL_QUEUES = "*"

_FAVICON = Path(__file__).parent / "static" / "consoles" / "favicon.ico"

#: A bucket's figures as the charts and the table read them: the job's row, or several of the
#: job's rows summed into a range's bucket (:func:`regroup`, with the same attributes).
FigureRow = QueueBucketStats | SimpleNamespace
#: A bucket's end-to-end latency, likewise.
LatencyRow = LatencyBucketStats | SimpleNamespace


class OverviewRow(TypedDict):
    """A queue's line of the page's overview: its totals over the job's window."""

    queue: str
    attempts: int
    succeeded: int
    failed: int
    timed_out: int
    retries: int
    last: datetime
    failure_rate: float | None
    retry_rate: float | None
    preprocess_estimate: float
    process_estimate: float
    failure_text: str
    retry_text: str


def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which browsers ask every origin for: the console's icon (the pages link
    the same file under ``/static/``)."""
    return HttpResponse(_FAVICON.read_bytes(), content_type="image/x-icon", headers={"Cache-Control": "max-age=86400"})


def _epoch(dt: datetime) -> float:
    return dt.timestamp()


def _percentile_series(rows: Sequence[FigureRow | LatencyRow], measure: str) -> list[Series]:
    return [
        Series(f"p{p}", [(_epoch(r.bucket_start), getattr(r, f"{measure}_p{p}")) for r in rows]) for p in (50, 95, 99)
    ]


def _charts(rows: Sequence[FigureRow], fits: Sequence[EstimateFit], latency: Sequence[LatencyRow]) -> list[SafeString]:
    by_stage: dict[str, list[tuple[float, float | None]]] = {"preprocess": [], "process": []}
    for f in fits:
        by_stage[f.stage].append((_epoch(f.created_at), f.estimate))
    return [
        line_chart(
            "Throughput (succeeded / s)",
            [Series("succeeded/s", [(_epoch(r.bucket_start), r.throughput) for r in rows])],
            unit="/s",
        ),
        line_chart(
            "End-to-end latency (enqueue to ack, from the archive)", _percentile_series(latency, "latency"), unit="s"
        ),
        line_chart("Wait time (enqueue to processing)", _percentile_series(rows, "wait"), unit="s"),
        line_chart("Processing time", _percentile_series(rows, "process"), unit="s"),
        line_chart("Pre-processing time", _percentile_series(rows, "preprocess"), unit="s"),
        line_chart(
            "Failure and retry rates",
            [
                Series("failures", [(_epoch(r.bucket_start), r.failure_rate) for r in rows]),
                Series("retries", [(_epoch(r.bucket_start), r.retry_rate) for r in rows]),
            ],
            unit="%",
        ),
        line_chart(
            "Learned estimates (per run)",
            [Series("pre-process", by_stage["preprocess"]), Series("process", by_stage["process"])],
            unit="s",
        ),
    ]


def _weighted(rows: Sequence[Bucket], field: str, weight: str) -> float | None:
    known: list[tuple[float, float]] = [
        (getattr(r, field), getattr(r, weight)) for r in rows if getattr(r, field) is not None
    ]
    total = sum(w for _, w in known)
    if not known:
        return None
    if total == 0:
        return sum(v for v, _ in known) / len(known)
    return sum(v * w for v, w in known) / total


def _highest(rows: Sequence[Bucket], field: str) -> float | None:
    known: list[float] = [getattr(r, field) for r in rows if getattr(r, field) is not None]
    return max(known) if known else None


def regroup(
    rows: Sequence[Bucket], seconds: int, counts: tuple[str, ...], weight: str, percentiles: tuple[str, ...]
) -> list[SimpleNamespace]:
    """The job's buckets (of one queue or of several) summed into buckets of ``seconds``: counts
    added up; a p50 is the mean of the buckets' p50 weighted by ``weight``, a p95 or p99 the
    highest of theirs (an upper bound: percentiles cannot be added up exactly)."""
    groups: dict[float, list[Bucket]] = {}
    for r in rows:
        start = r.bucket_start.timestamp()
        groups.setdefault(start - start % seconds, []).append(r)
    out = []
    for start in sorted(groups):
        members = groups[start]
        row = SimpleNamespace(bucket_start=datetime.fromtimestamp(start, tz=UTC), bucket_seconds=seconds)
        for c in counts:
            setattr(row, c, sum(getattr(m, c) for m in members))
        for name in percentiles:
            setattr(row, name, _weighted(members, name, weight) if name.endswith("p50") else _highest(members, name))
        out.append(row)
    return out


_FIGURE_COUNTS = ("attempts", "succeeded", "failed", "timed_out", "abandoned", "retries")
_FIGURE_PERCENTILES = tuple(f"{m}_p{p}" for m in ("wait", "preprocess", "process") for p in (50, 95, 99))


def _bucket_rows(
    queues: list[str], job_bucket: int, since: datetime, seconds: int
) -> tuple[Sequence[FigureRow], Sequence[LatencyRow]]:
    """The figures and latency rows of ``queues`` since ``since``, in buckets of ``seconds``
    (the job's own rows when that is its bucket and one queue is shown)."""
    # Every job bucket of the range, the newest kept if there are more (a week of 60 s buckets
    # is 10,080 a queue, summed below into the range's own buckets).
    per_queue = min(MAX_JOB_BUCKETS, int((timezone.now() - since).total_seconds() // max(1, job_bucket)) + 1)
    cap = per_queue * max(1, len(queues))
    rows = list(
        QueueBucketStats.objects.filter(queue__in=queues, bucket_seconds=job_bucket, bucket_start__gte=since).order_by(
            "-bucket_start"
        )[:cap]
    )[::-1]
    latency = list(
        LatencyBucketStats.objects.filter(
            queue__in=queues, bucket_seconds=job_bucket, bucket_start__gte=since
        ).order_by("-bucket_start")[:cap]
    )[::-1]
    if seconds <= job_bucket and len(queues) == 1:
        return rows, latency
    seconds = max(seconds, job_bucket)
    summed = regroup(rows, seconds, _FIGURE_COUNTS, "attempts", _FIGURE_PERCENTILES)
    for r in summed:
        r.throughput = r.succeeded / seconds
        r.failure_rate = (r.failed + r.timed_out) / r.attempts if r.attempts else 0.0
        r.retry_rate = r.retries / r.attempts if r.attempts else 0.0
    return summed, regroup(latency, seconds, ("acked",), "acked", ("latency_p50", "latency_p95", "latency_p99"))


def dashboards(request: HttpRequest, site: admin.AdminSite) -> TemplateResponse:
    """The page, for a user with ``consoles.view_dashboards``, with the figures of the queues it
    may read and that exist now (a queue deleted since, over the API or SQS, is not listed: its
    figures stay in the job's tables, under a name a new queue may take)."""
    if not request.user.has_perm("consoles.view_dashboards"):
        raise PermissionDenied
    caller = Caller.of(request.user)
    last_run = DashboardRun.objects.first()
    last_ok = DashboardRun.objects.filter(status=DashboardRun.Status.SUCCEEDED).first()
    bucket = last_ok.bucket_seconds if last_ok else None

    estimates = {
        q["name"]: q for q in service.permitted_queues(caller).values("name", "preprocess_estimate", "process_estimate")
    }
    overview: list[OverviewRow] = []
    if last_ok:
        totals = (
            service.only_permitted(QueueBucketStats.objects.all(), caller, name="queue")
            .filter(bucket_seconds=last_ok.bucket_seconds, bucket_start__gte=last_ok.window_start)
            .values("queue")
            .annotate(
                attempts=Sum("attempts"),
                succeeded=Sum("succeeded"),
                failed=Sum("failed"),
                timed_out=Sum("timed_out"),
                retries=Sum("retries"),
                last=Max("bucket_start"),
            )
            .order_by("-attempts", "queue")
        )
        for t in totals:
            q = estimates.get(t["queue"])
            if q is None:
                continue
            failure_rate = (t["failed"] + t["timed_out"]) / t["attempts"] if t["attempts"] else None
            retry_rate = t["retries"] / t["attempts"] if t["attempts"] else None
            overview.append(
                {
                    **t,
                    "failure_rate": failure_rate,
                    "retry_rate": retry_rate,
                    "preprocess_estimate": q["preprocess_estimate"],
                    "process_estimate": q["process_estimate"],
                    "failure_text": format_value(failure_rate, "%"),
                    "retry_text": format_value(retry_rate, "%"),
                }
            )

    names = sorted(estimates)
    selected = request.GET.get("queue") or (overview[0]["queue"] if overview else (names[0] if names else None))
    chosen = request.GET.get("range") or DEFAULT_RANGE
    if chosen not in RANGES:
        chosen = DEFAULT_RANGE
    range_label, range_seconds, range_bucket = RANGES[chosen]
    status = 200
    context: dict[str, Any] = {
        **site.each_context(request),
        "title": "Dashboards",
        "last_run": last_run,
        "last_ok": last_ok,
        "bucket": bucket,
        "overview": overview,
        "queues": names,
        "selected": selected,
        "all_queues": ALL_QUEUES,
        "ranges": [(key, label) for key, (label, _, _) in RANGES.items()],
        "range": chosen,
        "range_label": range_label,
    }
    if selected == ALL_QUEUES:
        shown = names
    elif selected is not None and selected in names:
        shown = [selected]
    else:
        shown = []
    if selected is not None and selected != ALL_QUEUES and selected not in names:
        context["unknown"] = selected
        context["selected"] = None
        status = 404
    elif selected is not None:
        rows: Sequence[FigureRow] = []
        latency: Sequence[LatencyRow] = []
        if last_ok:
            since = timezone.now() - timedelta(seconds=range_seconds)
            rows, latency = _bucket_rows(shown, last_ok.bucket_seconds, since, range_bucket)
        fits = list(EstimateFit.objects.filter(queue__in=shown).order_by("created_at", "stage"))
        if selected == ALL_QUEUES:
            fits = []  # learned per queue: on each queue's page
        latest_fit: dict[str, EstimateFit] = {}
        for f in fits:
            latest_fit[f.stage] = f
        context.update(
            {
                "charts": _charts(rows, fits, latency),
                "latency": latency[::-1][:TABLE_BUCKETS],
                "buckets": rows[::-1][:TABLE_BUCKETS],
                "workers": WorkerStats.objects.filter(run=last_ok, queue__in=shown) if last_ok else [],
                "groups": (GroupStats.objects.filter(run=last_ok, queue__in=shown)[:TABLE_GROUPS] if last_ok else []),
                "groups_total": GroupStats.objects.filter(run=last_ok, queue__in=shown).count() if last_ok else 0,
                "range_bucket": max(range_bucket, bucket or 0),
                "queue_estimates": estimates.get(selected),
                "fits": [latest_fit[s] for s in ("preprocess", "process") if s in latest_fit],
            }
        )
    return TemplateResponse(request, "consoles/dashboards.html", context, status=status)
