"""The operators' console: queue figures from live state, purge, release of a lease, rate history."""

from __future__ import annotations

import math
import re
import time

import pytest

from queues.engine.ids import parse_message_id
from queues.engine.keys import block_key
from queues.engine.partition import PartitionUnavailable
from queues.models import Partition, Queue


@pytest.fixture
def staff_api(api, user):
    user.is_staff = True
    user.save()
    from queues.http.auth import CachedTokenAuthentication

    CachedTokenAuthentication.forget()
    return api


def _enqueue(api, name, n, **extra):
    r = api.post(
        f"/api/v1/queues/{name}/enqueue", {"messages": [{"body": f"m{i}", **extra} for i in range(n)]}, format="json"
    )
    assert r.status_code == 201, r.content
    return r.json()["ids"]


def test_queue_page_shows_depth_in_flight_delayed_dead_letters_age_and_rates(
    admin_client, api, make_queue, runtime, purge_kv
):
    # given a queue with 7 ready, 2 of them then in flight, 3 delayed, and a dead-letter queue
    # holding one message
    dlq = make_queue(partitions=1)
    name = make_queue(partitions=2, dead_letter_queue=dlq, max_receives=1)
    runtime.tick()
    _enqueue(api, name, 7)
    _enqueue(api, name, 3, delay=600)
    _enqueue(api, dlq, 1)
    got = api.post(f"/api/v1/queues/{name}/dequeue", {"max": 2}, format="json").json()["messages"]
    assert len(got) == 2
    # when the owner publishes its figures (twice: rates are counter growth between passes)
    runtime.tick()
    _enqueue(api, name, 5)
    runtime.tick()
    page = admin_client.get("/admin/queues/queue/", {"q": name}).content.decode()
    # then the rows hold them and the queue list shows them
    rows = Partition.objects.filter(queue__name=name)
    assert sum(p.depth for p in rows) == 7 + 3 + 5 - 2
    assert sum(p.in_flight for p in rows) == 2
    assert sum(p.delayed for p in rows) == 3
    assert sum(p.enqueue_rate for p in rows) > 0
    assert all(p.oldest_enqueued_at is not None for p in rows if p.depth)
    assert '<td class="field-depth">13</td>' in page
    assert '<td class="field-in_flight">2</td>' in page
    assert '<td class="field-delayed">3</td>' in page
    assert "1 / 0" in page  # one waiting in the dead-letter queue, none moved by this queue yet
    assert "field-oldest_age" in page and " s</td>" in page


def test_purge_removes_every_message_and_fences_the_old_owner(staff_api, make_queue, runtime, purge_kv):
    # given a queue with messages, some in flight, and a small block size (several blocks)
    api = staff_api
    name = make_queue(partitions=1, block_size=4)
    runtime.tick()
    ids = _enqueue(api, name, 30)
    got = api.post(f"/api/v1/queues/{name}/dequeue", {"max": 3}, format="json").json()["messages"]
    old = runtime.manager(name, 0)
    old_blocks = list(old.blocks)
    store = runtime.queue_store(name)
    assert None not in store.get_many(ids)
    # when an operator purges it
    r = api.post(f"/api/v1/queues/{name}/purge", {}, format="json")
    # then every message and block is gone from the store
    assert r.status_code == 200 and r.json() == {"purged": 30}
    assert store.get_many(ids) == [None] * 30
    assert all(store.get(block_key(name, 0, b)) is None for b in old_blocks)
    # and the old owner, were it still running somewhere, can write nothing more
    old.closed = False
    with pytest.raises(PartitionUnavailable):
        old.enqueue([old.cache.get(ids[-1]) or store.get(ids[-1]) or _any_message()])
    # and the queue serves again, empty, under a newer epoch
    runtime.tick()
    assert api.post(f"/api/v1/queues/{name}/dequeue", {}, format="json").json()["messages"] == []
    fresh = _enqueue(api, name, 2)
    assert [
        m["body"] for m in api.post(f"/api/v1/queues/{name}/dequeue", {"max": 5}, format="json").json()["messages"]
    ] == ["m0", "m1"]
    assert Partition.objects.get(queue__name=name, index=0).epoch > old.lease.epoch
    assert parse_message_id(fresh[0]).block not in old_blocks
    # an ack of a purged delivery changes nothing (its message is gone)
    r = api.post(
        f"/api/v1/queues/{name}/ack", {"messages": [{"id": got[0]["id"], "receipt": got[0]["receipt"]}]}, format="json"
    )
    assert r.status_code == 409
    assert Queue.objects.get(name=name).purged_total == 30


def _any_message():
    from queues.engine.ids import StoredMessage

    return StoredMessage("late", 0.0)


def test_purge_and_release_need_manage(api, make_queue, runtime, purge_kv):
    import uuid

    from django.contrib.auth.models import User

    from queues.models import Grant
    from tests.integration.wsgi_client import token_client

    name = make_queue(partitions=1)
    runtime.tick()
    _enqueue(api, name, 2)
    # a user who may consume (not manage) the queue is refused both, and told what it lacks
    worker = User.objects.create(username=f"w-{uuid.uuid4().hex[:8]}")
    Grant.objects.create(user=worker, queue=Queue.objects.get(name=name), action="consume")
    other = token_client("drf", worker)
    for path in (f"/api/v1/queues/{name}/purge", f"/api/v1/queues/{name}/partitions/0/release"):
        r = other.post(path, {}, format="json")
        assert r.status_code == 403 and r.json()["missing"] == "manage", r.content
    # nothing changed
    assert len(other.post(f"/api/v1/queues/{name}/dequeue", {"max": 5}, format="json").json()["messages"]) == 2


def test_bad_purge_and_release_requests_are_refused(staff_api, make_queue, runtime, purge_kv):
    name = make_queue(partitions=2)
    runtime.tick()
    _enqueue(staff_api, name, 2)
    assert staff_api.post(f"/api/v1/queues/{name}/purge", {"close_only": True}, format="json").status_code == 400
    assert staff_api.post(f"/api/v1/queues/{name}/purge", [1], format="json").status_code == 400
    assert staff_api.post("/api/v1/queues/nope/purge", {}, format="json").status_code == 404
    r = staff_api.post(f"/api/v1/queues/{name}/partitions/7/release", {}, format="json")
    assert r.status_code == 404 and r.json()["error"] == "no_such_partition"
    assert staff_api.get(f"/api/v1/queues/{name}/stats").json()["depth"] == 2


def test_release_gives_the_lease_up_for_a_lease_period(staff_api, admin_client, make_queue, runtime, purge_kv):
    # given a partition this node owns
    name = make_queue(partitions=2, lease_period=30)
    runtime.tick()
    p = Partition.objects.get(queue__name=name, index=1)
    assert p.owner_id == runtime.node_id
    # when an operator releases its lease from the partition list
    r = admin_client.post(
        "/admin/queues/partition/", {"action": "release_lease", "_selected_action": [p.pk]}, follow=True
    )
    # then the row is free, this node does not take it back at once, and the other still serves
    assert r.status_code == 200 and "released by test-node" in r.content.decode()
    assert Partition.objects.get(pk=p.pk).owner_id is None
    runtime.tick()
    assert Partition.objects.get(pk=p.pk).owner_id is None
    assert staff_api.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json").status_code == 201
    # and a second release finds no owner
    r = staff_api.post(f"/api/v1/queues/{name}/partitions/1/release", {}, format="json")
    assert r.status_code == 409 and r.json()["error"] == "not_owned"
    # after the hold-off the node may take it again
    runtime.hold_off.clear()
    runtime.tick()
    assert Partition.objects.get(pk=p.pk).owner_id == runtime.node_id


def test_purge_action_in_the_admin(admin_client, api, make_queue, runtime, purge_kv):
    name = make_queue(partitions=2)
    runtime.tick()
    _enqueue(api, name, 6)
    q = Queue.objects.get(name=name)
    r = admin_client.post("/admin/queues/queue/", {"action": "purge", "_selected_action": [q.pk]}, follow=True)
    assert r.status_code == 200 and f"{name}: purged 6 messages" in r.content.decode().lower()
    runtime.tick()
    assert api.get(f"/api/v1/queues/{name}/stats").json()["depth"] == 0


def test_topic_page_says_which_subscription_holds_how_much(admin_client, api, runtime, purge_kv, unique_name):
    topic = unique_name("t")
    assert api.post("/api/v1/topics", {"name": topic, "partitions": 2}, format="json").status_code == 201
    for sub in ("fast", "slow"):
        assert api.post(f"/api/v1/topics/{topic}/subscriptions", {"name": sub}, format="json").status_code == 201
    runtime.tick()
    r = api.post(f"/api/v1/topics/{topic}/publish", {"messages": [{"body": str(i)} for i in range(9)]}, format="json")
    assert r.status_code == 201
    got = api.post(f"/api/v1/topics/{topic}/subscriptions/fast/dequeue", {"max": 20}, format="json").json()["messages"]
    api.post(
        f"/api/v1/topics/{topic}/subscriptions/fast/ack",
        {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]},
        format="json",
    )
    runtime.tick()
    q = Queue.objects.get(name=topic)
    page = admin_client.get(f"/admin/queues/queue/{q.pk}/change/").content.decode()
    subs = admin_client.get("/admin/queues/subscription/").content.decode()
    # "slow" holds all nine, "fast" none; both pages read it from the owners' published figures
    holds = re.findall(r'field-held">\s*<p>(\d+)</p>', page)
    assert sorted(holds) == ["0", "9"], holds
    assert f"{topic}/slow" in subs and '<td class="field-held">9</td>' in subs


def test_subscription_page_shows_positions_and_what_only_the_archive_holds(
    admin_client, staff_api, runtime, purge_kv, unique_name
):
    # given an archiving topic whose slow subscription held six messages when retention passed
    api = staff_api
    topic = unique_name("t")
    r = api.post("/api/v1/topics", {"name": topic, "partitions": 1, "archive": "all"}, format="json")
    assert r.status_code == 201, r.content
    for sub in ("fast", "slow"):
        assert api.post(f"/api/v1/topics/{topic}/subscriptions", {"name": sub}, format="json").status_code == 201
    runtime.tick()
    ids = api.post(
        f"/api/v1/topics/{topic}/publish", {"messages": [{"body": str(i)} for i in range(6)]}, format="json"
    ).json()["ids"]
    got = api.post(f"/api/v1/topics/{topic}/subscriptions/fast/dequeue", {"max": 20}, format="json").json()["messages"]
    api.post(
        f"/api/v1/topics/{topic}/subscriptions/fast/ack",
        {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]},
        format="json",
    )
    r = api.post(f"/api/v1/queues/{topic}/expire", {"older_than": 0}, format="json")
    assert r.status_code == 200 and r.json() == {"expired": 0, "archived": 6}, r.content
    runtime.tick()
    # then its page shows its next message in the partition, six held, six only in the archive
    from queues.models import Subscription

    slow = Subscription.objects.get(topic__name=topic, name="slow")
    page = admin_client.get(f"/admin/queues/subscription/{slow.pk}/change/").content.decode()
    assert re.search(r'field-archived">.*?<div class="readonly">6</div>', page, re.S), page
    row = re.search(r'<table class="positions">.*?<tbody>(.*?)</tbody>', page, re.S).group(1)
    assert re.findall(r"<td>(.*?)</td>", row) == ["0", f"<code>{ids[0]}</code>", "6", "0", "0", "6"]
    listing = admin_client.get("/admin/queues/subscription/", {"topic__id__exact": slow.topic_id}).content.decode()
    assert '<td class="field-archived">6</td>' in listing and '<td class="field-archived">0</td>' in listing


def test_admin_cannot_rename_a_queue_and_deleting_one_empties_the_store(
    admin_client, api, make_queue, runtime, purge_kv
):
    name = make_queue(partitions=1)
    runtime.tick()
    ids = _enqueue(api, name, 3)
    q = Queue.objects.get(name=name)
    store = runtime.queue_store(name)
    assert None not in store.get_many(ids)
    page = admin_client.get(f"/admin/queues/queue/{q.pk}/change/").content.decode()
    assert 'name="name"' not in page and 'name="block_size"' not in page
    assert admin_client.get(f"/admin/queues/partition/{Partition.objects.get(queue=q).pk}/delete/").status_code == 403
    r = admin_client.post(f"/admin/queues/queue/{q.pk}/delete/", {"post": "yes"}, follow=True)
    assert r.status_code == 200 and not Queue.objects.filter(pk=q.pk).exists()
    assert store.get_many(ids) == [None] * 3


def test_a_block_lists_its_messages_and_their_states(staff_api, admin_client, make_queue, runtime, purge_kv):
    # given a queue's block of 4 holding a message in flight, one acknowledged, one delayed
    # and one ready
    api = staff_api
    name = make_queue(partitions=1, block_size=4, visibility_timeout=300)
    runtime.tick()
    first, second, delayed = _enqueue(api, name, 2) + _enqueue(api, name, 1, delay=600)
    got = api.post(f"/api/v1/queues/{name}/dequeue", {"max": 2}, format="json").json()["messages"]
    assert [m["id"] for m in got] == [first, second]
    ack = {"messages": [{"id": second, "receipt": got[1]["receipt"]}]}
    assert api.post(f"/api/v1/queues/{name}/ack", ack, format="json").json()["acked"] == 1
    (ready,) = _enqueue(api, name, 1)
    block = parse_message_id(first).block
    assert {parse_message_id(m).block for m in (second, delayed, ready)} == {block}
    p = Partition.objects.get(queue__name=name, index=0)
    # when an operator clicks the block in the partition's tree drawing
    r = admin_client.get(f"/admin/queues/partition/{p.pk}/blocks/{block}.json")
    # then the owner lists its messages, each with its state
    assert r.status_code == 200, r.content
    listing = r.json()
    states = {m["id"]: m["states"][""] for m in listing["messages"]}
    assert states == {first: "in_flight", second: "gone", delayed: "delayed", ready: "ready"}
    assert (listing["block"], listing["used"], listing["live"], listing["more"]) == (block, 4, 3, 0)
    (held,) = [m for m in listing["messages"] if m["id"] == first]
    assert held["receive_counts"] == {"": 1} and 0 < held["visible_in"][""] <= 300
    # and the same read is what another node asks of the owner (staff or nodes only)
    r = api.post(f"/api/v1/queues/{name}/partitions/0/blocks/{block}", {"limit": 2}, format="json")
    assert r.status_code == 200 and [m["id"] for m in r.json()["messages"]] == [first, second], r.content
    assert r.json()["more"] == 2
    # a block it holds nothing of lists nothing; a bad block ID or partition is refused
    gone = "00000fff-0123456789abcdef"
    r = admin_client.get(f"/admin/queues/partition/{p.pk}/blocks/{gone}.json")
    assert r.status_code == 200 and r.json()["messages"] == [] and r.json()["live"] == 0
    r = admin_client.get(f"/admin/queues/partition/{p.pk}/blocks/nope.json")
    assert r.status_code == 400 and r.json()["error"] == "invalid_block"
    r = api.post(f"/api/v1/queues/{name}/partitions/3/blocks/{block}", {}, format="json")
    assert r.status_code == 404 and r.json()["error"] == "no_such_partition"


def test_a_block_of_a_partition_another_node_owns_is_asked_of_it(
    admin_client, make_queue, runtime, purge_kv, monkeypatch
):
    from queues import service

    # given a partition this node gave up, now owned by another node
    name = make_queue(partitions=1, block_size=4)
    runtime.tick()
    assert runtime.release_partition(name, 0)
    monkeypatch.setattr(runtime.router, "owner_of", lambda queue_id, queue, index: "other-node:8000")
    asked = []

    class Owner:
        def block_messages(self, address, queue, index, block, limit, hops, caller):
            asked.append((address, queue, index, block, limit, hops, caller.user_id))
            return {"block": block, "messages": [{"id": f"{queue}/0/{block}/0", "index": 0, "states": {"": "ready"}}]}

    previous = service.get_peers()
    service.set_peers(Owner())  # type: ignore[arg-type]
    try:
        # when an operator clicks one of its blocks
        block = "00000002-0123456789abcdef"
        p = Partition.objects.get(queue__name=name, index=0)
        r = admin_client.get(f"/admin/queues/partition/{p.pk}/blocks/{block}.json")
    finally:
        service.set_peers(previous)
    # then the owner is asked, for the operator, and its answer shown
    user_id = int(admin_client.session["_auth_user_id"])
    assert asked == [("other-node:8000", name, 0, block, service.BLOCK_LISTING_MAX, 0, user_id)]
    assert r.status_code == 200 and r.json()["messages"][0]["states"] == {"": "ready"}, r.content


def test_the_overview_opens_with_the_last_hour_of_each_queues_rates(
    admin_client, api, make_queue, runtime, purge_kv, monkeypatch
):
    from django.urls import reverse

    from queues.cluster import node
    from queues.models import RateSample

    # given a queue whose owner's housekeeping passes fall in four steps of the rate history:
    # one three hours ago, then the last three minutes, with enqueues between them
    name = make_queue(partitions=2)
    now = time.time()
    clock = [now - 3 * 3600]
    monkeypatch.setattr(node, "wall", lambda: clock[0])
    runtime.tick()
    for minutes_ago in (3, 2, 1):
        _enqueue(api, name, 4)
        clock[0] = now - 60 * minutes_ago
        runtime.tick()
        runtime.tick()  # (a second pass in the same step adds no point)
    # then each pass's step is a point of the queue's history on the overview, summed over its
    # partitions, oldest first; the point older than the hour kept is gone
    steps = [math.floor((now - 60 * m) / 60) * 60 for m in (3, 2, 1)]
    figures = admin_client.get(reverse("admin:overview_json")).json()
    line = next(q for q in figures["queues"] if q["name"] == name)
    assert [p[0] for p in line["history"]] == steps, line["history"]
    assert all(p[1] > 0 for p in line["history"]), line["history"]
    assert figures["history_step"] == 60.0
    assert RateSample.objects.filter(partition__queue__name=name).count() == 2 * 3
    # the page opens with them, and a poll asks only for the points after those it has
    page = admin_client.get(reverse("admin:overview"))
    shown = next(q for q in page.context["figures"]["queues"] if q["name"] == name)
    assert [p[0] for p in shown["history"]] == steps
    later = admin_client.get(reverse("admin:overview_json"), {"history_after": steps[1]}).json()
    assert [p[0] for q in later["queues"] if q["name"] == name for p in q["history"]] == steps[2:]
    # and a time no datetime holds asks for nothing newer, or for all there is
    for after, points in (("1e300", []), ("-1e300", steps)):
        r = admin_client.get(reverse("admin:overview_json"), {"history_after": after})
        assert r.status_code == 200, r.content
        assert [p[0] for q in r.json()["queues"] if q["name"] == name for p in q["history"]] == points


def test_a_pass_whose_rate_history_cannot_be_written_still_ends(runtime, make_queue, monkeypatch):
    from django.db import OperationalError

    from queues.models import RateSample

    # given a node holding partitions, whose rate history table cannot be written
    make_queue(partitions=2)
    runtime.tick()

    def refused(*args, **kwargs):
        raise OperationalError("relation queues_ratesample does not exist")

    monkeypatch.setattr(RateSample.objects, "bulk_create", refused)
    runtime._history_step = None  # the next pass writes a point
    before = runtime.last_pass
    # when a housekeeping pass runs
    runtime.tick()
    # then the pass ends as any other: it is counted as done, the partitions still held
    assert runtime.last_pass is not None and runtime.last_pass != before
    assert runtime.local_managers(next(iter(runtime.queues)))
