from django.urls import re_path

from . import views

urlpatterns = [
    # /sqs, /sqs/ and any queue URL under it (older SDKs post to the queue URL).
    re_path(r"^sqs(?:/(?P<rest>.*))?$", views.endpoint, name="sqs"),
    # The site's root too, as SQS itself answers at its host's root: kombu (and so Celery's SQS
    # transport) builds its endpoint from the broker URL's host and port only.
    re_path(r"^$", views.root, name="sqs-root"),
]
