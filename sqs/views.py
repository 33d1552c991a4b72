"""The SQS endpoint: one view under ``/sqs/`` (queue URLs ``http://<node>/sqs/<region>/<account>/<queue>``).

Every call: find the active ``AccessKey`` of an active user that the call names before reading
its body (none: refused unread), read the body to a bound, check the SigV4 signature with the
key's secret, count the call against the user's rate as the REST API does, decode the protocol
(AWS JSON 1.0 by ``X-Amz-Target``, which must be signed; else the query protocol's
``Action=...``, in a POST's form or a GET's query string, at the service's endpoint or at a
queue's URL, whose queue it then acts on), run the action as that user (``actions``), encode
the answer or the error in the same protocol. A GET that names no action is SQS's 404
``UnknownOperationException``, answered before anything is looked up. Past a per-user limit
(call rate, concurrent long polls) the answer is SQS's throttling error, ``RequestThrottled``.
A store or database outage is ServiceUnavailable (503, Retry-After), never a 500.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import logging
import uuid
from functools import lru_cache

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.utils.crypto import salted_hmac
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions

from mq_client.tracing import traceparent_of_xray, valid_traceparent, valid_xray
from queues import service, tracing
from queues.http import served_header, throttles
from queues.http.auth import caller_of_id
from queues.http.direct import DirectAnswer
from queues.service import served
from sqs import actions, query, sigv4, wire
from sqs.context import Context, shown, sqs_error
from sqs.errors import SQSError
from sqs.keys import ActiveKey, active_key

log = logging.getLogger(__name__)


#: The most bytes of an SQS request's body, refused by its Content-Length before a byte is read
#: (413): a batch's bodies at the most any queue allows (1 MiB in all), each byte of them up to
#: three once percent-encoded or JSON-escaped, and room for the rest of the call. Never more than
#: the node's limit for any request (``API_MAX_REQUEST_BYTES``).
MAX_REQUEST_BYTES = 4 * 1024 * 1024 + 64 * 1024


def _headers(request: HttpRequest) -> dict[str, str]:
    """The request's headers in lower case, as signed (Host and Content-Type included): those
    ``request.headers`` holds, read from the environ straight."""
    out = {}
    for k, v in request.META.items():
        # (the environ holds the server's keys and the process's environment too: most of its
        # keys are no header, and each is looked up once)
        name = _NAMES.get(k)
        if name is None:
            name = k[5:].replace("_", "-").lower() if k.startswith("HTTP_") else ""
            if len(_NAMES) < _MAX_NAMES:
                _NAMES[k] = name
        if name:
            out[name] = v
    return out


#: environ key -> header name ("": no header); the headers WSGI names without ``HTTP_`` given.
_NAMES: dict[str, str] = {"CONTENT_TYPE": "content-type", "CONTENT_LENGTH": "content-length"}
#: the most environ keys :data:`_NAMES` learns (header names are the callers' to choose).
_MAX_NAMES = 4096


def _key_of(request: HttpRequest, headers: dict[str, str]) -> tuple[ActiveKey, sigv4.Claim]:
    """The active key of an active user that the request names (its Authorization header, else
    a presigned query string), found before a byte of the body is read: a call that names none,
    or a key unknown, revoked or of an inactive user, is refused with its body unread. With
    what the signature claims, which ``_authenticate`` checks."""
    claimed = sigv4.claim(request.META.get("QUERY_STRING", ""), headers)  # (a SignatureError: an SQSError)
    key = active_key(claimed.cred.access_key_id)
    if key is None:
        raise SQSError("InvalidClientTokenId", "The security token included in the request is invalid.")
    return key, claimed


def _body(request: HttpRequest) -> bytes:
    """The body, refused (413) by its Content-Length before it is read when over the limit."""
    length = request.META.get("CONTENT_LENGTH") or "0"
    if not (length.isascii() and length.isdigit()):
        raise SQSError("MalformedQueryString", f"Content-Length must be a number of bytes, got {shown(length)!r}")
    limit = min(MAX_REQUEST_BYTES, settings.API_MAX_REQUEST_BYTES)
    # (a length of more digits than the limit's is over it, never converted: int() refuses
    # text of more than 4,300 digits)
    if len(length.lstrip("0")) > len(str(limit)) or int(length) > limit:
        raise SQSError(
            "RequestEntityTooLarge",
            f"the request body of {shown(length)} bytes is over the limit of {limit} bytes",
            413,
        )
    return request.body


def _authenticate(
    request: HttpRequest, headers: dict[str, str], body: bytes, key: ActiveKey, claimed: sigv4.Claim
) -> sigv4.Credential:
    """The credential of the request, signed with ``key``'s secret, as ``claimed`` (``_key_of``)."""
    raw_path = request.META.get("RAW_URI") or request.get_full_path()
    req = sigv4.Request(
        request.method or "POST",
        raw_path.split("?", 1)[0],
        request.META.get("QUERY_STRING", ""),
        headers,
        body,
    )
    # (a SignatureError: an SQSError)
    cred = sigv4.verify(req, lambda key_id: key.secret if key_id == key.access_key_id else None, claimed=claimed)
    if "x-amz-target" in headers and "x-amz-target" not in cred.signed_headers:
        # The target is the action: unsigned, it could turn a signed call into any other.
        raise SQSError("IncompleteSignature", "the signature must cover the X-Amz-Target header", 400)
    return cred


def _region(cred: sigv4.Credential) -> str:
    """The region the call is served in: the node's one (``SQS_REGION``), which a call signed for
    another is refused for; else the one it is signed for (every region one namespace)."""
    region: str = settings.SQS_REGION
    if not region:
        return cred.region
    if cred.region != region:
        raise SQSError(
            "SignatureDoesNotMatch",
            f"Credential should be scoped to a valid region, not '{cred.region}': this endpoint serves {region}",
            403,
        )
    return region


def _form(request: HttpRequest, body: bytes) -> dict[str, str]:
    """The query protocol's parameters: the query string's and the body's (a form, when its
    Content-Type says so: ``query.parse_form``), neither overriding the other (a parameter in
    both is refused)."""
    content_type, _, options = (request.META.get("CONTENT_TYPE") or "").partition(";")
    posted: dict[str, str] = {}
    if content_type.strip().lower() == "application/x-www-form-urlencoded":
        posted = query.parse_form(body, _charset(options), settings.DATA_UPLOAD_MAX_NUMBER_FIELDS)
    both = request.GET.keys() & posted.keys()
    if both:
        raise SQSError(
            "InvalidParameterValue",
            f"the parameter {sorted(both)[0]} is both in the query string and in the body: send it once",
        )
    return {**request.GET.dict(), **posted}


def _charset(options: str) -> str:
    """The ``charset`` of a Content-Type's options if it is a text encoding that writes ASCII
    as ASCII (a form is split at ``&`` and ``=`` before it is decoded), else UTF-8 (SQS's)."""
    for option in options.split(";"):
        name, _, value = option.partition("=")
        if name.strip().lower() == "charset":
            return _text_codec(value.strip().strip('"')) or "utf-8"
    return "utf-8"


@lru_cache(maxsize=64)
def _text_codec(name: str) -> str | None:
    """The codec ``name`` names, if it reads and writes ASCII as ASCII and reads any byte;
    else None (asked on every form: botocore names ``utf-8`` in each)."""
    with contextlib.suppress(Exception):  # no codec, or one that is not a text encoding
        codec = codecs.lookup(name)
        if codec.encode(_ASCII)[0] == _ASCII.encode() and codec.decode(_ASCII.encode())[0] == _ASCII:
            codec.decode(b"\xff\xfe", "replace")  # and reads any byte (idna refuses to)
            return codec.name
    return None


#: what a form's charset must read and write as ASCII does.
_ASCII = "&=%+.-_~ azAZ09"


def _throttle(key: ActiveKey) -> None:
    """The REST API's per-user call rate (``API_THROTTLE_USER``), counted in the same windows:
    past it, SQS's throttling error (400 RequestThrottled, which SDKs back off from and retry)."""
    try:
        throttles.check_user(key.user_id)
    except exceptions.Throttled as exc:
        wait = max(1.0, float(getattr(exc, "wait", None) or 1))  # DRF sets it; its stubs omit it
        raise SQSError(
            "RequestThrottled",
            f"Request was throttled: over this user's call rate; retry in {wait:g} s",
            retry_after=wait,
        ) from None


def sender_id(user_id: object) -> str:
    """The SenderId of a user's messages: opaque and stable for the user, AWS-like (``AIDA`` and
    17 upper-case letters and digits), derived with an HMAC keyed by ``SECRET_KEY`` so that it
    names neither the user nor a credential of theirs."""
    return _sender_id(str(user_id), settings.SECRET_KEY)


@lru_cache(maxsize=4096)
def _sender_id(user_id: str, secret: str) -> str:
    digest = salted_hmac("sqs.sender-id", user_id, secret=secret, algorithm="sha256").digest()
    return "AIDA" + base64.b32encode(digest).decode("ascii")[:17]


def _respond(answer: tuple[int, dict[str, str], bytes], request_id: str) -> DirectAnswer:
    """The answer as the fast path takes it: (status, headers in order, body); its headers are
    the protocol's (Content-Type first) and the request's ID."""
    status, headers, body = answer
    return status, [*headers.items(), ("x-amzn-RequestId", request_id)], body


def _http(answer: DirectAnswer) -> HttpResponse:
    """The answer as Django's response (the same status, headers and body)."""
    status, headers, body = answer
    response = HttpResponse(body, status=status)
    for k, v in headers:
        response[k] = v
    return response


@csrf_exempt
def endpoint(request: HttpRequest, rest: str = "") -> HttpResponse:
    """One SQS call (:func:`serve`) through Django."""
    return _http(serve(request, rest))


def serve(request: HttpRequest, rest: str = "") -> DirectAnswer:
    """One SQS call. Its key is looked up before the body is read (unknown: refused unread),
    the body read to ``MAX_REQUEST_BYTES``, the signature checked, the user's rate counted.
    With ``SERVED_BY_HEADER``, the answer names the partition managers that served it."""
    token = served.begin()
    if token is None:
        return _serve(request, rest)
    try:
        status, headers, body = _serve(request, rest)
    finally:
        served_by = served.end(token)
    return status, [*headers, *served_header.header_items(served_by)], body


def _serve(request: HttpRequest, rest: str) -> DirectAnswer:
    request_id = str(uuid.uuid4())
    headers = _headers(request)
    json_protocol = wire.is_json_request(headers)
    if request.method == "GET" and not json_protocol and not request.GET.get("Action"):
        # No action: no call of the query protocol, whose GETs name theirs in the query string.
        # SQS answers it unsigned or signed alike, before anything else (nothing to read here).
        return _respond((404, {"Content-Type": XML}, UNKNOWN_OPERATION), request_id)
    try:
        if request.method not in ("POST", "GET"):
            raise SQSError("InvalidAction", "SQS calls are POST (or GET with the query protocol)")
        key, claimed = _key_of(request, headers)
        body = _body(request)
        cred = _authenticate(request, headers, body, key, claimed)
        _throttle(key)
        region = _region(cred)
        base_url = f"{request.scheme}://{request.get_host()}/sqs"
        if json_protocol:
            action, params = wire.decode(headers, body)
        else:
            # At a queue's URL (any path under /sqs/), the queue is the path's (the QueueUrl a
            # form names wins, as in SQS).
            path = rest.strip("/")
            queue_url = f"{base_url}/{path}" if path else None
            action, params = query.decode(_form(request, body), queue_url)  # (a QueryError: an SQSError)
        try:
            caller = caller_of_id(key.user_id)
        except exceptions.AuthenticationFailed:  # its user deleted or made inactive just now
            raise SQSError("InvalidClientTokenId", "The security token included in the request is invalid.") from None
        ctx = Context(
            caller=caller,
            base_url=base_url,
            account=settings.SQS_ACCOUNT_ID,
            region=region,
            sender_id=sender_id(key.user_id),
            trace_header=_xray_header(headers),
        )
        key.touch()
        call = service.begin_call()
        trace_token = None
        try:
            trace_token = _attach_trace(headers) if tracing.ON else None
            result = actions.run(action, params, ctx)
        finally:
            tracing.detach(trace_token)
            service.end_call(call)
    except Exception as exc:
        err = sqs_error(exc)
        if err is None:
            log.exception("SQS call failed")
            err = SQSError("InternalFailure", "The request processing has failed.")
        return _error(err, json_protocol, request_id)
    if json_protocol:
        return _respond(wire.encode(result), request_id)
    return _respond((200, {"Content-Type": XML}, query.encode(action, result, request_id)), request_id)


def _xray_header(headers: dict[str, str]) -> str:
    """The request's ``X-Amzn-Trace-Id``, ``""`` when it is none or not an X-Ray trace header.
    A transport header, and not signed (SDKs leave it out of the signature, as a proxy may add
    or change it): one that is not X-Ray's is dropped, never copied into the call's messages."""
    header = headers.get("x-amzn-trace-id", "")
    return header if header and valid_xray(header) else ""


def _attach_trace(headers: dict[str, str]) -> object | None:
    """The caller's trace context, current for the call: its ``traceparent``, else its X-Ray
    header (``X-Amzn-Trace-Id``, the one SQS clients send)."""
    parent = headers.get("traceparent", "")
    if not valid_traceparent(parent):
        parent = traceparent_of_xray(headers.get("x-amzn-trace-id", "")) or ""
    return tracing.attach(parent, headers.get("tracestate"))


def direct_endpoint(request: HttpRequest, rest: str) -> DirectAnswer:
    """:func:`endpoint` as the fast path calls it, without Django's middleware (``POST /sqs/...``):
    the view reads no session, cookie or CSRF token, and finds its caller itself; its answer
    is handed back as it is, with no Django response made of it."""
    return serve(request, rest)


#: The query protocol's answers, as SQS sends them.
XML = "text/xml"
#: SQS's answer (404) to a GET that names no action.
UNKNOWN_OPERATION = b"<UnknownOperationException/>"


def error_answer(err: SQSError, json_protocol: bool) -> DirectAnswer:
    """``err`` as the endpoint answers it, with a request ID of its own."""
    return _error(err, json_protocol, str(uuid.uuid4()))


def _error(err: SQSError, json_protocol: bool, request_id: str) -> DirectAnswer:
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
