"""The SQS API's query protocol (``Action=...`` form posts, XML answers), as older SDKs and tools
send it: plain form posts signed with SigV4 (botocore's signer), against a real node on
PostgreSQL + Redis. The same actions as the JSON protocol, the same queues and errors in the
query protocol's own codes and shape."""

from __future__ import annotations

import hashlib
import uuid
import xml.etree.ElementTree as ET
from urllib.parse import urlencode

import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from django.conf import settings

from sqs.models import AccessKey

#: One node for the module's tests (:func:`module_node`): the key it must read is committed
#: (:func:`committed`); each test reads the database in a transaction rolled back after it.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.node(shared=True)]

NS = {"s": "http://queue.amazonaws.com/doc/2012-11-05/"}


def _post(node, key: AccessKey, params: dict, *, secret: str | None = None) -> tuple[int, ET.Element]:
    body = urlencode({**params, "Version": "2012-11-05"})
    url = f"{node.url}/sqs"
    req = AWSRequest("POST", url, data=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
    SigV4Auth(Credentials(key.access_key_id, secret or key.secret), "sqs", "eu-west-1").add_auth(req)
    r = requests.post(url, data=body, headers=dict(req.headers), timeout=30)
    assert r.headers["Content-Type"].startswith("text/xml"), r.text
    return r.status_code, ET.fromstring(r.content)


def _text(tree: ET.Element, path: str) -> str | None:
    found = tree.find(path, NS)
    return None if found is None else found.text


def test_the_query_protocol_end_to_end(node, key):
    name = f"qp-{uuid.uuid4().hex[:8]}"
    # CreateQueue with an attribute in the query protocol's flattened form
    status, tree = _post(
        node,
        key,
        {
            "Action": "CreateQueue",
            "QueueName": name,
            "Attribute.1.Name": "VisibilityTimeout",
            "Attribute.1.Value": "30",
        },
    )
    assert status == 200 and tree.tag == "{" + NS["s"] + "}CreateQueueResponse"
    url = _text(tree, "s:CreateQueueResult/s:QueueUrl")
    assert url == f"{node.url}/sqs/eu-west-1/000000000000/{name}"
    assert _text(tree, "s:ResponseMetadata/s:RequestId")

    # SendMessage with a message attribute: SQS's digests
    body = "héllo <xml> & co"
    status, tree = _post(
        node,
        key,
        {
            "Action": "SendMessage",
            "QueueUrl": url,
            "MessageBody": body,
            "MessageAttribute.1.Name": "kind",
            "MessageAttribute.1.Value.DataType": "String",
            "MessageAttribute.1.Value.StringValue": "greeting",
        },
    )
    assert status == 200
    assert _text(tree, "s:SendMessageResult/s:MD5OfMessageBody") == hashlib.md5(body.encode()).hexdigest()
    assert _text(tree, "s:SendMessageResult/s:MD5OfMessageAttributes")
    status, tree = _post(
        node,
        key,
        {
            "Action": "SendMessageBatch",
            "QueueUrl": url,
            "SendMessageBatchRequestEntry.1.Id": "a",
            "SendMessageBatchRequestEntry.1.MessageBody": "second",
            "SendMessageBatchRequestEntry.2.Id": "b",
            "SendMessageBatchRequestEntry.2.MessageBody": "third",
        },
    )
    assert status == 200
    ok = tree.findall("s:SendMessageBatchResult/s:SendMessageBatchResultEntry", NS)
    assert sorted(_text(e, "s:Id") for e in ok) == ["a", "b"]

    # ReceiveMessage: bodies, system attributes, message attributes by "All"
    messages: list[ET.Element] = []
    for _ in range(20):
        if len(messages) >= 3:
            break
        status, tree = _post(
            node,
            key,
            {
                "Action": "ReceiveMessage",
                "QueueUrl": url,
                "MaxNumberOfMessages": "10",
                "WaitTimeSeconds": "1",
                "AttributeName.1": "All",
                "MessageAttributeName.1": "All",
            },
        )
        assert status == 200
        messages += tree.findall("s:ReceiveMessageResult/s:Message", NS)
    assert sorted(_text(m, "s:Body") for m in messages) == sorted([body, "second", "third"])
    first = next(m for m in messages if _text(m, "s:Body") == body)
    assert _text(first, "s:MD5OfBody") == hashlib.md5(body.encode()).hexdigest()
    attributes = {_text(a, "s:Name"): _text(a, "s:Value") for a in first.findall("s:Attribute", NS)}
    assert attributes["ApproximateReceiveCount"] == "1" and int(attributes["SentTimestamp"]) > 0
    (kind,) = first.findall("s:MessageAttribute", NS)
    assert _text(kind, "s:Name") == "kind" and _text(kind, "s:Value/s:StringValue") == "greeting"

    # DeleteMessageBatch: every entry succeeds, and the queue is empty afterwards
    entries = {}
    for i, m in enumerate(messages, 1):
        entries[f"DeleteMessageBatchRequestEntry.{i}.Id"] = f"d{i}"
        entries[f"DeleteMessageBatchRequestEntry.{i}.ReceiptHandle"] = _text(m, "s:ReceiptHandle")
    status, tree = _post(node, key, {"Action": "DeleteMessageBatch", "QueueUrl": url, **entries})
    assert status == 200
    assert len(tree.findall("s:DeleteMessageBatchResult/s:DeleteMessageBatchResultEntry", NS)) == 3
    assert tree.findall("s:DeleteMessageBatchResult/s:BatchResultErrorEntry", NS) == []
    status, tree = _post(node, key, {"Action": "GetQueueAttributes", "QueueUrl": url, "AttributeName.1": "All"})
    got = {_text(a, "s:Name"): _text(a, "s:Value") for a in tree.findall("s:GetQueueAttributesResult/s:Attribute", NS)}
    assert got["VisibilityTimeout"] == "30"
    assert got["ApproximateNumberOfMessages"] == "0" and got["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_query_protocol_errors_in_its_own_codes_and_shape(node, key):
    # a queue that does not exist: the query protocol's code, Sender's fault
    status, tree = _post(node, key, {"Action": "GetQueueUrl", "QueueName": f"nope-{uuid.uuid4().hex[:6]}"})
    assert status == 400 and tree.tag == "{" + NS["s"] + "}ErrorResponse"
    assert _text(tree, "s:Error/s:Code") == "AWS.SimpleQueueService.NonExistentQueue"
    assert _text(tree, "s:Error/s:Type") == "Sender" and _text(tree, "s:RequestId")
    # a bad parameter and an unknown action
    status, tree = _post(node, key, {"Action": "ReceiveMessage", "QueueUrl": "x", "MaxNumberOfMessages": "ten"})
    assert status == 400 and _text(tree, "s:Error/s:Code") == "InvalidParameterValue"
    status, tree = _post(node, key, {"Action": "FlyToTheMoon"})
    assert status == 400 and _text(tree, "s:Error/s:Code") == "InvalidAction"
    # a wrong secret is refused before anything is looked at
    status, tree = _post(node, key, {"Action": "ListQueues"}, secret="wrong" * 8)
    assert status == 403 and _text(tree, "s:Error/s:Code") == "SignatureDoesNotMatch"


def test_a_form_of_too_many_fields_is_refused_and_a_large_non_ascii_body_is_read_whole(node, key):
    # past Django's field limit (DATA_UPLOAD_MAX_NUMBER_FIELDS): 400, not a server error
    many = {"Action": "ListQueues", **{f"Junk.{i}": "x" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS)}}
    status, tree = _post(node, key, many)
    assert status == 400 and _text(tree, "s:Error/s:Code") == "MalformedQueryString"
    # a body of non-ASCII text near the size limit comes back whole
    status, tree = _post(node, key, {"Action": "CreateQueue", "QueueName": f"big-{uuid.uuid4().hex[:6]}"})
    url = _text(tree, "s:CreateQueueResult/s:QueueUrl")
    assert status == 200 and url
    text = "é中 a+b%&=" * 40_000
    status, tree = _post(node, key, {"Action": "SendMessage", "QueueUrl": url, "MessageBody": text})
    assert status == 200, ET.tostring(tree)
    status, tree = _post(node, key, {"Action": "ReceiveMessage", "QueueUrl": url})
    assert status == 200 and _text(tree, "s:ReceiveMessageResult/s:Message/s:Body") == text
