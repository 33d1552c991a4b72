"""SQS FIFO receives by message group, as AWS documents them, on both protocols (AWS JSON 1.0
through boto3, and the query protocol), against one real node on PostgreSQL + Redis for the
module.

From AWS's pages on FIFO delivery ("Amazon SQS FIFO queue message ordering", "Why doesn't my
FIFO queue return all messages", ReceiveMessage's MaxNumberOfMessages):

- a receive returns as many messages of one message group as it may (up to
  ``MaxNumberOfMessages``), in the order they were sent, and may fill the rest with other
  groups' messages;
- while messages of a group are in flight (received, not deleted), no other message of that
  group is returned; the group's next ones come once the in-flight ones are deleted, or
  visible again;
- a message made visible again comes back in its place, so the group's order holds;
- SendMessageBatch keeps the entries' order within a group.

A FIFO queue created over SQS has ``group_batch`` on, and the REST API answers it; a strict
queue of the REST API keeps one message of a group in flight (tests/unit/test_groups.py).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from queues.engine.ids import group_partition
from tests.integration.test_sqs_aws_rules import Api, Refused

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.django_db]


def _fifo(sqs_api: Api, *, visibility: int = 60) -> str:
    attrs = {"FifoQueue": "true", "ContentBasedDeduplication": "true", "VisibilityTimeout": str(visibility)}
    url = sqs_api("CreateQueue", QueueName=f"b-{uuid.uuid4().hex[:8]}.fifo", Attributes=attrs)["QueueUrl"]
    assert isinstance(url, str)
    return url


def _send(sqs_api: Api, url: str, *entries: tuple[str, str]) -> None:
    """(group, body) entries, in one SendMessageBatch (10 at most)."""
    answer = sqs_api(
        "SendMessageBatch",
        QueueUrl=url,
        Entries=[
            {"Id": str(i), "MessageBody": body, "MessageGroupId": group} for i, (group, body) in enumerate(entries)
        ],
    )
    assert not answer.get("Failed"), answer


def _receive(sqs_api: Api, url: str, n: int = 10) -> list[dict[str, Any]]:
    got = sqs_api(
        "ReceiveMessage",
        QueueUrl=url,
        MaxNumberOfMessages=n,
        WaitTimeSeconds=0,
        AttributeNames=["MessageGroupId", "ApproximateReceiveCount"],
    ).get("Messages", [])
    assert isinstance(got, list)
    return got


def _bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["Body"] for m in messages]


def _delete(sqs_api: Api, url: str, messages: list[dict[str, Any]]) -> None:
    for m in messages:
        sqs_api("DeleteMessage", QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_a_receive_takes_a_groups_messages_in_order_and_holds_the_group(sqs_api):
    # given a FIFO queue with two groups of one partition ("a" and "c"), sent interleaved
    assert group_partition("a", 4) == group_partition("c", 4)  # (a queue has 4 by default)
    url = _fifo(sqs_api)
    _send(sqs_api, url, ("a", "a1"), ("c", "c1"), ("a", "a2"), ("a", "a3"), ("c", "c2"), ("a", "a4"), ("a", "a5"))

    # when a consumer receives 3: the first group's first 3, in the order they were sent
    first = _receive(sqs_api, url, 3)
    assert _bodies(first) == ["a1", "a2", "a3"]
    assert {m["Attributes"]["MessageGroupId"] for m in first} == {"a"}

    # and while they are in flight, no other message of the group comes; the other group's do
    other = _receive(sqs_api, url)
    assert _bodies(other) == ["c1", "c2"]
    _delete(sqs_api, url, first[:-1] + other)
    assert _receive(sqs_api, url) == [], "a3 is still in flight"

    # and once all of them are deleted, the group's next ones come, in order
    _delete(sqs_api, url, first[-1:])
    assert _bodies(_receive(sqs_api, url)) == ["a4", "a5"]


def test_a_message_visible_again_waits_for_its_batch_and_keeps_its_place(sqs_api):
    # given three messages of a group received at once
    url = _fifo(sqs_api)
    _send(sqs_api, url, ("g", "m1"), ("g", "m2"), ("g", "m3"), ("g", "m4"))
    got = _receive(sqs_api, url, 3)
    assert _bodies(got) == ["m1", "m2", "m3"]

    # when the second is made visible again
    sqs_api("ChangeMessageVisibility", QueueUrl=url, ReceiptHandle=got[1]["ReceiptHandle"], VisibilityTimeout=0)

    # then nothing of the group comes while the first and third are in flight
    assert _receive(sqs_api, url) == []
    _delete(sqs_api, url, got[:1])
    assert _receive(sqs_api, url) == []

    # and once the third is settled too, the second comes back first, then the next
    _delete(sqs_api, url, got[2:])
    again = _receive(sqs_api, url)
    assert _bodies(again) == ["m2", "m4"]
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in again] == ["2", "1"]


def test_a_batch_of_ten_comes_in_one_receive(sqs_api):
    # given ten messages of one group sent in one batch
    url = _fifo(sqs_api)
    _send(sqs_api, url, *[("g", f"m{i}") for i in range(10)])

    # when received with MaxNumberOfMessages=10: all of them, in order, in one answer
    got = _receive(sqs_api, url)
    assert _bodies(got) == [f"m{i}" for i in range(10)]
    # and deleted in one batch, the queue is empty
    answer = sqs_api(
        "DeleteMessageBatch",
        QueueUrl=url,
        Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)],
    )
    assert not answer.get("Failed") and len(answer["Successful"]) == 10
    assert _receive(sqs_api, url) == []


def test_refusals_name_what_aws_names(sqs_api):
    # (AWS's texts, as moto's AWS-verified tests check them)
    url = _fifo(sqs_api)
    for action, entry in (
        ("SendMessageBatch", "SendMessageBatchRequestEntry"),
        ("DeleteMessageBatch", "DeleteMessageBatchRequestEntry"),
    ):
        with pytest.raises(Refused) as empty:
            sqs_api(action, QueueUrl=url, Entries=[])
        assert empty.value.code.endswith("EmptyBatchRequest")
        assert empty.value.message == f"There should be at least one {entry} in the request."
    with pytest.raises(Refused) as bad_id:
        sqs_api("SendMessageBatch", QueueUrl=url, Entries=[{"Id": ".!@#", "MessageBody": "x", "MessageGroupId": "g"}])
    assert bad_id.value.message == (
        "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
        "It can be at most 80 letters long."
    )
    with pytest.raises(Refused) as delayed:
        sqs_api("SendMessage", QueueUrl=url, MessageBody="x", MessageGroupId="g", DelaySeconds=5)
    assert delayed.value.message == (
        "Value 5 for parameter DelaySeconds is invalid. Reason: The request include parameter that is not valid "
        "for this queue type."
    )
