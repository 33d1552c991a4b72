from django.urls import re_path

from . import views

urlpatterns = [
    # /sqs, /sqs/ and any queue URL under it (older SDKs post to the queue URL).
    re_path(r"^sqs(?:/(?P<rest>.*))?$", views.endpoint, name="sqs"),
]
