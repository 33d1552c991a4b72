"""A queue's ``group_batch`` setting through the REST API and the service layer that the REST
and SQS entrances share: on, a dequeue takes as many of a group's next messages as it has
room for, in order, and the group is held until each is acknowledged or visible again (what
SQS FIFO queues do: tests/integration/test_sqs_fifo_batches.py); off, a strict queue keeps one
message of a group in flight. Either way an ack that frees a group wakes a waiting long poll.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from queues import service
from queues.access import SYSTEM
from queues.cluster import long_polls
from queues.service import MessageDraft
from tests.launcher import wait_until

pytestmark = pytest.mark.django_db

API = "/api/v1/queues"


def _enqueue(api, name: str, *bodies: str) -> None:
    r = api.post(f"{API}/{name}/enqueue", {"messages": [{"body": b, "group": "g"} for b in bodies]}, format="json")
    assert r.status_code == 201, r.content


def _dequeue(api, name: str, n: int = 10) -> list[dict]:
    r = api.post(f"{API}/{name}/dequeue", {"max": n, "visibility_timeout": 60}, format="json")
    assert r.status_code == 200, r.content
    return list(r.json()["messages"])


@pytest.mark.parametrize("batch", [True, False])
def test_the_setting_is_answered_and_decides_how_many_of_a_group_go(api, make_queue, batch):
    # given a strict queue with group_batch on or off
    name = make_queue(partitions=1, strict=True, group_batch=batch)
    assert api.get(f"{API}/{name}").json()["group_batch"] is batch
    _enqueue(api, name, "m1", "m2", "m3")

    # when a consumer dequeues up to 10: all three in order, or the first alone
    got = _dequeue(api, name)
    assert [m["body"] for m in got] == (["m1", "m2", "m3"] if batch else ["m1"])
    # and nothing more of the group goes while they are in flight
    assert _dequeue(api, name) == []


def test_the_setting_can_be_changed(api, make_queue):
    # given a strict queue that delivers one of a group at a time
    name = make_queue(partitions=1, strict=True)
    assert api.get(f"{API}/{name}").json()["group_batch"] is False

    # when group_batch is turned on
    r = api.patch(f"{API}/{name}", {"group_batch": True}, format="json")
    assert r.status_code == 200, r.content

    # then its dequeues take a group's messages together
    assert r.json()["group_batch"] is True
    _enqueue(api, name, "m1", "m2")
    assert [m["body"] for m in _dequeue(api, name)] == ["m1", "m2"]


@pytest.mark.parametrize("batch", [True, False])
def test_an_ack_that_frees_a_group_wakes_a_long_poll(api, make_queue, batch):
    # given a group whose first messages are in flight, and a long poll waiting for more
    name = make_queue(partitions=1, strict=True, group_batch=batch)
    service.enqueue(name, [MessageDraft(b, group="g") for b in ("m1", "m2", "m3")], caller=SYSTEM)
    out = service.dequeue(name, caller=SYSTEM, max_messages=2, visibility_timeout=60)
    assert [d.message.body for d in out] == (["m1", "m2"] if batch else ["m1"])
    results: list[list] = []

    def long_poll() -> None:
        try:
            results.append(service.dequeue(name, caller=SYSTEM, max_messages=10, wait=20))
        finally:
            connection.close()  # this thread's own connection

    poll = threading.Thread(target=long_poll)
    poll.start()
    try:
        wait_until(lambda: long_polls.WAITS.total == 1, 30, "the long poll waiting")

        # when the messages in flight are acknowledged
        service.ack(name, [(service.parse_message_id(d.id), d.receipt) for d in out], caller=SYSTEM)
    finally:
        poll.join(timeout=30)

    # then the poll gets the group's next message (not its wait's end, with nothing: the
    # messages in flight were hidden for longer than it waits)
    assert [[d.message.body for d in got] for got in results] == [["m3"] if batch else ["m2"]]
