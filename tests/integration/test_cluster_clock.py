"""Nodes whose wall clocks are minutes apart are one cluster: each reads other nodes' heartbeats
and forwarded calls' signatures on the database's clock (queues/cluster/clock.py).

Found by the nemesis run (``python -m nemesis.run --minutes 1 --seed 5 --faults
drift,partition-stores,partition-peers,kill``): a node restarted with its wall clock 77 s
behind had its forwarded calls refused by its peers (the signature's time was outside
``CLUSTER_CLOCK_SKEW``), and its clients were answered 401 for another node's refusal."""

from __future__ import annotations

import time

import pytest

from nemesis import clocks
from queues.cluster import clock
from tests.integration.nodes import Client
from tests.integration.test_cluster_4xx import group_in, split_queue

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_the_cluster_clock_is_the_database_s_whatever_this_node_s_says(monkeypatch):
    real = time.time
    assert abs(clock.measure()) < 1.0  # one machine, one clock
    # when this node's wall clock is five minutes fast
    monkeypatch.setattr(time, "time", lambda: real() + 300)
    offset = clock.measure()
    # then the cluster's clock still reads the database's time
    assert -301 < offset < -299
    assert abs(clock.time_s() - real()) < 1.0
    monkeypatch.undo()
    clock.measure()


@pytest.mark.skipif(not clocks.available()[0], reason="libfaketime is not installed (scripts/services.sh packages)")
def test_a_node_whose_wall_clock_is_minutes_off_forwards_and_is_forwarded_to(node_factory, token):
    # given node A on time and node B whose wall clock is five minutes behind
    a = node_factory()
    b = node_factory(**clocks.Drift(1.0, -300).env())
    name, at_a, at_b = split_queue(a, b, token, lease_period=30)
    ca, cb = Client(a.url, token), Client(b.url, token)
    # when each is asked to enqueue to the other's partition, and to ack there
    for client, there in ((ca, at_b), (cb, at_a)):
        r = client.post(f"queues/{name}/enqueue", {"messages": [{"body": "x", "group": group_in(there)}]})
        assert r.status_code == 201, r.text  # (was 401: the peer refused the signature's time)
        r = client.post(f"queues/{name}/dequeue", {"max": 10, "visibility_timeout": 60})
        assert r.status_code == 200, r.text
        messages = r.json()["messages"]
        assert [m["body"] for m in messages] == ["x"]
        r = client.post(
            f"queues/{name}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in messages]}
        )
        assert r.status_code == 200 and r.json()["acked"] == 1, r.text
