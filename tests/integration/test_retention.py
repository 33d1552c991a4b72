"""Retention: the Celery task asks each owner node to remove messages past the queue's retention."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.integration.nodes import Client

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.mark.node(env={"NODE_HEARTBEAT": "0.2"})
def test_retention_task_removes_old_messages_and_counts_them(node_factory, token):
    from queues.access import SYSTEM
    from queues.models import Queue
    from queues.service import expire_everywhere

    node = node_factory()
    try:
        # given a queue with old and new messages, on a node
        c = Client(node.url, token)
        name = f"ret-{uuid.uuid4().hex[:6]}"
        assert c.post("queues", {"name": name, "partitions": 2, "block_size": 4}).status_code == 201
        old = c.post(f"queues/{name}/enqueue", {"messages": [{"body": f"old{i}"} for i in range(8)]}).json()["ids"]
        queue = Queue.objects.get(name=name)
        # when nothing is past the retention yet, the task removes nothing
        assert expire_everywhere(queue, caller=SYSTEM) == 0
        # and when the retention shrinks below the messages' age (as if time had passed)
        time.sleep(1.2)
        Queue.objects.filter(pk=queue.pk).update(retention=1)
        time.sleep(0.6)  # the node reads the queue's settings at its next housekeeping pass
        new = c.post(f"queues/{name}/enqueue", {"messages": [{"body": f"new{i}"} for i in range(4)]}).json()["ids"]
        expired = expire_everywhere(queue, caller=SYSTEM)
        # then the old messages are gone and counted, and the new ones are delivered
        assert expired == len(old)
        got = c.post(f"queues/{name}/dequeue", {"max": 100, "wait": 0.5}).json()["messages"]
        assert {m["id"] for m in got} == set(new)
        assert Queue.objects.get(pk=queue.pk).expired_total == len(old)
        # and only nodes and staff may ask for it
        r = c.post(f"queues/{name}/expire", {})
        assert r.status_code == 403
    finally:
        node.stop()
