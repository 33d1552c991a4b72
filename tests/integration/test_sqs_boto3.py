"""The SQS API with boto3 (AWS JSON 1.0, SigV4) against a real node on PostgreSQL + Redis.

Every action docs/reference/sqs.md's table lists as supported, FIFO order and deduplication, a dead-letter
queue by RedrivePolicy and the move back, long polling, batch errors per entry, signatures
refused (bad secret, unknown or revoked key, stale date), the REST API's permissions, and the
same messages read through both APIs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import boto3
import botocore.auth
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from queues.models import Grant, Queue
from sqs.ids import sqs_message_id
from sqs.models import AccessKey
from tests.integration.nodes import Client
from tests.launcher import wait_until

#: One node for the module's tests (:func:`module_node`): the rows it must read are committed
#: (:func:`committed`); each test reads the database in a transaction rolled back after it.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.node(shared=True)]


def _user(name: str = "sqs") -> User:
    return User.objects.create(username=f"{name}-{uuid.uuid4().hex[:8]}")


def _client(node, key: AccessKey | None = None, *, secret: str | None = None, key_id: str | None = None):
    return boto3.client(
        "sqs",
        endpoint_url=f"{node.url}/sqs",
        region_name="eu-west-1",
        aws_access_key_id=key_id or key.access_key_id,
        aws_secret_access_key=secret or key.secret,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}, read_timeout=60),
    )


def _code(exc: pytest.ExceptionInfo) -> str:
    return exc.value.response["Error"]["Code"]


def _name(prefix: str = "sq") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _receive_all(sqs, url: str, expected: int, **kw) -> list[dict]:
    got: list[dict] = []
    deadline = time.monotonic() + 30
    while len(got) < expected and time.monotonic() < deadline:
        got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, **kw).get("Messages", [])
    return got


# --- queues -------------------------------------------------------------------------------------
def test_queue_actions(sqs, node):
    name = _name()
    attrs = {"VisibilityTimeout": "45", "DelaySeconds": "0", "ReceiveMessageWaitTimeSeconds": "3"}
    url = sqs.create_queue(QueueName=name, Attributes=attrs, tags={"team": "a"})["QueueUrl"]
    assert url == f"{node.url}/sqs/eu-west-1/000000000000/{name}"
    # idempotent with the same attributes; another value is QueueAlreadyExists
    assert sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueNameExists) as exc:
        sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "46"})
    assert _code(exc) == "QueueAlreadyExists"
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    # the queue is the service's: its row has the settings
    row = Queue.objects.get(name=name)
    assert (row.visibility_timeout, row.strict) == (45, False)

    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got["VisibilityTimeout"] == "45"
    assert got["ReceiveMessageWaitTimeSeconds"] == "3"
    assert got["QueueArn"] == f"arn:aws:sqs:eu-west-1:000000000000:{name}"
    assert got["ApproximateNumberOfMessages"] == "0"
    assert int(got["CreatedTimestamp"]) > 0
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"MessageRetentionPeriod": "3600", "MaximumMessageSize": "2048"})
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["MessageRetentionPeriod", "MaximumMessageSize"])
    assert got["Attributes"] == {"MessageRetentionPeriod": "3600", "MaximumMessageSize": "2048"}
    with pytest.raises(ClientError) as exc:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "99999"})
    assert _code(exc) == "InvalidAttributeValue"
    with pytest.raises(ClientError) as exc:
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Nope"])
    assert _code(exc) == "InvalidAttributeName"

    # tags
    sqs.tag_queue(QueueUrl=url, Tags={"env": "test"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "env": "test"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test"}

    # list: prefix and pages
    prefix = _name("lst")
    urls = [sqs.create_queue(QueueName=f"{prefix}-{i}")["QueueUrl"] for i in range(5)]
    assert sqs.list_queues(QueueNamePrefix=prefix)["QueueUrls"] == urls
    pages, token = [], None
    while True:
        kw = {"NextToken": token} if token else {}
        page = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2, **kw)
        pages.append(page["QueueUrls"])
        token = page.get("NextToken")
        if not token:
            break
    assert [len(p) for p in pages] == [2, 2, 1]
    assert functools.reduce(operator.iadd, pages, []) == urls
    paginated = [
        u
        for p in sqs.get_paginator("list_queues").paginate(QueueNamePrefix=prefix, MaxResults=2)
        for u in p["QueueUrls"]
    ]
    assert paginated == urls

    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as exc:
        sqs.get_queue_url(QueueName=name)
    assert _code(exc) == "AWS.SimpleQueueService.NonExistentQueue"
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=url, MessageBody="x")
    assert not Queue.objects.filter(name=name).exists()


# --- messages -----------------------------------------------------------------------------------
def _md5_attributes(attrs: dict) -> str:
    """SQS's digest, written out here from the documented algorithm."""
    h = hashlib.md5()
    for name in sorted(attrs):
        a = attrs[name]
        value = a["BinaryValue"] if "BinaryValue" in a else a["StringValue"].encode()
        for part in (name.encode(), a["DataType"].encode()):
            h.update(len(part).to_bytes(4, "big") + part)
        h.update((b"\x02" if "BinaryValue" in a else b"\x01") + len(value).to_bytes(4, "big") + value)
    return h.hexdigest()


def test_send_receive_delete_with_attributes_and_digests(sqs):
    url = sqs.create_queue(QueueName=_name())["QueueUrl"]
    attrs = {
        "kind": {"DataType": "String", "StringValue": "order"},
        "n": {"DataType": "Number", "StringValue": "42"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xffdata"},
        "custom": {"DataType": "String.json", "StringValue": '{"a": 1}'},
    }
    sent = sqs.send_message(QueueUrl=url, MessageBody="héllo ✓", MessageAttributes=attrs)
    assert sent["MD5OfMessageBody"] == hashlib.md5("héllo ✓".encode()).hexdigest()
    assert sent["MD5OfMessageAttributes"] == _md5_attributes(attrs)

    (m,) = sqs.receive_message(
        QueueUrl=url, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"], WaitTimeSeconds=5
    )["Messages"]
    assert m["Body"] == "héllo ✓" and m["MessageId"] == sent["MessageId"]
    assert m["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert m["MessageAttributes"] == attrs
    assert m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert abs(int(m["Attributes"]["SentTimestamp"]) / 1000 - time.time()) < 120
    assert "ApproximateFirstReceiveTimestamp" in m["Attributes"] and "SenderId" in m["Attributes"]

    # in flight: not delivered again; visibility 0 gives it back with a receive count of 2
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
    (again,) = sqs.receive_message(
        QueueUrl=url, AttributeNames=["ApproximateReceiveCount"], MessageAttributeNames=["n", "bl.*"], WaitTimeSeconds=5
    )["Messages"]
    assert again["Attributes"] == {"ApproximateReceiveCount": "2"}
    assert set(again["MessageAttributes"]) == {"n"}
    # the first delivery's handle no longer acts on the message
    with pytest.raises(ClientError) as exc:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert _code(exc) == "ReceiptHandleIsInvalid"
    # a visibility change takes it (SQS: a standard queue's earlier receipt of a message in flight)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=60)
    with pytest.raises(ClientError) as exc:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
    assert _code(exc) == "ReceiptHandleIsInvalid"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])  # deleted already: fine, as SQS
    assert "Messages" not in sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)

    # bad input changes nothing
    for kw, code in (
        ({"MessageBody": "bad \x01"}, "InvalidMessageContents"),
        # (a String attribute's value: the body's rule and error, per the API reference)
        (
            {"MessageBody": "x", "MessageAttributes": {"a": {"DataType": "String", "StringValue": "bad \x01"}}},
            "InvalidMessageContents",
        ),
        ({"MessageBody": "x", "DelaySeconds": 901}, "InvalidParameterValue"),
        ({"MessageBody": "x", "MessageDeduplicationId": "d"}, "InvalidParameterValue"),
        (
            {"MessageBody": "x", "MessageAttributes": {"a": {"DataType": "Number", "StringValue": "x"}}},
            "InvalidParameterValue",
        ),
    ):
        with pytest.raises(ClientError) as exc:
            sqs.send_message(QueueUrl=url, **kw)
        assert _code(exc) == code, kw
    with pytest.raises(ClientError) as exc:
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11)
    assert _code(exc) == "InvalidParameterValue"
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"] == {
        "ApproximateNumberOfMessages": "0"
    }


def test_batches_and_their_errors_per_entry(sqs):
    url = sqs.create_queue(QueueName=_name(), Attributes={"VisibilityTimeout": "60"})["QueueUrl"]
    entries = [{"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(9)] + [{"Id": "bad", "MessageBody": "\x00"}]
    out = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert sorted(s["Id"] for s in out["Successful"]) == sorted(f"m{i}" for i in range(9))
    assert out["Failed"] == [
        {"Id": "bad", "SenderFault": True, "Code": "InvalidMessageContents", "Message": out["Failed"][0]["Message"]}
    ]
    for s in out["Successful"]:
        assert s["MD5OfMessageBody"] == hashlib.md5(f"body {s['Id'][1:]}".encode()).hexdigest()

    for kw, code in (
        ({"Entries": []}, "AWS.SimpleQueueService.EmptyBatchRequest"),
        (
            {"Entries": [{"Id": f"e{i}", "MessageBody": "x"} for i in range(11)]},
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        ),
        ({"Entries": [{"Id": "same", "MessageBody": "x"}] * 2}, "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
        ({"Entries": [{"Id": "no spaces", "MessageBody": "x"}]}, "AWS.SimpleQueueService.InvalidBatchEntryId"),
    ):
        with pytest.raises(ClientError) as exc:
            sqs.send_message_batch(QueueUrl=url, **kw)
        assert _code(exc) == code
    with pytest.raises(sqs.exceptions.BatchEntryIdsNotDistinct):
        sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": "x"}] * 2)

    got = _receive_all(sqs, url, 9)
    assert sorted(m["Body"] for m in got) == sorted(f"body {i}" for i in range(9))
    # visibility per entry: one bad handle fails alone
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok", "ReceiptHandle": got[0]["ReceiptHandle"], "VisibilityTimeout": 120},
            {"Id": "junk", "ReceiptHandle": "junk", "VisibilityTimeout": 1},
        ],
    )
    assert [s["Id"] for s in changed["Successful"]] == ["ok"]
    assert [(f["Id"], f["Code"]) for f in changed["Failed"]] == [("junk", "ReceiptHandleIsInvalid")]
    # delete per entry: a stale handle (given back and received again) fails alone, the rest go
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=got[1]["ReceiptHandle"], VisibilityTimeout=0)
    (again,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert again["MessageId"] == got[1]["MessageId"]
    deleted = sqs.delete_message_batch(
        QueueUrl=url, Entries=[{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
    )
    assert [f["Id"] for f in deleted["Failed"]] == ["d1"]
    assert deleted["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    assert sorted(s["Id"] for s in deleted["Successful"]) == sorted(f"d{i}" for i in range(9) if i != 1)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)


def test_long_polling_and_purge_and_delay(sqs):
    url = sqs.create_queue(QueueName=_name(), Attributes={"ReceiveMessageWaitTimeSeconds": "20"})["QueueUrl"]
    got: list = []

    def receive():  # the queue's ReceiveMessageWaitTimeSeconds: a long poll without WaitTimeSeconds
        got.append(sqs.receive_message(QueueUrl=url).get("Messages", []))

    t = threading.Thread(target=receive)
    t.start()
    time.sleep(1.0)  # the receive is waiting (an empty answer would end it early: checked below)
    assert t.is_alive(), "the receive answered at once instead of waiting"
    sqs.send_message(QueueUrl=url, MessageBody="late")
    t.join(30)
    assert [m["Body"] for m in got[0]] == ["late"]

    # a delayed message is not delivered before its time
    sqs.send_message(QueueUrl=url, MessageBody="delayed", DelaySeconds=2)
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    wait_until(lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages"), 30, "the delayed message")

    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(5)])
    sqs.purge_queue(QueueUrl=url)
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)


# --- FIFO ---------------------------------------------------------------------------------------
def test_fifo_order_dedup_and_sequence(sqs):
    name = _name("fifo") + ".fifo"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    assert url.endswith("/" + name)
    row = Queue.objects.get(name=name[: -len(".fifo")] + "-fifo")
    assert row.strict and row.group_batch and row.dedup_window == 300
    with pytest.raises(ClientError) as exc:
        sqs.create_queue(QueueName=_name(), Attributes={"FifoQueue": "true"})
    assert _code(exc) == "InvalidParameterValue"

    with pytest.raises(ClientError) as exc:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")
    assert _code(exc) == "MissingParameter"
    with pytest.raises(ClientError) as exc:  # no dedup ID and no content-based deduplication
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g")
    assert _code(exc) == "InvalidParameterValue"

    ids = {}
    for group in ("a", "b"):
        for i in range(5):
            ids[(group, i)] = sqs.send_message(
                QueueUrl=url, MessageBody=f"{group}{i}", MessageGroupId=group, MessageDeduplicationId=f"{group}-{i}"
            )["MessageId"]
    # the same dedup ID within five minutes: the first message's ID, nothing stored
    repeat = sqs.send_message(QueueUrl=url, MessageBody="other", MessageGroupId="a", MessageDeduplicationId="a-0")
    assert repeat["MessageId"] == ids[("a", 0)]
    # content-based deduplication
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"ContentBasedDeduplication": "true"})
    first = sqs.send_message(QueueUrl=url, MessageBody="same body", MessageGroupId="c")["MessageId"]
    assert sqs.send_message(QueueUrl=url, MessageBody="same body", MessageGroupId="c")["MessageId"] == first

    seen: dict[str, list] = {}
    deadline = time.monotonic() + 30
    while sum(len(v) for v in seen.values()) < 11 and time.monotonic() < deadline:
        for m in sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"], WaitTimeSeconds=1
        ).get("Messages", []):
            a = m["Attributes"]
            seen.setdefault(a["MessageGroupId"], []).append(m)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert [m["Body"] for m in seen["a"]] == [f"a{i}" for i in range(5)]
    assert [m["Body"] for m in seen["b"]] == [f"b{i}" for i in range(5)]
    assert [m["Body"] for m in seen["c"]] == ["same body"]
    sequences = [int(m["Attributes"]["SequenceNumber"]) for m in seen["a"]]
    assert sequences == sorted(sequences) and len(set(sequences)) == 5
    assert seen["a"][0]["Attributes"]["MessageDeduplicationId"] == "a-0"
    assert seen["c"][0]["Attributes"]["MessageDeduplicationId"] == hashlib.sha256(b"same body").hexdigest()


def test_fifo_group_is_held_while_a_message_is_in_flight(sqs):
    url = sqs.create_queue(
        QueueName=_name("fifo") + ".fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageGroupId="g")
    (m0,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=5)["Messages"]
    assert m0["Body"] == "m0"
    # while m0 is in flight its group is held back
    assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m0["ReceiptHandle"])
    got = _receive_all(sqs, url, 1)
    assert got[0]["Body"] == "m1"


# --- dead letters -------------------------------------------------------------------------------
def test_dead_letter_queue_by_redrive_policy_and_the_move_back(sqs):
    dlq_url = sqs.create_queue(QueueName=_name("dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    url = sqs.create_queue(QueueName=_name("src"), Attributes={"RedrivePolicy": policy})["QueueUrl"]
    got = json.loads(
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"]["RedrivePolicy"]
    )
    assert got == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == [url]

    sqs.send_message(QueueUrl=url, MessageBody="poison")
    for _ in range(2):  # received twice, never deleted
        (m,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, VisibilityTimeout=0)["Messages"]
        assert m["Body"] == "poison"

    found: list[dict] = []

    def dead() -> bool:
        # a receive of the source sets aside what is past maxReceiveCount and moves it
        sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0, VisibilityTimeout=0)
        found[:] = sqs.receive_message(
            QueueUrl=dlq_url, MessageSystemAttributeNames=["DeadLetterQueueSourceArn"], WaitTimeSeconds=1
        ).get("Messages", [])
        return bool(found)

    wait_until(dead, 30, "the dead letter")
    (d,) = found
    sqs.change_message_visibility(QueueUrl=dlq_url, ReceiptHandle=d["ReceiptHandle"], VisibilityTimeout=0)
    assert d["Body"] == "poison"
    assert d["Attributes"]["DeadLetterQueueSourceArn"].endswith(":" + url.rsplit("/", 1)[1])

    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    tasks = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert handle and tasks[0]["Status"] == "COMPLETED"
    assert "TaskHandle" not in tasks[0]  # SQS: listed only while the task runs
    assert tasks[0]["ApproximateNumberOfMessagesMoved"] == 1
    (back,) = _receive_all(sqs, url, 1)
    assert back["Body"] == "poison"
    assert "Messages" not in sqs.receive_message(QueueUrl=dlq_url, WaitTimeSeconds=1)

    # a FIFO queue's dead-letter queue is a FIFO queue
    with pytest.raises(ClientError) as exc:
        sqs.create_queue(QueueName=_name("f") + ".fifo", Attributes={"FifoQueue": "true", "RedrivePolicy": policy})
    assert _code(exc) == "InvalidParameterValue"
    # "" removes the policy
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": ""})
    assert "RedrivePolicy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]


# --- signatures and permissions -----------------------------------------------------------------
def _signed_at(when: datetime):
    """botocore signing as if its clock read ``when``."""
    real = botocore.auth.datetime.datetime

    class Fixed(real):
        @classmethod
        def utcnow(cls):
            return when.replace(tzinfo=None)

        @classmethod
        def now(cls, tz=None):
            return when if tz else when.replace(tzinfo=None)

    return real, Fixed


def test_signatures_refused(node, committed, cluster_member):
    user = committed(_user)
    key = committed(lambda: AccessKey.issue(user))
    good = _client(node, key)
    url = good.create_queue(QueueName=_name())["QueueUrl"]

    with pytest.raises(ClientError) as exc:
        _client(node, key, secret="wrong-secret").send_message(QueueUrl=url, MessageBody="x")
    assert _code(exc) == "SignatureDoesNotMatch"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as exc:
        _client(node, key_id="AKMQNOSUCHKEY0000000", secret="s").list_queues()
    assert _code(exc) == "InvalidClientTokenId"

    real, fixed = _signed_at(datetime.now(UTC) - timedelta(minutes=20))
    botocore.auth.datetime.datetime = fixed
    try:
        with pytest.raises(ClientError) as exc:
            _client(node, key).list_queues()
    finally:
        botocore.auth.datetime.datetime = real
    assert _code(exc) == "RequestExpired"

    # unsigned, and a form of the JSON protocol without a signature
    r = requests.post(
        f"{node.url}/sqs/",
        data="{}",
        headers={"X-Amz-Target": "AmazonSQS.ListQueues", "Content-Type": "application/x-amz-json-1.0"},
        timeout=10,
    )
    assert r.status_code == 403 and r.headers["x-amzn-query-error"].startswith("MissingAuthenticationToken;")

    # nothing of the refused calls was stored
    assert "Messages" not in good.receive_message(QueueUrl=url)
    wait_until(lambda: AccessKey.objects.get(pk=key.pk).last_used_at is not None, 10, "last use recorded")
    committed(key.revoke)
    with pytest.raises(ClientError) as exc:
        good.list_queues()
    assert _code(exc) == "InvalidClientTokenId"
    user.is_active = False
    committed(user.save)
    with pytest.raises(ClientError) as exc:
        _client(node, committed(lambda: AccessKey.issue(user))).list_queues()
    assert _code(exc) == "InvalidClientTokenId"


def test_the_rest_api_permissions_apply(node, committed):
    owner, producer, stranger = committed(lambda: (_user("owner"), _user("producer"), _user("stranger")))
    owner_sqs = _client(node, committed(lambda: AccessKey.issue(owner)))
    url = owner_sqs.create_queue(QueueName=_name("perm"))["QueueUrl"]
    committed(
        lambda: Grant.objects.create(
            user=producer, queue=Queue.objects.get(name=url.rsplit("/", 1)[1]), action="produce"
        )
    )
    producer_sqs = _client(node, committed(lambda: AccessKey.issue(producer)))
    stranger_sqs = _client(node, committed(lambda: AccessKey.issue(stranger)))

    def can_send():
        try:
            producer_sqs.send_message(QueueUrl=url, MessageBody="from producer")
            return True
        except producer_sqs.exceptions.QueueDoesNotExist:
            return False  # the node reads grants again within a few seconds

    wait_until(can_send, 20, "the grant to apply")
    with pytest.raises(ClientError) as exc:
        producer_sqs.receive_message(QueueUrl=url)
    assert _code(exc) == "AccessDenied"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as exc:
        producer_sqs.purge_queue(QueueUrl=url)
    assert _code(exc) == "AccessDenied"
    with pytest.raises(ClientError) as exc:
        producer_sqs.tag_queue(QueueUrl=url, Tags={"a": "b"})
    assert _code(exc) == "AccessDenied"
    # a queue the caller may not read does not exist for it, and is not listed
    with pytest.raises(stranger_sqs.exceptions.QueueDoesNotExist):
        stranger_sqs.send_message(QueueUrl=url, MessageBody="x")
    assert url not in stranger_sqs.list_queues().get("QueueUrls", [])
    (m,) = owner_sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert m["Body"] == "from producer"


# --- the same queues through both APIs ----------------------------------------------------------
def test_messages_cross_between_boto3_and_the_rest_api(node, committed):
    user = committed(_user)
    sqs = _client(node, committed(lambda: AccessKey.issue(user)))
    rest = Client(node.url, committed(lambda: Token.objects.create(user=user)).key)
    name = _name("both")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]

    # boto3 -> REST
    sent = sqs.send_message(
        QueueUrl=url, MessageBody="to rest", MessageAttributes={"k": {"DataType": "String", "StringValue": "v"}}
    )
    r = rest.post(f"queues/{name}/dequeue", {"max": 10, "wait": 5})
    assert r.status_code == 200, r.text
    (m,) = r.json()["messages"]
    # the REST API's ID is the service's path; the SQS API's has no "/" (sqs.ids)
    assert (sqs_message_id(m["id"]), m["body"], m["attributes"]["k"]) == (sent["MessageId"], "to rest", "v")
    assert (
        rest.post(f"queues/{name}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]}]}).json()["acked"] == 1
    )

    # REST -> boto3 (REST attributes read as String / Number)
    r = rest.post(f"queues/{name}/enqueue", {"body": "to boto3", "attributes": {"s": "x", "n": 7}})
    assert r.status_code == 201, r.text
    (got,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], WaitTimeSeconds=5)["Messages"]
    assert (got["MessageId"], got["Body"]) == (sqs_message_id(r.json()["id"]), "to boto3")
    assert got["MessageAttributes"] == {
        "s": {"DataType": "String", "StringValue": "x"},
        "n": {"DataType": "Number", "StringValue": "7"},
    }
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
    assert rest.get(f"queues/{name}/stats").json()["depth"] == 0

    # a FIFO queue is the strict queue <name>-fifo of the REST API
    fifo = sqs.create_queue(QueueName=f"{name}.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    sqs.send_message(QueueUrl=fifo, MessageBody="f", MessageGroupId="g", MessageDeduplicationId="1")
    r = rest.post(f"queues/{name}-fifo/dequeue", {"max": 1, "wait": 5})
    assert [(x["body"], x["group"]) for x in r.json()["messages"]] == [("f", "g")]


def test_the_endpoint_answers_at_the_root_too(node, committed):
    # kombu's SQS transport (so Celery) takes a host and port only and posts to /
    key = committed(lambda: AccessKey.issue(_user()))
    at_root = boto3.client(
        "sqs",
        endpoint_url=node.url,
        region_name="eu-west-1",
        aws_access_key_id=key.access_key_id,
        aws_secret_access_key=key.secret,
    )
    url = at_root.create_queue(QueueName=_name())["QueueUrl"]
    assert url.startswith(f"{node.url}/sqs/eu-west-1/000000000000/")
    at_root.send_message(QueueUrl=url, MessageBody="via /")
    (m,) = _client(node, key).receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert m["Body"] == "via /"
    # and GET / is the node's map (config/root.py), which names the SQS endpoint
    page = requests.get(f"{node.url}/", timeout=10)
    assert page.status_code == 200 and page.json()["sqs"] == "/sqs"
