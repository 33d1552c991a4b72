"""Topics with several subscriptions: fan-out, group order, removal only when all have acked."""

from __future__ import annotations

import pytest

from queues.engine.ids import parse_message_id
from queues.models import Partition

#: Every test through DRF's test client and through the node's WSGI application (whose fast
#: path serves publish and the subscription calls).
pytestmark = pytest.mark.transports


def _publish(api, topic, bodies, **extra):
    r = api.post(f"/api/v1/topics/{topic}/publish", {"messages": [{"body": b, **extra} for b in bodies]}, format="json")
    assert r.status_code == 201, r.content
    return r.json()["ids"]


def _drain(api, topic, sub, *, ack=True, max_rounds=50):
    got = []
    for _ in range(max_rounds):
        r = api.post(f"/api/v1/topics/{topic}/subscriptions/{sub}/dequeue", {"max": 100}, format="json")
        assert r.status_code == 200, r.content
        batch = r.json()["messages"]
        if not batch:
            break
        got.extend(batch)
        if ack:
            r = api.post(
                f"/api/v1/topics/{topic}/subscriptions/{sub}/ack",
                {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in batch]},
                format="json",
            )
            assert r.status_code == 200 and r.json()["acked"] == len(batch), r.content
    return got


@pytest.fixture
def make_topic(api, unique_name, runtime):
    def make(subs=(), **fields):
        fields.setdefault("name", unique_name("t"))
        r = api.post("/api/v1/topics", fields, format="json")
        assert r.status_code == 201, r.content
        for sub in subs:
            spec = sub if isinstance(sub, dict) else {"name": sub}
            r = api.post(f"/api/v1/topics/{fields['name']}/subscriptions", spec, format="json")
            assert r.status_code == 201, r.content
        runtime.tick()
        return fields["name"]

    return make


def test_every_subscription_gets_every_message_once(api, make_topic, runtime, purge_kv):
    # given a topic with three subscriptions
    topic = make_topic(["a", "b", "c"], partitions=2, block_size=8)
    ids = _publish(api, topic, [f"m{i}" for i in range(50)])
    # when each drains and acks
    got = {sub: _drain(api, topic, sub) for sub in "abc"}
    # then each received every message exactly once
    for sub in "abc":
        assert sorted(m["id"] for m in got[sub]) == sorted(ids), sub
    # and the messages and their blocks are gone once the last one acked
    assert runtime.queue_store(topic).get_many(ids) == [None] * len(ids)
    runtime.tick()
    assert sum(p.live_blocks for p in Partition.objects.filter(queue__name=topic)) <= 2  # the heads


def test_nothing_is_removed_before_the_slowest_subscription_acks(api, make_topic, runtime, purge_kv):
    topic = make_topic(["fast", "slow"], partitions=1, block_size=4)
    ids = _publish(api, topic, [f"m{i}" for i in range(10)])
    assert len(_drain(api, topic, "fast")) == 10
    # the slow one has not read: every message is still stored, and the admin figures say who holds them
    assert None not in runtime.queue_store(topic).get_many(ids)
    stats = api.get(f"/api/v1/topics/{topic}/subscriptions/slow/stats").json()
    assert stats["held"] == 10 and stats["acked"] == 0
    assert api.get(f"/api/v1/topics/{topic}/subscriptions/fast/stats").json()["held"] == 0
    # a takeover keeps what "fast" acked: it gets nothing again, "slow" gets everything
    runtime.stop(release=True)
    from queues import service
    from queues.cluster.node import NodeRuntime

    rt2 = NodeRuntime("test-node-2", background=False).start()
    service.set_runtime(rt2)
    try:
        assert _drain(api, topic, "fast") == []
        assert sorted(m["id"] for m in _drain(api, topic, "slow")) == sorted(ids)
        assert rt2.queue_store(topic).get_many(ids) == [None] * 10
    finally:
        rt2.stop(release=True)
        service.set_runtime(runtime)


def test_a_subscriptions_stats_give_the_age_of_what_it_holds_in_flight(api, make_topic, runtime, purge_kv):
    # given a subscription with its only message in flight (the queue's stats give an age then)
    topic = make_topic(["s", "other"], partitions=2)
    _publish(api, topic, ["m"])
    [m] = _drain(api, topic, "s", ack=False)
    # when its stats are read, live from the owner and as the owner published them
    live = api.get(f"/api/v1/topics/{topic}/subscriptions/s/stats").json()
    runtime.tick()
    part = Partition.objects.get(queue__name=topic, index=parse_message_id(m["id"]).partition)
    # then it holds one, in flight, and says how old it is
    assert (live["held"], live["in_flight"], live["depth"]) == (1, 1, 0)
    assert live["oldest_age"] is not None and live["oldest_age"] >= 0
    assert part.cursors["s"]["held"] == 1 and part.cursors["s"]["oldest_enqueued_at"] is not None
    # and once acked it holds nothing, and has no age
    r = api.post(
        f"/api/v1/topics/{topic}/subscriptions/s/ack",
        {"messages": [{"id": m["id"], "receipt": m["receipt"]}]},
        format="json",
    )
    assert r.status_code == 200, r.content
    done = api.get(f"/api/v1/topics/{topic}/subscriptions/s/stats").json()
    assert (done["held"], done["in_flight"], done["oldest_age"]) == (0, 0, None)
    assert api.get(f"/api/v1/topics/{topic}/subscriptions/other/stats").json()["oldest_age"] is not None


def test_group_order_per_subscription(api, make_topic, runtime, purge_kv):
    topic = make_topic(["x", "y"], partitions=2)
    for i in range(6):
        _publish(api, topic, [f"g1-{i}"], group="g1")
        _publish(api, topic, [f"g2-{i}"], group="g2")
    for sub in "xy":
        seen: dict[str, list[str]] = {}
        while True:
            batch = api.post(f"/api/v1/topics/{topic}/subscriptions/{sub}/dequeue", {"max": 10}, format="json").json()[
                "messages"
            ]
            if not batch:
                break
            groups = [m["group"] for m in batch]
            assert len(groups) == len(set(groups)), "two of one group in flight at once"
            for m in batch:
                seen.setdefault(m["group"], []).append(m["body"])
            api.post(
                f"/api/v1/topics/{topic}/subscriptions/{sub}/ack",
                {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in batch]},
                format="json",
            )
        assert seen == {g: [f"{g}-{i}" for i in range(6)] for g in ("g1", "g2")}


def test_start_newest_and_oldest(api, make_topic, runtime, purge_kv):
    topic = make_topic(["early"], partitions=1)
    before = _publish(api, topic, ["old1", "old2"])
    for spec in ({"name": "new", "start": "newest"}, {"name": "all", "start": "oldest"}):
        assert api.post(f"/api/v1/topics/{topic}/subscriptions", spec, format="json").status_code == 201
    runtime.tick()
    after = _publish(api, topic, ["new1"])
    assert sorted(m["id"] for m in _drain(api, topic, "new")) == after
    assert sorted(m["id"] for m in _drain(api, topic, "all")) == sorted(before + after)
    assert sorted(m["id"] for m in _drain(api, topic, "early")) == sorted(before + after)


def test_redelivery_and_receipts_are_per_subscription(api, make_topic, runtime, purge_kv):
    topic = make_topic(["a", "b"], partitions=1)
    [mid] = _publish(api, topic, ["x"])
    a = api.post(f"/api/v1/topics/{topic}/subscriptions/a/dequeue", {"visibility_timeout": 0}, format="json").json()
    b = api.post(f"/api/v1/topics/{topic}/subscriptions/b/dequeue", {}, format="json").json()
    assert a["messages"][0]["id"] == b["messages"][0]["id"] == mid
    # a's receipt is not b's
    r = api.post(
        f"/api/v1/topics/{topic}/subscriptions/b/ack",
        {"messages": [{"id": mid, "receipt": a["messages"][0]["receipt"]}]},
        format="json",
    )
    assert r.status_code == 409
    # a's visibility ran out: a gets it again (receive count 2); b still holds it
    again = api.post(f"/api/v1/topics/{topic}/subscriptions/a/dequeue", {}, format="json").json()["messages"]
    assert [m["receive_count"] for m in again] == [2]
    assert api.post(f"/api/v1/topics/{topic}/subscriptions/b/dequeue", {}, format="json").json()["messages"] == []


def test_bad_topic_calls_are_refused(api, make_topic, make_queue, runtime, purge_kv):
    topic = make_topic(["a"], partitions=1)
    queue = make_queue(partitions=1)
    _publish(api, topic, ["x"])
    # a topic is read through a subscription only: under /queues/ it is not found, and says why
    r = api.post(f"/api/v1/queues/{topic}/dequeue", {}, format="json")
    assert r.status_code == 404 and r.json()["error"] == "is_a_topic"
    assert api.post(f"/api/v1/topics/{topic}/subscriptions/nope/dequeue", {}, format="json").status_code == 404
    assert api.post(f"/api/v1/topics/{queue}/publish", {"body": "x"}, format="json").status_code == 404
    assert api.post(f"/api/v1/topics/{queue}/subscriptions", {"name": "s"}, format="json").status_code == 404
    for bad in (
        {"name": "a"},
        {"name": "bad/name"},
        {"name": "s", "start": "middle"},
        {"name": ""},
        {"name": "s", "extra": 1},
        {"name": "s", "max_receives": 2},
    ):
        r = api.post(f"/api/v1/topics/{topic}/subscriptions", bad, format="json")
        assert r.status_code in (400, 409), (bad, r.content)
    assert [s["name"] for s in api.get(f"/api/v1/topics/{topic}/subscriptions").json()] == ["a"]
    # still one message for "a"
    assert len(_drain(api, topic, "a")) == 1


def test_subscription_dead_letters(api, make_topic, make_queue, runtime, purge_kv):
    dlq = make_queue(partitions=1)
    topic = make_topic([{"name": "picky", "dead_letter_queue": dlq, "max_receives": 1}, "ok"], partitions=1)
    [mid] = _publish(api, topic, ["poison"])
    first = api.post(
        f"/api/v1/topics/{topic}/subscriptions/picky/dequeue", {"visibility_timeout": 0}, format="json"
    ).json()["messages"]
    assert [m["id"] for m in first] == [mid]
    assert api.post(f"/api/v1/topics/{topic}/subscriptions/picky/dequeue", {}, format="json").json()["messages"] == []
    moved = api.post(f"/api/v1/queues/{dlq}/dequeue", {}, format="json").json()["messages"]
    assert [m["body"] for m in moved] == ["poison"] and moved[0]["history"]["source"] == f"{topic}/picky"
    # the other subscription still has it
    assert [m["id"] for m in _drain(api, topic, "ok")] == [mid]
    assert parse_message_id(mid) is not None


def test_fan_out_with_a_subscription_stopped_and_resumed(api, make_topic, runtime, purge_kv):
    # given three subscriptions and grouped messages published in rounds
    topic = make_topic(["a", "b", "c"], partitions=3, block_size=8)
    ids: list[str] = []
    got: dict[str, list[dict]] = {s: [] for s in "abc"}

    def consume(sub):
        while True:
            batch = api.post(f"/api/v1/topics/{topic}/subscriptions/{sub}/dequeue", {"max": 7}, format="json").json()[
                "messages"
            ]
            if not batch:
                return
            got[sub].extend(batch)
            api.post(
                f"/api/v1/topics/{topic}/subscriptions/{sub}/ack",
                {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in batch]},
                format="json",
            )

    for rnd in range(4):
        for g in range(5):
            ids += _publish(api, topic, [f"g{g}-{rnd}-{k}" for k in range(3)], group=f"g{g}")
        consume("a")
        consume("b")
        if rnd == 0:
            consume("c")  # then "c" stops
        # nothing "c" has not acked is removed while it is stopped
        held_by_c = set(ids) - {m["id"] for m in got["c"]}
        assert None not in runtime.queue_store(topic).get_many(sorted(held_by_c))
    consume("c")  # resumed
    for sub in "abc":
        assert sorted(m["id"] for m in got[sub]) == sorted(ids), sub  # every message exactly once
        for g in range(5):
            bodies = [m["body"] for m in got[sub] if m["group"] == f"g{g}"]
            assert bodies == [f"g{g}-{r}-{k}" for r in range(4) for k in range(3)], (sub, g)
    assert runtime.queue_store(topic).get_many(ids) == [None] * len(ids)
