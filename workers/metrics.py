"""Prometheus metrics of the Celery workers' attempts, taken from the attempt log records as
the service stores them (``services.record_attempts``): attempts by outcome, and the seconds
of pre-processing and processing per queue. The node that stores a record counts it, so the
figures of all workers are on the nodes' ``/metrics`` (summed over nodes by Prometheus)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Histogram

from workers.models import AttemptLog

#: Seconds of a phase: from well under a second to an hour-long task.
PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

ATTEMPTS = Counter("mq_worker_attempts", "Workers' processing attempts recorded, by outcome", ["queue", "outcome"])
PREPROCESS_SECONDS = Histogram(
    "mq_worker_preprocess_seconds", "Seconds of pre-processing per attempt", ["queue"], buckets=PHASE_BUCKETS
)
PROCESS_SECONDS = Histogram(
    "mq_worker_process_seconds", "Seconds of processing per attempt", ["queue"], buckets=PHASE_BUCKETS
)


def count_attempts(rows: Iterable[AttemptLog]) -> None:
    """Count stored attempt records (a phase that did not both start and end is not timed)."""
    for row in rows:
        ATTEMPTS.labels(row.queue, row.outcome).inc()
        for histogram, start, end in (
            (PREPROCESS_SECONDS, row.preprocess_started_at, row.preprocess_ended_at),
            (PROCESS_SECONDS, row.process_started_at, row.process_ended_at),
        ):
            if start is not None and end is not None:
                histogram.labels(row.queue).observe((end - start).total_seconds())
