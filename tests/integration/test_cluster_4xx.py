"""Across two real nodes: a 4xx changes nothing (a batch ack with one bad receipt, a batch
enqueue whose forwarded share is refused), and redrive reaches a dead-letter queue whose
partitions another node serves (issue 14)."""

from __future__ import annotations

import uuid
from itertools import count

import pytest

from queues.engine.ids import group_partition
from tests.integration.nodes import Client, node_info
from tests.launcher import NodeProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def node_id(node: NodeProcess) -> str:
    return node_info(node.url)["node"]  # healthz tells anonymous callers nothing


def owners(c: Client, queue: str) -> dict[int, str | None]:
    r = c.get(f"queues/{queue}/partitions")
    assert r.status_code == 200, r.text
    return {p["index"]: p["owner"] for p in r.json()["partitions"]}


def split_queue(a: NodeProcess, b: NodeProcess, token: str, **fields) -> tuple[str, int, int]:
    """A queue of two partitions, one served by ``a`` and one by ``b``: its name and the index
    of each one's."""
    name = f"x-{uuid.uuid4().hex[:8]}"
    ca = Client(a.url, token)
    r = ca.post("queues", {"name": name, "partitions": 2, **fields})
    assert r.status_code == 201, r.text
    ids = {node_id(a): "a", node_id(b): "b"}
    wait_until(lambda: sorted(ids.get(o or "", "-") for o in owners(ca, name).values()) == ["a", "b"], 30, "a split")
    where = {ids[o]: i for i, o in owners(ca, name).items() if o}
    return name, where["a"], where["b"]


def group_in(index: int) -> str:
    """A group whose messages go to partition ``index`` of two."""
    return next(g for g in (f"g{i}" for i in count()) if group_partition(g, 2) == index)


def test_a_batch_ack_with_one_bad_receipt_at_another_node_acks_nothing(node_factory, token):
    # given a queue split over nodes A and B, one message in flight on each
    a, b = node_factory(), node_factory()
    name, at_a, at_b = split_queue(a, b, token, lease_period=30)
    ca, cb = Client(a.url, token), Client(b.url, token)
    r = ca.post(
        f"queues/{name}/enqueue",
        {"messages": [{"body": "a", "group": group_in(at_a)}, {"body": "b", "group": group_in(at_b)}]},
    )
    assert r.status_code == 201, r.text
    (ma,) = ca.post(f"queues/{name}/dequeue", {"visibility_timeout": 120}).json()["messages"]
    (mb,) = cb.post(f"queues/{name}/dequeue", {"visibility_timeout": 120}).json()["messages"]
    assert (ma["body"], mb["body"]) == ("a", "b")
    # when A is asked to ack both, B's with a receipt that is not B's
    r = ca.post(
        f"queues/{name}/ack",
        {"messages": [{"id": ma["id"], "receipt": ma["receipt"]}, {"id": mb["id"], "receipt": ma["receipt"]}]},
    )
    # then it is refused, and A's message was not acked either: its receipt still acks it
    assert r.status_code == 409, r.text
    r = ca.post(f"queues/{name}/ack", {"messages": [{"id": ma["id"], "receipt": ma["receipt"]}]})
    assert r.status_code == 200 and r.json() == {"acked": 1, "not_found": 0}, r.text
    r = ca.post(f"queues/{name}/ack", {"messages": [{"id": mb["id"], "receipt": mb["receipt"]}]})
    assert r.status_code == 200 and r.json() == {"acked": 1, "not_found": 0}, r.text


def test_a_batch_enqueue_whose_forwarded_share_is_refused_stores_nothing(node_factory, token):
    # given a queue split over nodes A and B, where A's description of it is behind: A refreshes
    # it every 10 s, and B has just made its messages smaller (max_message_size 100)
    b = node_factory()
    a = node_factory(NODE_HEARTBEAT="10")
    name, at_a, at_b = split_queue(a, b, token, lease_period=60)
    ca, cb = Client(a.url, token), Client(b.url, token)
    r = cb.session.patch(f"{b.url}/api/v1/queues/{name}", json={"max_message_size": 100}, timeout=30)
    assert r.status_code == 200, r.text
    # when A gets a batch of 200-byte messages, its own partition's first, then B's
    body = "x" * 200
    r = ca.post(
        f"queues/{name}/enqueue",
        {"messages": [{"body": body, "group": group_in(at_a)}, {"body": body, "group": group_in(at_b)}]},
    )
    # then B's refusal is the answer, and A stored nothing either
    assert 400 <= r.status_code < 500, r.text
    assert ca.post(f"queues/{name}/dequeue", {"max": 10}).json()["messages"] == []
    assert cb.post(f"queues/{name}/dequeue", {"max": 10}).json()["messages"] == []


def test_redrive_moves_dead_letters_that_another_node_serves(node_factory, token):
    # given a dead-letter queue served by node B holding a dead letter of a queue served by A
    b = node_factory()
    cb = Client(b.url, token)
    dlq = f"dlq-{uuid.uuid4().hex[:6]}"
    assert cb.post("queues", {"name": dlq, "partitions": 1}).status_code == 201
    a = node_factory()
    ca = Client(a.url, token)
    source = f"src-{uuid.uuid4().hex[:6]}"
    r = ca.post("queues", {"name": source, "partitions": 1, "dead_letter_queue": dlq, "max_receives": 1})
    assert r.status_code == 201, r.text
    assert list(owners(ca, dlq).values()) == [node_id(b)]
    assert list(owners(ca, source).values()) == [node_id(a)]
    mid = ca.post(f"queues/{source}/enqueue", {"body": "poison"}).json()["id"]
    assert [m["id"] for m in ca.post(f"queues/{source}/dequeue", {"visibility_timeout": 0}).json()["messages"]] == [mid]
    ca.post(f"queues/{source}/dequeue", {})  # moves it to B's dead-letter queue
    wait_until(lambda: cb.get(f"queues/{dlq}/stats").json()["depth"] == 1, 10, "the dead letter at B")
    # when A is asked to redrive the dead-letter queue
    r = ca.post(f"queues/{dlq}/redrive", {"max": 10})
    # then B's dead letter is moved back, through B
    assert r.status_code == 200 and r.json()["moved"] == 1 and r.json()["sources"] == {source: 1}, r.text
    got = ca.post(f"queues/{source}/dequeue", {"wait": 2}).json()["messages"]
    assert [(m["body"], m["receive_count"]) for m in got] == [("poison", 1)]
    assert cb.get(f"queues/{dlq}/stats").json()["depth"] == 0


def test_a_call_forwarded_to_a_node_that_just_died_answers_503(node_factory, token):
    # given a queue split over nodes A and B with a long lease, a message in flight on B's
    # partition, and B killed: its lease still names it the owner for a while
    a, b = node_factory(), node_factory()
    name, _, at_b = split_queue(a, b, token, lease_period=60)
    ca, cb = Client(a.url, token), Client(b.url, token)
    r = ca.post(f"queues/{name}/enqueue", {"body": "b", "group": group_in(at_b)})
    assert r.status_code == 201, r.text
    (mb,) = cb.post(f"queues/{name}/dequeue", {"visibility_timeout": 120}).json()["messages"]
    b.kill()
    # when A is asked for calls it forwards to B
    calls = [
        ("ack", {"messages": [{"id": mb["id"], "receipt": mb["receipt"]}]}),
        ("visibility", {"id": mb["id"], "receipt": mb["receipt"], "visibility_timeout": 5}),
        ("enqueue", {"body": "c", "group": group_in(at_b)}),
    ]
    for call, body in calls:
        r = ca.post(f"queues/{name}/{call}", body)
        # then each answers 503 with Retry-After (the owner is unreachable), never 500
        assert r.status_code == 503, (call, r.status_code, r.text)
        assert r.headers.get("Retry-After"), call
