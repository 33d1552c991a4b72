"""The SQS endpoint against a hostile or careless caller, on a real node (PostgreSQL + Redis):
nothing of a body is read before the key it names is known, a key's caller is held to the
REST API's per-user limits and answered with SQS's throttling error, a signature vouches only
for what it covers (a presigned URL's unsigned payload, its query parameters, the JSON
protocol's X-Amz-Target, its lifetime), a deeply nested body is a 400, and SenderId names no
credential."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from urllib.parse import urlencode

import boto3
import pytest
import requests
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from django.contrib.auth.models import User

from queues.access import Caller
from queues.models import Grant, Queue
from sqs import service as sqs_service
from sqs.models import AccessKey

#: One node for the module's tests (:func:`module_node`), with these settings: the rows it must
#: read are committed (:func:`committed`); each test reads the database in a transaction rolled
#: back after it.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db,
    pytest.mark.node(shared=True, env={"LONG_POLL_MAX_PER_USER": "1"}),
]

NS = {"s": "http://queue.amazonaws.com/doc/2012-11-05/"}
REGION = "eu-west-1"
JSON = "application/x-amz-json-1.0"


def _user(name: str = "sec") -> User:
    return User.objects.create(username=f"{name}-{uuid.uuid4().hex[:8]}")


def _key(committed, name: str = "sec") -> AccessKey:
    """A key of a new user, committed (the node reads it)."""
    return committed(lambda: AccessKey.issue(_user(name)))


def _client(node, key: AccessKey, **config):
    return boto3.client(
        "sqs",
        endpoint_url=f"{node.url}/sqs",
        region_name=REGION,
        aws_access_key_id=key.access_key_id,
        aws_secret_access_key=key.secret,
        config=Config(retries={"max_attempts": 1}, read_timeout=60, **config),
    )


def _name(prefix: str = "sec") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _code(exc: pytest.ExceptionInfo) -> str:
    return exc.value.response["Error"]["Code"]


def _exists(name: str) -> bool:
    return Queue.objects.filter(name=name).exists()


def _signed(key: AccessKey, method: str, url: str, body: bytes | str = b"", headers: dict | None = None) -> dict:
    """The headers of ``method url`` signed in the Authorization header, as botocore signs."""
    req = AWSRequest(method, url, data=body, headers=dict(headers or {}))
    SigV4Auth(Credentials(key.access_key_id, key.secret), "sqs", REGION).add_auth(req)
    return dict(req.headers)


def _presigned(key: AccessKey, url: str, params: dict, expires: int = 300, method: str = "GET") -> str:
    """A URL presigned (SigV4 in the query string, over an unsigned payload) for ``method`` with
    the query protocol's ``params``."""
    req = AWSRequest(method, f"{url}?{urlencode({**params, 'Version': '2012-11-05'})}")
    SigV4QueryAuth(Credentials(key.access_key_id, key.secret), "sqs", REGION, expires=expires).add_auth(req)
    return req.prepare().url


def _xml_code(r: requests.Response) -> str | None:
    found = ET.fromstring(r.content).find("s:Error/s:Code", NS)
    return None if found is None else found.text


# --- no body before the caller is known ---------------------------------------------------------
def _headers_only(node, path: str, headers: dict[str, str], length: int) -> tuple[int, dict[str, str], bytes]:
    """POST ``path`` with ``headers`` and a Content-Length of ``length``, and send no byte of the
    body: the answer, which must come without it (a read of the body would wait forever)."""
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
    try:
        conn.putrequest("POST", path, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.putheader("Content-Length", str(length))
        conn.endheaders()
        try:
            answer = conn.getresponse()
        except TimeoutError:
            pytest.fail(f"POST {path} with {sorted(headers)} waited for its body: it was read before the key was known")
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def test_a_call_without_a_known_key_is_refused_with_its_body_unread(node, committed):
    def keys() -> tuple[AccessKey, AccessKey]:
        revoked = AccessKey.issue(_user())
        revoked.revoke()
        inactive_user = _user()
        inactive = AccessKey.issue(inactive_user)
        inactive_user.is_active = False
        inactive_user.save()
        return revoked, inactive

    revoked, inactive = committed(keys)
    date = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")

    def header_auth(key_id: str) -> dict[str, str]:
        return {
            "Authorization": f"AWS4-HMAC-SHA256 Credential={key_id}/{date[:8]}/{REGION}/sqs/aws4_request, "
            f"SignedHeaders=host;x-amz-date, Signature={'0' * 64}",
            "X-Amz-Date": date,
        }

    presigned_query = urlencode(
        {
            "Action": "ListQueues",
            "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
            "X-Amz-Credential": f"AKMQNOSUCHKEY0000000/{date[:8]}/{REGION}/sqs/aws4_request",
            "X-Amz-Date": date,
            "X-Amz-Expires": "300",
            "X-Amz-SignedHeaders": "host",
            "X-Amz-Signature": "0" * 64,
        }
    )
    cases = [
        ({}, "MissingAuthenticationToken"),
        (header_auth("AKMQNOSUCHKEY0000000"), "InvalidClientTokenId"),
        (header_auth(revoked.access_key_id), "InvalidClientTokenId"),
        (header_auth(inactive.access_key_id), "InvalidClientTokenId"),
    ]
    for path in ("/sqs/", "/", f"/sqs/000000000000/{_name()}"):
        for headers, code in cases:
            # both protocols: a form post, and the JSON protocol (its errors name the code in a header)
            status, _, body = _headers_only(
                node, path, {**headers, "Content-Type": "application/x-www-form-urlencoded"}, 1000
            )
            assert status == 403, (path, code, body)
            assert f"<Code>{code}</Code>".encode() in body, (path, body)
            status, answer_headers, _ = _headers_only(
                node, path, {**headers, "Content-Type": JSON, "X-Amz-Target": "AmazonSQS.ListQueues"}, 1000
            )
            assert status == 403, (path, code)
            assert answer_headers["x-amzn-query-error"].startswith(f"{code};"), (path, answer_headers)
        status, _, body = _headers_only(
            node, f"{path}?{presigned_query}", {"Content-Type": "application/x-www-form-urlencoded"}, 1000
        )
        assert status == 403 and b"<Code>InvalidClientTokenId</Code>" in body, (path, body)


def test_a_key_revoked_or_its_user_made_inactive_is_refused_from_the_next_call(node, committed, cluster_member):
    # given a user's two keys, each of which has just sent a message (its key, its user and the
    # queue looked up by the node already)
    owner = committed(lambda: User.objects.create(username=_name("holder"), is_superuser=True))
    first, second = committed(lambda: (AccessKey.issue(owner), AccessKey.issue(owner)))
    sqs = _client(node, first)
    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    other = _client(node, second)
    for client in (sqs, other):
        client.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "before"}])
    # when the first is revoked through the service, the very next call with it is refused
    assert committed(lambda: sqs_service.revoke_access_key(first, caller=Caller.of(owner)))
    with pytest.raises(ClientError) as exc:
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "after"}])
    assert _code(exc) == "InvalidClientTokenId"
    # while the second still works, until its user is made inactive
    other.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    owner.is_active = False
    committed(lambda: owner.save(update_fields=["is_active"]))
    with pytest.raises(ClientError) as exc:
        other.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    assert _code(exc) == "InvalidClientTokenId"
    # and nothing was sent after the revocation
    owner.is_active = True
    committed(lambda: owner.save(update_fields=["is_active"]))
    third = _client(node, committed(lambda: AccessKey.issue(owner)))
    bodies = [m["Body"] for m in third.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])]
    assert "after" not in bodies


def test_a_known_key_s_body_is_bounded_by_its_length_before_it_is_read(node, committed):
    key = _key(committed)
    date = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    headers = {
        "Authorization": f"AWS4-HMAC-SHA256 Credential={key.access_key_id}/{date[:8]}/{REGION}/sqs/aws4_request, "
        f"SignedHeaders=host;x-amz-date, Signature={'0' * 64}",
        "X-Amz-Date": date,
        "Content-Type": JSON,
        "X-Amz-Target": "AmazonSQS.SendMessageBatch",
    }
    # when a known key's call says it carries 6 MiB (over the SQS endpoint's bound, under the
    # node's 8 MiB for any request) and sends nothing
    status, answer_headers, body = _headers_only(node, "/sqs/", headers, 6 * 1024 * 1024)
    # then it is answered 413 at once
    assert status == 413, body
    assert answer_headers["x-amzn-query-error"].startswith("RequestEntityTooLarge;")

    # and a body within the bound is read and checked as before: a batch of 1 MiB goes through
    sqs = _client(node, key)
    url = sqs.create_queue(QueueName=_name(), Attributes={"MaximumMessageSize": str(1024 * 1024)})["QueueUrl"]
    entries = [{"Id": str(i), "MessageBody": "é" * (50 * 1024)} for i in range(10)]
    assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 10


# --- throttling ---------------------------------------------------------------------------------
def test_a_long_poll_past_the_per_user_cap_is_throttled_not_a_500(node, committed):
    key = _key(committed)
    sqs = _client(node, key)
    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    got: list[dict] = []
    failed: list[ClientError] = []
    stop = threading.Event()

    def waiter():
        # holds the user's one long poll (LONG_POLL_MAX_PER_USER=1) until a message comes
        while not stop.is_set() and not got:
            try:
                got.extend(_client(node, key).receive_message(QueueUrl=url, WaitTimeSeconds=20).get("Messages", []))
            except ClientError as exc:
                if _code_of(exc) != "RequestThrottled":
                    failed.append(exc)
                    return
                time.sleep(0.05)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            assert not failed, failed[0].response
            assert time.monotonic() < deadline, "no second long poll was refused while the first waited"
            try:
                sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
            except ClientError as exc:
                response = exc.response
                assert _code_of(exc) == "RequestThrottled", response
                break
            time.sleep(0.2)
        assert response["ResponseMetadata"]["HTTPStatusCode"] == 400
        assert response["ResponseMetadata"]["HTTPHeaders"]["retry-after"]
        # the query protocol answers the same in its own shape
        form = urlencode({"Action": "ReceiveMessage", "QueueUrl": url, "WaitTimeSeconds": "1"})
        headers = _signed(key, "POST", f"{node.url}/sqs", form, {"Content-Type": "application/x-www-form-urlencoded"})
        r = requests.post(f"{node.url}/sqs", data=form, headers=headers, timeout=30)
        assert (r.status_code, _xml_code(r)) == (400, "RequestThrottled"), r.text
        sqs.send_message(QueueUrl=url, MessageBody="ends the wait")
        thread.join(30)
        assert [m["Body"] for m in got] == ["ends the wait"]
    finally:
        stop.set()


def _code_of(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


# --- what a signature covers --------------------------------------------------------------------
def test_a_presigned_url_vouches_for_no_body(node, committed):
    key = _key(committed)
    sqs = _client(node, key)
    name = _name()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    presigned = _presigned(key, f"{node.url}/sqs", {"Action": "GetQueueAttributes", "QueueUrl": url}, method="POST")
    # as presigned, it works
    r = requests.post(presigned, timeout=30)
    assert r.status_code == 200 and b"GetQueueAttributesResponse" in r.content, r.text
    # with a body posted to it, whatever the body says, it is refused and changes nothing
    for body in (
        urlencode({"Action": "DeleteQueue", "QueueUrl": url}),
        urlencode({"Action": "SendMessage", "MessageBody": "forged"}),
    ):
        r = requests.post(
            presigned, data=body, headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=30
        )
        assert (r.status_code, _xml_code(r)) == (403, "SignatureDoesNotMatch"), r.text
    # so is a header-signed call that declares its payload unsigned
    headers = _signed(
        key,
        "POST",
        f"{node.url}/sqs",
        b"",
        {"Content-Type": "application/x-www-form-urlencoded", "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"},
    )
    body = urlencode({"Action": "DeleteQueue", "QueueUrl": url})
    r = requests.post(f"{node.url}/sqs", data=body, headers=headers, timeout=30)
    assert (r.status_code, _xml_code(r)) == (403, "SignatureDoesNotMatch"), r.text
    # and without a body, that call still goes (what presigned URLs are for)
    r = requests.post(presigned, timeout=30)
    assert r.status_code == 200, r.text
    assert _exists(name)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)


def test_body_parameters_never_override_query_parameters(node, committed):
    key = _key(committed)
    sqs = _client(node, key)
    name = _name()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    target = f"{node.url}/sqs?{urlencode({'Action': 'GetQueueAttributes', 'QueueUrl': url})}"
    body = urlencode({"Action": "DeleteQueue", "QueueUrl": url})
    headers = _signed(key, "POST", target, body, {"Content-Type": "application/x-www-form-urlencoded"})
    r = requests.post(target, data=body, headers=headers, timeout=30)
    assert (r.status_code, _xml_code(r)) == (400, "InvalidParameterValue"), r.text
    assert b"Action" in r.content
    assert _exists(name)
    # parameters split between the two, none in both, are read together
    target = f"{node.url}/sqs?{urlencode({'Action': 'GetQueueAttributes'})}"
    body = urlencode({"QueueUrl": url, "AttributeName.1": "All"})
    headers = _signed(key, "POST", target, body, {"Content-Type": "application/x-www-form-urlencoded"})
    r = requests.post(target, data=body, headers=headers, timeout=30)
    assert r.status_code == 200 and b"QueueArn" in r.content, r.text


def test_the_json_protocol_s_target_must_be_signed(node, committed):
    key = _key(committed)
    sqs = _client(node, key)
    name = _name()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    body = json.dumps({"QueueUrl": url})
    # signed without X-Amz-Target, which is then added: any action could be put there
    headers = _signed(key, "POST", f"{node.url}/sqs/", body, {"Content-Type": JSON})
    headers["X-Amz-Target"] = "AmazonSQS.DeleteQueue"
    r = requests.post(f"{node.url}/sqs/", data=body, headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    assert r.headers["x-amzn-query-error"].startswith("IncompleteSignature;")
    assert _exists(name)
    # signed with it, the same call goes through
    headers = _signed(
        key, "POST", f"{node.url}/sqs/", body, {"Content-Type": JSON, "X-Amz-Target": "AmazonSQS.DeleteQueue"}
    )
    assert requests.post(f"{node.url}/sqs/", data=body, headers=headers, timeout=30).status_code == 200
    assert not _exists(name)


def test_a_presigned_url_lives_at_most_seven_days(node, committed):
    key = _key(committed)
    params = {"Action": "ListQueues"}
    r = requests.get(_presigned(key, f"{node.url}/sqs", params, expires=7 * 24 * 3600), timeout=30)
    assert r.status_code == 200, r.text
    for expires in (7 * 24 * 3600 + 1, 10 * 365 * 24 * 3600):
        r = requests.get(_presigned(key, f"{node.url}/sqs", params, expires=expires), timeout=30)
        assert (r.status_code, _xml_code(r)) == (400, "AuthorizationQueryParametersError"), r.text


# --- bodies -------------------------------------------------------------------------------------
def test_a_deeply_nested_json_body_is_a_400(node, committed):
    key = _key(committed)
    for depth in (100_000, 20):
        body = '{"QueueNamePrefix": ' + "[" * depth + "]" * depth + "}"
        headers = _signed(
            key, "POST", f"{node.url}/sqs/", body, {"Content-Type": JSON, "X-Amz-Target": "AmazonSQS.ListQueues"}
        )
        r = requests.post(f"{node.url}/sqs/", data=body, headers=headers, timeout=30)
        assert r.status_code == 400, (depth, r.status_code, r.text)
        assert r.headers["x-amzn-query-error"].startswith("MalformedQueryString;")
    # the node still serves
    assert "ResponseMetadata" in _client(node, key).list_queues()


# --- SenderId -----------------------------------------------------------------------------------
def test_sender_id_is_an_opaque_id_of_the_user_never_its_key(node, committed):
    producer, consumer = committed(lambda: (_user("producer"), _user("consumer")))
    first, second = committed(lambda: (AccessKey.issue(producer), AccessKey.issue(producer)))
    other = committed(lambda: AccessKey.issue(consumer))
    name = _name()
    url = _client(node, first).create_queue(QueueName=name)["QueueUrl"]

    def grants() -> None:
        Grant.objects.create(user=consumer, queue=Queue.objects.get(name=name), action="produce")
        Grant.objects.create(user=consumer, queue=Queue.objects.get(name=name), action="consume")

    committed(grants)

    def send(key: AccessKey, body: str) -> None:
        deadline = time.monotonic() + 20
        sqs = _client(node, key)
        while True:
            try:
                sqs.send_message(QueueUrl=url, MessageBody=body)
                return
            except sqs.exceptions.QueueDoesNotExist:  # the node reads grants again within a few seconds
                if time.monotonic() > deadline:
                    raise

    send(first, "a")
    send(second, "b")
    send(other, "c")
    sqs = _client(node, other)
    senders: dict[str, str] = {}
    deadline = time.monotonic() + 30
    while len(senders) < 3 and time.monotonic() < deadline:
        for m in sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["SenderId"]
        ).get("Messages", []):
            senders[m["Body"]] = m["Attributes"]["SenderId"]
    assert sorted(senders) == ["a", "b", "c"], senders
    for sender in senders.values():
        assert re.fullmatch(r"[A-Z0-9]{21}", sender), sender
        assert sender not in {first.access_key_id, second.access_key_id, other.access_key_id}
        assert "AKMQ" not in sender
    # one ID per user, whichever of its keys signed; another for another user
    assert senders["a"] == senders["b"] != senders["c"]
