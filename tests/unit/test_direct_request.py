"""A direct view's request (``fastpath.DirectRequest``) answers what Django's ``WSGIRequest``
answers: its host (judged once per Host header, refused as Django refuses it), its body (read
once, with Django's limit), its path and query."""

from __future__ import annotations

import io

import pytest
from django.core.exceptions import DisallowedHost, RequestDataTooBig
from django.core.handlers.wsgi import WSGIRequest
from django.http.request import RawPostDataException
from django.test import override_settings

from queues.api.fastpath import DirectRequest


def _environ(host: str = "127.0.0.1:8000", body: bytes = b'{"a": 1}', **extra: str) -> dict:
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/sqs/us-east-1/000000000000/orders",
        "QUERY_STRING": "Action=SendMessage&x=%C3%A9",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "HTTP_HOST": host,
        "CONTENT_LENGTH": str(len(body)),
        "CONTENT_TYPE": "application/x-www-form-urlencoded; charset=utf-8",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        **extra,
    }


@override_settings(ALLOWED_HOSTS=["127.0.0.1", "mq.example"])
def test_it_answers_as_djangos_request():
    for host in ("127.0.0.1:8000", "mq.example", "MQ.example:443"):
        ours, django = DirectRequest(_environ(host)), WSGIRequest(_environ(host))
        for request in (ours, django):
            request.body  # noqa: B018 - read first, as the SQS view reads it
        assert ours.get_host() == django.get_host() == host
        assert ours.get_host() == host  # (judged once: the second answer the same)
        assert ours.body == django.body == b'{"a": 1}'
        assert ours.read() == django.read() == b'{"a": 1}'  # (a stream over the body, as Django leaves it)
        assert (ours.scheme, ours.method, ours.path_info, ours.get_full_path()) == (
            django.scheme,
            django.method,
            django.path_info,
            django.get_full_path(),
        )
        assert ours.GET.dict() == django.GET.dict() == {"Action": "SendMessage", "x": "é"}


@override_settings(ALLOWED_HOSTS=["mq.example"])
def test_a_host_not_allowed_is_refused_as_django_refuses_it():
    for host in ("evil.example", "127.0.0.1:8000", "mq.example@evil"):
        with pytest.raises(DisallowedHost):
            DirectRequest(_environ(host)).get_host()
    with override_settings(ALLOWED_HOSTS=["evil.example"]):  # (the judged hosts are forgotten)
        assert DirectRequest(_environ("evil.example")).get_host() == "evil.example"


def test_a_body_over_djangos_limit_is_refused_and_a_stream_read_first_is_refused():
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=4), pytest.raises(RequestDataTooBig):
        DirectRequest(_environ(body=b"12345")).body  # noqa: B018
    request = DirectRequest(_environ())
    request.read(1)
    with pytest.raises(RawPostDataException):
        request.body  # noqa: B018
    with pytest.raises(ValueError):  # (as Django's: the SQS view refuses such a length before)
        DirectRequest(_environ(CONTENT_LENGTH="abc")).body  # noqa: B018
    # a Content-Length shorter than what was sent: that many bytes, as Django reads them
    assert DirectRequest(_environ(body=b"abcdef", CONTENT_LENGTH="3")).body == b"abc"
