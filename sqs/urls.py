from django.urls import re_path

from sqs import views

urlpatterns = [
    # /sqs, /sqs/ and any queue URL under it (older SDKs and kombu post to the queue URL).
    re_path(r"^sqs(?:/(?P<rest>.*))?$", views.endpoint, name="sqs"),
    # POST / as well: clients that take a host and port only (kombu's SQS transport, so Celery)
    # send there. GET / stays unrouted (404).
    re_path(r"^$", views.root_endpoint, name="sqs-root"),
]
