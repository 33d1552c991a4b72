"""Whether a request's headers name an SQS access key this node knows, for the body gate
(``queues.api.bodies``): such a request's body goes to the SQS view whole, where SigV4 checks
it; any other caller's body is refused past a few KB, or read under a deadline, before it."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs

#: the access key ID of a SigV4 ``Authorization`` header (``Credential=AKID/date/region/...``)
_HEADER_KEY = re.compile(r"AWS4-HMAC-SHA256\s.*?Credential=([^/,\s]+)/")


def access_key_known(environ: dict[str, Any]) -> bool:
    """True when the request is signed (header or presigned URL) with an active access key."""
    from .models import AccessKey

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
