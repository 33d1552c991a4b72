"""The SQS endpoint: one view under ``/sqs/`` (queue URLs ``http://<node>/sqs/<account>/<queue>``).

Every call: check the SigV4 signature against an active ``AccessKey`` of an active user, decode
the protocol (AWS JSON 1.0 by ``X-Amz-Target``; else the query protocol's ``Action=...``), run
the action as that user (``actions``), encode the answer or the error in the same protocol.
A store or database outage is ServiceUnavailable (503, Retry-After), never a 500.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from queues import service
from queues.auth import caller_of

from . import actions, query, sigv4, wire
from .errors import SQSError
from .models import AccessKey

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
            form = {**request.GET.dict(), **request.POST.dict()}
            try:
                action, params = query.decode(form)
            except query.QueryError as exc:
                raise SQSError(exc.code, exc.message, exc.status, exc.sender_fault) from None
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
    return _respond((200, {"Content-Type": XML}, query.encode(action, result, request_id)), request_id)


#: The query protocol's answers, as SQS sends them.
XML = "text/xml"


def _error(err: SQSError, json_protocol: bool, request_id: str) -> HttpResponse:
    if json_protocol:
        return _respond(wire.encode_error(err), request_id)
    headers = {"Content-Type": XML}
    if err.retry_after is not None:
        headers["Retry-After"] = f"{err.retry_after:g}"
    body = query.encode_error(err.code, err.message, err.sender_fault, request_id)
    return _respond((err.status, headers, body), request_id)


@csrf_exempt
def root_endpoint(request: HttpRequest) -> HttpResponse:
    """``POST /``: the SQS endpoint for clients configured with a host and port only."""
    if request.method != "POST":
        raise Http404("nothing here: the REST API is under /api/v1/, the SQS API under /sqs/")
    return endpoint(request)
