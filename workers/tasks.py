"""Periodic work of the workers app, run by Celery beat."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings

from workers import outbox, services
from workers.models import OutboxMessage


# "Expire" is the queues' retention rule applied; these trim the workers' own records. The
# registered task names stay as they are: beat schedules and queued tasks name them.
@shared_task(name="workers.expire_attempt_logs", ignore_result=True)  # type: ignore[untyped-decorator]  # Celery has no types
def trim_attempt_logs() -> int:
    """Delete attempt records older than ATTEMPT_LOG_RETENTION_DAYS; returns how many."""
    return services.trim_attempt_logs(timedelta(days=settings.ATTEMPT_LOG_RETENTION_DAYS))


@shared_task(name="workers.expire_consumers", ignore_result=True)  # type: ignore[untyped-decorator]  # Celery has no types
def forget_silent_consumers() -> int:
    """Delete the consumers not heard from in CONSUMER_RETENTION seconds; returns how many."""
    return services.forget_silent_consumers()


@shared_task(name="workers.relay_outbox", ignore_result=True)  # type: ignore[untyped-decorator]  # Celery has no types
def relay_outbox() -> int:
    """Send the outbox rows left by processes that died between their commit and the send, each
    as its writer; how many were sent. Asks a node only when there is a row to send."""
    if not OutboxMessage.objects.filter(given_up_at__isnull=True).exists():
        return 0
    return outbox.relay(older_than=settings.OUTBOX_RELAY_AFTER)
