"""A task registered for the queue ``plain`` only: in the worker's ``TASKS_MODULES`` in
tests/integration/test_django_tasks.py, never imported by the test process (whose ``QUEUES``
has no ``plain``). Sent through ``default``, it must not run."""

from django.core.mail import send_mail

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task(queue_name="plain")
def mail_from_plain(subject):
    return send_mail(subject=subject, message="sent from plain", from_email=None, recipient_list=["ops@example.com"])
