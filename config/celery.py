"""The Celery app: settings under the CELERY_ namespace, tasks autodiscovered."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("mq")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
