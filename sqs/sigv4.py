"""AWS Signature Version 4, checked by hand (stdlib ``hmac``/``hashlib``): in the
``Authorization`` header or in the query string (a presigned URL).

The canonical request is rebuilt from what arrived (method, path, query, the signed headers,
the payload's SHA-256) exactly as the AWS documentation and botocore build it, the signing key
derived from the key's secret and the credential scope, and the HMACs compared in constant
time. A request dated more than ``MAX_SKEW`` from now is refused, as SQS does, so a captured
request cannot be replayed later; a presigned URL lives at most ``MAX_EXPIRES``, as AWS's do.
A payload left unsigned (``UNSIGNED-PAYLOAD``, what presigned URLs declare) is accepted only for
a request without a body, so a signature never vouches for a body it did not cover.

:func:`claimed_credential` reads whose key a request names without its body: the endpoint looks
the key up before it reads a byte of the body.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from urllib.parse import parse_qsl, quote

from sqs.errors import SQSError

ALGORITHM = "AWS4-HMAC-SHA256"
#: SQS refuses a signature dated more than 15 minutes from its clock.
MAX_SKEW = 15 * 60
#: The longest a presigned URL may live (X-Amz-Expires, seconds): seven days, as AWS.
MAX_EXPIRES = 7 * 24 * 3600
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


class SignatureError(SQSError):
    """Why a request's signature is refused: ``code`` is SQS's error code (403 unless said)."""

    def __init__(self, code: str, message: str, status: int = 403):
        super().__init__(code, message, status)


@dataclass(frozen=True)
class Request:
    """What the signature covers, as it arrived."""

    method: str
    #: the path as sent (percent-encoded).
    path: str
    #: the raw query string.
    query: str
    #: header names in lower case.
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class Credential:
    access_key_id: str
    date: str
    region: str
    service: str
    #: the header names the signature covers (lower case); empty until verified.
    signed_headers: frozenset[str] = frozenset()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


@lru_cache(maxsize=1024)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """The key a day's signatures of one secret, region and service are made with: four HMACs,
    derived once per process for each (as AWS's SDKs keep it for the day)."""
    k = _hmac(("AWS4" + secret).encode("utf-8"), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def canonical_query(query: str, *, without: str = "") -> str:
    """Each name and value percent-encoded as SigV4 says (RFC 3986 unreserved kept), sorted."""
    if not query:
        return ""  # (a POST's: most calls)
    pairs = [(_encode(k), _encode(v)) for k, v in parse_qsl(query, keep_blank_values=True) if k != without]
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def canonical_request(req: Request, signed_headers: list[str], payload_hash: str, *, without: str = "") -> str:
    headers = "".join(f"{h}:{' '.join(req.headers.get(h, '').split())}\n" for h in signed_headers)
    # Services other than S3 encode the (already encoded) path once more: botocore does.
    path = quote(req.path or "/", safe="/~")
    return "\n".join(
        [
            req.method.upper(),
            path,
            canonical_query(req.query, without=without),
            headers,
            ";".join(signed_headers),
            payload_hash,
        ]
    )


def string_to_sign(amz_date: str, cred: Credential, canonical: str) -> str:
    scope = f"{cred.date}/{cred.region}/{cred.service}/aws4_request"
    return "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode("utf-8")).hexdigest()])


def _parse_credential(value: str) -> Credential:
    parts = value.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not parts[0]:
        raise SignatureError("IncompleteSignature", f"malformed credential scope {value!r}", 400)
    return Credential(parts[0], parts[1], parts[2], parts[3])


@lru_cache(maxsize=64)
def _parse_date(amz_date: str) -> datetime:
    try:
        return datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise SignatureError("IncompleteSignature", f"malformed X-Amz-Date {amz_date!r}", 400) from None


@dataclass(frozen=True)
class Claim:
    """What a request's signature says of itself, read from its headers or query string."""

    cred: Credential
    signed_headers: list[str]
    signature: str
    amz_date: str
    #: a presigned URL's lifetime (seconds); None for a signature in the Authorization header.
    expires: int | None
    #: the query parameter the canonical query leaves out (the signature itself, presigned).
    without: str


def claim(query_string: str, headers: Mapping[str, str]) -> Claim:
    """What a request's signature says of itself (Authorization header, else a presigned query
    string), read without its body and not verified. Raises SignatureError
    (MissingAuthenticationToken, IncompleteSignature, AuthorizationQueryParametersError)."""
    query = dict(parse_qsl(query_string, keep_blank_values=True)) if query_string else {}
    auth = headers.get("authorization", "")
    if auth:
        algorithm, _, rest = auth.partition(" ")
        if algorithm != ALGORITHM:
            raise SignatureError("IncompleteSignature", f"only {ALGORITHM} signatures are accepted", 400)
        fields = {}
        for item in rest.split(","):
            name, _, value = item.strip().partition("=")
            fields[name] = value
        if not {"Credential", "SignedHeaders", "Signature"} <= fields.keys():
            raise SignatureError(
                "IncompleteSignature", "Authorization needs Credential, SignedHeaders and Signature", 400
            )
        amz_date = headers.get("x-amz-date", "")
        if not amz_date:
            raise SignatureError("IncompleteSignature", "the request needs an X-Amz-Date header", 400)
        return Claim(
            _parse_credential(fields["Credential"]),
            fields["SignedHeaders"].split(";"),
            fields["Signature"],
            amz_date,
            None,
            "",
        )
    if "X-Amz-Signature" in query:
        if query.get("X-Amz-Algorithm") != ALGORITHM:
            raise SignatureError("IncompleteSignature", f"only {ALGORITHM} signatures are accepted", 400)
        try:
            expires = int(query.get("X-Amz-Expires", "900"))
        except ValueError:
            raise SignatureError("IncompleteSignature", "X-Amz-Expires must be a number of seconds", 400) from None
        if not 1 <= expires <= MAX_EXPIRES:
            raise SignatureError(
                "AuthorizationQueryParametersError",
                f"X-Amz-Expires must be between 1 and {MAX_EXPIRES} seconds (seven days), got {expires}",
                400,
            )
        return Claim(
            _parse_credential(query.get("X-Amz-Credential", "")),
            query.get("X-Amz-SignedHeaders", "").split(";"),
            query["X-Amz-Signature"],
            query.get("X-Amz-Date", ""),
            expires,
            "X-Amz-Signature",
        )
    raise SignatureError("MissingAuthenticationToken", "the request must be signed with AWS Signature Version 4")


def claimed_credential(query: str, headers: Mapping[str, str]) -> Credential:
    """The credential a request names (Authorization header, else a presigned query string),
    read without its body and not verified: whose key to look up before reading the body.
    Raises SignatureError (MissingAuthenticationToken, IncompleteSignature,
    AuthorizationQueryParametersError)."""
    return claim(query, headers).cred


#: A signature as SigV4 writes it: the HMAC-SHA256, in lower-case hexadecimal.
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
#: An ``x-amz-content-sha256`` as SigV4 writes it (or UNSIGNED-PAYLOAD).
_PAYLOAD_HASH = re.compile(r"[0-9a-f]{64}")


def check_claim(found: Claim, headers: Mapping[str, str], has_body: bool, now: datetime | None = None) -> None:
    """What can be told of a signature before the body and the key's secret: its shape, its
    date, what it must sign. A request that fails here cannot be signed validly, whatever its
    body, so it is refused before its body is read. Raises SignatureError: IncompleteSignature
    (malformed), SignatureDoesNotMatch (a signature not of SigV4's shape, a credential scope of
    another day, Host or a sent X-Amz-Date left unsigned, a body under UNSIGNED-PAYLOAD or
    under a malformed payload hash), RequestExpired (dated more than ``MAX_SKEW`` away, or a
    presigned URL past its expiry).

    The rules are AWS's (Signature Version 4 reference, "Create a signed AWS API request"): the
    Host header and, when sent, X-Amz-Date must be among the signed headers.
    """
    now = now or datetime.now(UTC)
    cred, signed_headers, amz_date, expires = found.cred, found.signed_headers, found.amz_date, found.expires
    signed_at = _parse_date(amz_date)
    if not _SIGNATURE.fullmatch(found.signature):
        raise SignatureError("SignatureDoesNotMatch", "the signature must be 64 lower-case hexadecimal digits")
    if cred.date != amz_date[:8]:
        raise SignatureError("SignatureDoesNotMatch", "the credential scope's date is not the request's date")
    if "host" not in signed_headers:
        raise SignatureError("SignatureDoesNotMatch", "the Host header must be signed")
    if expires is None and "x-amz-date" not in signed_headers:
        raise SignatureError("SignatureDoesNotMatch", "the X-Amz-Date header must be signed")
    skew = (now - signed_at).total_seconds()
    if abs(skew) > MAX_SKEW and (expires is None or skew < 0):
        raise SignatureError(
            "RequestExpired",
            f"Signature expired: {amz_date} is more than 15 minutes from the server's time "
            f"{now.strftime('%Y%m%dT%H%M%SZ')}",
            400,
        )
    if expires is not None and skew > expires:
        raise SignatureError("RequestExpired", f"the presigned request expired {skew - expires:.0f} s ago", 400)
    declared = headers.get("x-amz-content-sha256")
    if declared and declared != UNSIGNED_PAYLOAD and not _PAYLOAD_HASH.fullmatch(declared):
        raise SignatureError("SignatureDoesNotMatch", "x-amz-content-sha256 is not a SHA-256 in hexadecimal")
    if has_body and declared == UNSIGNED_PAYLOAD:
        # A signature over UNSIGNED-PAYLOAD vouches for no body.
        raise SignatureError("SignatureDoesNotMatch", "UNSIGNED-PAYLOAD is accepted only for a request without a body")


def verify(
    req: Request, secret_of: Callable[[str], str | None], now: datetime | None = None, *, claimed: Claim | None = None
) -> Credential:
    """The credential of a correctly signed, fresh request, with the headers it signed.

    ``secret_of`` gives an active key's secret (None: no such key, or revoked). Raises
    SignatureError: MissingAuthenticationToken (unsigned), IncompleteSignature (malformed),
    AuthorizationQueryParametersError (a presigned URL to live more than ``MAX_EXPIRES``),
    InvalidClientTokenId (unknown or revoked key), RequestExpired (dated more than
    ``MAX_SKEW`` away, or a presigned URL past its expiry), SignatureDoesNotMatch (also: a body
    under a signature that left the payload unsigned). ``claimed``: :func:`claim` of this
    request's query and headers, when read already.
    """
    now = now or datetime.now(UTC)
    found = claimed or claim(req.query, req.headers)
    cred, signed_headers, amz_date = found.cred, found.signed_headers, found.amz_date
    check_claim(found, req.headers, bool(req.body), now)
    secret = secret_of(cred.access_key_id)
    if secret is None:
        raise SignatureError("InvalidClientTokenId", "The security token included in the request is invalid.")
    key = signing_key(secret, cred.date, cred.region, cred.service)
    body_hash = hashlib.sha256(req.body).hexdigest()
    declared = req.headers.get("x-amz-content-sha256")
    if declared and declared != UNSIGNED_PAYLOAD and declared != body_hash:
        raise SignatureError("SignatureDoesNotMatch", "x-amz-content-sha256 is not the payload's SHA-256")
    # (a body under UNSIGNED-PAYLOAD is refused by check_claim): with one, only its hash will do.
    hashes = [body_hash] if req.body else [declared] if declared else [body_hash, UNSIGNED_PAYLOAD]
    for payload_hash in hashes:
        canonical = canonical_request(req, signed_headers, payload_hash, without=found.without)
        expected = hmac.new(key, string_to_sign(amz_date, cred, canonical).encode("utf-8"), hashlib.sha256).hexdigest()
        if hmac.compare_digest(expected, found.signature):
            return Credential(cred.access_key_id, cred.date, cred.region, cred.service, frozenset(signed_headers))
    raise SignatureError(
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. "
        "Check your AWS Secret Access Key and signing method."
        + (
            " A request with a body must sign its payload (UNSIGNED-PAYLOAD is not accepted for one)."
            if req.body and found.expires is not None
            else ""
        ),
    )
