"""Whether a request's headers name an SQS access key this node knows, for the body gate
(``queues.api.bodies``): such a request's body goes to the SQS view whole, where SigV4 checks
it. Any other caller's SQS call goes to the view unread (``is_sqs_call``), which refuses it
before its body, in SQS's words."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs

from queues.api.front import Refusal
from sqs import sigv4, wire
from sqs.errors import CODES, SQSError

#: the access key ID of a SigV4 ``Authorization`` header (``Credential=AKID/date/region/...``)
_HEADER_KEY = re.compile(r"AWS4-HMAC-SHA256\s.*?Credential=([^/,\s]+)/")


def is_sqs_call(environ: dict[str, Any]) -> bool:
    """Whether the request goes to the SQS view (``/sqs/...``, or ``POST /``), which finds its
    access key from the headers and refuses an unknown one before it reads the body."""
    path = environ.get("PATH_INFO", "")
    return path.startswith("/sqs/") or (path == "/" and environ.get("REQUEST_METHOD") == "POST")


def access_key_known(environ: dict[str, Any]) -> bool:
    """True when the request is signed (header or presigned URL) with an active access key."""
    from sqs.models import AccessKey

    match = _HEADER_KEY.match(environ.get("HTTP_AUTHORIZATION", ""))
    if match is not None:
        key_id = match[1]
    else:
        query = environ.get("QUERY_STRING", "")
        if "X-Amz-Credential" not in query:
            return False
        key_id = parse_qs(query).get("X-Amz-Credential", [""])[0].partition("/")[0]
    if not key_id or len(key_id) > 32:
        return False
    return AccessKey.objects.filter(access_key_id=key_id, revoked_at__isnull=True).exists()


# --- the node's front (queues.api.front): before the body, and its refusals in SQS's words ------
def _sqs_path(method: str, path: str) -> bool:
    return path == "/sqs" or path.startswith("/sqs/") or (path == "/" and method == "POST")


def _refusal(err: SQSError, headers: Any) -> Refusal:
    from sqs.views import error_answer

    status, out, body = error_answer(err, wire.is_json_request(headers))
    return Refusal(status, out, body)


def pre_body(method: str, path: str, query: str, headers: Any) -> Refusal | None:
    """An SQS call whose signature cannot be valid, whatever its body (``sigv4.check_claim``),
    refused before the body is read; None for any other request."""
    if not _sqs_path(method, path):
        return None
    try:
        sigv4.check_claim(sigv4.claim(query, headers), headers, True)
    except sigv4.SignatureError as exc:
        return _refusal(SQSError(exc.code, exc.message, exc.status), headers)
    return None


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
    code = _FRONT_CODES.get(status, "InternalFailure")
    keep = status if code not in CODES else None
    return _refusal(SQSError(code, detail, keep, retry_after=retry_after), headers)
