"""Periodic work of the consoles app, run by Celery beat (``dashboards``, every DASHBOARDS_EVERY s)."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.utils import timezone

#: a run still marked running after this long is taken for dead (its process was killed)
STALE_RUN = timedelta(hours=1)


@shared_task(name="consoles.refresh_dashboards", ignore_result=True)  # type: ignore[untyped-decorator]  # Celery has no types
def refresh_dashboards() -> int | None:
    """Run the dashboards job unless another run is in progress; the run's ID, or None if skipped.

    Beat fires on schedule whether or not the last run ended: two runs at once would only
    compete for the same rows, so the later one steps aside.
    """
    from consoles.models import DashboardRun
    from consoles.spark import job

    busy = DashboardRun.objects.filter(
        status=DashboardRun.Status.RUNNING, started_at__gte=timezone.now() - STALE_RUN
    ).exists()
    if busy:
        return None
    return job.run(trigger="beat").pk
