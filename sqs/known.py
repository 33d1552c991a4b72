"""Whether a request's headers name an SQS access key this node knows, for the body gate
(``queues.http.bodies``): such a request's body goes to the SQS view whole, where SigV4 checks
it. Any other caller's SQS call goes to the view unread (``is_sqs_call``), which refuses it
before its body, in SQS's words."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs

from queues.http.front import Refusal
from sqs import sigv4, wire
from sqs.errors import CODES, SQSError
from sqs.keys import active_key

#: the access key ID of a SigV4 ``Authorization`` header (``Credential=AKID/date/region/...``)
_HEADER_KEY = re.compile(r"AWS4-HMAC-SHA256\s.*?Credential=([^/,\s]+)/")


def is_sqs_call(environ: dict[str, Any]) -> bool:
    """Whether the request goes to the SQS view (``/sqs/...``, or ``POST /``), which finds its
    access key from the headers and refuses an unknown one before it reads the body."""
    path = environ.get("PATH_INFO", "")
    return path.startswith("/sqs/") or (path == "/" and environ.get("REQUEST_METHOD") == "POST")


def _key_id(environ: dict[str, Any]) -> str | None:
    """The access key ID the request's signature names (header or presigned URL), if any."""
    match = _HEADER_KEY.match(environ.get("HTTP_AUTHORIZATION", ""))
    if match is not None:
        key_id = match[1]
    else:
        query = environ.get("QUERY_STRING", "")
        if "X-Amz-Credential" not in query:
            return None
        key_id = parse_qs(query).get("X-Amz-Credential", [""])[0].partition("/")[0]
    return key_id if key_id and len(key_id) <= 32 else None


def access_key_known(environ: dict[str, Any]) -> bool:
    """True when the request is signed (header or presigned URL) with an active access key."""
    from sqs.models import AccessKey

    key_id = _key_id(environ)
    return key_id is not None and AccessKey.objects.filter(access_key_id=key_id, revoked_at__isnull=True).exists()


# --- the node's front (queues.http.front): before the body, and its refusals in SQS's words ------
def _sqs_path(method: str, path: str) -> bool:
    return path == "/sqs" or path.startswith("/sqs/") or (path == "/" and method == "POST")


def _refusal(err: SQSError, headers: Any) -> Refusal:
    from sqs.views import error_answer

    status, out, body = error_answer(err, wire.is_json_request(headers))
    return Refusal(status, out, body)


def pre_body(method: str, path: str, query: str, headers: Any) -> Refusal | None:
    """An SQS call refused before its body is read, whatever the body: a body longer than the
    endpoint takes (``sqs.views.MAX_REQUEST_BYTES``: 413 RequestEntityTooLarge), a signature
    that cannot be valid (``sigv4.check_claim``). None for any other request."""
    if not _sqs_path(method, path):
        return None
    from sqs.views import MAX_REQUEST_BYTES

    length = headers.get("content-length") or "0"
    if length.isascii() and length.isdigit() and int(length) > MAX_REQUEST_BYTES:
        message = f"the request body of {length} bytes is over the limit of {MAX_REQUEST_BYTES} bytes"
        return _refusal(SQSError("RequestEntityTooLarge", message, 413), headers)
    try:
        sigv4.check_claim(sigv4.claim(query, headers), headers, True)
    except sigv4.SignatureError as exc:
        return _refusal(exc, headers)
    return None


def unknown_key(environ: dict[str, Any]) -> tuple[str, str, str, list[tuple[str, str]]] | None:
    """An SQS call whose access key is unknown, revoked or of an inactive user, refused by its
    headers (``queues.http.bodies.before_body``: a request thread, the database may be asked)
    before its body is read, as the view refuses it; None for any other request."""
    if not is_sqs_call(environ):
        return None
    key_id = _key_id(environ)
    if key_id is not None and active_key(key_id) is not None:
        return None
    if key_id is None and not environ.get("HTTP_AUTHORIZATION") and "X-Amz-" not in environ.get("QUERY_STRING", ""):
        return None  # unsigned: the view answers MissingAuthenticationToken (or a GET's 404)
    return "403 Forbidden", "InvalidClientTokenId", "The security token included in the request is invalid.", []


#: the front's refusals (HTTP status) as SQS's errors
_FRONT_CODES = {
    400: "MalformedQueryString",
    408: "RequestTimeout",
    413: "RequestEntityTooLarge",
    429: "RequestThrottled",
    503: "ServiceUnavailable",
}


def render_refusal(
    path: str, headers: Any, status: int, error: str, detail: str, retry_after: float | None
) -> Refusal | None:
    """The front's refusal of an SQS call in SQS's protocol (RequestThrottled for a share taken:
    what SDKs back off from and retry)."""
    if not (path == "/sqs" or path.startswith("/sqs/") or path == "/"):
        return None
    code = error if error in CODES else _FRONT_CODES.get(status, "InternalFailure")
    keep = status if code not in CODES else None
    return _refusal(SQSError(code, detail, keep, retry_after=retry_after), headers)
