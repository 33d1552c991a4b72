"""Identity as AWS's API reference keeps it, on both protocols (AWS JSON 1.0 with boto3, the
query protocol with signed form posts), against a real node on PostgreSQL + Redis:

- a MessageId serves as a batch entry's ``Id`` (letters, digits, ``-``, ``_``; AWS's are UUIDs);
- a FIFO send answers its ``SequenceNumber``, increasing in a group, the one every receive shows;
- a dead letter keeps its MessageId;
- the ``X-Amzn-Trace-Id`` header is the ``AWSTraceHeader`` of the messages a call sends;
- queue URLs and ARNs name the region; a node serves one (``SQS_REGION``);
- message move tasks take a ``DestinationArn``; their handles are SQS's;
- AddPermission and RemovePermission give and take back grants.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
import xml.etree.ElementTree as ET
from urllib.parse import urlencode

import boto3
import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from queues.models import Grant
from sqs.models import AccessKey
from tests.integration.test_sqs_boto3 import _client, _name, _receive_all
from tests.integration.test_sqs_query import NS, _post, _text
from tests.launcher import wait_until

# One node for the module (its tests only call it); rows it must read are committed apart.
pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.django_db, pytest.mark.node(shared=True)]

_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")


def _new_key() -> AccessKey:
    return AccessKey.issue(User.objects.create(username=f"ident-{uuid.uuid4().hex[:8]}"))


def _query(node, key, action: str, **params: str) -> ET.Element:
    status, tree = _post(node, key, {"Action": action, **params})
    assert status == 200, ET.tostring(tree)
    return tree


def _signed(
    node, key, params: dict[str, str], *, region: str = "eu-west-1", trace: str | None = None
) -> requests.Response:
    """A query-protocol call signed for ``region``, with an ``X-Amzn-Trace-Id`` header if given."""
    body = urlencode({**params, "Version": "2012-11-05"})
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if trace:
        headers["X-Amzn-Trace-Id"] = trace
    req = AWSRequest("POST", f"{node.url}/sqs", data=body, headers=headers)
    SigV4Auth(Credentials(key.access_key_id, key.secret), "sqs", region).add_auth(req)
    return requests.post(f"{node.url}/sqs", data=body, headers=dict(req.headers), timeout=30)


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


# --- SequenceNumber -----------------------------------------------------------------------------
# "SequenceNumber: The large, non-consecutive number that Amazon SQS assigns to each message. [...]
# SequenceNumber continues to increase for a particular MessageGroupId." (SendMessage, FIFO only)
def _fifo(sqs) -> str:
    url: str = sqs.create_queue(
        QueueName=_name("seq") + ".fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    return url


def test_fifo_sends_answer_their_sequence_number_json(sqs):
    url = _fifo(sqs)
    one = sqs.send_message(QueueUrl=url, MessageBody="a0", MessageGroupId="g")
    batch = sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": f"e{i}", "MessageBody": f"a{i}", "MessageGroupId": "g"} for i in (1, 2)]
    )["Successful"]
    sent = [one, *sorted(batch, key=lambda e: e["Id"])]
    numbers = [int(e["SequenceNumber"]) for e in sent]
    assert numbers == sorted(numbers) and len(set(numbers)) == 3
    # the same number at every receive
    got = []
    for _ in range(3):
        (m,) = sqs.receive_message(QueueUrl=url, AttributeNames=["SequenceNumber"], WaitTimeSeconds=5)["Messages"]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        got.append(m)
    assert {m["MessageId"]: m["Attributes"]["SequenceNumber"] for m in got} == {
        e["MessageId"]: e["SequenceNumber"] for e in sent
    }
    # a standard queue answers none
    plain = sqs.create_queue(QueueName=_name())["QueueUrl"]
    assert "SequenceNumber" not in sqs.send_message(QueueUrl=plain, MessageBody="x")


def test_fifo_sends_answer_their_sequence_number_query(node, key, sqs):
    url = _fifo(sqs)
    numbers = []
    for i in range(2):
        tree = _query(node, key, "SendMessage", QueueUrl=url, MessageBody=f"q{i}", MessageGroupId="g")
        numbers.append(int(_text(tree, "s:SendMessageResult/s:SequenceNumber") or "0"))
    tree = _query(
        node,
        key,
        "SendMessageBatch",
        QueueUrl=url,
        **{
            "SendMessageBatchRequestEntry.1.Id": "b",
            "SendMessageBatchRequestEntry.1.MessageBody": "q2",
            "SendMessageBatchRequestEntry.1.MessageGroupId": "g",
        },
    )
    (entry,) = tree.findall("s:SendMessageBatchResult/s:SendMessageBatchResultEntry", NS)
    numbers.append(int(_text(entry, "s:SequenceNumber") or "0"))
    assert numbers == sorted(numbers) and len(set(numbers)) == 3 and numbers[0] > 0


# --- dead letters -------------------------------------------------------------------------------
# SQS keeps a message's MessageId when it moves it to the dead-letter queue; a message moved on
# by a redrive "is considered a new message [...] assigned a new messageID".
def test_a_dead_letter_keeps_its_message_id_on_both_protocols(node, key, sqs):
    dlq_url = sqs.create_queue(QueueName=_name("dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
    url = sqs.create_queue(QueueName=_name("src"), Attributes={"RedrivePolicy": policy})["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="poison")["MessageId"]
    (m,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, VisibilityTimeout=0)["Messages"]
    assert m["MessageId"] == sent
    found: list[dict] = []

    def dead() -> bool:
        sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0, VisibilityTimeout=0)
        found[:] = sqs.receive_message(QueueUrl=dlq_url, WaitTimeSeconds=1, VisibilityTimeout=0).get("Messages", [])
        return bool(found)

    wait_until(dead, 30, "the dead letter")
    assert found[0]["MessageId"] == sent
    (q,) = _query_receive(node, key, dlq_url, 1, VisibilityTimeout="0")
    assert _text(q, "s:MessageId") == sent
    # its receipt handle is the dead-letter queue's
    sqs.delete_message(QueueUrl=dlq_url, ReceiptHandle=_text(q, "s:ReceiptHandle"))
    assert "Messages" not in sqs.receive_message(QueueUrl=dlq_url, WaitTimeSeconds=1)


# --- AWSTraceHeader -----------------------------------------------------------------------------
# X-Ray: "The default trace header is carried by X-Amzn-Trace-Id and corresponds to all messages
# included in a SendMessage or SendMessageBatch request. [...] If both headers are set, the message
# system attribute overrides the HTTP trace header."
TRACE = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
OTHER = "Root=1-5759e988-00000000e1be46a994272793;Sampled=0"


def _traced(sqs):
    def add(request, **_kw):
        request.headers["X-Amzn-Trace-Id"] = TRACE

    sqs.meta.events.register("before-sign.sqs.*", add)
    return sqs


def test_the_trace_header_is_the_aws_trace_header_json(node, key, committed):
    sqs = _traced(_client(node, key))
    url = sqs.create_queue(QueueName=_name("trace"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="one")
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "b", "MessageBody": "two"}])
    sqs.send_message(
        QueueUrl=url,
        MessageBody="three",
        MessageSystemAttributes={"AWSTraceHeader": {"DataType": "String", "StringValue": OTHER}},
    )
    got = _receive_all(sqs, url, 3, MessageSystemAttributeNames=["AWSTraceHeader"])
    assert {m["Body"]: m["Attributes"]["AWSTraceHeader"] for m in got} == {"one": TRACE, "two": TRACE, "three": OTHER}
    # not asked for: not answered
    plain = _client(node, key)
    plain.send_message(QueueUrl=url, MessageBody="four")
    (m,) = _receive_all(plain, url, 1)
    assert "Attributes" not in m
    # a message sent over REST with W3C trace context (a traceparent attribute) answers it as
    # X-Ray's header: the same trace
    name = url.rsplit("/", 1)[1]
    r = requests.post(
        f"{node.url}/api/v1/queues/{name}/enqueue",
        json={"body": "five", "attributes": {"traceparent": "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"}},
        headers={"Authorization": f"Token {committed(lambda: Token.objects.create(user=key.user)).key}"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    (m,) = _receive_all(plain, url, 1, MessageSystemAttributeNames=["AWSTraceHeader"])
    assert (m["Body"], m["Attributes"]["AWSTraceHeader"]) == ("five", TRACE)


def test_the_trace_header_is_the_aws_trace_header_query(node, key):
    url = _text(_query(node, key, "CreateQueue", QueueName=_name("trace")), "s:CreateQueueResult/s:QueueUrl")
    assert url
    r = _signed(node, key, {"Action": "SendMessage", "QueueUrl": url, "MessageBody": "q"}, trace=TRACE)
    assert r.status_code == 200, r.text
    (m,) = _query_receive(node, key, url, 1, **{"MessageSystemAttributeName.1": "AWSTraceHeader"})
    assert {_text(a, "s:Name"): _text(a, "s:Value") for a in m.findall("s:Attribute", NS)} == {"AWSTraceHeader": TRACE}


# --- regions ------------------------------------------------------------------------------------
# A queue URL and its ARN name the region (AWS: https://sqs.<region>.amazonaws.com/<account>/<name>,
# arn:aws:sqs:<region>:<account>:<name>). A node serves one region (SQS_REGION); unset, the one a
# call is signed for.
def test_queue_urls_and_arns_name_the_region_json(node, key):
    for region in ("eu-west-1", "ap-south-1"):
        client = boto3.client(
            "sqs",
            endpoint_url=f"{node.url}/sqs",
            region_name=region,
            aws_access_key_id=key.access_key_id,
            aws_secret_access_key=key.secret,
        )
        name = _name("reg")
        url = client.create_queue(QueueName=name)["QueueUrl"]
        assert url == f"{node.url}/sqs/{region}/000000000000/{name}"
        arn = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        assert arn == f"arn:aws:sqs:{region}:000000000000:{name}"


@pytest.mark.django_db(transaction=True)
def test_a_node_serves_its_own_region_only(node_factory):
    # (a node of its own, set to one region)
    node, key = node_factory(SQS_REGION="eu-central-1"), _new_key()

    def client(region: str):
        return boto3.client(
            "sqs",
            endpoint_url=f"{node.url}/sqs",
            region_name=region,
            aws_access_key_id=key.access_key_id,
            aws_secret_access_key=key.secret,
        )

    name = _name("reg")
    url = client("eu-central-1").create_queue(QueueName=name)["QueueUrl"]
    assert url == f"{node.url}/sqs/eu-central-1/000000000000/{name}"
    with pytest.raises(ClientError) as exc:
        client("us-east-1").get_queue_url(QueueName=name)
    assert exc.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    # the query protocol: the same refusal in its own shape
    r = _signed(node, key, {"Action": "GetQueueUrl", "QueueName": name}, region="us-east-1")
    assert r.status_code == 403 and _text(ET.fromstring(r.content), "s:Error/s:Code") == "SignatureDoesNotMatch"
    r = _signed(node, key, {"Action": "GetQueueUrl", "QueueName": name}, region="eu-central-1")
    assert r.status_code == 200 and _text(ET.fromstring(r.content), "s:GetQueueUrlResult/s:QueueUrl") == url


# --- message move tasks -------------------------------------------------------------------------
# StartMessageMoveTask: "DestinationArn: The ARN of the queue that receives the moved messages. [...]
# If this field is left blank, the messages will be redriven back to their respective original
# source queues." AWS's TaskHandle is the base64 of {"taskId": ..., "sourceArn": ...}.
def _arn(sqs, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return arn


def _dead_letter_queue(sqs) -> str:
    """A new queue another queue's RedrivePolicy names (a move task's source must be one)."""
    dlq = sqs.create_queue(QueueName=_name("dlq"))["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": _arn(sqs, dlq), "maxReceiveCount": 3})
    sqs.create_queue(QueueName=_name("src"), Attributes={"RedrivePolicy": policy})
    return dlq


def _handle(handle: str) -> dict:
    task = json.loads(base64.b64decode(handle))
    assert set(task) == {"taskId", "sourceArn"} and uuid.UUID(task["taskId"])
    return task


def test_a_move_task_to_a_destination_json(sqs):
    source = _dead_letter_queue(sqs)
    dest = sqs.create_queue(QueueName=_name("dest"))["QueueUrl"]
    sqs.send_message_batch(QueueUrl=source, Entries=[{"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(3)])
    source_arn, dest_arn = _arn(sqs, source), _arn(sqs, dest)
    handle = sqs.start_message_move_task(SourceArn=source_arn, DestinationArn=dest_arn)["TaskHandle"]
    assert _handle(handle)["sourceArn"] == source_arn
    (task,) = sqs.list_message_move_tasks(SourceArn=source_arn)["Results"]
    assert (task["DestinationArn"], task["Status"]) == (dest_arn, "COMPLETED")
    assert "TaskHandle" not in task  # SQS: listed only while the task runs
    assert task["ApproximateNumberOfMessagesMoved"] == 3
    assert sorted(m["Body"] for m in _receive_all(sqs, dest, 3)) == ["m0", "m1", "m2"]
    assert "Messages" not in sqs.receive_message(QueueUrl=source, WaitTimeSeconds=1)
    # a FIFO source needs a FIFO destination
    fifo = _fifo(sqs)
    with pytest.raises(ClientError) as exc:
        sqs.start_message_move_task(SourceArn=_arn(sqs, fifo), DestinationArn=dest_arn)
    assert exc.value.response["Error"]["Code"] == "InvalidParameterValue"


def test_a_move_task_to_a_destination_query(node, key, sqs):
    source = _dead_letter_queue(sqs)
    dest = sqs.create_queue(QueueName=_name("dest"))["QueueUrl"]
    sqs.send_message(QueueUrl=source, MessageBody="moved")
    source_arn, dest_arn = _arn(sqs, source), _arn(sqs, dest)
    tree = _query(node, key, "StartMessageMoveTask", SourceArn=source_arn, DestinationArn=dest_arn)
    handle = _text(tree, "s:StartMessageMoveTaskResult/s:TaskHandle")
    assert handle and _handle(handle)["sourceArn"] == source_arn
    tree = _query(node, key, "ListMessageMoveTasks", SourceArn=source_arn)
    (entry,) = tree.findall("s:ListMessageMoveTasksResult/s:ListMessageMoveTasksResultEntry", NS)
    assert _text(entry, "s:Status") == "COMPLETED" and _text(entry, "s:DestinationArn") == dest_arn
    assert entry.find("s:TaskHandle", NS) is None  # SQS: listed only while the task runs
    assert [m["Body"] for m in _receive_all(sqs, dest, 1)] == ["moved"]


# --- AddPermission, RemovePermission ------------------------------------------------------------
# AddPermission "adds a permission to a queue for a specific principal"; its Label is "the unique
# identification of the permission you're setting", RemovePermission takes it back. Here an entry
# of AWSAccountIds names a user of the service (user name or access key ID), and an action maps
# to a grant (sqs.permissions).
def _grants(user, queue: str) -> set[str]:
    return set(Grant.objects.filter(user=user, queue__name=queue).values_list("action", flat=True))


def test_add_and_remove_permission_json(node, sqs, committed):
    bob_key = committed(lambda: AccessKey.issue(User.objects.create(username=f"bob-{uuid.uuid4().hex[:8]}")))
    bob = bob_key.user
    as_bob = _client(node, bob_key)
    name = _name("perm")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.add_permission(QueueUrl=url, Label="send", AWSAccountIds=[bob.username], Actions=["SendMessage"])
    sqs.add_permission(
        QueueUrl=url, Label="recv", AWSAccountIds=[bob.username], Actions=["ReceiveMessage", "SendMessage"]
    )
    assert _grants(bob, name) == {"produce", "consume"}
    policy = json.loads(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"])
    assert [s["Sid"] for s in policy["Statement"]] == ["send", "recv"]
    assert policy["Statement"][0]["Action"] == ["SQS:SendMessage"]

    def sends() -> bool:
        try:
            as_bob.send_message(QueueUrl=url, MessageBody="from bob")
        except ClientError:
            return False
        return True

    wait_until(sends, 20, "bob's grant")
    # a label taken, an AWS account ID, an unknown action: refused
    for kw in (
        {"Label": "send", "AWSAccountIds": [bob.username], "Actions": ["SendMessage"]},
        {"Label": "other", "AWSAccountIds": ["111122223333"], "Actions": ["SendMessage"]},
        {"Label": "other", "AWSAccountIds": [bob.username], "Actions": ["FlyToTheMoon"]},
    ):
        with pytest.raises(ClientError) as exc:
            sqs.add_permission(QueueUrl=url, **kw)
        assert exc.value.response["Error"]["Code"] == "InvalidParameterValue", kw
    # bob may not give permissions: manage
    with pytest.raises(ClientError) as exc:
        as_bob.add_permission(QueueUrl=url, Label="mine", AWSAccountIds=[bob.username], Actions=["*"])
    assert exc.value.response["Error"]["Code"] == "AccessDenied"
    # "send" removed: "recv" still gives produce
    sqs.remove_permission(QueueUrl=url, Label="send")
    assert _grants(bob, name) == {"produce", "consume"}
    sqs.remove_permission(QueueUrl=url, Label="recv")
    assert _grants(bob, name) == set()
    assert "Policy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    wait_until(lambda: not sends(), 20, "bob's grant taken back")
    with pytest.raises(ClientError) as exc:
        sqs.remove_permission(QueueUrl=url, Label="recv")
    assert exc.value.response["Error"]["Code"] == "InvalidParameterValue"


def test_add_and_remove_permission_query(node, key, sqs, committed):
    carol_key = committed(lambda: AccessKey.issue(User.objects.create(username=f"carol-{uuid.uuid4().hex[:8]}")))
    carol = carol_key.user
    name = _name("perm")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    _query(
        node,
        key,
        "AddPermission",
        QueueUrl=url,
        Label="all",
        **{"AWSAccountId.1": carol_key.access_key_id, "ActionName.1": "GetQueueAttributes", "ActionName.2": "*"},
    )
    assert _grants(carol, name) == {"read", "manage"}
    _query(node, key, "RemovePermission", QueueUrl=url, Label="all")
    assert _grants(carol, name) == set()
    status, tree = _post(node, key, {"Action": "RemovePermission", "QueueUrl": url, "Label": "all"})
    assert status == 400 and _text(tree, "s:Error/s:Code") == "InvalidParameterValue"
