"""A WSGI fast path in front of Django for the four message calls.

Measured in-process (``bench/`` notes): Django's middleware, DRF's request wrapping and content
negotiation cost about 500 µs a call, against 15 µs for enqueueing one message. The message
calls are most of a queue's traffic, so for ``POST /api/v1/queues/<name>/{enqueue, dequeue,
ack, visibility}`` with a ``Token`` header and a JSON body this layer authenticates (the same
cached token check as DRF), parses with orjson, and calls the very functions the DRF views call
(``calls``) as the same :class:`~queues.access.Caller` (the token's user; for a node, the user
named by ``X-MQ-On-Behalf-Of``: without it a node may make none of these calls), mapping errors
with the same functions as the DRF exception handler.

Everything else, and every request it is not sure about (no token, a session cookie, another
content type, another method), goes to Django and DRF unchanged; so do the schema and the
browsable API. The integration tests send the hostile-input matrix through both paths.
"""

from __future__ import annotations

import logging
import re
import time
from http import HTTPStatus

import orjson
from django.db import close_old_connections
from rest_framework import exceptions

from .. import metrics
from ..auth import CachedTokenAuthentication, ClusterPeer, caller_of, caller_on_behalf_of, request_caller
from ..router import cluster_secret_ok, hops_of
from . import calls, throttles
from .errors import PayloadTooLarge, api_error, domain_error

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


class FastPath:
    def __init__(self, app):
        self.app = app
        self.auth = CachedTokenAuthentication()

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        match = _PATH.match(environ.get("PATH_INFO", ""))
        if match is None:
            return self.app(environ, start_response)
        scheme, _, key = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        key = key.strip()
        peer = environ.get("HTTP_X_MQ_CLUSTER_SECRET")
        content_type = environ.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
        if content_type != "application/json" or (
            peer is None and (scheme.lower() != "token" or not key or " " in key)
        ):
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
        try:
            if peer is not None:
                if not cluster_secret_ok(peer):
                    raise exceptions.AuthenticationFailed("bad cluster secret")
                on_behalf = environ.get("HTTP_X_MQ_ON_BEHALF_OF")
                caller = request_caller(ClusterPeer(caller_on_behalf_of(on_behalf) if on_behalf is not None else None))
            else:
                user, _ = self.auth.authenticate_credentials(key)
                throttles.check_user(user.pk)
                caller = caller_of(user)
            hops = hops_of(environ.get("HTTP_X_MQ_HOPS"))
            # The caller's right and the queue's limits before a byte of the body is read.
            limit = calls.body_limit(call, name, caller=caller)
            status, payload = calls.CALLS[call](
                name, self._body(environ, limit), hops, trusted=peer is not None, caller=caller
            )
        except Exception as exc:
            mapped = domain_error(exc) or api_error(exc)
            if mapped is None:
                log.exception("fast path: %s %s", call, name)
                mapped = (500, {"error": "server_error", "detail": "internal error; see the node's log"}, {})
            status, payload, headers = mapped
            if isinstance(exc, exceptions.AuthenticationFailed):
                headers["WWW-Authenticate"] = self.auth.authenticate_header(None)
        finally:
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
            ],
        )
        return [body]

    @staticmethod
    def _body(environ, limit: int):
        """The JSON body, refused (413) by its ``Content-Length`` before it is read when over
        ``limit``; a chunked body (no length) is read to at most ``limit`` + 1 bytes."""
        length = int(environ.get("CONTENT_LENGTH") or 0)  # digits: checked by the caller
        if length > limit:
            raise PayloadTooLarge(f"request body of {length} bytes is over this call's limit of {limit} bytes")
        if length <= 0:
            if "chunked" not in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
                return {}  # as DRF: an empty body is an empty object
            raw = environ["wsgi.input"].read(limit + 1)
            if len(raw) > limit:
                raise PayloadTooLarge(f"request body is over this call's limit of {limit} bytes")
            if not raw:
                return {}
        else:
            raw = environ["wsgi.input"].read(length)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise exceptions.ParseError(f"malformed JSON: {exc}") from None
