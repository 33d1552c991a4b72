"""A test client that calls the node's real WSGI application in-process.

``config.wsgi.application`` is the fast path (``queues/api/fastpath.py``) in front of Django.
DRF's ``APIClient`` goes straight to Django's handler and so never sees the fast path; this client
builds a PEP 3333 environ and calls the WSGI application itself, in the test's thread and so in
its database transaction. It has the part of ``APIClient``'s interface the API suites use:
``get/post/put/patch/delete/generic``, ``format="json"`` or raw data with ``content_type``,
``credentials(...)``, extra ``HTTP_*`` environ keys, and responses with ``status_code``,
``content``, ``json()``, ``data``, ``headers`` and ``response["Header"]``; and ``served_by``,
"django" when Django's handler answered (it sends ``request_started``), else "fastpath".

Like Django's test client it keeps the request signals from closing the database connection
(which would end the test's transaction), and it re-raises the exception no view answered
(behind a 500, or an outage's 503 from ``handler500``), from Django (``got_request_exception``)
or from the fast path (its ``log.exception``).
"""

from __future__ import annotations

import io
import json
import logging
import sys
from contextlib import contextmanager
from unittest import mock
from urllib.parse import unquote_to_bytes, urlencode, urlsplit

from django.core import signals
from django.db import close_old_connections

FASTPATH_LOGGER = "queues.api.fastpath"


class Headers:
    """Case-insensitive response headers (the last value of a repeated header wins)."""

    def __init__(self, pairs: list[tuple[str, str]]):
        self.pairs = list(pairs)
        self._map = {k.lower(): v for k, v in self.pairs}

    def __getitem__(self, name: str) -> str:
        return self._map[name.lower()]

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._map

    def get(self, name: str, default=None):
        return self._map.get(name.lower(), default)

    def __repr__(self) -> str:
        return f"Headers({self.pairs!r})"


class WsgiResponse:
    def __init__(self, status: str, headers: list[tuple[str, str]], content: bytes, served_by: str = ""):
        self.served_by = served_by
        code, _, reason = status.partition(" ")
        self.status_code = int(code)
        self.reason_phrase = reason
        self.headers = Headers(headers)
        self.content = content

    def __getitem__(self, name: str) -> str:
        return self.headers[name]

    def __contains__(self, name: str) -> bool:
        return name in self.headers

    def has_header(self, name: str) -> bool:
        return name in self.headers

    def get(self, name: str, default=None):
        return self.headers.get(name, default)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8")

    def json(self):
        content_type = self.headers.get("Content-Type", "")
        if not content_type.startswith("application/json"):
            raise ValueError(f"content type {content_type!r} is not JSON: {self.content[:200]!r}")
        return json.loads(self.content)

    @property
    def data(self):
        """The decoded JSON body (DRF's ``Response.data`` as the client sees it), else None."""
        try:
            return self.json() if self.content else None
        except ValueError:
            return None

    def __repr__(self) -> str:
        return f"<WsgiResponse {self.status_code} {self.headers.get('Content-Type')!r} {self.content[:80]!r}>"


class _Capture(logging.Handler):
    """Keeps the exceptions the fast path logs before answering 500."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.exc_info = None

    def emit(self, record):
        if record.exc_info and self.exc_info is None:
            self.exc_info = record.exc_info


def _json(data) -> bytes:
    # As DRF's JSONRenderer with its defaults (UNICODE_JSON, COMPACT_JSON, STRICT_JSON).
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


class WsgiClient:
    """Calls ``config.wsgi.application`` (or ``app``) with a hand-built WSGI environ."""

    transport = "fastpath"

    def __init__(self, app=None, raise_request_exception: bool = True, **defaults):
        if app is None:
            from config.wsgi import application as app
        self.app = app
        self.raise_request_exception = raise_request_exception
        self.defaults = defaults
        self._credentials: dict = {}

    # --- APIClient's interface ----------------------------------------------------------------
    def credentials(self, **kwargs) -> None:
        """Environ entries sent with every request (replaces the previous ones, as APIClient)."""
        self._credentials = kwargs

    def get(self, path, data=None, **extra):
        if data:
            extra.setdefault("QUERY_STRING", urlencode(data, doseq=True))
        return self.generic("GET", path, **extra)

    def head(self, path, data=None, **extra):
        if data:
            extra.setdefault("QUERY_STRING", urlencode(data, doseq=True))
        return self.generic("HEAD", path, **extra)

    def options(self, path, data=None, format=None, content_type=None, **extra):
        return self._with_body("OPTIONS", path, data, format, content_type, extra)

    def post(self, path, data=None, format=None, content_type=None, **extra):
        return self._with_body("POST", path, data, format, content_type, extra)

    def put(self, path, data=None, format=None, content_type=None, **extra):
        return self._with_body("PUT", path, data, format, content_type, extra)

    def patch(self, path, data=None, format=None, content_type=None, **extra):
        return self._with_body("PATCH", path, data, format, content_type, extra)

    def delete(self, path, data=None, format=None, content_type=None, **extra):
        return self._with_body("DELETE", path, data, format, content_type, extra)

    def generic(self, method, path, data=b"", content_type="application/octet-stream", *, headers=None, **extra):
        if isinstance(data, str):
            data = data.encode("utf-8")
        environ = self._environ(method, path, bytes(data or b""), content_type, headers, extra)
        return self.request(environ)

    # --- the WSGI call ------------------------------------------------------------------------
    def _with_body(self, method, path, data, format, content_type, extra):
        if data is None:
            return self.generic(method, path, b"", content_type or "application/octet-stream", **extra)
        if content_type is not None:  # raw data, as APIClient with content_type
            return self.generic(method, path, data, content_type, **extra)
        if format not in (None, "json"):
            raise ValueError(f"WsgiClient only encodes JSON, not {format!r}")
        if format is None and not isinstance(data, (dict, list)):
            raise ValueError("WsgiClient: give format='json' or a content_type")
        return self.generic(method, path, _json(data), "application/json", **extra)

    def _environ(self, method, path, body: bytes, content_type, headers, extra) -> dict:
        parts = urlsplit(path)
        environ = {
            "REQUEST_METHOD": method.upper(),
            "SCRIPT_NAME": "",
            # PEP 3333: the percent-decoded path as bytes, carried in a latin-1 str.
            "PATH_INFO": unquote_to_bytes(parts.path).decode("iso-8859-1"),
            "QUERY_STRING": parts.query,
            "SERVER_NAME": "testserver",
            "SERVER_PORT": "80",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "HTTP_HOST": "testserver",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": False,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        if body or method.upper() in ("POST", "PUT", "PATCH"):
            environ["CONTENT_LENGTH"] = str(len(body))
            environ["CONTENT_TYPE"] = content_type
        environ.update(self.defaults)
        for name, value in (headers or {}).items():
            key = name.upper().replace("-", "_")
            environ[key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"] = value
        environ.update(extra)
        environ.update(self._credentials)  # as APIClient: credentials win over per-request extras
        return environ

    def request(self, environ: dict) -> WsgiResponse:
        captured: dict = {}
        started: list = []
        chunks: list[bytes] = []

        def start_response(status, response_headers, exc_info=None):
            if exc_info is not None and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, list(response_headers)]
            return chunks.append  # the legacy write() callable

        def on_exception(sender, request=None, **kwargs):
            captured.setdefault("exc_info", sys.exc_info())

        def on_started(sender, **kwargs):
            captured["django"] = True

        capture = _Capture()
        log = logging.getLogger(FASTPATH_LOGGER)
        with self._keep_connection():
            signals.got_request_exception.connect(on_exception, dispatch_uid=f"wsgi-client-{id(self)}")
            signals.request_started.connect(on_started, dispatch_uid=f"wsgi-client-{id(self)}")
            log.addHandler(capture)
            try:
                result = self.app(environ, start_response)
                try:
                    for chunk in result:
                        chunks.append(bytes(chunk))
                finally:
                    close = getattr(result, "close", None)
                    if close is not None:
                        close()  # as a WSGI server: sends request_finished for Django
            finally:
                log.removeHandler(capture)
                signals.got_request_exception.disconnect(dispatch_uid=f"wsgi-client-{id(self)}")
                signals.request_started.disconnect(dispatch_uid=f"wsgi-client-{id(self)}")
        assert started, "the application returned without calling start_response"
        response = WsgiResponse(
            started[0], started[1], b"".join(chunks), "django" if captured.get("django") else "fastpath"
        )
        exc_info = captured.get("exc_info") or capture.exc_info
        if self.raise_request_exception and exc_info is not None and exc_info[1] is not None:
            raise exc_info[1].with_traceback(exc_info[2])
        return response

    @staticmethod
    @contextmanager
    def _keep_connection():
        """As Django's test client: the test's transaction must survive the request.

        Django's handler closes old connections on request_started and request_finished, the
        fast path after each call; inside the test's atomic block that would close the
        connection and break the transaction.
        """
        started = signals.request_started.disconnect(close_old_connections)
        finished = signals.request_finished.disconnect(close_old_connections)
        try:
            with mock.patch("queues.api.fastpath.close_old_connections", lambda **kwargs: None):
                yield
        finally:
            if started:
                signals.request_started.connect(close_old_connections)
            if finished:
                signals.request_finished.connect(close_old_connections)


TRANSPORTS = ["drf", "fastpath"]


def make_client(transport: str):
    """A fresh client for one transport: DRF's APIClient (straight to Django) or the WSGI app."""
    if transport == "drf":
        from rest_framework.test import APIClient

        client = APIClient()
        client.transport = "drf"
        return client
    if transport == "fastpath":
        return WsgiClient()
    raise ValueError(f"unknown transport {transport!r}")


def token_client(transport: str, user):
    """A client of that transport authenticated with a new token of ``user`` (as the ``api`` fixture)."""
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=user)
    client = make_client(transport)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    client.token = token.key
    return client
