"""Periodic work of the workers app, run by Celery beat."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings

from . import services


@shared_task(name="workers.expire_attempt_logs", ignore_result=True)
def expire_attempt_logs() -> int:
    """Apply the attempt log's retention (ATTEMPT_LOG_RETENTION_DAYS); returns how many expired."""
    return services.expire_attempt_logs(timedelta(days=settings.ATTEMPT_LOG_RETENTION_DAYS))


@shared_task(name="workers.expire_consumers", ignore_result=True)
def expire_consumers() -> int:
    """Delete the consumers not heard from in CONSUMER_RETENTION seconds; returns how many."""
    return services.expire_consumers()
