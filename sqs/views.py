"""The SQS endpoint: one view under ``/sqs/`` (queue URLs ``http://<node>/sqs/<account>/<queue>``).

Every call: check the SigV4 signature against an active ``AccessKey`` of an active user, decode
the protocol (AWS JSON 1.0 by ``X-Amz-Target``; else the query protocol's ``Action=...``), run
the action as that user (``actions``), encode the answer or the error in the same protocol.
A store or database outage is ServiceUnavailable (503, Retry-After), never a 500.
"""

from __future__ import annotations

import importlib
import logging
import uuid
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from queues import service
from queues.auth import caller_of

from . import actions, sigv4, wire
from .errors import SQSError
from .models import AccessKey

#: The query protocol's codec (``Action=...`` form posts, XML answers), pure functions:
#: ``decode_request(form: dict[str, str]) -> (action, params)`` (params in the JSON protocol's
#: shape), ``encode_response(action, result, request_id) -> (status, headers, body)`` and
#: ``encode_error(err: SQSError, request_id) -> (status, headers, body)``. Without it, only
#: the JSON protocol is served.
query: Any
try:
    query = importlib.import_module("sqs.query")
except ImportError:  # pragma: no cover - not there yet
    query = None

log = logging.getLogger(__name__)


def _headers(request: HttpRequest) -> dict[str, str]:
    """The request's headers in lower case, as signed (Host and Content-Type included)."""
    out = {k.lower(): v for k, v in request.headers.items()}
    return out


def _authenticate(request: HttpRequest, headers: dict[str, str], body: bytes) -> tuple[AccessKey, sigv4.Credential]:
    keys: dict[str, AccessKey] = {}

    def secret_of(key_id: str) -> str | None:
        key = (
            AccessKey.objects.filter(access_key_id=key_id, revoked_at__isnull=True, user__is_active=True)
            .select_related("user")
            .first()
        )
        if key is None:
            return None
        keys[key_id] = key
        return key.secret

    raw_path = request.META.get("RAW_URI") or request.get_full_path()
    req = sigv4.Request(
        request.method or "POST",
        raw_path.split("?", 1)[0],
        request.META.get("QUERY_STRING", ""),
        headers,
        body,
    )
    try:
        cred = sigv4.verify(req, secret_of)
    except sigv4.SignatureError as exc:
        raise SQSError(exc.code, exc.message, exc.status) from None
    return keys[cred.access_key_id], cred


def _respond(answer: tuple[int, dict[str, str], bytes], request_id: str) -> HttpResponse:
    status, headers, body = answer
    response = HttpResponse(body, status=status)
    for k, v in headers.items():
        response[k] = v
    response["x-amzn-RequestId"] = request_id
    return response


@csrf_exempt
def endpoint(request: HttpRequest, rest: str = "") -> HttpResponse:
    request_id = str(uuid.uuid4())
    headers = _headers(request)
    body = request.body
    json_protocol = wire.is_json_request(headers)
    form: dict[str, Any] = {}
    try:
        if request.method not in ("POST", "GET"):
            raise SQSError("InvalidAction", "SQS calls are POST (or GET with the query protocol)")
        key, cred = _authenticate(request, headers, body)
        if json_protocol:
            action, params = wire.decode(headers, body)
        else:
            if query is None:
                raise SQSError("InvalidAction", "the query protocol is not served by this node; use AWS JSON 1.0")
            form = {**request.GET.dict(), **request.POST.dict()}
            action, params = query.decode_request(form)
        ctx = actions.Context(
            caller=caller_of(key.user),
            base_url=f"{request.scheme}://{request.get_host()}/sqs",
            account=settings.SQS_ACCOUNT_ID,
            region=cred.region,
            access_key_id=key.access_key_id,
        )
        key.touch()
        result = actions.run(action, params, ctx)
    except SQSError as err:
        return _error(err, json_protocol, request_id)
    except (service.KVError, DatabaseError) as exc:
        return _error(
            SQSError("ServiceUnavailable", f"unavailable now, retry: {exc}", retry_after=1), json_protocol, request_id
        )
    except Exception:
        log.exception("SQS call failed")
        return _error(SQSError("InternalFailure", "The request processing has failed."), json_protocol, request_id)
    if json_protocol:
        return _respond(wire.encode(result), request_id)
    assert query is not None
    return _respond(query.encode_response(action, result, request_id), request_id)


def _error(err: SQSError, json_protocol: bool, request_id: str) -> HttpResponse:
    if json_protocol or query is None:
        return _respond(wire.encode_error(err), request_id)
    return _respond(query.encode_error(err, request_id), request_id)


@csrf_exempt
def root_endpoint(request: HttpRequest) -> HttpResponse:
    """``POST /``: the SQS endpoint for clients configured with a host and port only."""
    if request.method != "POST":
        raise Http404("nothing here: the REST API is under /api/v1/, the SQS API under /sqs/")
    return endpoint(request)
