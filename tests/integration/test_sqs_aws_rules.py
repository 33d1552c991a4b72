"""SQS's validation and error codes as AWS's API reference gives them, action by action, on
both protocols: AWS JSON 1.0 (boto3) and the query protocol (botocore's own query serializer
and parser, signed with SigV4), against a real node on PostgreSQL + Redis. Each refusal is
checked to change nothing.

The sources, by point: SendMessageBatch (the batch's 1 MiB counted with message attributes,
BatchRequestTooLong; a FIFO entry needs MessageGroupId, and a MessageDeduplicationId unless
ContentBasedDeduplication), CreateQueue / SetQueueAttributes (the FIFO-only attributes, the
``.fifo`` name with ``FifoQueue``, ``Policy`` removed by ``""``, RedrivePolicy's
InvalidParameterValue), the message attribute's Name (alphanumeric, ``_``, ``-``, ``.``),
ChangeMessageVisibility / DeleteMessage (a FIFO receipt expires with its visibility timeout:
InvalidParameterValue "The receipt handle has expired"), PurgeQueue and SendMessage's
DelaySeconds ("If you don't specify a value, the default value for the queue applies").
"""

from __future__ import annotations

import base64
import importlib.util
import json
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from botocore.model import ServiceModel
from botocore.parsers import create_parser
from botocore.serialize import create_serializer
from django.contrib.auth.models import User

from sqs.models import AccessKey
from tests.launcher import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.django_db]

_spec = importlib.util.spec_from_file_location(
    "gen_sqs_query_shapes", Path(__file__).resolve().parents[2] / "scripts" / "gen_sqs_query_shapes.py"
)
assert _spec and _spec.loader
_gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gen)
_RAW = botocore.session.get_session().get_component("data_loader").load_service_model("sqs", "service-2")
QUERY_MODEL = ServiceModel(_gen.query_model(_RAW), service_name="sqs")
NS = {"s": "http://queue.amazonaws.com/doc/2012-11-05/"}


class Refused(Exception):
    def __init__(self, code: str, status: int, message: str = ""):
        super().__init__(f"{status} {code}: {message}")
        self.code = code
        self.status = status
        self.message = message


class Api:
    """One SQS client, ``protocol`` "json" or "query": ``sqs_api("SendMessage", QueueUrl=...)``
    answers the result as botocore parses it, or raises :class:`Refused` with the error code
    (the query protocol's, which boto3 reads from the JSON protocol's header too)."""

    def __init__(self, node: Any, key: AccessKey, protocol: str):
        self.node, self.key, self.protocol = node, key, protocol
        self.client = boto3.client(
            "sqs",
            endpoint_url=f"{node.url}/sqs",
            region_name="eu-west-1",
            aws_access_key_id=key.access_key_id,
            aws_secret_access_key=key.secret,
            config=Config(retries={"max_attempts": 1}, read_timeout=60),
        )

    def __call__(self, action: str, **params: Any) -> dict[str, Any]:
        if self.protocol == "json":
            method = getattr(self.client, botocore.xform_name(action))
            try:
                return method(**params)
            except ClientError as exc:
                raise Refused(
                    exc.response["Error"]["Code"],
                    exc.response["ResponseMetadata"]["HTTPStatusCode"],
                    exc.response["Error"].get("Message", ""),
                ) from None
        op = QUERY_MODEL.operation_model(action)
        request = create_serializer("query", include_validation=False).serialize_to_request(params, op)
        body = request["body"]
        url = f"{self.node.url}/sqs"
        aws = AWSRequest("POST", url, data=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
        SigV4Auth(Credentials(self.key.access_key_id, self.key.secret), "sqs", "eu-west-1").add_auth(aws)
        aws.prepare()
        r = requests.post(url, data=aws.body, headers=dict(aws.headers), timeout=60)
        if r.status_code >= 400:
            error = ET.fromstring(r.content)
            code, message = error.find("s:Error/s:Code", NS), error.find("s:Error/s:Message", NS)
            raise Refused(
                code.text if code is not None else "?",
                r.status_code,
                (message.text or "") if message is not None else "",
            )
        response = {"status_code": r.status_code, "headers": dict(r.headers), "body": r.content}
        return create_parser("query").parse(response, op.output_shape)


def _name(prefix: str = "r") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _refused(sqs_api: Api, action: str, **params: Any) -> Refused:
    with pytest.raises(Refused) as exc:
        sqs_api(action, **params)
    assert 400 <= exc.value.status < 500
    return exc.value


def _receive(sqs_api: Api, url: str, wait: int = 1, **kw: Any) -> list[dict[str, Any]]:
    return sqs_api("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait, **kw).get(
        "Messages", []
    )


def _depth(sqs_api: Api, url: str) -> int:
    attrs = sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attrs["Attributes"]["ApproximateNumberOfMessages"])


#: The counts a queue answers: available, in flight, delayed.
_COUNTS = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)


def _counts(sqs_api: Api, url: str) -> tuple[str, ...]:
    """The queue's :data:`_COUNTS`, in that order."""
    got = sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=list(_COUNTS))["Attributes"]
    return tuple(got[name] for name in _COUNTS)


def _fifo(sqs_api: Api, **attrs: str) -> str:
    return sqs_api("CreateQueue", QueueName=_name("f") + ".fifo", Attributes={"FifoQueue": "true", **attrs})["QueueUrl"]


# --- SendMessageBatch: what refuses the whole batch --------------------------------------------
def test_a_fifo_batch_without_a_group_or_a_dedup_id_is_refused_whole(sqs_api):
    url = _fifo(sqs_api)
    good = {"Id": "good", "MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "d1"}
    e = _refused(sqs_api, "SendMessageBatch", QueueUrl=url, Entries=[good, {"Id": "nogroup", "MessageBody": "b"}])
    assert e.code == "MissingParameter"
    no_dedup = {"Id": "nodedup", "MessageBody": "c", "MessageGroupId": "g"}
    e = _refused(sqs_api, "SendMessageBatch", QueueUrl=url, Entries=[good, no_dedup])
    assert e.code == "InvalidParameterValue"
    assert _depth(sqs_api, url) == 0  # the good entry was not stored either
    # with content-based deduplication the ID may be left out
    url = _fifo(sqs_api, ContentBasedDeduplication="true")
    out = sqs_api("SendMessageBatch", QueueUrl=url, Entries=[no_dedup])
    assert [s["Id"] for s in out["Successful"]] == ["nodedup"]


def test_a_batch_over_1_mib_with_its_attributes_is_batch_request_too_long(sqs_api):
    url = sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    # five messages of 200 KiB bodies (1,000 KiB: under 1 MiB) and 20 KiB attributes each
    attr = {"pad": {"DataType": "String", "StringValue": "a" * 20 * 1024}}
    entries = [{"Id": f"m{i}", "MessageBody": "b" * 200 * 1024, "MessageAttributes": attr} for i in range(5)]
    e = _refused(sqs_api, "SendMessageBatch", QueueUrl=url, Entries=entries)
    assert e.code == "AWS.SimpleQueueService.BatchRequestTooLong"
    assert _depth(sqs_api, url) == 0
    out = sqs_api("SendMessageBatch", QueueUrl=url, Entries=entries[:4])  # 880 KiB in all: taken
    assert len(out["Successful"]) == 4


# --- CreateQueue, SetQueueAttributes ------------------------------------------------------------
def test_fifo_attributes_are_unknown_on_a_standard_queue(sqs_api):
    name = _name("std")
    for attrs, code in (
        ({"ContentBasedDeduplication": "false"}, "InvalidAttributeName"),
        ({"DeduplicationScope": "queue"}, "InvalidAttributeName"),
        ({"FifoThroughputLimit": "perQueue"}, "InvalidAttributeName"),
        ({"FifoQueue": "true"}, "InvalidParameterValue"),  # a FIFO queue's name ends in .fifo
    ):
        assert _refused(sqs_api, "CreateQueue", QueueName=name, Attributes=attrs).code == code, attrs
    # a .fifo name is a FIFO queue's only with FifoQueue=true
    for attrs in ({}, {"FifoQueue": "false"}):
        assert (
            _refused(sqs_api, "CreateQueue", QueueName=name + ".fifo", Attributes=attrs).code == "InvalidParameterValue"
        )
    assert "QueueUrls" not in sqs_api("ListQueues", QueueNamePrefix=name)
    url = sqs_api("CreateQueue", QueueName=name)["QueueUrl"]
    for attrs in ({"ContentBasedDeduplication": "true"}, {"DeduplicationScope": "messageGroup"}):
        assert _refused(sqs_api, "SetQueueAttributes", QueueUrl=url, Attributes=attrs).code == "InvalidAttributeName"
    got = sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert not {"ContentBasedDeduplication", "DeduplicationScope", "FifoQueue"} & set(got)
    # on a FIFO queue they are known, with SQS's values only
    fifo = _fifo(sqs_api, DeduplicationScope="messageGroup", FifoThroughputLimit="perMessageGroupId")
    e = _refused(sqs_api, "SetQueueAttributes", QueueUrl=fifo, Attributes={"DeduplicationScope": "everywhere"})
    assert e.code == "InvalidAttributeValue"
    got = sqs_api("GetQueueAttributes", QueueUrl=fifo, AttributeNames=["All"])["Attributes"]
    assert got["DeduplicationScope"] == "messageGroup" and got["FifoThroughputLimit"] == "perMessageGroupId"


def test_add_permission_takes_the_endpoint_s_own_account_and_grants_nobody(sqs_api):
    """AddPermission naming the account the queue URLs name: taken, as SQS takes its own
    account; the statement is in the Policy and RemovePermission takes it out again."""
    url = sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    account = url.rstrip("/").split("/")[-2]
    sqs_api("AddPermission", QueueUrl=url, Label="own", AWSAccountIds=[account], Actions=["SendMessage"])
    policy = json.loads(sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"])
    (statement,) = policy["Statement"]
    assert statement["Principal"] == {"AWS": [f"arn:aws:iam::{account}:root"]}
    assert statement["Action"] == ["SQS:SendMessage"]
    other = "123456789012" if account != "123456789012" else "210987654321"
    e = _refused(sqs_api, "AddPermission", QueueUrl=url, Label="other", AWSAccountIds=[other], Actions=["SendMessage"])
    assert e.code == "InvalidParameterValue"
    sqs_api("RemovePermission", QueueUrl=url, Label="own")
    assert "Policy" not in sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["Policy"]).get("Attributes", {})


def test_an_empty_policy_removes_it(sqs_api):
    url = sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    policy = '{"Version":"2012-10-17","Statement":[]}'
    sqs_api("SetQueueAttributes", QueueUrl=url, Attributes={"Policy": policy})
    assert sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["Policy"])["Attributes"] == {"Policy": policy}
    sqs_api("SetQueueAttributes", QueueUrl=url, Attributes={"Policy": ""})
    assert "Policy" not in sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]


def test_redrive_policy_refusals_are_invalid_parameter_value(sqs_api):
    url = sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    arn = sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    dlq = sqs_api("CreateQueue", QueueName=_name("dlq"))["QueueUrl"]
    dlq_arn = sqs_api("GetQueueAttributes", QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for policy in (
        f'{{"deadLetterTargetArn":"{arn}","maxReceiveCount":3}}',  # itself
        f'{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":0}}',
        f'{{"deadLetterTargetArn":"{arn[:-8]}nothere1","maxReceiveCount":3}}',
        "not json",
    ):
        e = _refused(sqs_api, "SetQueueAttributes", QueueUrl=url, Attributes={"RedrivePolicy": policy})
        assert e.code == "InvalidParameterValue", policy
    assert "RedrivePolicy" not in sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    # a queue created naming itself does not exist yet: refused alike, and not created
    name = _name()
    policy = f'{{"deadLetterTargetArn":"{arn.rsplit(":", 1)[0]}:{name}","maxReceiveCount":3}}'
    e = _refused(sqs_api, "CreateQueue", QueueName=name, Attributes={"RedrivePolicy": policy})
    assert e.code == "InvalidParameterValue"
    assert "QueueUrls" not in sqs_api("ListQueues", QueueNamePrefix=name)


# CreateQueue's MaximumMessageSize: "from 1,024 bytes (1 KiB) up to 1,048,576 bytes (1 MiB). Default:
# 1,048,576 bytes (1 MiB)." Here a dead letter must fit its dead-letter queue, so a queue whose
# RedrivePolicy names a smaller one takes that queue's size when it names none.
MIB = 1024 * 1024


def test_maximum_message_size_defaults_to_1_mib_and_a_1_mib_message_is_taken(sqs_api):
    url = sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    got = sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["MaximumMessageSize"])["Attributes"]
    assert got == {"MaximumMessageSize": str(MIB)}
    # 1 MiB counted with the message attributes, through the node's request limits: over JSON
    # as 2-byte characters, which boto3 escapes to 6 bytes each (3 MiB of request); over the
    # query protocol as ASCII (the node's form parsing takes seconds over 3 MiB of %XX)
    attrs = {"a": {"DataType": "String", "StringValue": "v"}}  # 1 + 6 + 1 bytes
    body = "é" * ((MIB - 8) // 2) if sqs_api.protocol == "json" else "a" * (MIB - 8)
    sqs_api("SendMessage", QueueUrl=url, MessageBody=body, MessageAttributes=attrs)
    e = _refused(sqs_api, "SendMessage", QueueUrl=url, MessageBody=body + "x", MessageAttributes=attrs)
    assert e.code == "InvalidParameterValue"
    (m,) = _receive(sqs_api, url, 5, MessageAttributeNames=["All"])
    assert m["Body"] == body and m["MessageAttributes"]["a"]["StringValue"] == "v"


def test_a_queue_whose_dead_letter_queue_is_smaller_takes_its_size(sqs_api):
    small = sqs_api("CreateQueue", QueueName=_name("dlq"), Attributes={"MaximumMessageSize": str(256 * 1024)})[
        "QueueUrl"
    ]
    policy = json.dumps({"deadLetterTargetArn": _arn(sqs_api, small), "maxReceiveCount": "3"})
    url = sqs_api("CreateQueue", QueueName=_name(), Attributes={"RedrivePolicy": policy})["QueueUrl"]
    got = sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["MaximumMessageSize"])["Attributes"]
    assert got == {"MaximumMessageSize": str(256 * 1024)}
    # named, a size over the dead-letter queue's is refused
    e = _refused(
        sqs_api, "CreateQueue", QueueName=_name(), Attributes={"RedrivePolicy": policy, "MaximumMessageSize": str(MIB)}
    )
    assert e.code == "InvalidAttributeValue"
    e = _refused(sqs_api, "SetQueueAttributes", QueueUrl=url, Attributes={"MaximumMessageSize": str(MIB)})
    assert e.code == "InvalidAttributeValue"


# --- messages -----------------------------------------------------------------------------------
def test_message_attribute_names_take_unicode_letters_and_digits(sqs_api):
    url = sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    attrs = {
        "größe": {"DataType": "Number", "StringValue": "3"},
        "数量.単位_x-1": {"DataType": "String", "StringValue": "個"},
    }
    sent = sqs_api("SendMessage", QueueUrl=url, MessageBody="x", MessageAttributes=attrs)
    (m,) = _receive(sqs_api, url, 5, MessageAttributeNames=["All"])
    assert m["MessageAttributes"] == attrs
    assert m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    # what the name may not hold is still refused, and nothing is stored
    for bad in ("with space", "a/b", "AWS.x", ".start", "a..b"):
        attrs = {bad: {"DataType": "String", "StringValue": "v"}}
        e = _refused(sqs_api, "SendMessage", QueueUrl=url, MessageBody="y", MessageAttributes=attrs)
        assert e.code == "InvalidParameterValue", bad
    assert _depth(sqs_api, url) == 0


def test_a_message_delay_of_zero_overrides_the_queues(sqs_api):
    url = sqs_api("CreateQueue", QueueName=_name(), Attributes={"DelaySeconds": "60"})["QueueUrl"]
    sqs_api("SendMessage", QueueUrl=url, MessageBody="queue's delay")
    sqs_api("SendMessage", QueueUrl=url, MessageBody="now", DelaySeconds=0)
    sqs_api("SendMessageBatch", QueueUrl=url, Entries=[{"Id": "b", "MessageBody": "batch now", "DelaySeconds": 0}])
    got: list[dict[str, Any]] = []
    for _ in range(5):
        got += _receive(sqs_api, url, 1)
        if len(got) >= 2:
            break
    assert sorted(m["Body"] for m in got) == ["batch now", "now"]


def test_a_fifo_message_delay_of_zero_leaves_the_queues_in_force(sqs_api):
    """SendMessage: "When you set FifoQueue, you can't set DelaySeconds per message. You can
    set this parameter only on a queue level": 0 is taken, and the queue's delay applies."""
    url = _fifo(sqs_api, ContentBasedDeduplication="true", DelaySeconds="60")
    sqs_api("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="g", DelaySeconds=0)
    sqs_api(
        "SendMessageBatch",
        QueueUrl=url,
        Entries=[{"Id": "b", "MessageBody": "y", "MessageGroupId": "h", "DelaySeconds": 0}],
    )
    assert _receive(sqs_api, url, 1) == []
    counts = sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesDelayed"])
    assert counts["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "2"
    e = _refused(sqs_api, "SendMessage", QueueUrl=url, MessageBody="z", MessageGroupId="g", DelaySeconds=1)
    assert e.code == "InvalidParameterValue"


def test_change_visibility_takes_an_earlier_receipt_of_a_standard_queue(sqs_api):
    url = sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    sqs_api("SendMessage", QueueUrl=url, MessageBody="x")
    (first,) = _receive(sqs_api, url, 5)
    sqs_api("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    (second,) = _receive(sqs_api, url, 5)
    assert second["MessageId"] == first["MessageId"]
    # the first delivery's receipt still changes the message in flight
    sqs_api("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    (third,) = _receive(sqs_api, url, 5, AttributeNames=["ApproximateReceiveCount"])
    assert third["Attributes"]["ApproximateReceiveCount"] == "3"
    sqs_api("DeleteMessage", QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])
    # a message deleted is not available for a visibility change
    e = _refused(
        sqs_api, "ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=third["ReceiptHandle"], VisibilityTimeout=5
    )
    assert e.code == "InvalidParameterValue"


def test_a_receipt_of_a_message_visible_again_hides_nothing(sqs_api):
    """ChangeMessageVisibility: a message whose visibility timeout ran out is not in flight,
    so no receipt of it hides it again, alone or in a batch, whether or not anyone received
    it since; the message stays visible (nobody's receive count moved)."""
    url = sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    sqs_api("SendMessage", QueueUrl=url, MessageBody="x")
    (m,) = _receive(sqs_api, url, 5, VisibilityTimeout=1)
    time.sleep(1.5)
    e = _refused(
        sqs_api, "ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=30
    )
    assert e.code == "InvalidParameterValue" and "not available for visibility timeout change" in e.message
    batch = sqs_api(
        "ChangeMessageVisibilityBatch",
        QueueUrl=url,
        Entries=[{"Id": "a", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 30}],
    )
    assert [(f["Id"], f["Code"]) for f in batch["Failed"]] == [("a", "InvalidParameterValue")]
    assert batch.get("Successful", []) == []
    (again,) = _receive(sqs_api, url, 0, AttributeNames=["ApproximateReceiveCount"])
    assert again["MessageId"] == m["MessageId"] and again["Attributes"]["ApproximateReceiveCount"] == "2"
    # the new receipt changes it; the first one still does not
    sqs_api("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=0)
    (third,) = _receive(sqs_api, url, 5)
    assert third["MessageId"] == m["MessageId"]
    sqs_api("DeleteMessage", QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_a_visibility_totals_at_most_12_hours_from_the_receive(sqs_api, fifo):
    """ChangeMessageVisibility: "If you attempt to set VisibilityTimeout to a value greater than
    the maximum time left, Amazon SQS returns an error" (12 hours from the receive in all)."""
    url = (
        _fifo(sqs_api, ContentBasedDeduplication="true")
        if fifo
        else sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    )
    sqs_api("SendMessage", QueueUrl=url, MessageBody="x", **({"MessageGroupId": "g"} if fifo else {}))
    (m,) = _receive(sqs_api, url, 5, VisibilityTimeout=60)
    # at once after the receive, the whole 12 hours are left
    sqs_api("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=43200)
    time.sleep(2.1)
    for action, params in (
        ("ChangeMessageVisibility", {"ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 43200}),
        ("ChangeMessageVisibility", {"ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 43199}),
    ):
        e = _refused(sqs_api, action, QueueUrl=url, **params)
        assert e.code == "InvalidParameterValue" and "Total VisibilityTimeout" in e.message, e
    batch = sqs_api(
        "ChangeMessageVisibilityBatch",
        QueueUrl=url,
        Entries=[
            {"Id": "over", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 43200},
            {"Id": "within", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0},
        ],
    )
    assert [f["Id"] for f in batch["Failed"]] == ["over"] and [s["Id"] for s in batch["Successful"]] == ["within"]
    # the entry within the limit took effect: visible at once
    (again,) = _receive(sqs_api, url, 5)
    assert again["MessageId"] == m["MessageId"]


@pytest.mark.parametrize("where", ["message", "queue"])
def test_a_long_poll_wakes_when_a_delay_ends(sqs_api, where):
    """A receive waiting 20 s answers a message delayed 1 s (its own DelaySeconds, or the
    queue's) when the delay ends, not when the wait does."""
    attrs = {"DelaySeconds": "1"} if where == "queue" else {}
    url = sqs_api("CreateQueue", QueueName=_name(), Attributes=attrs)["QueueUrl"]
    sqs_api("SendMessage", QueueUrl=url, MessageBody="later", **({"DelaySeconds": 1} if where == "message" else {}))
    started = time.monotonic()
    (m,) = _receive(sqs_api, url, 20)
    took = time.monotonic() - started
    assert m["Body"] == "later"
    assert 0.5 < took < 10, took
    sqs_api("DeleteMessage", QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_a_long_poll_ends_with_its_queue_and_takes_nothing_of_its_successor(sqs_api):
    """A receive waiting on a queue that is deleted ends with nothing, at once; a queue created
    again under the name is a new queue, whose messages the deleted one's callers never get."""
    name = _name()
    url = sqs_api("CreateQueue", QueueName=name)["QueueUrl"]
    result: dict[str, Any] = {}

    def poll() -> None:
        started = time.monotonic()
        try:
            result["messages"] = _receive(sqs_api, url, 10)
        except Refused as exc:  # the queue is gone: also an end, not a message of its successor
            result["refused"] = exc.code
        result["took"] = time.monotonic() - started

    waiting = threading.Thread(target=poll)
    waiting.start()
    time.sleep(1.0)
    sqs_api("DeleteQueue", QueueUrl=url)
    again = sqs_api("CreateQueue", QueueName=name)["QueueUrl"]
    sqs_api("SendMessage", QueueUrl=again, MessageBody="the new queue's")
    waiting.join(15)
    assert not waiting.is_alive()
    assert result.get("messages", []) == [], result
    assert result["took"] < 8, result
    (m,) = _receive(sqs_api, again, 5, AttributeNames=["ApproximateReceiveCount"])
    assert m["Body"] == "the new queue's" and m["Attributes"]["ApproximateReceiveCount"] == "1"
    sqs_api("DeleteQueue", QueueUrl=again)


def test_delayed_messages_count_as_delayed_not_available(sqs_api):
    """GetQueueAttributes: ApproximateNumberOfMessagesDelayed counts the messages whose delay
    has not passed; ApproximateNumberOfMessages, those a receive could take now."""
    url = sqs_api("CreateQueue", QueueName=_name(), Attributes={"DelaySeconds": "30"})["QueueUrl"]
    sqs_api("SendMessage", QueueUrl=url, MessageBody="later")
    sqs_api("SendMessage", QueueUrl=url, MessageBody="now", DelaySeconds=0)
    counts = sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (counts["ApproximateNumberOfMessages"], counts["ApproximateNumberOfMessagesDelayed"]) == ("1", "1")
    (m,) = _receive(sqs_api, url, 0)
    assert m["Body"] == "now"
    assert _counts(sqs_api, url) == ("0", "1", "1")
    assert _receive(sqs_api, url, 0) == []


def test_a_receive_attempt_retried_answers_the_same_messages_while_in_flight(sqs_api):
    """ReceiveMessage, FIFO: "subsequent calls with the same ReceiveRequestAttemptId return the
    same messages and receipt handles", for five minutes, while they are in flight."""
    url = _fifo(sqs_api, ContentBasedDeduplication="true")
    for body in ("one", "two", "three"):
        sqs_api("SendMessage", QueueUrl=url, MessageBody=body, MessageGroupId="g")

    def receive(attempt: str) -> list[dict[str, Any]]:
        return _receive(sqs_api, url, 0, VisibilityTimeout=30, ReceiveRequestAttemptId=attempt)

    first = receive("attempt-1")
    assert [m["Body"] for m in first] == ["one", "two", "three"]
    retry = receive("attempt-1")
    assert [(m["MessageId"], m["ReceiptHandle"]) for m in retry] == [
        (m["MessageId"], m["ReceiptHandle"]) for m in first
    ]
    assert receive("attempt-2") == []  # another attempt: the group is held
    # one deleted: the retry answers the two still in flight, with their handles
    sqs_api("DeleteMessage", QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"])
    assert [m["ReceiptHandle"] for m in receive("attempt-1")] == [m["ReceiptHandle"] for m in first[1:]]
    # made visible again: no longer the attempt's; a retry is a new receive, kept in its turn
    for m in first[1:]:
        sqs_api("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
    fresh = receive("attempt-1")
    assert [m["Body"] for m in fresh] == ["two", "three"]
    assert {m["ReceiptHandle"] for m in fresh}.isdisjoint(m["ReceiptHandle"] for m in first)
    assert [m["ReceiptHandle"] for m in receive("attempt-1")] == [m["ReceiptHandle"] for m in fresh]
    for m in fresh:
        sqs_api("DeleteMessage", QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert receive("attempt-1") == []


def test_a_receive_attempt_id_is_128_alphanumerics_or_punctuation_at_most(sqs_api):
    url = _fifo(sqs_api, ContentBasedDeduplication="true")
    sqs_api("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="g")
    for bad in ("a" * 129, "with space", "é"):
        e = _refused(sqs_api, "ReceiveMessage", QueueUrl=url, ReceiveRequestAttemptId=bad)
        assert e.code == "InvalidParameterValue" and "ReceiveRequestAttemptId" in e.message, bad
    # refused calls took nothing: the message is there for a good ID
    (m,) = _receive(sqs_api, url, 0, ReceiveRequestAttemptId="a" * 127 + "!")
    assert m["Body"] == "x"
    plain = sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    assert _refused(sqs_api, "ReceiveMessage", QueueUrl=plain, ReceiveRequestAttemptId="a" * 129).code == (
        "InvalidParameterValue"
    )


def test_fifo_receives_hand_out_the_group_whose_message_is_oldest_first(sqs_api):
    """FIFO: groups sent in the order g1, g2, g3 come back in that order, each on a partition of
    its own; a group whose message is made visible again comes back before the younger ones."""
    from queues.engine.ids import group_partition

    url = _fifo(sqs_api, ContentBasedDeduplication="true")
    partitions = 4  # CreateQueue's default
    groups: list[str] = []
    for i in range(1000):
        g = f"grp-{i}"
        if group_partition(g, partitions) not in {group_partition(h, partitions) for h in groups}:
            groups.append(g)
        if len(groups) == 3:
            break
    # sent newest partition first, so that no partition order gives the groups' order
    groups.sort(key=lambda g: -group_partition(g, partitions))
    for g in groups:
        for k in (1, 2):
            sqs_api("SendMessage", QueueUrl=url, MessageBody=f"{g}/{k}", MessageGroupId=g)

    def first() -> dict[str, Any]:
        return sqs_api("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=1)["Messages"][0]

    one = [first() for _ in groups]
    assert [m["Body"] for m in one] == [f"{g}/1" for g in groups]
    # the first group's message visible again: it comes back first
    sqs_api("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=one[0]["ReceiptHandle"], VisibilityTimeout=0)
    again = first()
    assert again["Body"] == f"{groups[0]}/1"
    for m in [again, *one[1:]]:
        sqs_api("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
    every = _receive(sqs_api, url, 0)
    assert [m["Body"] for m in every] == [f"{g}/{k}" for g in groups for k in (1, 2)]


def test_a_standard_queue_s_message_group_id_is_kept_and_orders_nothing(sqs_api):
    """Fair queues: "MessageGroupId ... for standard queues, it's used for fair queue
    delivery": kept and answered; a group's messages are not held one at a time."""
    url = sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    for body in ("one", "two"):
        sqs_api("SendMessage", QueueUrl=url, MessageBody=body, MessageGroupId="tenant-a")
    sqs_api(
        "SendMessageBatch", QueueUrl=url, Entries=[{"Id": "b", "MessageBody": "three", "MessageGroupId": "tenant-b"}]
    )
    sqs_api("SendMessage", QueueUrl=url, MessageBody="none")
    got: list[dict[str, Any]] = []
    for _ in range(10):
        got += _receive(sqs_api, url, 1, AttributeNames=["MessageGroupId"])
        if len(got) >= 4:
            break
    groups = {m["Body"]: m.get("Attributes", {}).get("MessageGroupId") for m in got}
    assert groups == {"one": "tenant-a", "two": "tenant-a", "three": "tenant-b", "none": None}


def test_a_fifo_receipt_expires_with_its_visibility_timeout(sqs_api):
    url = _fifo(sqs_api, ContentBasedDeduplication="true")
    sqs_api("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="g")
    (m,) = _receive(sqs_api, url, 5, VisibilityTimeout=1)
    time.sleep(1.5)
    # its timeout ran out: the receipt deletes nothing, though nobody received the message since
    assert (
        _refused(sqs_api, "DeleteMessage", QueueUrl=url, ReceiptHandle=m["ReceiptHandle"]).code
        == "InvalidParameterValue"
    )
    # delivered again, with a new receipt; the old one stays refused
    (again,) = _receive(sqs_api, url, 5)
    assert again["MessageId"] == m["MessageId"]
    for action, extra in (("DeleteMessage", {}), ("ChangeMessageVisibility", {"VisibilityTimeout": 5})):
        e = _refused(sqs_api, action, QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], **extra)
        assert e.code == "InvalidParameterValue", action
    batch = sqs_api("DeleteMessageBatch", QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": m["ReceiptHandle"]}])
    assert [(f["Id"], f["Code"]) for f in batch["Failed"]] == [("a", "InvalidParameterValue")]
    # nothing deleted: the new receipt deletes it (twice, within its timeout)
    assert _depth(sqs_api, url) == 0 and _receive(sqs_api, url, 0) == []
    sqs_api("DeleteMessage", QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    sqs_api("DeleteMessage", QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    assert _depth(sqs_api, url) == 0


def test_purge_forgets_the_fifo_dedup_ids(sqs_api):
    url = _fifo(sqs_api)
    first = sqs_api("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d")
    repeat = sqs_api("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d")
    assert repeat["MessageId"] == first["MessageId"] and _depth(sqs_api, url) == 1
    sqs_api("PurgeQueue", QueueUrl=url)
    assert _depth(sqs_api, url) == 0
    again = sqs_api("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d")
    assert again["MessageId"] != first["MessageId"]
    (m,) = _receive(sqs_api, url, 5)
    assert m["MessageId"] == again["MessageId"]


# --- message move tasks -------------------------------------------------------------------------
# CancelMessageMoveTask: "A message movement can only be cancelled when the current status is
# RUNNING. Cancelling a message movement task does not revert the messages that have already been
# moved. It can only stop the messages that have not been moved yet." Its result is
# ApproximateNumberOfMessagesMoved; its errors include ResourceNotFoundException. "Only one active
# message movement task is supported per queue at any given time." ListMessageMoveTasksResultEntry:
# Status "RUNNING, COMPLETED, CANCELLING, CANCELLED, and FAILED"; TaskHandle "only populated for
# tasks that are in RUNNING status"; ApproximateNumberOfMessagesToMove "obtained at the time of
# starting". ListMessageMoveTasks' MaxResults: "The default is 1 [...] The upper limit is 10."
# StartMessageMoveTask's MaxNumberOfMessagesPerSecond: at most 500.
NO_TASK = "ResourceNotFoundException"


def _arn(sqs_api: Api, url: str) -> str:
    arn: str = sqs_api("GetQueueAttributes", QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return arn


def _tasks(sqs_api: Api, arn: str, **kw: Any) -> list[dict[str, Any]]:
    return sqs_api("ListMessageMoveTasks", SourceArn=arn, **kw).get("Results", [])


def _dead_letter_queue(sqs_api: Api) -> str:
    """A new queue that another queue's RedrivePolicy names (StartMessageMoveTask takes only
    such a source): its URL."""
    dlq = sqs_api("CreateQueue", QueueName=_name("dlq"))["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": _arn(sqs_api, dlq), "maxReceiveCount": 3})
    sqs_api("CreateQueue", QueueName=_name("src"), Attributes={"RedrivePolicy": policy})
    return dlq


def _slow_move(sqs_api: Api, messages: int) -> tuple[str, str, str, str]:
    """A task moving ``messages`` messages of a new queue to another, one a second: source and
    destination URL, source ARN, the task's handle."""
    source = _dead_letter_queue(sqs_api)
    dest = sqs_api("CreateQueue", QueueName=_name("dest"))["QueueUrl"]
    entries = [{"Id": f"m{i}", "MessageBody": f"m{i}"} for i in range(messages)]
    sqs_api("SendMessageBatch", QueueUrl=source, Entries=entries)
    arn = _arn(sqs_api, source)
    handle = sqs_api(
        "StartMessageMoveTask", SourceArn=arn, DestinationArn=_arn(sqs_api, dest), MaxNumberOfMessagesPerSecond=1
    )
    return source, dest, arn, handle["TaskHandle"]


def _ended(sqs_api: Api, arn: str) -> dict[str, Any]:
    """The source's newest task once it is no longer RUNNING or CANCELLING (CANCELLING at most
    until the task's next look at its status)."""
    seen: list[dict[str, Any]] = []

    def ended() -> bool:
        seen[:] = _tasks(sqs_api, arn)
        return seen[0]["Status"] not in ("RUNNING", "CANCELLING")

    wait_until(ended, 30, "the move task to end")
    return seen[0]


def test_a_cancelled_move_task_stops_and_keeps_what_it_moved(sqs_api):
    source, dest, arn, handle = _slow_move(sqs_api, 8)
    (task,) = _tasks(sqs_api, arn)
    assert (task["Status"], task["TaskHandle"]) == ("RUNNING", handle)
    assert (task["ApproximateNumberOfMessagesToMove"], task["MaxNumberOfMessagesPerSecond"]) == (8, 1)
    # one task of a source at a time
    e = _refused(sqs_api, "StartMessageMoveTask", SourceArn=arn, DestinationArn=_arn(sqs_api, dest))
    assert e.code == "AWS.SimpleQueueService.UnsupportedOperation"
    moved = sqs_api("CancelMessageMoveTask", TaskHandle=handle)["ApproximateNumberOfMessagesMoved"]
    assert 0 <= moved < 8
    status = _tasks(sqs_api, arn)[0]["Status"]
    assert status in ("CANCELLING", "CANCELLED")
    task = _ended(sqs_api, arn)
    assert task["Status"] == "CANCELLED" and "TaskHandle" not in task
    done = task["ApproximateNumberOfMessagesMoved"]
    assert moved <= done < 8
    # what was moved stays moved, the rest stays in the source
    assert (_depth(sqs_api, dest), _depth(sqs_api, source)) == (done, 8 - done)
    # a cancelled task is not running: not cancelled again
    assert _refused(sqs_api, "CancelMessageMoveTask", TaskHandle=handle).code == NO_TASK
    # the audit trail has the task's start, its cancel and its end, by the key's user
    from queues.models import AuditEntry

    trail = list(AuditEntry.objects.filter(target=source.rsplit("/", 1)[1]).order_by("at", "pk"))
    moves = [(e.actor, e.action) for e in trail if e.action.startswith("move_")]
    user = sqs_api.key.user.get_username()
    assert moves == [(user, "move_start"), (user, "move_cancel"), (user, "move_end")]
    assert trail[-1].detail["status"] == "CANCELLED" and trail[-1].detail["moved"] == done


def test_a_move_task_s_source_must_be_a_dead_letter_queue(sqs_api):
    plain = sqs_api("CreateQueue", QueueName=_name())["QueueUrl"]
    dest = sqs_api("CreateQueue", QueueName=_name("dest"))["QueueUrl"]
    sqs_api("SendMessage", QueueUrl=plain, MessageBody="stays")
    for extra in ({}, {"DestinationArn": _arn(sqs_api, dest)}):
        e = _refused(sqs_api, "StartMessageMoveTask", SourceArn=_arn(sqs_api, plain), **extra)
        assert e.code == "InvalidParameterValue" and "Dead Letter Queue" in e.message
    assert _tasks(sqs_api, _arn(sqs_api, plain)) == [] and _depth(sqs_api, plain) == 1


def test_only_a_running_task_is_cancelled(sqs_api):
    source = _dead_letter_queue(sqs_api)
    dest = sqs_api("CreateQueue", QueueName=_name("dest"))["QueueUrl"]
    sqs_api("SendMessage", QueueUrl=source, MessageBody="m")
    arn = _arn(sqs_api, source)
    # with no rate, a small task has ended when StartMessageMoveTask answers
    handle = sqs_api("StartMessageMoveTask", SourceArn=arn, DestinationArn=_arn(sqs_api, dest))["TaskHandle"]
    (task,) = _tasks(sqs_api, arn)
    assert (task["Status"], task["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 1)
    assert "TaskHandle" not in task
    assert _refused(sqs_api, "CancelMessageMoveTask", TaskHandle=handle).code == NO_TASK
    # a handle of no task, and one that is no handle
    other = base64.b64encode(json.dumps({"taskId": str(uuid.uuid4()), "sourceArn": arn}).encode()).decode()
    for bad in (other, "bm90LWEtdGFzaw==", "?"):
        assert _refused(sqs_api, "CancelMessageMoveTask", TaskHandle=bad).code == NO_TASK
    e = _refused(sqs_api, "StartMessageMoveTask", SourceArn=arn, MaxNumberOfMessagesPerSecond=501)
    assert e.code == "InvalidParameterValue"


def test_list_message_move_tasks_answers_the_most_recent_up_to_max_results(sqs_api):
    source = _dead_letter_queue(sqs_api)
    arn = _arn(sqs_api, source)
    for _ in range(11):  # an empty dead-letter queue: each task ends at once
        sqs_api("StartMessageMoveTask", SourceArn=arn)
    (newest,) = _tasks(sqs_api, arn)
    ten = _tasks(sqs_api, arn, MaxResults=10)
    assert len(ten) == 10 and ten[0] == newest
    assert all(t["Status"] == "COMPLETED" for t in ten)
    stamps = [t["StartedTimestamp"] for t in ten]
    assert stamps == sorted(stamps, reverse=True)
    for bad in (0, 11):
        assert _refused(sqs_api, "ListMessageMoveTasks", SourceArn=arn, MaxResults=bad).code == "InvalidParameterValue"


def test_a_task_whose_process_stopped_is_failed_in_its_row_when_listed(sqs_api, committed):
    """A RUNNING row whose process stopped writing (a node killed mid-task) is listed FAILED
    and its row says so from then on: no other process finds it running."""
    from datetime import timedelta

    from django.utils import timezone

    from queues.models import AuditEntry, Queue
    from sqs import move_tasks
    from sqs.models import MoveTask

    source = _dead_letter_queue(sqs_api)
    arn = _arn(sqs_api, source)
    q = Queue.objects.get(name=source.rsplit("/", 1)[1])
    old = timezone.now() - timedelta(seconds=move_tasks.STALE + 5)
    task = committed(
        lambda: MoveTask.objects.create(
            handle=move_tasks.task_handle(arn), queue_id=q.pk, source_arn=arn, started_ms=1, beat_at=old
        )
    )
    (listed,) = _tasks(sqs_api, arn)
    assert (listed["Status"], listed["FailureReason"]) == ("FAILED", move_tasks.LOST)
    assert "TaskHandle" not in listed
    row = MoveTask.objects.get(pk=task.pk)
    assert (row.status, row.failure_reason) == (MoveTask.FAILED, move_tasks.LOST)
    # its end is in the audit trail once, by the node (its process is gone), however often listed
    _tasks(sqs_api, arn)
    ends = AuditEntry.objects.filter(action="move_end", detail__task=task.pk)
    assert [(e.actor, e.target, e.detail["status"]) for e in ends] == [("system", q.name, "FAILED")]
    # a new task of the source may start: none is running
    sqs_api("StartMessageMoveTask", SourceArn=arn)
    assert _tasks(sqs_api, arn)[0]["Status"] == "COMPLETED"


def test_a_task_stopped_by_an_error_of_ours_names_no_internals(module_node, committed, caplog):
    """The error goes to the log; the row's FailureReason says only that it was internal. (The
    task runs on a thread of its own, with its own connection, as in a node.)"""
    import threading

    from queues.access import SYSTEM
    from queues.models import Queue
    from sqs import move_tasks
    from sqs.context import Context
    from sqs.models import MoveTask

    q = committed(lambda: Queue.objects.create(name=_name("broken")))
    task = committed(
        lambda: MoveTask.objects.create(handle=_name("h"), queue_id=q.pk, source_arn="arn:aws:sqs:x:1:q", started_ms=1)
    )

    class Exploding:
        pk, created_by_id = q.pk, None

        @property
        def name(self) -> str:
            raise RuntimeError("SELECT secret FROM somewhere")

    ctx = Context(caller=SYSTEM, base_url="http://n/sqs", account="000000000000", region="eu-west-1")
    with caplog.at_level("ERROR"):
        thread = threading.Thread(target=move_tasks._Runner(task.pk, Exploding(), ctx, None, None, 1).run)
        thread.start()
        thread.join(30)
    row = MoveTask.objects.get(pk=task.pk)
    assert (row.status, row.failure_reason) == (MoveTask.FAILED, move_tasks.BROKEN)
    assert "secret" not in row.failure_reason and "SELECT secret" in caplog.text


def test_a_cancel_from_another_process_stops_the_move(module_node, key, committed):
    """The task runs in the node's process; the cancel is made by this test's process, on the
    same database: what every process of a node (and every node) shares."""
    from queues.access import SYSTEM
    from sqs import actions
    from sqs.context import Context

    sqs_api = Api(module_node, key, "json")
    source, dest, arn, handle = _slow_move(sqs_api, 8)
    ctx = Context(caller=SYSTEM, base_url=f"{module_node.url}/sqs", account="000000000000", region="eu-west-1")
    out = committed(lambda: actions.run("CancelMessageMoveTask", {"TaskHandle": handle}, ctx))
    assert 0 <= out["ApproximateNumberOfMessagesMoved"] < 8
    task = _ended(sqs_api, arn)
    assert task["Status"] == "CANCELLED"
    done = task["ApproximateNumberOfMessagesMoved"]
    assert (_depth(sqs_api, dest), _depth(sqs_api, source)) == (done, 8 - done) and done < 8


def test_a_move_task_whose_user_is_made_inactive_stops_and_fails(module_node, committed):
    """The task runs on after its start was checked: each round reads its user's rights again."""
    from sqs.models import MoveTask

    user = committed(lambda: User.objects.create(username=_name("mover")))
    sqs_api = Api(module_node, committed(lambda: AccessKey.issue(user)), "json")
    *_, handle = _slow_move(sqs_api, 8)
    # when the task's user is made inactive while it moves one message a second
    committed(lambda: User.objects.filter(pk=user.pk).update(is_active=False))
    # then the task ends, failed, before it moved them all
    wait_until(
        lambda: MoveTask.objects.filter(handle=handle).exclude(status=MoveTask.RUNNING).exists(),
        30,
        "the move task to end",
    )
    task = MoveTask.objects.get(handle=handle)
    assert task.status == MoveTask.FAILED and "AccessDenied" in task.failure_reason
    assert task.moved < 8


def test_fifo_counts_while_a_group_is_held(sqs_api):
    """GetQueueAttributes on a FIFO queue while a receive holds a group: NotVisible counts the
    messages in flight alone; the group's messages waiting behind them are visible (counted as
    ApproximateNumberOfMessages), as AWS counts them."""
    url = _fifo(sqs_api, ContentBasedDeduplication="true")
    for body in ("one", "two", "three"):
        sqs_api("SendMessage", QueueUrl=url, MessageBody=body, MessageGroupId="g")
    sqs_api("SendMessage", QueueUrl=url, MessageBody="other", MessageGroupId="h")
    (m,) = sqs_api("ReceiveMessage", QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=30)["Messages"]
    assert m["Body"] == "one"
    assert _counts(sqs_api, url) == ("3", "1", "0")
    sqs_api("DeleteMessage", QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert _counts(sqs_api, url) == ("3", "0", "0")
