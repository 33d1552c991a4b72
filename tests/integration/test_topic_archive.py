"""A slow subscription reads from the archive, across a takeover; then a replay round trip.

Real node processes on loopback, PostgreSQL (the database and the archive table) and Redis
(the key-value store). A topic that archives every message has a fast subscription that acks
at once and a slow one that reads nothing; retention passes, so the messages leave the
key-value store (only stubs stay, with no body) while the archive table holds them. The node
is SIGKILLed; the next owner serves the slow subscription every body from the archive, in
group order; the archive then replays them into a queue.
"""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings

from archive import archiver
from archive.models import ArchivedMessage
from queues.engine.ids import StoredMessage
from queues.engine.keys import incarnation
from queues.models import Queue
from tests.integration.nodes import Client, drain
from tests.launcher import wait_until

pytestmark = pytest.mark.cluster

GROUPS = 4
PER_GROUP = 30


def in_group_order(messages: list[dict]) -> bool:
    by_group: dict[str, list[int]] = {}
    for m in messages:
        by_group.setdefault(m["group"], []).append(m["attributes"]["i"])
    return all(seen == sorted(seen) for seen in by_group.values())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_slow_subscription_reads_from_the_archive_after_a_takeover_and_replay_round_trips(
    node_factory, token, redis_client
):
    from rest_framework.authtoken.models import Token

    user = Token.objects.get(key=token).user
    user.is_staff = True  # retention on demand (``expire``) is for staff and nodes
    user.save()
    from queues.kv.redis import RedisStore

    store = RedisStore(redis_client).within(settings.KV_PREFIX)  # as the nodes open it
    first = node_factory()
    second = node_factory(start=False)
    topic, copy = f"news-{uuid.uuid4().hex[:6]}", f"copy-{uuid.uuid4().hex[:6]}"

    def topic_store():
        """The store's view of the topic's keys (its incarnation's)."""
        return store.within(incarnation(Queue.objects.get(name=topic).pk))

    try:
        c = Client(first.url, token)
        r = c.post("topics", {"name": topic, "partitions": 2, "block_size": 16, "lease_period": 2, "archive": "all"})
        assert r.status_code == 201 and r.json()["archive"] == "all", r.text
        for sub in ("fast", "slow"):
            assert c.post(f"topics/{topic}/subscriptions", {"name": sub, "start": "oldest"}).status_code == 201
        wait_until(
            lambda: all(p["owner"] for p in c.get(f"queues/{topic}/partitions").json()["partitions"]),
            20,
            "the node to own every partition",
        )
        sent: dict[str, dict] = {}
        for g in range(GROUPS):
            batch = [
                {"body": f"g{g}-m{k}", "group": f"g{g}", "attributes": {"i": g * PER_GROUP + k}}
                for k in range(PER_GROUP)
            ]
            r = c.post(f"topics/{topic}/publish", {"messages": batch})
            assert r.status_code == 201, r.text
            sent.update(zip(r.json()["ids"], batch))
        # given the fast subscription acknowledged everything
        fast = drain(c, f"topics/{topic}/subscriptions/fast")
        assert {m["id"] for m in fast} == set(sent)
        # when retention passes (on demand: older than 0 s)
        r = c.post(f"queues/{topic}/expire", {"older_than": 0})
        assert r.status_code == 200, r.text
        # then nothing is removed for the slow subscription: the archive table holds all of them
        # (written by the owner: the archiver has not run) and the store keeps bodiless stubs
        assert r.json() == {"expired": 0, "archived": len(sent)}
        rows = {row.message_id: row for row in ArchivedMessage.objects.filter(queue=topic)}
        assert set(rows) == set(sent)
        assert all(rows[mid].body == sent[mid]["body"] for mid in sent)
        stubs = [StoredMessage.from_bytes(raw) for raw in topic_store().get_many(list(sent))]
        assert all(s.archived and s.body == "" and s.attributes is None for s in stubs)
        assert not any(sent[mid]["body"].encode() in raw for mid, raw in zip(sent, topic_store().get_many(list(sent))))
        slow_stats = c.get(f"topics/{topic}/subscriptions/slow/stats").json()
        assert slow_stats["archived"] == len(sent) and slow_stats["held"] == len(sent)

        # when the node is killed and another takes the partitions over
        first.kill()
        second.start()
        c2 = Client(second.url, token)
        wait_until(
            lambda: all(
                p["address"] == f"127.0.0.1:{second.port}"
                for p in c2.get(f"queues/{topic}/partitions").json()["partitions"]
            ),
            30,
            "the second node to own every partition",
        )
        # then the slow subscription gets every message once, each body from the archive, in
        # group order, and the fast one nothing
        slow = drain(c2, f"topics/{topic}/subscriptions/slow")
        assert sorted(m["id"] for m in slow) == sorted(sent)
        for m in slow:
            assert m["archived"] is True
            assert (m["body"], m["group"], m["attributes"]) == (
                sent[m["id"]]["body"],
                sent[m["id"]]["group"],
                sent[m["id"]]["attributes"],
            )
        assert in_group_order(slow)
        assert drain(c2, f"topics/{topic}/subscriptions/fast") == []
        # and once it acked them, the stubs are gone from the store
        assert topic_store().get_many(list(sent)) == [None] * len(sent)

        # when the archiver copies the journal (entries and the slow subscription's ack markers)
        archiver.run(topic, store=store)
        # then every row is there once and acknowledged
        assert ArchivedMessage.objects.filter(queue=topic).count() == len(sent)
        assert not ArchivedMessage.objects.filter(queue=topic, acked_at__isnull=True).exists()

        # when the archived messages are replayed into a queue
        assert c2.post("queues", {"name": copy, "partitions": 2}).status_code == 201
        r = c2.post("archive/replay", {"queue": topic, "into": copy, "ids": list(sent)})
        assert r.status_code == 200 and r.json()["replayed"] == len(sent), r.text
        # then the queue gives back the same messages, in group order
        copied = drain(c2, f"queues/{copy}")
        assert sorted((m["body"], m["group"], m["attributes"]["i"]) for m in copied) == sorted(
            (s["body"], s["group"], s["attributes"]["i"]) for s in sent.values()
        )
        assert in_group_order(copied)
    finally:
        first.stop()
        second.stop()
        for pk, name in Queue.objects.filter(name__in=[topic, copy]).values_list("pk", "name"):
            store.within(incarnation(pk)).delete_prefix(name)
