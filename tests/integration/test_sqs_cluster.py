"""The SQS API on two nodes over PostgreSQL + Redis: messages sent through the node that does
not own their partition, and dead letters whose dead-letter queue lives on the other node.

A message keeps what SQS knows of it beyond name -> text (attribute types, the deduplication ID,
the sender, the trace header) when a node forwards it to its partition's owner, and when the
owner moves it to a dead-letter queue served by the other node; a plain REST message set aside
beside SQS dead letters moves with them.
"""

from __future__ import annotations

import time
import uuid

import boto3
import pytest
from botocore.config import Config
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from queues.engine.ids import group_partition
from sqs.models import AccessKey
from tests.integration.nodes import Client, node_info
from tests.launcher import NodeProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

GROUPS = 20
#: SQS's CreateQueue makes a queue of the service's default partitions.
PARTITIONS = 4


class Both:
    """One user's clients of both nodes: boto3 (SQS) and REST, and which node is which."""

    def __init__(self, a: NodeProcess, b: NodeProcess):
        user = User.objects.create(username=f"sqs-{uuid.uuid4().hex[:8]}")
        key = AccessKey.issue(user)
        token = Token.objects.create(user=user).key
        self.nodes = (a, b)
        self.sqs = {n: _boto3(n, key) for n in self.nodes}
        self.rest = {n: Client(n.url, token) for n in self.nodes}
        self.by_id = {node_info(n.url)["node"]: n for n in self.nodes}

    def other(self, node: NodeProcess) -> NodeProcess:
        return self.nodes[1] if node is self.nodes[0] else self.nodes[0]

    def owners(self, queue: str) -> dict[int, NodeProcess | None]:
        r = self.rest[self.nodes[0]].get(f"queues/{queue}/partitions")
        assert r.status_code == 200, r.text
        return {p["index"]: self.by_id.get(p["owner"]) if p["owner"] else None for p in r.json()["partitions"]}

    def settled(self, queue: str, *, each: int) -> dict[int, NodeProcess]:
        """The queue's owners once every partition has one and each node holds ``each``."""
        found: dict[int, NodeProcess] = {}

        def done() -> bool:
            owners = self.owners(queue)
            held = list(owners.values())
            if None in held or any(held.count(n) != each for n in self.nodes):
                return False
            found.update({i: n for i, n in owners.items() if n is not None})
            return True

        wait_until(done, 30, f"{queue}'s partitions shared out, {each} a node")
        return found

    def owner(self, queue: str) -> NodeProcess:
        """The owner of a queue of one partition, once it has one."""
        wait_until(lambda: self.owners(queue)[0] is not None, 30, f"{queue} served")
        owner = self.owners(queue)[0]
        assert owner is not None
        return owner

    def move(self, queue: str, to: NodeProcess) -> None:
        """Have ``to`` own the one partition of ``queue`` (its owner releases it to the other)."""
        owner = self.owner(queue)
        if owner is not to:
            r = self.rest[owner].post(f"queues/{queue}/partitions/0/release", {})
            assert r.status_code == 200, r.text
            wait_until(lambda: self.owners(queue)[0] is to, 30, f"{queue} served by {to.url}")


def _boto3(node: NodeProcess, key: AccessKey):
    return boto3.client(
        "sqs",
        endpoint_url=f"{node.url}/sqs",
        region_name="eu-west-1",
        aws_access_key_id=key.access_key_id,
        aws_secret_access_key=key.secret,
        # (botocore retries a 5xx, never a refusal: a 400 shows.)
        config=Config(retries={"max_attempts": 3, "mode": "standard"}, read_timeout=60),
    )


def _attributes(i: int) -> dict:
    out = {
        "kind": {"DataType": "String", "StringValue": f"k{i}"},
        "n": {"DataType": "Number", "StringValue": str(i)},
        "blob": {"DataType": "Binary", "BinaryValue": bytes([0, 255, i])},
        "doc": {"DataType": "String.json", "StringValue": f'{{"i": {i}}}'},
    }
    if i % 10 == 0:  # past the REST API's attribute limits (64-character names, 1,024-character values)
        out["a" * 100] = {"DataType": "String", "StringValue": "v" * 2000}
    return out


def _entry(group: str, k: int, poisoned: set[str]) -> dict:
    """Message ``k`` of ``group`` (the second of a poisoned group is poison): typed
    attributes, a deduplication ID, a trace header."""
    i = int(group[1:]) * 10 + k
    return {
        "MessageBody": f"poison {group}" if k == 1 and group in poisoned else f"{group}-{k}",
        "MessageGroupId": group,
        "MessageDeduplicationId": f"{group}-{k}",
        "MessageAttributes": _attributes(i),
        "MessageSystemAttributes": {
            "AWSTraceHeader": {"DataType": "String", "StringValue": f"Root=1-{i:08x}-bd862e3fe1be46a994272793"}
        },
    }


def _check_message(m: dict, entry: dict) -> None:
    """What SQS knows of a message came back as it was sent."""
    a = m["Attributes"]
    assert m["Body"] == entry["MessageBody"]
    assert m["MessageAttributes"] == entry["MessageAttributes"], m
    assert a["MessageGroupId"] == entry["MessageGroupId"]
    assert a["MessageDeduplicationId"] == entry["MessageDeduplicationId"]
    assert a["AWSTraceHeader"] == entry["MessageSystemAttributes"]["AWSTraceHeader"]["StringValue"]
    assert a.get("SenderId"), m


def test_sqs_sends_through_the_other_node_and_dead_letters_cross_nodes(two_nodes):
    both = Both(*two_nodes)
    a = both.nodes[0]
    tag = uuid.uuid4().hex[:8]
    # given a FIFO dead-letter queue of one partition, on one node
    dlq = f"dlq-{tag}-fifo"
    r = both.rest[a].post("queues", {"name": dlq, "partitions": 1, "strict": True})
    assert r.status_code == 201, r.text
    dlq_node = both.owner(dlq)
    dlq_url = both.sqs[a].get_queue_url(QueueName=f"dlq-{tag}.fifo")["QueueUrl"]
    dlq_arn = both.sqs[a].get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    # and a FIFO source queue naming it, two partitions on each node
    src = f"src-{tag}"
    both.sqs[a].create_queue(
        QueueName=f"{src}.fifo",
        Attributes={
            "FifoQueue": "true",
            "VisibilityTimeout": "60",
            "RedrivePolicy": f'{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":1}}',
        },
    )
    owner = both.settled(f"{src}-fifo", each=PARTITIONS // 2)
    url = {n: both.sqs[n].get_queue_url(QueueName=f"{src}.fifo")["QueueUrl"] for n in both.nodes}
    groups = [f"g{i:02d}" for i in range(GROUPS)]
    through = {g: both.other(owner[group_partition(g, PARTITIONS)]) for g in groups}
    # A group's second message is poison where its partition is not on the dead-letter queue's
    # node: its dead letter crosses to the other node.
    poisoned = {g for g in groups if owner[group_partition(g, PARTITIONS)] is not dlq_node}
    assert poisoned and len(poisoned) < GROUPS, "the groups' partitions are all on one node"
    sent: dict[str, dict] = {}

    # when every message is sent through the node that does not own its group's partition:
    # each group's first with SendMessage, its second and third with SendMessageBatch, ten
    # entries a batch (five groups, over both partitions the other node owns)
    for g in groups:
        e = _entry(g, 0, poisoned)
        out = both.sqs[through[g]].send_message(QueueUrl=url[through[g]], **e)
        sent[out["MessageId"]] = e
    for node in both.nodes:
        mine = [g for g in groups if through[g] is node]
        for start in range(0, len(mine), 5):
            entries = [{"Id": f"{g}_{k}", **_entry(g, k, poisoned)} for g in mine[start : start + 5] for k in (1, 2)]
            out = both.sqs[node].send_message_batch(QueueUrl=url[node], Entries=entries)
            assert not out.get("Failed"), out["Failed"]
            by_id = {e["Id"]: e for e in entries}
            for ok in out["Successful"]:
                e = dict(by_id[ok["Id"]])
                del e["Id"]
                sent[ok["MessageId"]] = e
    assert len(sent) == 3 * GROUPS

    # then every message is delivered, in its group's order, with what SQS knows of it; a
    # poison message (received once, never deleted) goes to the dead-letter queue on the other
    # node, and its group goes on
    delivered: dict[str, list[str]] = {g: [] for g in groups}
    dead: dict[str, dict] = {}
    deadline = time.monotonic() + 90
    expected_dead = {f"poison {g}" for g in poisoned}
    while sum(map(len, delivered.values())) < 3 * GROUPS - len(poisoned) or set(dead) != expected_dead:
        assert time.monotonic() < deadline, (delivered, sorted(dead))
        for node in both.nodes:
            got = (
                both.sqs[node]
                .receive_message(
                    QueueUrl=url[node],
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=0,
                    AttributeNames=["All"],
                    MessageAttributeNames=["All"],
                )
                .get("Messages", [])
            )
            for m in got:
                _check_message(m, sent[m["MessageId"]])
                g = m["Attributes"]["MessageGroupId"]
                if m["Body"].startswith("poison"):
                    both.sqs[node].change_message_visibility(
                        QueueUrl=url[node], ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
                    )
                    continue
                delivered[g].append(m["Body"])
                both.sqs[node].delete_message(QueueUrl=url[node], ReceiptHandle=m["ReceiptHandle"])
            for d in (
                both.sqs[node]
                .receive_message(
                    QueueUrl=dlq_url,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=0,
                    AttributeNames=["All"],
                    MessageAttributeNames=["All"],
                )
                .get("Messages", [])
            ):
                dead[d["Body"]] = d
                both.sqs[node].delete_message(QueueUrl=dlq_url, ReceiptHandle=d["ReceiptHandle"])
        time.sleep(0.1)
    for g in groups:
        assert delivered[g] == [f"{g}-0", f"{g}-2"] if g in poisoned else [f"{g}-{k}" for k in range(3)], g
    for body, d in dead.items():
        g = body.removeprefix("poison ")
        # the dead letter keeps its MessageId, attributes, group, sender and trace; its
        # deduplication ID is its MessageId (SQS: the original message's ID replaces it)
        entry = {**_entry(g, 1, poisoned), "MessageDeduplicationId": d["MessageId"]}
        assert sent[d["MessageId"]]["MessageBody"] == body
        assert d["Attributes"]["DeadLetterQueueSourceArn"].endswith(f":{src}.fifo")
        assert d["Attributes"]["ApproximateReceiveCount"] == "1"
        _check_message(d, entry)
    senders = {d["Attributes"]["SenderId"] for d in dead.values()}
    assert len(senders) == 1
    # the source's depth as its owners publish it (each heartbeat): nothing is left there
    deadline = time.monotonic() + 15
    while (depth := both.rest[a].get(f"queues/{src}-fifo/stats").json()["depth"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert depth == 0


def test_a_rest_message_beside_sqs_dead_letters_moves_with_them(two_nodes):
    both = Both(*two_nodes)
    a, b = both.nodes
    tag = uuid.uuid4().hex[:8]
    # given a queue of one partition on node A whose dead-letter queue is on node B
    dlq, src = f"dlq-{tag}", f"src-{tag}"
    assert both.rest[b].post("queues", {"name": dlq, "partitions": 1}).status_code == 201
    r = both.rest[a].post("queues", {"name": src, "partitions": 1, "dead_letter_queue": dlq, "max_receives": 1})
    assert r.status_code == 201, r.text
    both.move(dlq, b)
    both.move(src, a)
    # and in it two SQS messages and a REST message, each received once and not acknowledged
    url = both.sqs[a].get_queue_url(QueueName=src)["QueueUrl"]
    kinds = {"kind": {"DataType": "String", "StringValue": "sqs"}, "n": {"DataType": "Number", "StringValue": "1"}}
    for body in ("sqs one", "sqs two"):
        both.sqs[a].send_message(QueueUrl=url, MessageBody=body, MessageAttributes=kinds)
    r = both.rest[a].post(f"queues/{src}/enqueue", {"body": "rest", "attributes": {"kind": "rest"}})
    assert r.status_code == 201, r.text
    got = both.rest[a].post(f"queues/{src}/dequeue", {"max": 10, "visibility_timeout": 0}).json()["messages"]
    assert sorted(m["body"] for m in got) == ["rest", "sqs one", "sqs two"]
    # when the next dequeue sets the three aside together
    assert both.rest[a].post(f"queues/{src}/dequeue", {"max": 10}).json()["messages"] == []
    # then all three are in the dead-letter queue on the other node, and none is left behind
    found: dict[str, dict] = {}

    def arrived() -> bool:
        r = both.rest[b].post(f"queues/{dlq}/dequeue", {"max": 10, "visibility_timeout": 0})
        assert r.status_code == 200, r.text
        found.update((m["id"], m) for m in r.json()["messages"])
        if len(found) < 3:
            both.rest[a].post(f"queues/{src}/dequeue", {"max": 10})  # (a retry of a move)
        return len(found) >= 3

    wait_until(arrived, 20, "three dead letters")
    assert sorted(m["body"] for m in found.values()) == ["rest", "sqs one", "sqs two"]
    assert {m["history"]["source"] for m in found.values()} == {src}
    assert both.rest[a].get(f"queues/{src}/stats").json()["depth"] == 0
    # and read through SQS, the SQS ones keep their attributes' types and their sender
    dlq_url = both.sqs[b].get_queue_url(QueueName=dlq)["QueueUrl"]
    seen: dict[str, dict] = {}

    def received() -> bool:
        got = both.sqs[b].receive_message(
            QueueUrl=dlq_url, MaxNumberOfMessages=10, AttributeNames=["All"], MessageAttributeNames=["All"]
        )
        seen.update((m["Body"], m) for m in got.get("Messages", []))
        return len(seen) == 3

    wait_until(received, 20, "the dead letters through SQS")
    for body in ("sqs one", "sqs two"):
        assert seen[body]["MessageAttributes"] == kinds
        assert seen[body]["Attributes"].get("SenderId")
    assert seen["rest"]["MessageAttributes"] == {"kind": {"DataType": "String", "StringValue": "rest"}}
    assert "SenderId" not in seen["rest"]["Attributes"]


def test_an_expired_fifo_receipt_is_refused_through_the_node_that_does_not_own_it(two_nodes):
    """A FIFO receipt whose visibility timeout ran out deletes nothing, whichever node the
    delete goes through: the owner refuses it for the other node as for its own caller."""
    both = Both(*two_nodes)
    a, b = both.nodes
    url = both.sqs[a].create_queue(QueueName="late.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    owners = both.settled("late-fifo", each=PARTITIONS // 2)
    # one group on a partition of each node
    groups = {}
    for i in range(200):
        node = owners[group_partition(f"g{i}", PARTITIONS)]
        groups.setdefault(node, f"g{i}")
    assert set(groups) == {a, b}
    for group in groups.values():
        both.sqs[a].send_message(QueueUrl=url, MessageBody=group, MessageGroupId=group, MessageDeduplicationId=group)
    got: list[dict] = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        answer = both.sqs[a].receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=1, WaitTimeSeconds=1
        )
        got += answer.get("Messages", [])
    assert len(got) == 2
    time.sleep(1.5)
    for m in got:
        for node in (a, b):  # through the owner, and through the other node
            with pytest.raises(both.sqs[node].exceptions.ClientError) as e:
                both.sqs[node].delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            assert e.value.response["Error"]["Code"] == "InvalidParameterValue", (node.url, m["Body"])
    # nothing was deleted: both are delivered again
    again: list[dict] = []
    deadline = time.monotonic() + 30
    while len(again) < 2 and time.monotonic() < deadline:
        again += (
            both.sqs[b].receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        )
    assert sorted(m["Body"] for m in again) == sorted(groups.values())


def test_a_receive_attempt_retried_through_the_other_node_answers_the_same(two_nodes):
    """A FIFO receive retried with its ReceiveRequestAttemptId through the other node answers
    the same messages and handles: the attempt is kept for the cluster, not in one process."""
    both = Both(*two_nodes)
    a, b = both.nodes
    url = both.sqs[a].create_queue(
        QueueName="attempts.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    both.settled("attempts-fifo", each=PARTITIONS // 2)
    for body in ("one", "two"):
        both.sqs[a].send_message(QueueUrl=url, MessageBody=body, MessageGroupId="g")
    first: list[dict] = []
    deadline = time.monotonic() + 30
    while not first and time.monotonic() < deadline:
        first = (
            both.sqs[a]
            .receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, ReceiveRequestAttemptId="retry-me"
            )
            .get("Messages", [])
        )
    assert [m["Body"] for m in first] == ["one", "two"]
    again = both.sqs[b].receive_message(QueueUrl=url, MaxNumberOfMessages=10, ReceiveRequestAttemptId="retry-me")
    assert [m["ReceiptHandle"] for m in again["Messages"]] == [m["ReceiptHandle"] for m in first]
    for m in first:
        both.sqs[b].delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_a_fair_queue_s_group_ids_are_answered_through_the_other_node(two_nodes):
    """A standard queue's MessageGroupId (its fairness key) is answered by receives through the
    node that does not own the messages' partitions: the owner's answer carries it."""
    both = Both(*two_nodes)
    a, b = both.nodes
    url = both.sqs[a].create_queue(QueueName="fair")["QueueUrl"]
    both.settled("fair", each=PARTITIONS // 2)
    sent = {f"m{i}": f"tenant-{i % 3}" for i in range(24)}
    for body, group in sent.items():
        both.sqs[a].send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group)
    got: dict[str, str | None] = {}
    deadline = time.monotonic() + 60
    while len(got) < len(sent) and time.monotonic() < deadline:
        answer = both.sqs[b].receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["MessageGroupId"]
        )
        for m in answer.get("Messages", []):
            got[m["Body"]] = m.get("Attributes", {}).get("MessageGroupId")
            both.sqs[b].delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert got == sent
