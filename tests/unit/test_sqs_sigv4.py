"""SigV4 as ``sqs.sigv4`` checks it, against requests botocore signs (header and query string)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sqs import message_attributes, sigv4

KEY, SECRET = "AKMQTESTKEY000000000", "secret-of-the-test-key"


def _signed(url: str, body: bytes, *, query_auth: bool = False, secret: str = SECRET, now: datetime | None = None):
    req = AWSRequest(
        method="POST",
        url=url,
        data=body,
        headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"},
    )
    creds = Credentials(KEY, secret)
    signer = (
        SigV4QueryAuth(creds, "sqs", "eu-west-1", expires=300) if query_auth else SigV4Auth(creds, "sqs", "eu-west-1")
    )
    if now is not None:
        import botocore.auth

        real = botocore.auth.datetime.datetime

        class Fixed(real):
            @classmethod
            def utcnow(cls):
                return now.replace(tzinfo=None)

            @classmethod
            def now(cls, tz=None):
                return now if tz else now.replace(tzinfo=None)

        botocore.auth.datetime.datetime = Fixed
        try:
            signer.add_auth(req)
        finally:
            botocore.auth.datetime.datetime = real
    else:
        signer.add_auth(req)
    prepared = req.prepare()
    split = urlsplit(prepared.url)
    headers = {k.lower(): v for k, v in prepared.headers.items()}
    headers["host"] = split.netloc
    return sigv4.Request("POST", split.path, split.query, headers, prepared.body or b"")


def _secret_of(key_id: str) -> str | None:
    return SECRET if key_id == KEY else None


@pytest.mark.parametrize("query_auth", [False, True])
def test_botocore_signatures_verify(query_auth):
    req = _signed("http://127.0.0.1:8000/sqs/", b'{"QueueNamePrefix": "a b/\\u00e9"}', query_auth=query_auth)
    cred = sigv4.verify(req, _secret_of)
    assert (cred.access_key_id, cred.region, cred.service) == (KEY, "eu-west-1", "sqs")


def test_a_path_and_query_with_characters_to_encode_verify():
    req = _signed("http://localhost:9/sqs/000000000000/q-1?x=a%20b&y=%E2%82%AC&x=0", b"Action=ListQueues")
    assert sigv4.verify(req, _secret_of).access_key_id == KEY


@pytest.mark.parametrize(
    "change, code",
    [
        (lambda r: r.__class__(r.method, r.path, r.query, r.headers, r.body + b" "), "SignatureDoesNotMatch"),
        (lambda r: r.__class__(r.method, "/other/", r.query, r.headers, r.body), "SignatureDoesNotMatch"),
        (
            lambda r: r.__class__(
                r.method, r.path, r.query, {**r.headers, "x-amz-target": "AmazonSQS.PurgeQueue"}, r.body
            ),
            "SignatureDoesNotMatch",
        ),
        (
            lambda r: r.__class__(r.method, r.path, r.query, {"host": r.headers["host"]}, r.body),
            "MissingAuthenticationToken",
        ),
    ],
)
def test_a_changed_request_is_refused(change, code):
    req = _signed("http://127.0.0.1:8000/sqs/", b"{}")
    with pytest.raises(sigv4.SignatureError) as exc:
        sigv4.verify(change(req), _secret_of)
    assert exc.value.code == code


def test_wrong_secret_and_unknown_key():
    with pytest.raises(sigv4.SignatureError) as exc:
        sigv4.verify(_signed("http://h/sqs/", b"{}", secret="not-it"), _secret_of)
    assert exc.value.code == "SignatureDoesNotMatch"
    with pytest.raises(sigv4.SignatureError) as exc:
        sigv4.verify(_signed("http://h/sqs/", b"{}"), lambda key_id: None)
    assert exc.value.code == "InvalidClientTokenId"


@pytest.mark.parametrize("minutes, ok", [(-14, True), (14, True), (-16, False), (16, False)])
def test_the_fifteen_minute_rule(minutes, ok):
    now = datetime.now(UTC).replace(microsecond=0)
    req = _signed("http://h/sqs/", b"{}", now=now + timedelta(minutes=minutes))
    if ok:
        assert sigv4.verify(req, _secret_of, now=now).access_key_id == KEY
    else:
        with pytest.raises(sigv4.SignatureError) as exc:
            sigv4.verify(req, _secret_of, now=now)
        assert exc.value.code == "RequestExpired"


def test_md5_of_message_attributes_is_sqs_s():
    # The digest AWS's documentation and SDKs compute (Java SDK's MessageMD5ChecksumHandler):
    # name, type, transport byte, value; each length-prefixed big-endian; names sorted.
    attrs = {"b": ("Number", "5"), "a": ("String", "x"), "c": ("Binary", b"\x00\x01")}
    h = hashlib.md5()
    for name, dtype, tb, value in (("a", "String", 1, b"x"), ("b", "Number", 1, b"5"), ("c", "Binary", 2, b"\x00\x01")):
        for part in (name.encode(), dtype.encode()):
            h.update(len(part).to_bytes(4, "big") + part)
        h.update(bytes([tb]) + len(value).to_bytes(4, "big") + value)
    assert message_attributes.md5_of_attributes(attrs) == h.hexdigest()
    assert message_attributes.md5_of_body("héllo") == hashlib.md5("héllo".encode()).hexdigest()


def _presigned(expires: int) -> sigv4.Request:
    req = AWSRequest(method="GET", url="http://h/sqs/?Action=ListQueues")
    SigV4QueryAuth(Credentials(KEY, SECRET), "sqs", "eu-west-1", expires=expires).add_auth(req)
    split = urlsplit(req.prepare().url)
    return sigv4.Request("GET", split.path, split.query, {"host": split.netloc}, b"")


def test_a_presigned_url_lives_at_most_seven_days():
    assert sigv4.verify(_presigned(sigv4.MAX_EXPIRES), _secret_of).access_key_id == KEY
    for expires in (sigv4.MAX_EXPIRES + 1, 10 * 365 * 86400):
        with pytest.raises(sigv4.SignatureError) as exc:
            sigv4.verify(_presigned(expires), _secret_of)
        assert (exc.value.code, exc.value.status) == ("AuthorizationQueryParametersError", 400)


def test_an_unsigned_payload_is_accepted_only_without_a_body():
    # a presigned URL signs UNSIGNED-PAYLOAD: as signed (no body) it verifies, with a body it does not
    req = _presigned(300)
    assert sigv4.verify(req, _secret_of).access_key_id == KEY
    with pytest.raises(sigv4.SignatureError) as exc:
        sigv4.verify(sigv4.Request("POST", req.path, req.query, req.headers, b"Action=DeleteQueue"), _secret_of)
    assert exc.value.code == "SignatureDoesNotMatch"
    # and so does a header signature that declares the payload unsigned
    aws = AWSRequest(
        method="POST", url="http://h/sqs/", data=b"", headers={"X-Amz-Content-SHA256": sigv4.UNSIGNED_PAYLOAD}
    )
    SigV4Auth(Credentials(KEY, SECRET), "sqs", "eu-west-1").add_auth(aws)
    headers = {k.lower(): v for k, v in aws.headers.items()} | {"host": "h"}
    assert sigv4.verify(sigv4.Request("POST", "/sqs/", "", headers, b""), _secret_of).access_key_id == KEY
    with pytest.raises(sigv4.SignatureError) as exc:
        sigv4.verify(sigv4.Request("POST", "/sqs/", "", headers, b"Action=DeleteQueue"), _secret_of)
    assert "UNSIGNED-PAYLOAD" in exc.value.message


@pytest.mark.parametrize("query_auth", [False, True])
def test_the_claimed_key_is_read_without_the_body_and_the_signed_headers_reported(query_auth):
    req = _signed("http://127.0.0.1:8000/sqs/", b"{}", query_auth=query_auth)
    assert sigv4.claimed_credential(req.query, req.headers).access_key_id == KEY
    assert "x-amz-target" in sigv4.verify(req, _secret_of).signed_headers
    with pytest.raises(sigv4.SignatureError) as exc:
        sigv4.claimed_credential("", {"host": "h"})
    assert exc.value.code == "MissingAuthenticationToken"
