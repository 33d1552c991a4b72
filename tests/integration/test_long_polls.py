"""Long polls cost a node a bounded share of its threads, and an empty poll forwards once.

Issue 14: each long poll held a request thread for up to 20 s with no cap per token, and an
empty dequeue forwarded to every other owner, each of which forwarded again (N(N-1) internal
calls per poll on N nodes).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from queues import service
from queues.access import SYSTEM
from queues.service import MessageDraft
from queues.service import messages as service_messages
from queues.testing import wait_until

pytestmark = pytest.mark.django_db

API = "/api/v1/queues"


class RecordingPeers:
    """Other owners that are empty: records each dequeue forwarded to them."""

    def __init__(self) -> None:
        self.dequeues: list[tuple[str, int]] = []

    def dequeue(self, address, target, max_messages, visibility, hops, caller):
        self.dequeues.append((address, hops))
        return []


@pytest.fixture
def two_other_owners(runtime, monkeypatch):
    """This node sees two other owners of every queue; their transport records what it gets."""
    peers = RecordingPeers()
    monkeypatch.setattr(runtime.router, "other_nodes", lambda queue_id, queue: ["peer-a:1", "peer-b:1"])
    previous = service.get_peers()
    service.set_peers(peers)  # type: ignore[arg-type]
    yield peers
    service.set_peers(previous)


def test_an_empty_dequeue_asks_each_other_owner_once(api, make_queue, two_other_owners):
    # given an empty queue
    name = make_queue(partitions=1)

    # when a client's dequeue finds nothing here
    assert service.dequeue(name, caller=SYSTEM, hops=0) == []

    # then each other owner is asked once, as a forwarded call
    assert sorted(two_other_owners.dequeues) == [("peer-a:1", 0), ("peer-b:1", 0)]


def test_a_forwarded_dequeue_never_forwards_again(api, make_queue, two_other_owners):
    # given an empty queue
    name = make_queue(partitions=1)

    # when another node forwards a dequeue here (one hop) and nothing is here
    assert service.dequeue(name, caller=SYSTEM, hops=1) == []

    # then it is answered from here: no owner is asked (before: each owner again, N(N-1) calls)
    assert two_other_owners.dequeues == []


def test_long_polls_past_the_cap_are_429_with_retry_after(api, make_queue, settings):
    # given a node that lets two long polls wait at once, both taken
    settings.LONG_POLL_MAX_PER_NODE = 2
    settings.LONG_POLL_MAX_PER_USER = 2
    name = make_queue(partitions=1)
    (warm,) = service.enqueue(name, [MessageDraft("warm-up")], caller=SYSTEM)  # the head block exists
    service.ack(name, [(service_messages.parse_message_id(warm), None)], caller=SYSTEM)
    results: list[list] = []

    def long_poll():
        try:
            results.append(service.dequeue(name, caller=SYSTEM, wait=20))
        finally:
            connection.close()  # this thread's own connection

    waiters = [threading.Thread(target=long_poll) for _ in range(2)]
    for t in waiters:
        t.start()
    try:
        wait_until(lambda: service_messages._WAITS.total == 2, 30, "two long polls waiting")

        # when a third long poll comes, and a poll that does not wait
        r = api.post(f"{API}/{name}/dequeue", {"wait": 5}, format="json")
        quick = api.post(f"{API}/{name}/dequeue", {"wait": 0}, format="json")

        # then the long poll is refused at once, saying when to retry; the quick one is served
        assert r.status_code == 429, r.content
        assert r.json()["error"] == "too_many_waits" and r.json()["detail"]
        assert int(r["Retry-After"]) >= 1
        assert quick.status_code == 200 and quick.json()["messages"] == []
    finally:
        service.enqueue(name, [MessageDraft("a"), MessageDraft("b")], caller=SYSTEM)  # wakes both
        for t in waiters:
            t.join(timeout=30)
    assert sorted(m.message.body for got in results for m in got) == ["a", "b"]
    # and the slots are given back: a long poll is served again
    wait_until(lambda: service_messages._WAITS.total == 0, 10, "slots given back")
    assert api.post(f"{API}/{name}/dequeue", {"wait": 0.1}, format="json").status_code == 200


def test_one_user_cannot_take_every_wait(api, make_queue, settings):
    # given a user already at its cap of long polls on this node (the node's cap is higher)
    settings.LONG_POLL_MAX_PER_USER = 1
    settings.LONG_POLL_MAX_PER_NODE = 10
    name = make_queue(partitions=1)
    from django.contrib.auth.models import User

    caller = service_messages.Caller.of(User.objects.get(auth_token__key=api.token))
    slot = service_messages._WAITS.slot(caller)
    try:
        # when it long polls once more
        r = api.post(f"{API}/{name}/dequeue", {"wait": 5}, format="json")

        # then 429, while another user (the system here) may still wait
        assert r.status_code == 429, r.content
        assert "Retry-After" in r
        assert service.dequeue(name, caller=SYSTEM, wait=0.05) == []
    finally:
        slot.__exit__(None, None, None)
