"""The Celery app: settings under the CELERY_ namespace, tasks autodiscovered."""

import logging
import os

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger
from celery.utils.log import get_multiprocessing_logger

from config.logs import escape_handlers

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("mq")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Workers consume the queues that have handlers (see workers/celery_step.py); the step module
# is light: the SDK and the pipeline are imported only when a worker starts.
from workers.celery_step import QueueConsumers  # noqa: E402 - imported once DJANGO_SETTINGS_MODULE is set

app.steps["worker"].add(QueueConsumers)


def _escaped_logs(logger: logging.Logger, **kwargs: object) -> None:
    """The worker's own handlers (Celery replaces Django's on the root logger) escape control
    characters too, as the nodes' do: a task's headers come from whoever sent it."""
    escape_handlers(logger)
    escape_handlers(get_multiprocessing_logger())


# Connected by a call rather than as decorators: Celery has no type information, and a decorator
# of unknown type would leave the receiver untyped.
after_setup_logger.connect(_escaped_logs)
after_setup_task_logger.connect(_escaped_logs)
