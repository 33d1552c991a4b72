"""The query protocol at a queue's URL and over GET, as AWS's guide to query API requests
describes it (*Making query API requests using AWS query protocol*): a GET or POST to
``https://<endpoint>/<account>/<queue>?Action=SendMessage&MessageBody=...`` acts on that queue,
with no ``QueueUrl`` parameter (one a request names wins); the actions that act on no queue
(``CreateQueue``, ``ListQueues``) are ``InvalidAction`` there; a GET that names no action is
404 ``UnknownOperationException``. Signed with botocore's SigV4 signer (header and presigned),
against a real node on PostgreSQL + Redis."""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from urllib.parse import quote, urlencode

import pytest
import requests
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from queues.models import Queue
from sqs.models import AccessKey

#: One node for the module's tests (:func:`module_node`): the key it must read is committed
#: (:func:`committed`); each test reads the database in a transaction rolled back after it.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.node(shared=True)]

NS = {"s": "http://queue.amazonaws.com/doc/2012-11-05/"}
REGION = "eu-west-1"


def _call(method: str, url: str, key: AccessKey, params: dict) -> requests.Response:
    """``method url`` with the query protocol's ``params`` (in the query string of a GET, in
    the form body of a POST), signed in the Authorization header as botocore signs."""
    form = urlencode({**params, "Version": "2012-11-05"}, quote_via=quote)  # spaces as %20, as botocore's
    if method == "GET":
        url, body, headers = f"{url}?{form}", "", {}
    else:
        body, headers = form, {"Content-Type": "application/x-www-form-urlencoded"}
    req = AWSRequest(method, url, data=body, headers=headers)
    SigV4Auth(Credentials(key.access_key_id, key.secret), "sqs", REGION).add_auth(req)
    return requests.request(method, url, data=body or None, headers=dict(req.headers), timeout=30)


def _xml(r: requests.Response) -> ET.Element:
    assert r.headers["Content-Type"].startswith("text/xml"), r.text
    return ET.fromstring(r.content)


def _text(tree: ET.Element, path: str) -> str | None:
    found = tree.find(path, NS)
    return None if found is None else found.text


def _create(node, key: AccessKey) -> tuple[str, str]:
    name = f"qurl-{uuid.uuid4().hex[:8]}"
    r = _call("POST", f"{node.url}/sqs", key, {"Action": "CreateQueue", "QueueName": name})
    assert r.status_code == 200, r.text
    url = _text(_xml(r), "s:CreateQueueResult/s:QueueUrl")
    assert url == f"{node.url}/sqs/{REGION}/000000000000/{name}"
    return name, url


def _arn(node, key: AccessKey, at: str, params: dict) -> str | None:
    r = _call("GET", at, key, {"Action": "GetQueueAttributes", "AttributeName.1": "QueueArn", **params})
    assert r.status_code == 200, r.text
    return _text(_xml(r), "s:GetQueueAttributesResult/s:Attribute/s:Value")


def test_a_queue_is_addressed_by_its_url_path_over_post_and_get(node, key):
    name, url = _create(node, key)
    other_name, other = _create(node, key)

    # POST to the queue's URL, no QueueUrl: the path's queue
    r = _call("POST", url, key, {"Action": "SendMessage", "MessageBody": "by post"})
    assert r.status_code == 200, r.text
    assert _text(_xml(r), "s:SendMessageResult/s:MessageId")
    # GET, as the guide's example sends one
    r = _call("GET", url, key, {"Action": "SendMessage", "MessageBody": "by get"})
    assert r.status_code == 200, r.text

    # the other queue, at its own URL, holds nothing; this one holds both
    r = _call("GET", other, key, {"Action": "ReceiveMessage"})
    assert r.status_code == 200 and _xml(r).findall("s:ReceiveMessageResult/s:Message", NS) == []
    bodies: dict[str, str | None] = {}
    for _ in range(10):
        if len(bodies) == 2:
            break
        r = _call("GET", url, key, {"Action": "ReceiveMessage", "MaxNumberOfMessages": "10", "WaitTimeSeconds": "1"})
        assert r.status_code == 200, r.text
        for m in _xml(r).findall("s:ReceiveMessageResult/s:Message", NS):
            bodies[_text(m, "s:Body") or ""] = _text(m, "s:ReceiptHandle")
    assert sorted(bodies) == ["by get", "by post"]
    for handle in bodies.values():
        r = _call("POST", url, key, {"Action": "DeleteMessage", "ReceiptHandle": handle})
        assert r.status_code == 200, r.text

    # a QueueUrl the request names wins over the path's
    assert _arn(node, key, url, {}) == f"arn:aws:sqs:{REGION}:000000000000:{name}"
    assert _arn(node, key, url, {"QueueUrl": other}) == f"arn:aws:sqs:{REGION}:000000000000:{other_name}"

    # DeleteQueue by GET at the URL; the URL then names a queue that does not exist
    r = _call("GET", url, key, {"Action": "DeleteQueue"})
    assert r.status_code == 200 and _xml(r).tag == "{" + NS["s"] + "}DeleteQueueResponse"
    assert not Queue.objects.filter(name=name).exists()
    r = _call("GET", url, key, {"Action": "GetQueueAttributes", "AttributeName.1": "QueueArn"})
    tree = _xml(r)
    assert r.status_code == 400 and _text(tree, "s:Error/s:Code") == "AWS.SimpleQueueService.NonExistentQueue"
    assert _text(tree, "s:Error/s:Message") == "The specified queue does not exist for this wsdl version."


def test_actions_on_no_queue_are_invalid_at_a_queue_url(node, key):
    name, url = _create(node, key)
    other_name, other = _create(node, key)
    new_name = f"qurl-{uuid.uuid4().hex[:8]}"
    for method in ("GET", "POST"):
        for params in ({"Action": "CreateQueue", "QueueName": new_name}, {"Action": "ListQueues"}):
            r = _call(method, url, key, params)
            tree = _xml(r)
            assert r.status_code == 400, (method, params, r.text)
            assert _text(tree, "s:Error/s:Code") == "InvalidAction" and _text(tree, "s:Error/s:Type") == "Sender"
            assert _text(tree, "s:Error/s:Message") == f"The action {params['Action']} is not valid for this endpoint."
    assert not Queue.objects.filter(name=new_name).exists()
    # ... and served at the service's endpoint
    r = _call("GET", f"{node.url}/sqs", key, {"Action": "ListQueues", "QueueNamePrefix": name})
    assert r.status_code == 200 and _text(_xml(r), "s:ListQueuesResult/s:QueueUrl") == url

    # GetQueueUrl is served at a queue's URL, of that queue or another
    for queue_name, expected in ((name, url), (other_name, other)):
        r = _call("GET", url, key, {"Action": "GetQueueUrl", "QueueName": queue_name})
        assert r.status_code == 200 and _text(_xml(r), "s:GetQueueUrlResult/s:QueueUrl") == expected
    # an action SQS does not have, and a missing parameter of one it has
    r = _call("GET", url, key, {"Action": "FooBar"})
    tree = _xml(r)
    assert r.status_code == 400 and _text(tree, "s:Error/s:Code") == "InvalidAction"
    assert _text(tree, "s:Error/s:Message") == "The action FooBar is not valid for this endpoint."
    r = _call("GET", url, key, {"Action": "SendMessage"})
    assert r.status_code == 400 and _text(_xml(r), "s:Error/s:Code") == "MissingParameter"


def test_a_get_that_names_no_action_is_an_unknown_operation(node, key):
    _, url = _create(node, key)
    signed = AWSRequest("GET", url)
    SigV4Auth(Credentials(key.access_key_id, key.secret), "sqs", REGION).add_auth(signed)
    for target, headers in (
        (url, {}),  # unsigned
        (url, dict(signed.headers)),  # signed
        (url, {"Accept": "application/json"}),  # answered in XML all the same
        (f"{node.url}/sqs", {}),
        (f"{url}?Version=2012-11-05", {}),
    ):
        r = requests.get(target, headers=headers, timeout=30)
        assert r.status_code == 404, (target, r.text)
        assert r.text.startswith("<UnknownOperationException"), r.text
        assert r.headers["Content-Type"].startswith("text/xml")


def test_a_get_s_signature_covers_its_query_string(node, key):
    name, url = _create(node, key)
    form = urlencode({"Action": "SendMessage", "MessageBody": "signed", "Version": "2012-11-05"}, quote_via=quote)
    req = AWSRequest("GET", f"{url}?{form}")
    SigV4Auth(Credentials(key.access_key_id, key.secret), "sqs", REGION).add_auth(req)
    # another body, or another action, under the same signature: refused, nothing sent
    for tampered in (form.replace("signed", "forged"), form.replace("SendMessage", "DeleteQueue")):
        r = requests.get(f"{url}?{tampered}", headers=dict(req.headers), timeout=30)
        assert r.status_code == 403 and _text(_xml(r), "s:Error/s:Code") == "SignatureDoesNotMatch", r.text
    # another queue's path under the same signature: refused too (the path is signed)
    _, other = _create(node, key)
    r = requests.get(f"{other}?{form}", headers=dict(req.headers), timeout=30)
    assert r.status_code == 403 and _text(_xml(r), "s:Error/s:Code") == "SignatureDoesNotMatch", r.text
    assert Queue.objects.filter(name=name).exists()
    r = _call("GET", url, key, {"Action": "GetQueueAttributes", "AttributeName.1": "ApproximateNumberOfMessages"})
    assert _text(_xml(r), "s:GetQueueAttributesResult/s:Attribute/s:Value") == "0"

    # as signed, it goes; and so does a presigned GET at the queue's URL
    r = requests.get(f"{url}?{form}", headers=dict(req.headers), timeout=30)
    assert r.status_code == 200, r.text
    presigned = AWSRequest(
        "GET", f"{url}?{urlencode({'Action': 'ReceiveMessage', 'WaitTimeSeconds': '2', 'Version': '2012-11-05'})}"
    )
    SigV4QueryAuth(Credentials(key.access_key_id, key.secret), "sqs", REGION, expires=300).add_auth(presigned)
    r = requests.get(presigned.prepare().url, timeout=30)
    assert r.status_code == 200, r.text
    assert [_text(m, "s:Body") for m in _xml(r).findall("s:ReceiveMessageResult/s:Message", NS)] == ["signed"]
