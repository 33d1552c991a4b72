"""Every API error is JSON: ``{"error": <code>, "detail": <what is wrong>}``.

The one place an exception becomes an HTTP answer (:func:`error_answer`): the service's errors
carry theirs (``queues.errors``), the stores' and Django's and DRF's map here. Views, the fast
path and the checks they call raise and never build error responses.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import redis
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, JsonResponse
from django.http.response import HttpResponseBase
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import set_rollback

from queues import service
from queues.errors import Fault, ServiceError, Unavailable
from queues.service.errors import NOT_FOUND_CODES

__all__ = ["NOT_FOUND_CODES", "STORE_OUTAGES", "api_error", "domain_error", "error_answer", "exception_handler"]


def _record_failure() -> None:
    try:
        service.get_runtime().record_failure()
    except Exception:  # noqa: BLE001, S110 - figures must never break an answer
        pass


log = logging.getLogger(__name__)


#: DRF's exceptions (raised by DRF itself: its parsers, authentication, permissions, throttles
#: and routing) -> the answer's ``error``. The service's own errors carry theirs.
_DRF_CODES: dict[type[exceptions.APIException], str] = {
    exceptions.ParseError: "malformed_json",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
    exceptions.ValidationError: "invalid",
}


#: What a store that is down, restarting or unreachable raises below the service layer's own
#: types: the database's connection errors (psycopg's, through Django: OperationalError covers
#: a refused or cut connection and a query past the client's deadline, InterfaceError a
#: connection already closed) and redis-py's connection errors and timeouts. IntegrityError
#: (409) and programming errors stay what they are.
STORE_OUTAGES = (OperationalError, InterfaceError, redis.ConnectionError, redis.TimeoutError)


def domain_error(exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str]] | None:
    """``(status, payload, headers)`` for the service's own exceptions (each carries its
    answer: ``queues.errors``) and for the stores' and Django's below them, else None."""
    if isinstance(exc, ServiceError):
        if isinstance(exc, Fault):  # this node's bug: answered as any other (logged, no words)
            return None
        if isinstance(exc, Unavailable):
            log.warning("unavailable: %s", exc)
            if exc.node_failure:
                _record_failure()
        return exc.status, exc.body(), exc.headers()
    if isinstance(exc, DjangoValidationError):  # a model's full_clean, past the serializer
        detail = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        return 400, {"error": "invalid", "detail": detail}, {}
    if isinstance(exc, ObjectDoesNotExist):  # removed by a concurrent call (a delete racing this one)
        return 404, {"error": "not_found", "detail": f"removed by a concurrent call: {exc}"}, {}
    if isinstance(exc, IntegrityError):  # a concurrent change got there first (a race)
        return 409, {"error": "conflict", "detail": "changed concurrently by another call; retry"}, {}
    if isinstance(exc, STORE_OUTAGES):
        # The database or a Redis (the key-value store outside its own wrapper, the cache)
        # cut, restarted or not answering within its timeout: nothing this call changed was
        # confirmed, and the same call may succeed in a moment. Django drops the broken
        # connection when the request ends (close_old_connections), so the retry reconnects.
        log.warning("store unavailable: %s: %s", type(exc).__name__, exc)
        return 503, {"error": "unavailable", "detail": f"a store is unavailable; retry: {exc}"}, {"Retry-After": "1"}
    return None


def api_error(exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str]] | None:
    """The same for DRF's exceptions (401, 404, 405, 415, 429 ...), else None."""
    if isinstance(exc, Http404):  # as DRF's handler does (e.g. ?format=xml), so the code is not "error"
        exc = exceptions.NotFound(*exc.args)
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(*exc.args)
    if not isinstance(exc, exceptions.APIException):
        return None
    code = next((c for t, c in _DRF_CODES.items() if isinstance(exc, t)), "error")
    detail = exc.detail
    if isinstance(detail, dict) and "detail" in detail:
        detail = detail["detail"]
    headers: dict[str, str] = {}
    # Throttled.wait is set in its __init__; the stubs leave it out
    if isinstance(exc, exceptions.Throttled) and exc.wait:  # type: ignore[attr-defined]
        headers["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]
    return exc.status_code, {"error": code, "detail": detail}, headers


def error_answer(exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str]] | None:
    """``(status, payload, headers)`` of the API's answer to ``exc``, the one place an exception
    becomes an HTTP answer (the views' handler and the fast path both answer with it); None for
    a bug (answered 500 by the caller, logged)."""
    return domain_error(exc) or api_error(exc)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's ``EXCEPTION_HANDLER``: :func:`error_answer` as a response; for DRF's own exceptions
    what DRF's handler adds too (an ``auth_header``'s WWW-Authenticate, the rollback)."""
    answer = domain_error(exc)
    if answer is None:
        answer = api_error(exc)
        if answer is None:
            return None
        auth_header = getattr(exc, "auth_header", None)
        if auth_header:
            answer[2]["WWW-Authenticate"] = auth_header
        set_rollback()
    status_code, payload, headers = answer
    return Response(payload, status=status_code, headers=headers)


class OutageMiddleware:
    """An outage met outside the API's views (the console's pages and forms: a store or the
    database not answering) is answered 503 with Retry-After, as the API answers it, not 500.
    The API's views answer their own errors first (``exception_handler``); an outage met in
    another middleware (a session saved as the response leaves) reaches :func:`json_500`."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> JsonResponse | None:
        return outage_response(exc)


def outage_response(exc: BaseException | None) -> JsonResponse | None:
    """503 with Retry-After if ``exc`` is an outage (ours or a store's), else None."""
    if not isinstance(exc, (Unavailable, *STORE_OUTAGES)):
        return None
    answer = domain_error(exc)
    if answer is None:
        return None
    status_code, payload, headers = answer
    return JsonResponse(payload, status=status_code, headers=headers)


def json_404(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse({"error": "not_found", "detail": f"no such path: {request.path}"}, status=404)


def json_500(request: HttpRequest) -> JsonResponse:
    """Django's answer to an exception no view or middleware answered; it runs while that
    exception is handled, so an outage met where no :class:`OutageMiddleware` sees it (another
    middleware's) is still 503 with Retry-After."""
    outage = outage_response(sys.exc_info()[1])
    if outage is not None:
        # logged already, as one warning (domain_error): not again by Django with its traceback
        outage._has_been_logged = True  # type: ignore[attr-defined]
        return outage
    return JsonResponse({"error": "server_error", "detail": "internal error; see the node's log"}, status=500)
