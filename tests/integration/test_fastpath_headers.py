"""The fast path's answers carry the security headers Django's answers carry, on a real node.

A node started with HSTS on (``SECURE_HSTS_SECONDS``) behind a TLS proxy
(``SECURE_PROXY_SSL_HEADER``) answers one enqueue through the fast path and one through Django
(``?format=json`` sends it there), over plain HTTP and as HTTPS: every header of Django's answer
but those of its own making (the date, the length, content negotiation's ``Vary``, DRF's
``Allow``) must be in the fast path's answer with the same value. With
``SECURE_SSL_REDIRECT``, plain HTTP is left to Django, which redirects it.
"""

from __future__ import annotations

import io

import pytest
import requests
from django.core.handlers.wsgi import WSGIRequest
from django.test import override_settings

from queues.api import fastpath
from tests.integration.wsgi_client import make_client

#: Headers each path makes for itself, not security headers.
OWN = {"date", "server", "content-length", "content-type", "vary", "allow"}
PROXY = ("HTTP_X_FORWARDED_PROTO", "https")


@pytest.mark.django_db(transaction=True)
@pytest.mark.node(env={"SECURE_HSTS_SECONDS": "3600", "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https"})
def test_fast_path_answers_carry_the_security_headers_of_django_answers(node, token, unique_name):
    # given
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    name = unique_name("hdr")
    assert session.post(f"{node.url}/api/v1/queues", json={"name": name}, timeout=30).status_code == 201
    enqueue = f"{node.url}/api/v1/queues/{name}/enqueue"

    for proto in ("http", "https"):
        headers = {"X-Forwarded-Proto": proto}
        # when
        fast = session.post(enqueue, json={"body": "x"}, headers=headers, timeout=30)
        django = session.post(enqueue + "?format=json", json={"body": "x"}, headers=headers, timeout=30)

        # then
        assert fast.status_code == django.status_code == 201, (fast.text, django.text)
        assert "Allow" in django.headers and "Allow" not in fast.headers  # DRF answered one only
        wanted = {k.lower(): v for k, v in django.headers.items() if k.lower() not in OWN}
        got = {k.lower(): v for k, v in fast.headers.items() if k.lower() not in OWN}
        assert got == wanted, proto
        assert got["x-content-type-options"] == "nosniff"
        if proto == "https":
            assert got["strict-transport-security"].startswith("max-age=3600")
        else:
            assert "strict-transport-security" not in got


@pytest.mark.django_db
def test_plain_http_is_left_to_django_where_it_redirects_to_https(api, purge_kv, make_queue):
    # given
    wsgi = make_client("fastpath")
    wsgi.credentials(HTTP_AUTHORIZATION=f"Token {api.token}")
    name = make_queue(partitions=1)

    # when
    with override_settings(SECURE_SSL_REDIRECT=True, SECURE_PROXY_SSL_HEADER=PROXY):
        plain = wsgi.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json")
        secure = wsgi.post(
            f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json", HTTP_X_FORWARDED_PROTO="https"
        )

    # then (the application's SecurityMiddleware read its settings when it was loaded: whether
    # it redirects here depends on what loaded it first; Django's decision either way)
    assert plain.served_by == "django"
    assert secure.served_by == "fastpath" and secure.status_code == 201


@pytest.mark.parametrize(
    "proxy, environ",
    [
        (None, {}),
        (None, {"wsgi.url_scheme": "https"}),
        (None, {"wsgi.url_scheme": "http", PROXY[0]: "https"}),
        (PROXY, {PROXY[0]: "https"}),
        (PROXY, {PROXY[0]: " https , http"}),
        (PROXY, {PROXY[0]: "http, https"}),
        (PROXY, {PROXY[0]: "HTTPS"}),
        (PROXY, {"wsgi.url_scheme": "https"}),
        (PROXY, {"wsgi.url_scheme": "https", PROXY[0]: "http"}),
    ],
)
def test_the_fast_path_takes_a_request_for_https_as_django_does(proxy, environ):
    with override_settings(SECURE_PROXY_SSL_HEADER=proxy):
        full = {"REQUEST_METHOD": "POST", "wsgi.input": io.BytesIO(), "wsgi.url_scheme": "http", **environ}
        assert fastpath.is_secure(full) == WSGIRequest(full).is_secure()
