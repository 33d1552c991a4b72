"""A call routed to a partition's owner that has just died.

A node killed without a word keeps its name on its partitions' rows until their leases pass to
a live node, and a router may hold that answer for a moment longer. A forwarded call that finds
the dead owner's port closed never reached it, so the node looks again for the partition's
owner and makes the call there, within the time an enqueue waits for an owner, rather than
answering 503 at once.

In-process: the runtime owns every partition. The test hides one partition from it and has
the router name a closed port until the node looks afresh, which is where a dead owner's
successor stands.
"""

from __future__ import annotations

import socket
import time

import pytest

from queues.api.peers import PeerUnreachable
from queues.cluster.node import NodeRuntime

pytestmark = pytest.mark.django_db

API = "/api/v1/queues"


def closed_port() -> str:
    """An address on loopback that refuses connections (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


class Hidden(dict):
    """The runtime's managers, without ``key`` until ``shown`` is set."""

    def __init__(self, real: dict, key: tuple[str, int]):
        super().__init__(real)
        self.key = key
        self.shown = False

    def __contains__(self, key: object) -> bool:
        return (self.shown or key != self.key) and super().__contains__(key)


@pytest.fixture
def dead_owner(runtime: NodeRuntime, monkeypatch, make_queue, api):
    """A one-partition queue whose router names a closed port until it forgets what it read;
    then the partition is this node's. Yields (queue name, the addresses the router named)."""
    name = make_queue(partitions=1)
    dead = closed_port()
    named: list[str | None] = []
    hidden = Hidden(runtime.managers, (name, 0))
    monkeypatch.setattr(runtime, "managers", hidden)
    real_owner_of, real_forget = runtime.router.owner_of, runtime.router.forget

    def owner_of(queue_id: int, queue: str, index: int) -> str | None:
        named.append(real_owner_of(queue_id, queue, index) if hidden.shown else dead)
        return named[-1]

    def forget(queue_id: int) -> None:
        hidden.shown = True  # a fresh look finds the live owner: here
        real_forget(queue_id)

    monkeypatch.setattr(runtime.router, "owner_of", owner_of)
    monkeypatch.setattr(runtime.router, "forget", forget)
    return name, named, dead


def test_an_ack_whose_owner_refuses_goes_to_the_partitions_next_owner(api, dead_owner, runtime):
    name, named, dead = dead_owner
    runtime.managers.shown = True
    r = api.post(f"{API}/{name}/enqueue", {"body": "x"}, format="json")
    assert r.status_code == 201, r.content
    got = api.post(f"{API}/{name}/dequeue", {"max": 1}, format="json").json()["messages"]
    assert len(got) == 1
    runtime.managers.shown = False
    named.clear()

    r = api.post(f"{API}/{name}/ack", {"messages": [{"id": got[0]["id"], "receipt": got[0]["receipt"]}]}, format="json")

    assert r.status_code == 200, r.content
    assert r.json() == {"acked": 1, "not_found": 0}
    assert named[0] == dead  # it was sent to the dead owner first
    stats = api.get(f"{API}/{name}/stats").json()
    assert stats["depth"] == 0 and stats["in_flight"] == 0


def test_an_enqueue_to_a_group_whose_owner_refuses_is_stored_once_at_the_next_owner(api, dead_owner, runtime):
    name, named, dead = dead_owner

    r = api.post(f"{API}/{name}/enqueue", {"body": "x", "group": "g"}, format="json")

    assert r.status_code == 201, r.content
    assert named[0] == dead
    runtime.managers.shown = True
    got = api.post(f"{API}/{name}/dequeue", {"max": 10}, format="json").json()["messages"]
    assert [m["body"] for m in got] == ["x"]


def test_a_refused_connection_is_told_apart_from_a_call_that_may_have_run(runtime):
    from queues.service.peers import get_peers

    with pytest.raises(PeerUnreachable) as refused:
        get_peers().expire(closed_port(), "q")
    assert refused.value.refused


def test_a_call_whose_owner_is_gone_answers_503_within_one_owner_wait(api, runtime, monkeypatch, make_queue):
    """The waits for an owner and the lookups after a refusal share one budget: a call that
    waited most of it for an owner, was refused by the one it found, and then finds none, is
    answered 503 when the budget ends, not after a second whole wait."""
    from queues.cluster import routing

    # given a partition with no owner for 80% of a wait, then a dead one, then none at all
    name = make_queue(partitions=1)
    monkeypatch.setattr(runtime, "managers", Hidden(runtime.managers, (name, 0)))
    wait = routing.owner_wait(runtime)
    dead = closed_port()
    named: list[str | None] = []
    start = time.monotonic()

    def owner_of(queue_id: int, queue: str, index: int) -> str | None:
        due = time.monotonic() - start >= 0.8 * wait
        named.append(dead if due and dead not in named else None)
        return named[-1]

    monkeypatch.setattr(runtime.router, "owner_of", owner_of)
    # when a client enqueues to it
    r = api.post(f"{API}/{name}/enqueue", {"body": "x", "group": "g"}, format="json")
    took = time.monotonic() - start
    # then it was sent to the dead owner, and answered 503 (retry) within the one wait
    assert dead in named
    assert r.status_code == 503, r.content
    assert r["Retry-After"]
    assert took < 1.5 * wait, f"answered after {took:.2f} s; one wait is {wait:.2f} s"
