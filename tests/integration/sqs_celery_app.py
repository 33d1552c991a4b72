"""A Celery app whose broker is the node's SQS endpoint, through kombu's SQS transport.

Nothing in it knows about this service: it is configured as an application that uses Amazon SQS
would be, with the node's address in place of AWS's (``sqs://<key>:<secret>@<host>:<port>``).
``MQ_SQS_BROKER_URL`` names the broker, ``MQ_SQS_QUEUE`` the task queue, ``MQ_SQS_OUT`` the
folder each worker process appends what it ran to (one file per process). With ``MQ_SQS_TRACES``
(a file), each worker process configures an OpenTelemetry SDK that appends its spans there as
JSON lines, and continues the trace context its tasks were sent with (``workers.celery_tracing``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery
from celery.signals import worker_process_init

# not the current app: a test importing this module must leave the project's tasks on the
# project's app (and its broker)
app = Celery("sqs_tasks", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("MQ_SQS_BROKER_URL", "sqs://"),
    broker_transport_options={
        "region": "us-east-1",
        "is_secure": False,
        # the task queue's VisibilityTimeout (kombu creates it with this attribute)
        "visibility_timeout": int(os.environ.get("MQ_SQS_VISIBILITY", "5")),
        "wait_time_seconds": 1,
        "polling_interval": 0.1,
    },
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("MQ_SQS_QUEUE", "sqs-celery"),
    task_ignore_result=True,
    worker_prefetch_multiplier=4,  # up to 8 messages per ReceiveMessage with two processes
    worker_hijack_root_logger=False,
)


@app.task(name="sqs_tasks.record")
def record(n: int, sleep: float = 0.0) -> None:
    time.sleep(sleep)
    with open(Path(os.environ["MQ_SQS_OUT"]) / f"{os.getpid()}.log", "a") as f:
        f.write(f"{n}\n")


@worker_process_init.connect
def _traced(**kwargs) -> None:
    """The SDK of an application's worker process, configured after the fork."""
    path = os.environ.get("MQ_SQS_TRACES")
    if not path:
        return
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from queues.tracing import JsonLinesExporter
    from workers import celery_tracing

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    celery_tracing.use(provider)
