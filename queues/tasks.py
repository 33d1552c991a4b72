"""Periodic work, run by Celery beat."""

from __future__ import annotations

import logging

from celery import shared_task

from .models import Partition, Queue
from .router import MAX_HOPS, Router

log = logging.getLogger(__name__)


def enforce_retention_on(queue: Queue, router: Router) -> int:
    """Ask every node that owns a partition of ``queue`` to apply the retention rule there.

    Only an owner can remove its partition's messages (it holds them in its append tree),
    so the task calls each owner once; a partition without a live owner is done by the node
    that takes it over, at the next run.
    """
    addresses = set(
        Partition.objects.filter(queue=queue, owner__isnull=False, owner__stopped_at=None).values_list(
            "owner__address", flat=True
        )
    )
    expired = 0
    for address in sorted(addresses):
        try:
            status, payload = router.forward(address, queue.name, "expire", {}, MAX_HOPS - 1)
        except Exception as exc:  # noqa: BLE001 - the next run tries again
            log.warning("retention on %s at %s: %s", queue.name, address, exc)
            continue
        if status == 200:
            expired += payload.get("expired", 0)
            if payload.get("deferred"):
                log.warning(
                    "retention on %s at %s deferred for partitions %s", queue.name, address, payload["deferred"]
                )
        else:
            log.warning("retention on %s at %s: %s %s", queue.name, address, status, payload)
    return expired


@shared_task(name="queues.enforce_retention", ignore_result=True)
def enforce_retention() -> dict[str, int]:
    """Remove messages older than their queue's retention, on every queue; counts per queue."""
    router = Router(node_id="celery")
    counts = {q.name: enforce_retention_on(q, router) for q in Queue.objects.all()}
    total = sum(counts.values())
    if total:
        log.info("retention removed %d messages: %s", total, {k: v for k, v in counts.items() if v})
    return counts
