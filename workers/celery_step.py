"""The Celery worker step that makes ``celery -A config worker`` a queue client.

At worker start it imports the handler modules (``WORKER_HANDLERS``), picks the queues
(``WORKER_QUEUES``, default: every queue with a handler), connects to the service
(``QUEUE_API_URL``, ``QUEUE_API_TOKEN``) and runs the pre-process/process pipeline with the
worker's concurrency (``-c``); at shutdown it finishes what it is processing, gives back what
it has not started, and sends the last log records. Without handlers it does nothing, so the
same worker can run ordinary Celery tasks (retention, dashboards) too.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from celery import bootsteps

if TYPE_CHECKING:
    from workers.pipeline import Pipeline

log = logging.getLogger(__name__)


class QueueConsumers(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery has no types
    requires = {"celery.worker.components:Pool"}

    # ``worker``: Celery's WorkController (no types).
    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.pipeline: Pipeline | None = None

    def start(self, worker: Any) -> None:
        from django.conf import settings

        from mq_client import Client
        from workers.handlers import configured_queues, discover
        from workers.pipeline import Pipeline, heartbeat_every

        found = discover()
        queues = configured_queues(found)
        if not queues:
            log.info("no queue handlers registered (WORKER_HANDLERS): not consuming queues")
            return
        if not os.environ.get("QUEUE_API_URL"):
            log.warning("handlers for %s but no QUEUE_API_URL: not consuming queues", queues)
            return
        client = Client.from_env()
        timeouts = [client.get_queue(q).visibility_timeout for q in queues]
        beat = heartbeat_every(timeouts)
        self.pipeline = Pipeline(
            client,
            found,
            queues,
            concurrency=max(1, int(worker.concurrency or 1)),
            pipelining=os.environ.get("WORKER_PIPELINING", "1") != "0",
            heartbeat_every=beat,
            name=f"{worker.hostname}",
            wait=float(os.environ.get("WORKER_WAIT", "2")),
            max_held=settings.WORKER_MAX_HELD,
        ).start()
        log.info("consuming %s with %s slots (heartbeat every %.1fs)", queues, self.pipeline.concurrency, beat)

    def stop(self, worker: Any) -> None:
        if self.pipeline is not None:
            self.pipeline.stop()
            log.info("queue consumers stopped after %d messages", self.pipeline.processed)
