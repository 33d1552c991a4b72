"""Identity as AWS's API reference keeps it, on both protocols (AWS JSON 1.0 with boto3, the
query protocol with signed form posts), against a real node on PostgreSQL + Redis:

- a MessageId serves as a batch entry's ``Id`` (letters, digits, ``-``, ``_``; AWS's are UUIDs);
"""

from __future__ import annotations

import re
import uuid
import xml.etree.ElementTree as ET

import pytest
from django.contrib.auth.models import User

from sqs.models import AccessKey
from tests.integration.test_sqs_boto3 import _client, _name, _receive_all
from tests.integration.test_sqs_query import NS, _post, _text

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")


@pytest.fixture
def key():
    return AccessKey.issue(User.objects.create(username=f"ident-{uuid.uuid4().hex[:8]}"))


@pytest.fixture
def sqs(node, key):
    return _client(node, key)


def _query(node, key, action: str, **params: str) -> ET.Element:
    status, tree = _post(node, key, {"Action": action, **params})
    assert status == 200, ET.tostring(tree)
    return tree


def _query_receive(node, key, url: str, expected: int, **params: str) -> list[ET.Element]:
    got: list[ET.Element] = []
    for _ in range(20):
        if len(got) >= expected:
            break
        tree = _query(
            node, key, "ReceiveMessage", QueueUrl=url, MaxNumberOfMessages="10", WaitTimeSeconds="1", **params
        )
        got += tree.findall("s:ReceiveMessageResult/s:Message", NS)
    return got


# --- MessageIds ---------------------------------------------------------------------------------
def test_message_ids_serve_as_batch_entry_ids_json(sqs):
    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    sent = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(3)])
    sent_ids = sorted(e["MessageId"] for e in sent["Successful"])
    assert all(_ENTRY_ID.fullmatch(i) for i in sent_ids), sent_ids
    got = _receive_all(sqs, url, 3)
    assert sorted(m["MessageId"] for m in got) == sent_ids
    done = sqs.delete_message_batch(
        QueueUrl=url, Entries=[{"Id": m["MessageId"], "ReceiptHandle": m["ReceiptHandle"]} for m in got]
    )
    assert sorted(e["Id"] for e in done["Successful"]) == sent_ids and not done.get("Failed")
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1, VisibilityTimeout=0)


def test_message_ids_serve_as_batch_entry_ids_query(node, key):
    url = _text(_query(node, key, "CreateQueue", QueueName=_name()), "s:CreateQueueResult/s:QueueUrl")
    assert url
    tree = _query(node, key, "SendMessage", QueueUrl=url, MessageBody="one")
    sent = _text(tree, "s:SendMessageResult/s:MessageId")
    assert sent and _ENTRY_ID.fullmatch(sent), sent
    (m,) = _query_receive(node, key, url, 1)
    assert _text(m, "s:MessageId") == sent
    tree = _query(
        node,
        key,
        "DeleteMessageBatch",
        QueueUrl=url,
        **{
            "DeleteMessageBatchRequestEntry.1.Id": sent,
            "DeleteMessageBatchRequestEntry.1.ReceiptHandle": _text(m, "s:ReceiptHandle") or "",
        },
    )
    (ok,) = tree.findall("s:DeleteMessageBatchResult/s:DeleteMessageBatchResultEntry", NS)
    assert _text(ok, "s:Id") == sent
