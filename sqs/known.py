"""Whether a request's headers name an SQS access key this node knows, for the body gate
(``queues.api.bodies``): such a request's body goes to the SQS view whole, where SigV4 checks
it. Any other caller's SQS call goes to the view unread (``is_sqs_call``), which refuses it
before its body, in SQS's words."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs

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
