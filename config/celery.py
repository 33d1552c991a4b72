"""The Celery app: settings under the CELERY_ namespace, tasks autodiscovered."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("mq")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Workers consume the queues that have handlers (see workers/celery_step.py); the step module
# is light: the SDK and the pipeline are imported only when a worker starts.
from workers.celery_step import QueueConsumers  # noqa: E402 - imported once DJANGO_SETTINGS_MODULE is set

app.steps["worker"].add(QueueConsumers)
