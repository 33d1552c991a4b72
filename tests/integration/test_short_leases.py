"""A lone node keeps serving a queue whose lease period is as short as the settings allow.

A lease is renewed when a third of its period has passed and the owner acts on it until
``LEASE_SAFETY`` (80 %) of it. A lease thread that looked once a heartbeat (1 s) let a lease
shorter than that lapse between two looks on the only node that held it: its calls answered
503 "lease expired on this node" (schemathesis made such queues with ``lease_period: 1``). A
1 s lease is refused: the 300 ms it leaves a renewal were missed now and then even so.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest

from tests.integration.nodes import Client

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.node(env={"NODE_HEARTBEAT": "1.0"}),
]


def _served(c: Client, name: str, seconds: float) -> Counter:
    """The statuses of ``seconds`` of enqueue, dequeue and ack on ``name``, back to back."""
    seen: Counter = Counter()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r = c.post(f"queues/{name}/enqueue", {"body": "x"})
        seen[r.status_code] += 1
        r = c.post(f"queues/{name}/dequeue", {"max": 10})
        seen[r.status_code] += 1
        if r.status_code == 200 and r.json()["messages"]:
            items = [{"id": m["id"], "receipt": m["receipt"]} for m in r.json()["messages"]]
            seen[c.post(f"queues/{name}/ack", {"messages": items}).status_code] += 1
    return seen


def _first_served(c: Client, name: str) -> None:
    deadline = time.monotonic() + 30
    while c.post(f"queues/{name}/enqueue", {"body": "warm"}).status_code != 201:
        assert time.monotonic() < deadline, "the queue was never served"
        time.sleep(0.1)


def test_the_shortest_lease_is_kept_by_its_lone_node(node, token):
    c = Client(node.url, token)
    name = f"short-{uuid.uuid4().hex[:6]}"
    r = c.post("queues", {"name": name, "partitions": 2, "lease_period": 1})
    assert r.status_code == 400 and "lease_period" in r.text, r.text
    assert c.post("queues", {"name": name, "partitions": 2, "lease_period": 2}).status_code == 201
    _first_served(c, name)

    seen = _served(c, name, 6)

    assert set(seen) <= {200, 201}, (seen, node.log_tail(20))
    assert "lease expired" not in node.log_tail(200)


def test_a_lease_period_shortened_while_held_is_kept(node, token):
    c = Client(node.url, token)
    name = f"shrunk-{uuid.uuid4().hex[:6]}"
    assert c.post("queues", {"name": name, "partitions": 2, "lease_period": 60}).status_code == 201
    _first_served(c, name)

    r = c.session.patch(f"{node.url}/api/v1/queues/{name}", json={"lease_period": 2}, timeout=30)
    assert r.status_code == 200, r.text
    seen = _served(c, name, 6)

    assert set(seen) <= {200, 201}, (seen, node.log_tail(20))
    # and back to a long one
    r = c.session.patch(f"{node.url}/api/v1/queues/{name}", json={"lease_period": 30}, timeout=30)
    assert r.status_code == 200, r.text
    assert set(_served(c, name, 2)) <= {200, 201}
