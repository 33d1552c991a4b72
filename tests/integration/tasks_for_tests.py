"""Tasks of tests/integration/test_django_tasks.py, and a view that enqueues one (a URLconf).

``email_users`` is Django's own example of its tasks framework, unchanged but for the import
(``django.tasks`` on Django 6, the ``django_tasks`` backport on 5.2).
"""

from django.core.mail import send_mail
from django.http import JsonResponse
from django.urls import path

import config.urls

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def email_users(emails, subject, message):
    return send_mail(subject=subject, message=message, from_email=None, recipient_list=emails)


@task
def fails(reason):
    raise ValueError(f"this task fails: {reason}")


def send_email(request):
    result = email_users.enqueue(
        emails=["user@example.com"],
        subject="You have a message",
        message="Hello there!",
    )
    return JsonResponse({"result_id": result.id})


urlpatterns = [path("send-email/", send_email), *config.urls.urlpatterns]
