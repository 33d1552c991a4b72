"""A Celery app whose broker is the node's SQS endpoint, through kombu's SQS transport.

Nothing in it knows about this service: it is configured as an application that uses Amazon SQS
would be, with the node's address in place of AWS's (``sqs://<key>:<secret>@<host>:<port>``).
``MQ_SQS_BROKER_URL`` names the broker, ``MQ_SQS_QUEUE`` the task queue, ``MQ_SQS_OUT`` the
folder each worker process appends what it ran to (one file per process).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery

app = Celery("sqs_tasks")
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
