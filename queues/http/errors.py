"""Every API error is JSON: ``{"error": <code>, "detail": <what is wrong>}``.

Domain errors map to statuses here, so views raise and never build error responses.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, JsonResponse
from django.http.response import HttpResponseBase
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from queues import service
from queues.errors import Fault, ServiceError, Unavailable
from queues.service.errors import NOT_FOUND_CODES

__all__ = ["NOT_FOUND_CODES", "STORE_OUTAGES", "BadRequest", "PayloadTooLarge", "api_error", "domain_error"]

if TYPE_CHECKING:
    from rest_framework.exceptions import _APIExceptionInput


def _record_failure() -> None:
    try:
        service.get_runtime().record_failure()
    except Exception:  # noqa: BLE001, S110 - figures must never break an answer
        pass


log = logging.getLogger(__name__)


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"
    default_detail = "request body too large"


class BadRequest(exceptions.APIException):
    """400 with a code of our own, so clients can tell errors apart without parsing text."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid"

    def __init__(self, detail: _APIExceptionInput, code: str = "invalid") -> None:
        super().__init__(detail, code)
        self.error_code = code


_DRF_CODES = {
    PayloadTooLarge: "payload_too_large",
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
    """The same for DRF's exceptions (400, 401, 404, 405, 413 ...), else None."""
    if not isinstance(exc, exceptions.APIException):
        return None
    if isinstance(exc, BadRequest):
        code = exc.error_code
    else:
        code = next((c for t, c in _DRF_CODES.items() if isinstance(exc, t)), "error")
    detail = exc.detail
    if isinstance(detail, dict) and set(detail) == {"detail"}:
        detail = detail["detail"]
    headers: dict[str, str] = {}
    # Throttled.wait is set in its __init__; the stubs leave it out
    if isinstance(exc, exceptions.Throttled) and exc.wait:  # type: ignore[attr-defined]
        headers["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]
    return exc.status_code, {"error": code, "detail": detail}, headers


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    mapped = domain_error(exc)
    if mapped is not None:
        status_code, payload, headers = mapped
        return Response(payload, status=status_code, headers=headers)
    # As DRF's handler does, so the code is not the generic "error" (e.g. ?format=xml: Http404).
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(*exc.args)
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(*exc.args)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, BadRequest):
        code = exc.error_code
    else:
        code = next((c for t, c in _DRF_CODES.items() if isinstance(exc, t)), "error")
    detail = response.data.get("detail", response.data) if isinstance(response.data, dict) else response.data
    response.data = {"error": code, "detail": detail}
    return response


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
