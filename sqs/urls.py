from django.urls import re_path

from sqs import views

urlpatterns = [
    # /sqs, /sqs/ and any queue URL under it (older SDKs and kombu post to the queue URL).
    re_path(r"^sqs(?:/(?P<rest>.*))?$", views.endpoint, name="sqs"),
    # POST / as well (clients that take a host and port only: kombu's SQS transport, so Celery)
    # is routed by config.root, which also answers GET / with a map of the node.
]
