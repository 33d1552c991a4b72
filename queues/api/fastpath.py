"""A WSGI fast path in front of Django for the four message calls.

Django's middleware, DRF's request wrapping and content negotiation cost many times what
enqueueing one message costs (``docs/explanation/performance.md``). The message calls are most of a
queue's traffic, so for ``POST /api/v1/queues/<name>/{enqueue, dequeue,
ack, visibility}`` with a ``Token`` header and a JSON body this layer authenticates (the same
cached token check as DRF), parses with orjson, and calls the very functions the DRF views call
(``calls``) as the same :class:`~queues.access.Caller` (the token's user; for a node, whose
call is signed (``queues.cluster.peerauth``), the user named by ``X-MQ-On-Behalf-Of``: without it a node
may make none of these calls), mapping errors with the same functions as the DRF exception
handler. A client's ``X-MQ-Hops`` is ignored (hop 0), as in DRF.

An app may also register a view that needs none of Django's middleware
(``queues.http.direct.register_direct_view``: the SQS endpoint, which finds its caller itself and answers in
its own protocol): a POST under its prefix is handed to it as Django's request, the Host and
HTTPS checked as Django checks them, Django's security headers added to its answer.

Everything else, and every request it is not sure about (no token, a session cookie, another
content type, another method, plain HTTP where ``SECURE_SSL_REDIRECT`` redirects it), goes to
Django and DRF unchanged; so do the schema and the browsable API. The integration tests send
the hostile-input matrix through both paths.

Its answers carry the security headers Django's answers carry (``X-Content-Type-Options``,
``Referrer-Policy``, ``Cross-Origin-Opener-Policy``, ``X-Frame-Options``, and
``Strict-Transport-Security`` on HTTPS when ``SECURE_HSTS_SECONDS`` is set): Django's own
``SecurityMiddleware`` and ``XFrameOptionsMiddleware`` make them (:func:`security_headers`),
from the same settings, when ``MIDDLEWARE`` lists them.
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast

import orjson
from django.conf import settings
from django.core.handlers.wsgi import LimitedStream, WSGIRequest
from django.core.signals import setting_changed
from django.db import close_old_connections
from django.dispatch import receiver
from django.http import HttpResponse, UnreadablePostError
from django.http.request import split_domain_port, validate_host
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware
from rest_framework import exceptions

from queues import metrics, tracing
from queues.api import calls
from queues.cluster import peerauth
from queues.errors import PayloadTooLarge
from queues.http import bodies, served_header, throttles
from queues.http.auth import CachedTokenAuthentication, caller_of, check_peer_body, peer_of, request_caller
from queues.http.direct import DirectView, direct_view
from queues.http.errors import error_answer
from queues.service import served
from queues.service.errors import InvalidRequest

if TYPE_CHECKING:
    from wsgiref.types import InputStream, StartResponse, WSGIApplication

log = logging.getLogger(__name__)

_PATH = re.compile(
    r"^/api/v1/(?:queues/(?P<queue>[^/]+)/(?P<call>enqueue|dequeue|ack|visibility)"
    r"|topics/(?P<topic>[^/]+)/(?:subscriptions/(?P<sub>[^/]+)/(?P<sub_call>dequeue|ack|visibility)"
    r"|(?P<publish>publish)))$"
)
_REASONS = {s.value: s.phrase for s in HTTPStatus}
_JSON_TYPES = ("application/json", "application/*", "*/*")


def _accepts_json(accept: str) -> bool:
    """Whether DRF's content negotiation could pick the JSON renderer (no Accept: any)."""
    return not accept.strip() or any(t.split(";")[0].strip().lower() in _JSON_TYPES for t in accept.split(","))


#: Host headers already judged: ``split_domain_port`` + ``validate_host`` would run on every
#: call, for the same few hosts. Bounded: emptied when full (a client sending ever new hosts
#: costs the check again, never memory).
_HOSTS: dict[str, bool] = {}
_HOSTS_MAX = 256


@receiver(setting_changed)
def _forget_hosts(*, setting: str, **_: Any) -> None:
    if setting == "ALLOWED_HOSTS":
        _HOSTS.clear()


def _host_allowed(environ: dict[str, Any]) -> bool:
    """Whether the Host header is one of ``ALLOWED_HOSTS`` (as Django's ``get_host`` checks)."""
    return _allowed(environ.get("HTTP_HOST") or environ.get("SERVER_NAME", ""))


def _allowed(host: str) -> bool:
    """Whether ``host`` (a Host header's value) names one of ``ALLOWED_HOSTS``."""
    allowed = _HOSTS.get(host)
    if allowed is None:
        domain, _ = split_domain_port(host)
        allowed = bool(domain) and validate_host(domain, settings.ALLOWED_HOSTS)
        if len(_HOSTS) >= _HOSTS_MAX:
            _HOSTS.clear()
        _HOSTS[host] = allowed
    return allowed


def is_secure(environ: dict[str, Any]) -> bool:
    """Whether Django takes the request for HTTPS (``HttpRequest.is_secure``): the first value
    of the ``SECURE_PROXY_SSL_HEADER`` header when the request has it, else the WSGI scheme."""
    proxy = settings.SECURE_PROXY_SSL_HEADER
    if proxy:
        header, secure_value = proxy
        value = environ.get(header)
        if value is not None:
            return bool(value.split(",", 1)[0].strip() == secure_value)
    return bool(environ.get("wsgi.url_scheme") == "https")


class DirectRequest(WSGIRequest):
    """Django's request as a direct view gets it: ``WSGIRequest``, with its host judged once per
    Host header (the answer :func:`_allowed` keeps for the fast path's own check; one it refuses
    is judged by Django itself, which raises ``DisallowedHost`` or allows ``DEBUG``'s local
    hosts) and its body read in one call (Django's limit, ``DATA_UPLOAD_MAX_MEMORY_SIZE``; what
    Django would refuse or read otherwise goes to Django's own ``body``). A direct view asks
    both on every call."""

    _read_started: bool

    def get_host(self) -> str:
        host = self._get_raw_host()  # type: ignore[attr-defined]  # (Django's own first step, unstubbed)
        return host if _allowed(host) else super().get_host()

    @property
    def body(self) -> bytes:
        body: bytes | None = self.__dict__.get("_body")
        if body is None:
            stream = cast(LimitedStream, self._stream)
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            if (
                self._read_started
                or (limit is not None and stream.limit > limit)
                or not (self.META.get("CONTENT_LENGTH") or "0").isdigit()
            ):
                # Django's answer: RawPostDataException, RequestDataTooBig, the ValueError of
                # a Content-Length that is no number
                return super().body
            self._read_started = True
            try:
                body = stream.read()
            except OSError as exc:
                raise UnreadablePostError(*exc.args) from exc
            self._body = body
            self._stream = io.BytesIO(body)  # (as Django leaves it)
        return body


#: The middleware that add headers to every answer of Django's, by their MIDDLEWARE path.
_HEADER_MIDDLEWARE = {
    "django.middleware.security.SecurityMiddleware": SecurityMiddleware,
    "django.middleware.clickjacking.XFrameOptionsMiddleware": XFrameOptionsMiddleware,
}
#: secure -> the headers (made once per setting of the settings below).
_SECURITY: dict[bool, tuple[tuple[str, str], ...]] = {}


@receiver(setting_changed)
def _forget_security_headers(*, setting: str, **_: Any) -> None:
    if setting.startswith("SECURE_") or setting in ("X_FRAME_OPTIONS", "MIDDLEWARE"):
        _SECURITY.clear()


def security_headers(secure: bool) -> tuple[tuple[str, str], ...]:
    """The headers Django's header middleware add to an answer to a plain HTTP (``secure``
    False) or an HTTPS request: those middleware themselves run once on an empty answer."""
    found = _SECURITY.get(secure)
    if found is None:
        request = WSGIRequest(
            {
                "REQUEST_METHOD": "POST",
                "PATH_INFO": "/",
                "wsgi.input": io.BytesIO(),
                "wsgi.url_scheme": "https" if secure else "http",
            }
        )
        response = HttpResponse()
        before = set(response.headers)
        for path in reversed(settings.MIDDLEWARE):  # (Django's order for answers)
            middleware = _HEADER_MIDDLEWARE.get(path)
            if middleware is not None:
                response = middleware(HttpResponse).process_response(request, response)  # type: ignore[attr-defined]  # both define it; the stubs' base does not
        found = _SECURITY[secure] = tuple((k, v) for k, v in response.headers.items() if k not in before)
    return found


class FastPath:
    def __init__(self, app: WSGIApplication) -> None:
        self.app = app
        self.auth = CachedTokenAuthentication()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        path = environ.get("PATH_INFO", "")
        match = _PATH.fullmatch(path)
        if match is None:
            direct = direct_view(path)
            if direct is not None:
                return self._direct(*direct, environ, start_response)
            return self.app(environ, start_response)
        if not _host_allowed(environ):
            return self.app(environ, start_response)  # Django refuses it (400), as for every other call
        secure = is_secure(environ)
        if settings.SECURE_SSL_REDIRECT and not secure:
            return self.app(environ, start_response)  # Django redirects it to HTTPS
        scheme, _, key = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        key = key.strip()
        # A node's signed call (or the old secret header, refused) comes without Authorization;
        # with one, DRF's order holds: the token decides.
        peer = not scheme and (peerauth.SIGNATURE_META in environ or peerauth.LEGACY_SECRET_META in environ)
        content_type = environ.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
        if content_type != "application/json" or (not peer and (scheme.lower() != "token" or not key or " " in key)):
            return self.app(environ, start_response)  # DRF answers exactly as it would
        length = environ.get("CONTENT_LENGTH") or "0"
        if (
            environ.get("QUERY_STRING")
            or not _accepts_json(environ.get("HTTP_ACCEPT", ""))
            or not (length.isascii() and length.isdigit())
        ):
            # ?format=..., an Accept without JSON (DRF: 406), an odd Content-Length: DRF decides.
            return self.app(environ, start_response)
        if match["queue"] is not None:
            raw_name, call = match["queue"], match["call"]
        elif match["publish"] is not None:
            raw_name, call = match["topic"], "publish"
        else:  # a topic's subscription: the calls take "topic/subscription"
            raw_name, call = f"{match['topic']}/{match['sub']}", match["sub_call"]
        name = raw_name.encode("latin-1").decode("utf-8", "replace")
        headers: dict[str, str] = {}
        started = time.perf_counter()
        served_token = served.begin()
        trace_token = None
        try:
            trace_token = tracing.attach_meta(environ) if tracing.ON else None  # the caller's traceparent
            if peer:
                # The signature (over the body's hash, in a header) before a byte of the body:
                # a forged or replayed one is refused unread.
                found = peer_of(environ, "POST", peerauth.request_path(environ))
                assert found is not None  # it claimed to be a node: a node, or AuthenticationFailed
                node, signed = found
                caller, hops = request_caller(node), node.hops
                raw = self._read(environ, settings.API_MAX_REQUEST_BYTES)
                check_peer_body(signed, raw)
                limit, checked = calls.checked_limit(call, name, caller=caller)
                if len(raw) > limit:
                    raise PayloadTooLarge(
                        f"request body of {len(raw)} bytes is over this call's limit of {limit} bytes"
                    )
            else:
                user, _ = self.auth.authenticate_credentials(key)
                throttles.check_user(user.pk)
                caller, hops = caller_of(user), 0  # a client's X-MQ-Hops is ignored
                # The caller's right and the queue's limits before a byte of the body is read:
                # the check is handed to the call, which makes no other.
                limit, checked = calls.checked_limit(call, name, caller=caller)
                if length == "0" and "HTTP_TRANSFER_ENCODING" not in environ:
                    raw = b""
                elif bodies.CALLER_READS.acquire(user.pk):
                    try:
                        raw = self._read(environ, limit)
                    finally:
                        bodies.CALLER_READS.release(user.pk)
                else:  # its other bodies are all still on their way
                    raise bodies.ReadersBusy(
                        f"{settings.API_BODY_READS_PER_CALLER} of this user's request bodies are being read already"
                    )
            status, payload = calls.CALLS[call](
                name, self._parse(raw), hops, trusted=peer, caller=caller, checked=checked
            )
        except Exception as exc:
            mapped = error_answer(exc)
            if mapped is None:
                log.exception("fast path: %s %s", call, name)
                mapped = (500, {"error": "server_error", "detail": "internal error; see the node's log"}, {})
            status, payload, headers = mapped
            if isinstance(exc, exceptions.AuthenticationFailed):
                # TokenAuthentication's header names its keyword whatever the request; the stubs
                # want a Request and allow no header back
                headers["WWW-Authenticate"] = self.auth.authenticate_header(None)  # type: ignore[arg-type, assignment]
        finally:
            if trace_token is not None:
                tracing.detach(trace_token)
            served_by = served.end(served_token)
            close_old_connections()
        body = orjson.dumps(payload)
        # Labelled with the URL's name (urls.py), as Django's middleware does for the same call.
        kind = "queue" if match["queue"] is not None else "topic" if call == "publish" else "subscription"
        metrics.observe_call(f"{kind}-{call}", status, started)
        start_response(
            f"{status} {_REASONS.get(status, '')}",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                *headers.items(),
                *served_header.header_items(served_by),
                *security_headers(secure),
            ],
        )
        return [body]

    def _direct(
        self, prefix: str, view: DirectView, environ: dict[str, Any], start_response: StartResponse
    ) -> Iterable[bytes]:
        """A direct view's call (``queues.http.direct``): Django's request, none of its middleware; the
        checks those would make that matter to such a view (the Host, HTTPS) made here, and
        their headers added to its answer."""
        if not _host_allowed(environ):
            return self.app(environ, start_response)  # Django refuses it (400), as for every other call
        secure = is_secure(environ)
        if settings.SECURE_SSL_REDIRECT and not secure:
            return self.app(environ, start_response)  # Django redirects it to HTTPS
        request = DirectRequest(environ)
        try:
            response = view(request, request.path_info[len(prefix) + 1 :])
        except Exception:
            log.exception("direct view: POST %s", request.path_info)
            response = HttpResponse(b"internal error; see the node's log", status=500, content_type="text/plain")
        finally:
            close_old_connections()
        if isinstance(response, tuple):
            status, given, body = response
            status_line = f"{status} {_REASONS.get(status, 'Unknown Status Code')}"  # (Django's phrases)
        else:
            given, body = list(response.items()), response.content
            status_line = f"{response.status_code} {response.reason_phrase}"
        headers = [(k, v) for k, v in given if k.lower() != "content-length"]
        have = {k.lower() for k, _ in headers}
        start_response(
            status_line,
            [
                *headers,
                ("Content-Length", str(len(body))),
                *((k, v) for k, v in security_headers(secure) if k.lower() not in have),
            ],
        )
        return [body]

    @staticmethod
    def _read(environ: dict[str, Any], limit: int) -> bytes:
        """The body, refused (413) by its ``Content-Length`` before it is read when over
        ``limit``; a chunked body (no length) is read to at most ``limit`` + 1 bytes."""
        length = int(environ.get("CONTENT_LENGTH") or 0)  # digits: checked by the caller
        if length > limit:
            raise PayloadTooLarge(f"request body of {length} bytes is over this call's limit of {limit} bytes")
        stream: InputStream = environ["wsgi.input"]
        if length > 0:
            return stream.read(length)
        if "chunked" not in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            return b""
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise PayloadTooLarge(f"request body is over this call's limit of {limit} bytes")
        return raw

    @staticmethod
    def _parse(raw: bytes) -> Any:  # a JSON body before validation: any JSON value
        if not raw:
            return {}  # as DRF: an empty body is an empty object
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"malformed JSON: {exc}", "malformed_json") from None
