"""The admin's dashboards page: the Spark job's figures over time, per queue.

Everything on it is read from the tables the job writes (and the queues' current estimates
from the ``Queue`` rows); nothing is computed here beyond sums for the overview. The charts
are SVG rendered on the server (:mod:`consoles.charts`).
"""

from __future__ import annotations

from pathlib import Path

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Max, Sum
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from consoles.charts import Series, format_value, line_chart
from consoles.models import DashboardRun, EstimateFit, GroupStats, LatencyBucketStats, QueueBucketStats, WorkerStats
from queues import service
from queues.access import Caller

#: buckets drawn per chart and listed in the table
MAX_BUCKETS = 1440
TABLE_BUCKETS = 30
TABLE_GROUPS = 25

_FAVICON = Path(__file__).parent / "static" / "consoles" / "favicon.ico"


def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which browsers ask every origin for: the console's icon (the pages link
    the same file under ``/static/``)."""
    return HttpResponse(_FAVICON.read_bytes(), content_type="image/x-icon", headers={"Cache-Control": "max-age=86400"})


def _epoch(dt) -> float:
    return dt.timestamp()


def _percentile_series(rows, measure: str) -> list[Series]:
    return [
        Series(f"p{p}", [(_epoch(r.bucket_start), getattr(r, f"{measure}_p{p}")) for r in rows]) for p in (50, 95, 99)
    ]


def _charts(rows, fits, latency) -> list:
    by_stage: dict[str, list] = {"preprocess": [], "process": []}
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


def dashboards(request, site: admin.AdminSite):
    """The page, for a user with ``consoles.view_dashboards``, with the figures of the queues it
    may read and that exist now (a queue deleted since, over the API or SQS, is not listed: its
    figures stay in the job's tables, under a name a new queue may take)."""
    if not request.user.has_perm("consoles.view_dashboards"):
        raise PermissionDenied
    caller = Caller.of(request.user)
    last_run = DashboardRun.objects.first()
    last_ok = DashboardRun.objects.filter(status=DashboardRun.Status.SUCCEEDED).first()
    bucket = last_ok.bucket_seconds if last_ok else None
    window_start = last_ok.window_start if last_ok else None

    overview = []
    if last_ok:
        totals = (
            service.only_permitted(QueueBucketStats.objects.all(), caller, name="queue")
            .filter(bucket_seconds=bucket, bucket_start__gte=window_start)
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
            t["failure_rate"] = (t["failed"] + t["timed_out"]) / t["attempts"] if t["attempts"] else None
            t["retry_rate"] = t["retries"] / t["attempts"] if t["attempts"] else None
            overview.append(t)
    estimates = {
        q["name"]: q for q in service.permitted_queues(caller).values("name", "preprocess_estimate", "process_estimate")
    }
    overview = [t for t in overview if t["queue"] in estimates]
    for t in overview:
        q = estimates[t["queue"]]
        t["preprocess_estimate"] = q["preprocess_estimate"]
        t["process_estimate"] = q["process_estimate"]
        t["failure_text"] = format_value(t["failure_rate"], "%")
        t["retry_text"] = format_value(t["retry_rate"], "%")

    names = sorted(estimates)
    selected = request.GET.get("queue") or (overview[0]["queue"] if overview else (names[0] if names else None))
    status = 200
    context = {
        **site.each_context(request),
        "title": "Dashboards",
        "last_run": last_run,
        "last_ok": last_ok,
        "bucket": bucket,
        "overview": overview,
        "queues": names,
        "selected": selected,
    }
    if selected is not None and selected not in names:
        context["unknown"] = selected
        context["selected"] = None
        status = 404
    elif selected is not None:
        rows = []
        if last_ok:
            rows = list(
                QueueBucketStats.objects.filter(queue=selected, bucket_seconds=bucket).order_by("-bucket_start")[
                    :MAX_BUCKETS
                ]
            )[::-1]
        fits = list(EstimateFit.objects.filter(queue=selected).order_by("created_at", "stage"))
        latency = []
        if last_ok:
            latency = list(
                LatencyBucketStats.objects.filter(queue=selected, bucket_seconds=bucket).order_by("-bucket_start")[
                    :MAX_BUCKETS
                ]
            )[::-1]
        latest_fit = {}
        for f in fits:
            latest_fit[f.stage] = f
        context.update(
            {
                "charts": _charts(rows, fits, latency),
                "latency": latency[::-1][:TABLE_BUCKETS],
                "buckets": rows[::-1][:TABLE_BUCKETS],
                "workers": WorkerStats.objects.filter(run=last_ok, queue=selected) if last_ok else [],
                "groups": (GroupStats.objects.filter(run=last_ok, queue=selected)[:TABLE_GROUPS] if last_ok else []),
                "groups_total": GroupStats.objects.filter(run=last_ok, queue=selected).count() if last_ok else 0,
                "queue_estimates": estimates.get(selected),
                "fits": [latest_fit[s] for s in ("preprocess", "process") if s in latest_fit],
            }
        )
    return TemplateResponse(request, "consoles/dashboards.html", context, status=status)
