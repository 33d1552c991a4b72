"""Request bodies before Django: no body of a caller not yet known is read whole or waited for.

Under ``runnode`` the node's front (``queues.http.front``) has read every body on its event loop,
within its sender's share, before this WSGI layer runs; it asks :func:`before_body` (in a
request thread) about a body that does not come at once, or is large, and refuses there what
this refuses, unread. The same checks stand here, for the WSGI application served by any WSGI
server, where ``wsgi.input.read`` waits in the request thread for the body as the client sends
it.

:class:`BodyGate` sits in front of Django (behind the fast path, which reads a body itself only
after it has authenticated the caller: ``queues.api.fastpath``). A request with a body is
passed on untouched when its headers name a caller this node knows (:func:`known_caller`: a
valid API token, a node's signature checked over its headers, a logged-in console session,
or what an app registers, such as the SQS access keys); the view reads the body then, up to
its own limits. A request whose token or node signature fails is answered 401 at once, unread,
and so is any body to the REST API (``/api/``) from a caller without credentials. Any other
body (an anonymous caller's: the console's login form) is refused by its ``Content-Length``
when over ``API_ANONYMOUS_MAX_REQUEST_BYTES`` (413, unread), and otherwise read here, by at
most ``API_ANONYMOUS_BODY_READERS`` request threads of the process at once; with those taken,
another is answered 503 at once, unread. A known caller's bodies read on the fast path count
against it (:class:`CallerReads`): one caller holds at most ``API_BODY_READS_PER_CALLER``
request threads with bodies on their way. Every such answer says ``Connection: close``.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import orjson
from django.conf import settings
from django.db import DatabaseError
from django.http.cookie import parse_cookie

from queues.cluster import peerauth
from queues.errors import Unavailable

if TYPE_CHECKING:
    from wsgiref.types import InputStream, StartResponse, WSGIApplication

log = logging.getLogger(__name__)

#: ``environ -> bool``: whether a request's headers name a caller known to this node. Apps
#: add theirs (:func:`register_known_caller`); an exception counts as "not known".
_KNOWN: list[Callable[[dict[str, Any]], bool]] = []


def register_known_caller(check: Callable[[dict[str, Any]], bool]) -> None:
    """Add a check of a request's headers (e.g. an app's own credentials) to :func:`known_caller`."""
    if check not in _KNOWN:
        _KNOWN.append(check)


#: ``environ -> bool``: whether a request goes to a view that finds its caller from the headers
#: and refuses one it does not know before it reads the body (the SQS endpoint): such a request
#: is passed on unread, whoever sends it, and the view answers in its own protocol.
_SELF_GUARDED: list[Callable[[dict[str, Any]], bool]] = []


def register_self_guarded(check: Callable[[dict[str, Any]], bool]) -> None:
    """Add a test of a request's path for views that authenticate before the body (see above)."""
    if check not in _SELF_GUARDED:
        _SELF_GUARDED.append(check)


#: Why a body is refused before it is read: (status line, error, detail, extra headers).
Refused = tuple[str, str, str, list[tuple[str, str]]]

#: ``environ -> Refused | None``: a self-guarded view's own refusal of a caller by the headers
#: (an unknown access key), for a front that reads the body before the view runs
#: (``queues.http.front``); it may ask the database.
_SELF_GUARD_REFUSALS: list[Callable[[dict[str, Any]], Refused | None]] = []


def register_self_guard_refusal(check: Callable[[dict[str, Any]], Refused | None]) -> None:
    """Add a self-guarded view's refusal of a caller by its headers (see :func:`before_body`)."""
    if check not in _SELF_GUARD_REFUSALS:
        _SELF_GUARD_REFUSALS.append(check)


def _token_known(environ: dict[str, Any]) -> bool:
    from rest_framework.exceptions import AuthenticationFailed

    from queues.http.auth import CachedTokenAuthentication

    scheme, _, key = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    key = key.strip()
    if scheme.lower() != "token" or not key or " " in key:
        return False
    try:
        CachedTokenAuthentication().authenticate_credentials(key)
    except AuthenticationFailed:
        return False
    return True


def _peer_known(environ: dict[str, Any]) -> bool:
    if peerauth.SIGNATURE_META not in environ:
        return False
    method = environ.get("REQUEST_METHOD", "")
    try:
        # (kept in the environ: the view's own check takes the answer, not a second guard entry)
        return peerauth.verify_headers(environ, method, peerauth.request_path(environ)) is not None
    except peerauth.PeerAuthFailed:
        return False
    except peerauth.PeerAuthBusy:
        return True  # a node's call: the view answers 503 as for any


def _session_known(environ: dict[str, Any]) -> bool:
    cookie = environ.get("HTTP_COOKIE")
    if not cookie or settings.SESSION_COOKIE_NAME not in cookie:
        return False
    from importlib import import_module

    from django.contrib.auth import SESSION_KEY

    key = parse_cookie(cookie).get(settings.SESSION_COOKIE_NAME)
    if not key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    return store.get(SESSION_KEY) is not None


def known_caller(environ: dict[str, Any]) -> bool:
    """Whether the request's headers name a caller this node knows (nothing of its body read).
    A store that cannot answer counts as known: the view answers the outage (503) itself."""
    checks = (_token_known, _peer_known, _session_known, *_KNOWN)
    for check in checks:
        try:
            if check(environ):
                return True
        except DatabaseError:
            return True
        except Exception:
            log.exception("body gate: %s failed; the caller counts as unknown", getattr(check, "__name__", check))
    return False


def _failed_credentials(environ: dict[str, Any]) -> str | None:
    """Why the API credentials the request presents (a token, a node's signature) fail, or
    None when it presents none: such a request is answered 401 before its body."""
    if peerauth.SIGNATURE_META in environ or peerauth.LEGACY_SECRET_META in environ:
        try:
            peerauth.verify_headers(environ, environ.get("REQUEST_METHOD", ""), peerauth.request_path(environ))
        except peerauth.PeerAuthFailed as exc:
            return str(exc)
        except peerauth.PeerAuthBusy:
            return None
    if environ.get("HTTP_AUTHORIZATION", "").partition(" ")[0].lower() == "token":
        return "Invalid token."
    return None


class ReadersBusy(Unavailable):
    """As many anonymous bodies as allowed are being read already (503: retry)."""

    node_failure = False

    @property
    def detail(self) -> str:
        return f"{self}; retry"


class _Readers:
    """At most ``size`` request threads of this process reading anonymous bodies at once."""

    def __init__(self, size: int):
        self.size = size
        self._free = threading.BoundedSemaphore(size)

    def read(self, stream: InputStream, length: int) -> bytes:
        if not self._free.acquire(blocking=False):
            raise ReadersBusy(f"{self.size} bodies of callers not authenticated are being read already")
        try:
            return stream.read(length)
        finally:
            self._free.release()


_READERS: _Readers | None = None
_READERS_LOCK = threading.Lock()


def readers() -> _Readers:
    global _READERS
    with _READERS_LOCK:
        if _READERS is None or _READERS.size != settings.API_ANONYMOUS_BODY_READERS:
            _READERS = _Readers(settings.API_ANONYMOUS_BODY_READERS)
        return _READERS


class CallerReads:
    """Bodies each known caller has being read in this process at once: a client trickling
    its bodies holds a request thread for each, so one caller may hold at most
    ``API_BODY_READS_PER_CALLER`` of them (past it: 503, unread), and the others keep theirs."""

    def __init__(self) -> None:
        self._counts: dict[Any, int] = {}
        self._lock = threading.Lock()

    def acquire(self, caller: Any) -> bool:
        with self._lock:
            held = self._counts.get(caller, 0)
            if held >= settings.API_BODY_READS_PER_CALLER:
                return False
            self._counts[caller] = held + 1
            return True

    def release(self, caller: Any) -> None:
        with self._lock:
            held = self._counts.get(caller, 0) - 1
            if held > 0:
                self._counts[caller] = held
            else:
                self._counts.pop(caller, None)


CALLER_READS = CallerReads()


def _refuse(
    start_response: StartResponse, status: str, error: str, detail: str, extra: Iterable[tuple[str, str]] = ()
) -> list[bytes]:
    body = orjson.dumps({"error": error, "detail": detail})
    start_response(
        status,
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            # the body is left unread (or half read): this connection carries no next request
            ("Connection", "close"),
            *extra,
        ],
    )
    return [body]


def before_body(environ: dict[str, Any]) -> tuple[bool, Refused | None]:
    """What a request with a body is, by its headers alone (``environ`` without the body):
    whether its caller is known (or its view finds its caller itself), and whether it is refused
    before the body is read: credentials that fail (401), a body to the REST API without
    credentials (401), an anonymous body without a length (411) or over
    ``API_ANONYMOUS_MAX_REQUEST_BYTES`` (413). May ask the database or the cache (a token, a
    session): call it from a request thread."""
    # A self-guarded view first: it finds its caller itself (its own refusal, when it has
    # registered one, is given here), so asking who calls costs it a lookup for nothing.
    if any(guarded(environ) for guarded in _SELF_GUARDED):
        for refusal in _SELF_GUARD_REFUSALS:
            refused = refusal(environ)
            if refused is not None:
                return False, refused
        return True, None
    if known_caller(environ):
        return True, None
    return False, _anonymous_refusal(environ)


def _anonymous_refusal(environ: dict[str, Any]) -> Refused | None:
    refused = _failed_credentials(environ)
    if refused is not None:
        return "401 Unauthorized", "authentication_failed", refused, [("WWW-Authenticate", "Token")]
    if environ.get("PATH_INFO", "").startswith("/api/"):
        # every call of the API that takes a body needs credentials: answered as DRF would
        return (
            "401 Unauthorized",
            "not_authenticated",
            "Authentication credentials were not provided.",
            [("WWW-Authenticate", "Token")],
        )
    length = environ.get("CONTENT_LENGTH") or ""
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower() or not (length.isascii() and length.isdigit()):
        return (
            "411 Length Required",
            "length_required",
            "a request without credentials must state its body's Content-Length",
            [],
        )
    size, limit = int(length), settings.API_ANONYMOUS_MAX_REQUEST_BYTES
    if size > limit:
        return (
            "413 Request Entity Too Large",
            "payload_too_large",
            f"request body of {size} bytes is over the limit of {limit} bytes for a caller not authenticated",
            [],
        )
    return None


class BodyGate:
    """WSGI middleware: see the module docstring."""

    def __init__(self, app: WSGIApplication) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        length = environ.get("CONTENT_LENGTH") or ""
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if (not length or length == "0") and not chunked:
            return self.app(environ, start_response)
        known, refused = before_body(environ)
        if known:
            return self.app(environ, start_response)
        if refused is not None:
            status, error, detail, extra = refused
            return _refuse(start_response, status, error, detail, extra)
        try:
            body = readers().read(environ["wsgi.input"], int(length))
        except ReadersBusy as exc:  # answered as it says, before Django (the views' answer: errors.py)
            status = f"{exc.status} {HTTPStatus(exc.status).phrase}"
            return _refuse(start_response, status, exc.code, exc.detail, list(exc.headers().items()))
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return self.app(environ, start_response)
