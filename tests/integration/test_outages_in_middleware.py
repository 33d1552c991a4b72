"""An outage met outside any view (in a middleware, as a session is saved on the way out) is
answered as the views answer one: 503 with Retry-After, never 500.

The outage is real: the middleware below calls a Redis, or opens a database connection, on a
loopback port bound and not listening (refused for certain), as a store that went away
mid-request does.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator

import pytest
import redis
from django.db import connections
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.test import Client

pytestmark = pytest.mark.django_db

_reach: Callable[[], None] | None = None
#: a loopback port bound by the test and not listening: a connection to it is refused.
_port = 0


def _redis_gone() -> None:
    redis.Redis(host="127.0.0.1", port=_port, socket_connect_timeout=1, socket_timeout=1).ping()


def _database_gone() -> None:
    db = connections["default"]
    gone = type(db)({**db.settings_dict, "HOST": "127.0.0.1", "PORT": str(_port)}, alias="gone")
    try:
        gone.ensure_connection()
    finally:
        gone.close()


class StoreOnTheWayOut:
    """Calls the store ``_reach`` names after the view answered (as SessionMiddleware saves a
    session), outermost of the middleware, so no other sees what it raises."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        if _reach is not None:
            _reach()
        return response


@pytest.fixture
def client_past_a_broken_middleware(settings, monkeypatch) -> Iterator[Client]:
    settings.MIDDLEWARE = [f"{__name__}.StoreOnTheWayOut", *settings.MIDDLEWARE]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setattr(f"{__name__}._port", closed.getsockname()[1])
        yield Client(raise_request_exception=False)


@pytest.mark.parametrize("store", [_redis_gone, _database_gone], ids=["redis", "database"])
def test_an_outage_in_a_middleware_is_503_with_retry_after(client_past_a_broken_middleware, store, monkeypatch, caplog):
    # given a middleware that meets a store not answering after the view answered
    monkeypatch.setattr(f"{__name__}._reach", store)
    # when a page of the console and a path of no page are asked for
    for path in ("/admin/login/", "/no-such-page/"):
        caplog.clear()
        r = client_past_a_broken_middleware.get(path)
        # then each is answered 503 with Retry-After, as an outage met in a view
        assert r.status_code == 503, (path, r.status_code, r.content[:200])
        assert r["Retry-After"] == "1"
        assert r.json()["error"] == "unavailable"
        # and logged once, as a warning naming the store's error, not as an error with a traceback
        outages = [rec for rec in caplog.records if rec.getMessage().startswith("store unavailable")]
        assert [rec.levelname for rec in outages] == ["WARNING"]
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


def test_another_error_in_a_middleware_is_still_500(client_past_a_broken_middleware, monkeypatch, caplog):
    # given a middleware failing on a bug of its own, not an outage
    def broken() -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(f"{__name__}._reach", broken)
    # when
    r = client_past_a_broken_middleware.get("/admin/login/")
    # then it stays a 500, with no internals in the answer
    assert r.status_code == 500
    assert r.json() == {"error": "server_error", "detail": "internal error; see the node's log"}
    assert "Retry-After" not in r
    # and the node's log has the error with its traceback
    (logged,) = [rec for rec in caplog.records if rec.name == "django.request"]
    assert logged.levelno == logging.ERROR and logged.exc_info and logged.exc_info[0] is ZeroDivisionError
