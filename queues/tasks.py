"""Periodic work, run by Celery beat."""

from __future__ import annotations

import logging

from celery import shared_task

from queues import service
from queues.access import SYSTEM
from queues.models import Queue

log = logging.getLogger(__name__)


@shared_task(name="queues.expire", ignore_result=True)  # type: ignore[untyped-decorator]  # celery has no type information
def expire() -> dict[str, int]:
    """Apply every queue's retention rule at its owners; messages removed, per queue."""
    counts = {q.name: service.expire_everywhere(q, caller=SYSTEM) for q in Queue.objects.all()}
    total = sum(counts.values())
    if total:
        log.info("retention removed %d messages: %s", total, {k: v for k, v in counts.items() if v})
    forgotten = service.forget_expired_dedup()
    if forgotten:
        log.info("forgot %d dedup_ids past their window", forgotten)
    return counts
