"""The archiver as a Celery periodic task (``CELERY_BEAT_SCHEDULE["archive"]``)."""

from __future__ import annotations

from celery import shared_task

from archive import archiver


@shared_task(name="archive.run_archiver", ignore_result=True)  # type: ignore[untyped-decorator]  # Celery has no types
def run_archiver(queue: str | None = None) -> dict[str, archiver.QueueReport]:
    """One pass over every queue's journal; one archiver per queue at a time (the lock)."""
    return archiver.run(queue)
