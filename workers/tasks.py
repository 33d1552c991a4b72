"""Periodic work of the workers app, run by Celery beat."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from .models import AttemptLog


@shared_task(name="workers.purge_attempt_logs", ignore_result=True)
def purge_attempt_logs() -> int:
    """Forget attempt records older than ATTEMPT_LOG_RETENTION_DAYS; returns how many."""
    cutoff = timezone.now() - timedelta(days=settings.ATTEMPT_LOG_RETENTION_DAYS)
    deleted, _ = AttemptLog.objects.filter(recorded_at__lt=cutoff).delete()
    return deleted
