"""The node's front (``queues.http.front``) in its pure parts: whose body a request is, the shares
of bodies on their way and held, the WSGI environ it builds, and the SQS checks made before a
body (``sqs.sigv4.check_claim``). The front serving real connections is tested on real nodes
(``tests/integration/test_hostile_callers.py``, ``test_untrusted_bodies.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from queues.http import front
from sqs import known, sigv4
from tests.unit.test_sqs_sigv4 import KEY, _signed


class Headers(dict):
    """Lower-case names, ``get`` and ``items`` as granian's RSGI headers have them."""


@pytest.mark.parametrize(
    ("headers", "query", "expected"),
    [
        ({"authorization": "Token abc"}, "", "token:abc"),
        ({"authorization": "token  abc "}, "", "token:abc"),
        (
            {"authorization": "AWS4-HMAC-SHA256 Credential=AKMQX/20261129/us-east-1/sqs/aws4_request, S=1"},
            "",
            "aws:AKMQX",
        ),
        ({}, "Action=ListQueues&X-Amz-Credential=AKMQY%2F20261129%2Fus-east-1", "aws:AKMQY"),
        ({"authorization": "Basic xyz"}, "", "auth:Basic xyz"),
        ({"x-mq-cluster-signature": "00"}, "", "peer"),
        ({"cookie": "a=1; sessionid=s3ss; b=2"}, "", "session:s3ss"),
        ({"cookie": "a=1"}, "", front.ANONYMOUS),
        ({}, "", front.ANONYMOUS),
    ],
)
def test_the_credential_a_request_presents(headers, query, expected):
    assert front.credential_of(Headers(headers), query) == expected


def _shares(**kw) -> front.Shares:
    return front.Shares(**{"per_caller": 2, "per_address": 3, "anonymous": 1, "bytes_total": 1000, **kw})


def test_a_callers_share_is_its_address_and_credential_together():
    shares = _shares()
    # given two bodies on their way from one caller
    assert shares.take("10.0.0.1", "aws:K", 10) is None
    assert shares.take("10.0.0.1", "aws:K", 10) is None
    # then its third is refused, while a stranger presenting the same key ID elsewhere is not
    assert shares.take("10.0.0.1", "aws:K", 10) == "this caller's"
    assert shares.take("10.0.0.9", "aws:K", 10) is None
    # and the address, whatever credentials it presents, holds at most three
    assert shares.take("10.0.0.1", "token:t", 10) is None
    assert shares.take("10.0.0.1", "token:u", 10) == "this address's"
    # once a body is read its slot comes back; its bytes stay held until released
    shares.read("10.0.0.1", "aws:K")
    assert shares.take("10.0.0.1", "aws:K", 10) is None
    assert shares.bytes_held == 50


def test_callers_without_credentials_share_one_count():
    shares = _shares()
    assert shares.take("10.0.0.1", front.ANONYMOUS, 10) is None
    assert shares.take("10.0.0.2", front.ANONYMOUS, 10) == "the unauthenticated callers'"
    shares.read("10.0.0.1", front.ANONYMOUS)
    assert shares.take("10.0.0.2", front.ANONYMOUS, 10) is None


def test_bytes_held_are_bounded_per_caller_address_and_process():
    shares = _shares(per_caller=10, per_address=20, bytes_total=1000)
    # a caller: a quarter of the process's bytes (any one body fits alone)
    assert shares.take("a", "t", 200) is None
    assert shares.take("a", "t", 100) == "this caller's"
    # an address: half
    assert shares.take("a", "u", 250) is None
    assert shares.take("a", "v", 100) == "this address's"
    # the process: all of it
    assert shares.take("b", "t", 250) is None
    assert shares.take("c", "t", 250) is None
    assert shares.take("d", "t", 100) == "this process's"


def test_released_shares_leave_nothing_behind():
    shares = _shares()
    shares.take("a", "t", 100)
    shares.read("a", "t")
    shares.release("a", "t", 100)
    assert shares.by_caller == {} and shares.by_address == {} and shares.bytes_held == 0


def test_the_environ_is_a_wsgi_servers():
    app = front.Front(lambda environ, start: [], threads=1)
    scope = SimpleNamespace(
        method="POST",
        path="/a b/é",
        query_string="q=%20x",
        server="127.0.0.1:8000",
        client="[::1]:5555",
        http_version="1.1",
        scheme="http",
    )
    headers = Headers()
    items = [
        ("content-type", "application/json"),
        ("x-a", "1"),
        ("x-a", "2"),
        ("cookie", "a=1"),
        ("cookie", "b=2"),
        ("x_a", "spoofed"),  # would read as X-A: dropped
        ("transfer-encoding", "chunked"),
    ]
    headers.items = lambda: items  # type: ignore[method-assign]
    environ = app._environ(scope, headers, b"{}", 2)
    assert environ["PATH_INFO"] == "/a b/é".encode().decode("latin-1")
    assert environ["QUERY_STRING"] == "q=%20x"
    assert (environ["SERVER_NAME"], environ["SERVER_PORT"]) == ("127.0.0.1", "8000")
    assert (environ["REMOTE_ADDR"], environ["REMOTE_PORT"]) == ("::1", "5555")
    assert environ["CONTENT_TYPE"] == "application/json" and environ["CONTENT_LENGTH"] == "2"
    assert environ["HTTP_X_A"] == "1,2" and environ["HTTP_COOKIE"] == "a=1; b=2"
    assert "HTTP_TRANSFER_ENCODING" not in environ  # (the body is whole: its length is given)
    assert environ["wsgi.input"].read() == b"{}"


def test_the_wsgi_answer_is_collected_whole():
    def app(environ, start_response):
        write = start_response("201 Created", [("X-A", "1")])
        write(b"a")
        return iter([b"b", b"", b"c"])

    assert front.run_wsgi(app, {}) == (201, [("X-A", "1")], b"abc")


# --- SQS: what cannot be valid is refused before the body ------------------------------------
def _claim(req: sigv4.Request) -> sigv4.Claim:
    return sigv4.claim(req.query, req.headers)


def test_a_botocore_signature_passes_the_checks_before_the_body():
    req = _signed("https://sqs.example/", b'{"QueueNamePrefix": "a"}')
    sigv4.check_claim(_claim(req), req.headers, True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda h: h.update(authorization=h["authorization"].rsplit("=", 1)[0] + "=00"), "64 lower-case"),
        (lambda h: h.update(authorization=h["authorization"].replace("x-amz-date", "x-amz-datf")), "X-Amz-Date"),
        (lambda h: h.update(authorization=h["authorization"].replace("host;", "")), "Host header"),
        (lambda h: h.update({"x-amz-date": "20200101T000000Z"}), "credential scope's date"),
        (lambda h: h.update({"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}), "UNSIGNED-PAYLOAD"),
        (lambda h: h.update({"x-amz-content-sha256": "abc"}), "SHA-256"),
    ],
)
def test_a_signature_that_cannot_be_valid_is_refused_before_the_body(change, message):
    req = _signed("https://sqs.example/", b"{}")
    headers = dict(req.headers)
    change(headers)
    with pytest.raises(sigv4.SignatureError, match=message):
        sigv4.check_claim(sigv4.claim(req.query, headers), headers, True)


def test_the_sqs_pre_body_check_answers_in_sqs_words():
    req = _signed("https://sqs.example/", b"{}")
    headers = Headers(req.headers)
    assert known.pre_body("POST", "/sqs/", "", headers) is None
    assert known.pre_body("POST", "/api/v1/queues", "", Headers()) is None  # not an SQS call
    headers["authorization"] = headers["authorization"].rsplit("=", 1)[0] + "=00"
    refusal = known.pre_body("POST", "/", "", headers)
    assert refusal is not None and refusal.status == 403
    assert b"SignatureDoesNotMatch" in refusal.body and KEY not in refusal.body.decode()
    unsigned = known.pre_body("POST", "/sqs/", "", Headers({"content-type": "application/x-amz-json-1.0"}))
    assert unsigned is not None and unsigned.status == 403 and b"MissingAuthenticationToken" in unsigned.body


def test_the_fronts_refusals_of_an_sqs_call_are_sqs_errors():
    json_call = Headers({"content-type": "application/x-amz-json-1.0", "x-amz-target": "AmazonSQS.SendMessage"})
    throttled = known.render_refusal("/sqs/", json_call, 429, "throttled", "taken; retry", 1)
    assert throttled is not None and throttled.status == 400
    assert b"RequestThrottled" in throttled.body and ("Retry-After", "1") in throttled.headers
    slow = known.render_refusal("/sqs/q", Headers({}), 408, "request_timeout", "slow", None)
    assert slow is not None and slow.status == 408 and b"<Code>RequestTimeout</Code>" in slow.body
    assert known.render_refusal("/api/v1/queues", json_call, 429, "throttled", "x", 1) is None
