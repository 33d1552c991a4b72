"""The message guarantees a user relies on: groups, strict queues, dead letters, delays,
metadata, deduplication (also across node processes) and replicated writes (KV_MIN_REPLICAS).

The first part runs in-process against the configured database and key-value store (PostgreSQL
+ Redis under ``make test``); the second starts real node processes; the last one also starts
a real Redis replica of the test Redis (``scripts/services.sh redis-replica``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest

from tests.integration.nodes import Client
from tests.integration.wsgi_client import TRANSPORTS, token_client
from tests.launcher import ROOT, free_port

API = "/api/v1/queues"


def in_process(fn):
    """A test in this process, on the configured database and store; the store emptied after."""
    return pytest.mark.django_db(pytest.mark.usefixtures("purge_kv")(fn))


def post(api, name, action, payload):
    return api.post(f"{API}/{name}/{action}", payload, format="json")


def enqueue(api, name, payload) -> dict:
    r = post(api, name, "enqueue", payload)
    assert r.status_code == 201, r.content
    return r.json()


def dequeue(api, name, **params) -> list[dict]:
    r = post(api, name, "dequeue", params)
    assert r.status_code == 200, r.content
    return r.json()["messages"]


def ack(api, name, messages) -> dict:
    r = post(api, name, "ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in messages]})
    assert r.status_code == 200, r.content
    return r.json()


def stats(api, name) -> dict:
    r = api.get(f"{API}/{name}/stats")
    assert r.status_code == 200, r.content
    return r.json()


# --- strict queues and message groups ---------------------------------------------------------
@in_process
def test_strict_queue_needs_groups_and_receipts(api, make_queue):
    # given a strict queue holding one grouped message
    name = make_queue(strict=True)
    mid = enqueue(api, name, {"body": "ok", "group": "g"})["id"]
    # when a message comes without a group
    r = post(api, name, "enqueue", {"body": "no group"})
    # then it is refused and nothing is stored
    assert r.status_code == 400 and r.json()["error"] == "missing_group", r.content
    r = post(api, name, "enqueue", {"messages": [{"body": "a", "group": "g"}, {"body": "b"}]})
    assert r.status_code == 400 and r.json()["error"] == "missing_group", r.content
    assert stats(api, name)["depth"] == 1
    # when a delivered message is acknowledged by ID alone, or without its receipt
    (m,) = dequeue(api, name)
    assert m["id"] == mid and m["group"] == "g"
    r = post(api, name, "ack", {"ids": [mid]})
    assert r.status_code == 400 and r.json()["error"] == "receipt_required", r.content
    r = post(api, name, "ack", {"messages": [{"id": mid}]})
    assert r.status_code == 400 and r.json()["error"] == "receipt_required", r.content
    # then it is still in flight; its receipt acknowledges it
    assert stats(api, name)["in_flight"] == 1
    assert ack(api, name, [m]) == {"acked": 1, "not_found": 0}


@in_process
def test_groups_deliver_in_order_one_at_a_time(api, make_queue):
    # given 3 groups x 5 messages, interleaved, in one batch, on a strict queue of 2 partitions
    name = make_queue(strict=True, partitions=2)
    groups = ["red", "green", "blue"]
    batch = [{"body": f"{g}:{i}", "group": g} for i in range(5) for g in groups]
    enqueue(api, name, {"messages": batch})
    seen: dict[str, list[int]] = {g: [] for g in groups}
    sequences: dict[str, list[int]] = {g: [] for g in groups}
    held: dict[str, dict] = {}  # group -> its message in flight
    rounds = 0
    # when a consumer dequeues up to 10 at a time and acks only part of what it holds each round
    while sum(map(len, seen.values())) < 15:
        rounds += 1
        assert rounds < 40, f"stuck: seen {seen}, holding {list(held)}"
        got = dequeue(api, name, max=10, visibility_timeout=60)
        # then no batch has two messages of a group, nor one of a group already in flight
        got_groups = [m["group"] for m in got]
        assert len(got_groups) == len(set(got_groups)), got_groups
        assert not set(got_groups) & set(held), (got_groups, list(held))
        for m in got:
            g, i = m["body"].split(":")
            seen[g].append(int(i))
            sequences[g].append(m["sequence"])
            held[g] = m
        done = [held.pop(g) for g in sorted(held)[: max(1, len(held) // 2)]] if held else []
        if done:
            ack(api, name, done)
    for m in held.values():
        ack(api, name, [m])
    # and each group came in order
    assert seen == {g: [0, 1, 2, 3, 4] for g in groups}
    assert all(s == sorted(s) and len(set(s)) == 5 for s in sequences.values()), sequences
    assert dequeue(api, name, max=10) == []


@in_process
def test_stale_receipt_is_409_on_a_strict_queue(api, make_queue):
    # given a strict queue whose message was delivered, made visible again and delivered again
    name = make_queue(strict=True)
    enqueue(api, name, {"body": "x", "group": "g"})
    (first,) = dequeue(api, name, visibility_timeout=60)
    r = post(api, name, "visibility", {"id": first["id"], "receipt": first["receipt"], "visibility_timeout": 0})
    assert r.status_code == 200, r.content
    (second,) = dequeue(api, name, visibility_timeout=60)
    assert second["id"] == first["id"] and second["receive_count"] == 2
    # when the first delivery's receipt is used
    r = post(api, name, "ack", {"messages": [{"id": first["id"], "receipt": first["receipt"]}]})
    # then 409, and the message stays
    assert r.status_code == 409 and r.json()["error"] == "receipt_mismatch", r.content
    assert stats(api, name)["in_flight"] == 1
    assert ack(api, name, [second])["acked"] == 1


# --- dead letters and redrive ------------------------------------------------------------------
def always_fails(body: str) -> None:
    raise RuntimeError(f"cannot handle {body!r}")


@in_process
def test_dead_letter_after_max_receives_then_redrive(api, make_queue):
    # given a queue with max_receives=3 and a dead-letter queue, and a handler that always fails
    dlq = make_queue()
    name = make_queue(partitions=1, dead_letter_queue=dlq, max_receives=3)
    mid = enqueue(api, name, {"body": "poison", "group": "g", "attributes": {"k": "v"}})["id"]
    # when a consumer tries it, fails and gives it back (visibility 0), again and again
    for attempt in (1, 2, 3):
        (m,) = dequeue(api, name, visibility_timeout=60)
        assert (m["id"], m["receive_count"]) == (mid, attempt)
        with pytest.raises(RuntimeError):
            always_fails(m["body"])
        r = post(api, name, "visibility", {"id": m["id"], "receipt": m["receipt"], "visibility_timeout": 0})
        assert r.status_code == 200, r.content
    # then a fourth delivery does not happen: the message is in the dead-letter queue, with history
    assert dequeue(api, name, max=10) == []
    s = stats(api, name)
    assert (s["depth"], s["in_flight"]) == (0, 0), s
    (dead,) = dequeue(api, dlq, visibility_timeout=60)
    assert dead["body"] == "poison" and dead["attributes"] == {"k": "v"}
    assert {k: dead["history"][k] for k in ("source", "id", "receive_count")} == {
        "source": name,
        "id": mid,
        "receive_count": 3,
    }
    assert dead["history"]["group"] == "g"
    # when it is given back (visible again) and redriven
    r = post(api, dlq, "visibility", {"id": dead["id"], "receipt": dead["receipt"], "visibility_timeout": 0})
    assert r.status_code == 200, r.content
    r = post(api, dlq, "redrive", {"max": 10})
    # then it is back in its queue, counting receives from one again, and gone from the DLQ
    assert r.status_code == 200 and r.json() == {"moved": 1, "skipped": 0, "sources": {name: 1}}, r.content
    s = stats(api, dlq)
    assert (s["depth"], s["in_flight"]) == (0, 0), s
    (back,) = dequeue(api, name, visibility_timeout=60)
    assert back["body"] == "poison" and back["receive_count"] == 1 and back["group"] == "g"
    assert back["attributes"] == {"k": "v"} and "history" not in back
    assert ack(api, name, [back])["acked"] == 1


# --- delays -----------------------------------------------------------------------------------
def wait_for_one(api, name, timeout: float = 5.0) -> tuple[dict, float]:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        got = dequeue(api, name, max=10)
        if got:
            assert len(got) == 1, got
            return got[0], time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"nothing delivered from {name} within {timeout}s")


@in_process
@pytest.mark.parametrize("how", ["delay", "not_before_epoch", "not_before_iso", "queue_default"])
def test_delayed_messages_wait_their_turn(api, make_queue, how):
    # given a message that may not be delivered for about a second
    name = make_queue(delay=1) if how == "queue_default" else make_queue()
    due = datetime.now(UTC) + timedelta(seconds=1)
    payload = {"body": how}
    if how == "delay":
        payload["delay"] = 1
    elif how == "not_before_epoch":
        payload["not_before"] = due.timestamp()
    elif how == "not_before_iso":
        payload["not_before"] = due.isoformat().replace("+00:00", "Z")
    sent = time.monotonic()
    enqueue(api, name, payload)
    # when a consumer asks at once
    # then nothing comes; it comes once the second has passed
    assert dequeue(api, name, max=10) == []
    m, at = wait_for_one(api, name)
    assert m["body"] == how
    assert 0.9 <= at - sent < 4, at - sent


@in_process
def test_an_explicit_zero_delay_overrides_the_queue_default(api, make_queue):
    # given a queue whose messages wait 60 s by default
    name = make_queue(delay=60)
    # when one message asks for no delay and one takes the default
    enqueue(api, name, {"messages": [{"body": "now", "delay": 0}, {"body": "later"}]})
    # then only the first is delivered now
    got = dequeue(api, name, max=10)
    assert [m["body"] for m in got] == ["now"]


# --- attributes, size, estimates --------------------------------------------------------------
@in_process
def test_attributes_size_and_estimates_round_trip(api, make_queue):
    # given a queue with default time estimates
    name = make_queue(preprocess_estimate=0.5, process_estimate=3)
    attributes = {"kind": "thumbnail", "priority": 2, "ratio": 0.25, "urgent": True, "empty": ""}
    # when one message carries attributes, size and its own estimates, and another none
    ids = enqueue(
        api,
        name,
        {
            "messages": [
                {"body": "rich", "attributes": attributes, "size": 123456, "estimates": {"process": 7.5}},
                {"body": "plain"},
            ]
        },
    )["ids"]
    got = {m["id"]: m for m in dequeue(api, name, max=10)}
    # then they come back as sent, with the queue's estimates where the message gave none
    rich, plain = got[ids[0]], got[ids[1]]
    assert rich["attributes"] == attributes and rich["size"] == 123456
    assert rich["estimates"] == {"preprocess": 0.5, "process": 7.5}
    assert plain["attributes"] == {} and plain["size"] is None and plain["group"] is None
    assert plain["estimates"] == {"preprocess": 0.5, "process": 3.0}
    assert isinstance(rich["sequence"], int) and rich["sequence"] < plain["sequence"]


# --- deduplication ----------------------------------------------------------------------------
@in_process
def test_dedup_id_stores_one_message(api, make_queue):
    # given a queue
    name = make_queue(partitions=2)
    # when the same dedup_id is sent twice
    first = enqueue(api, name, {"body": "a", "dedup_id": "order-1"})["id"]
    again = enqueue(api, name, {"body": "a (retry)", "dedup_id": "order-1"})["id"]
    # then both calls answer the same ID and one message is stored
    assert again == first
    assert stats(api, name)["depth"] == 1
    # when a batch repeats a dedup_id inside itself and repeats the earlier one
    ids = enqueue(
        api,
        name,
        {
            "messages": [
                {"body": "b", "dedup_id": "order-2"},
                {"body": "b2", "dedup_id": "order-2"},
                {"body": "a3", "dedup_id": "order-1"},
                {"body": "free"},
            ]
        },
    )["ids"]
    # then repeats take the first one's ID, and only new messages are stored
    assert ids[0] == ids[1] and ids[2] == first and len({ids[0], ids[3], first}) == 3
    assert stats(api, name)["depth"] == 3
    bodies = sorted(m["body"] for m in dequeue(api, name, max=10))
    assert bodies == ["a", "b", "free"]


@in_process
def test_a_failed_enqueue_gives_back_every_dedup_reservation(api, make_queue, monkeypatch):
    from queues.cluster import dedup

    # given a queue where another call is still enqueueing dedup_id "busy" (reserved, not confirmed)
    monkeypatch.setattr(dedup, "_WAIT", 0.2)
    name = make_queue()
    store = dedup.get_dedup()
    assert store.reserve(name, "busy", 300) is None
    try:
        # when a batch with a fresh dedup_id and the busy one is refused (503: busy elsewhere)
        r = post(
            api, name, "enqueue", {"messages": [{"body": "a", "dedup_id": "fresh"}, {"body": "b", "dedup_id": "busy"}]}
        )
        assert r.status_code == 503, r.content
        assert stats(api, name)["depth"] == 0
        # then the fresh dedup_id was given back: a retry of it alone is stored at once
        r = post(api, name, "enqueue", {"body": "a", "dedup_id": "fresh"})
        assert r.status_code == 201, r.content
        (m,) = dequeue(api, name, max=10)
        assert (m["id"], m["body"]) == (r.json()["id"], "a")
    finally:
        store.release(name, "busy")


@in_process
@pytest.mark.parametrize("backend", ["redis", "database"])
def test_a_reservation_never_confirmed_lapses_long_before_the_window(api, make_queue, monkeypatch, backend):
    from queues.cluster import dedup

    # given a dedup_id reserved by a call that died before confirming it (a node killed mid-call)
    monkeypatch.setattr(dedup, "_WAIT", 0.2)
    monkeypatch.setattr(dedup, "PENDING_TTL", 1)
    name = make_queue()
    store = dedup.RedisDedup() if backend == "redis" else dedup.DatabaseDedup()
    monkeypatch.setattr(dedup, "_store", store)
    assert store.reserve(name, "orphan", 300) is None
    try:
        # when a retry comes at once, it waits for the other call and gets a 503
        r = post(api, name, "enqueue", {"body": "a", "dedup_id": "orphan"})
        assert r.status_code == 503, r.content
        # then, the reservation's short life over (not the window's 300 s), the retry is stored
        time.sleep(1.5)
        r = post(api, name, "enqueue", {"body": "a", "dedup_id": "orphan"})
        assert r.status_code == 201, r.content
        # and, confirmed, it holds for the window: a repeat answers the same ID
        again = post(api, name, "enqueue", {"body": "a", "dedup_id": "orphan"})
        assert (again.status_code, again.json()["id"]) == (201, r.json()["id"])
    finally:
        store.release(name, "orphan")


@in_process
@pytest.mark.parametrize("backend", ["redis", "database"])
def test_a_batch_s_reservations_are_all_or_nothing(make_queue, monkeypatch, backend):
    from queues.cluster import dedup
    from queues.engine.partition import PartitionUnavailable

    monkeypatch.setattr(dedup, "_WAIT", 0.2)
    name = make_queue()
    store = dedup.RedisDedup() if backend == "redis" else dedup.DatabaseDedup()
    # given one dedup_id stored earlier and one another call is still storing
    assert store.reserve(name, "old", 300) is None
    store.confirm(name, "old", "the-old-id", 300)
    assert store.reserve(name, "busy", 300) is None
    try:
        # when a batch wants a fresh one, the stored one and the busy one: refused whole...
        with pytest.raises(PartitionUnavailable):
            store.reserve_many(name, ["fresh", "old", "busy"], 300)
        # ...and the fresh one it took is given back
        assert store.reserve_many(name, ["fresh"], 300) == {"fresh": None}
        store.release(name, "fresh")
    finally:
        store.release(name, "busy")
    # then, the busy one given back, the batch gets each: its own, or the first message's ID
    assert store.reserve_many(name, ["fresh", "old", "busy"], 300) == {
        "fresh": None,
        "old": "the-old-id",
        "busy": None,
    }
    store.confirm_many(name, [("fresh", "id-1"), ("busy", "id-2")], 300)
    assert store.reserve_many(name, ["busy", "fresh"], 300) == {"busy": "id-2", "fresh": "id-1"}


# --- bad input for the new fields --------------------------------------------------------------
BAD = [
    ({"body": "x", "group": "g" * 129}, "invalid_group"),
    ({"body": "x", "group": 5}, "invalid_group"),
    ({"body": "x", "group": ""}, "invalid_group"),
    ({"body": "x", "dedup_id": ["a"]}, "invalid_dedup_id"),
    ({"body": "x", "delay": 901}, "out_of_range"),
    ({"body": "x", "delay": -1}, "out_of_range"),
    ({"body": "x", "delay": "soon"}, "invalid_number"),
    ({"body": "x", "delay": 1, "not_before": 1}, "invalid_delay"),
    ({"body": "x", "not_before": "tomorrow"}, "invalid_delay"),
    ({"body": "x", "not_before": 4102444800}, "out_of_range"),  # year 2100: past the 15 min horizon
    ({"body": "x", "attributes": {f"k{i}": i for i in range(17)}}, "invalid_attributes"),
    ({"body": "x", "attributes": {"nested": {"a": 1}}}, "invalid_attributes"),
    ({"body": "x", "attributes": {"list": [1]}}, "invalid_attributes"),
    ({"body": "x", "attributes": ["a"]}, "invalid_attributes"),
    ({"body": "x", "attributes": {"": 1}}, "invalid_attributes"),
    ({"body": "x", "estimates": {"process": 1, "cook": 2}}, "invalid_estimates"),
    ({"body": "x", "estimates": {}}, "invalid_estimates"),
    ({"body": "x", "estimates": {"process": -1}}, "out_of_range"),
    ({"body": "x", "size": -1}, "out_of_range"),
    ({"body": "x", "size": 1.5}, "invalid_number"),
    ({"body": "x", "priority": 1}, "unknown_field"),
]


@in_process
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bad_new_fields_are_400_and_store_nothing(runtime, make_queue, transport):
    # given a queue, through each transport (DRF, and the node's fast path)
    from django.contrib.auth.models import User

    from queues.models import Grant, Queue

    user = User.objects.create(username=f"b-{uuid.uuid4().hex[:8]}")
    client = token_client(transport, user)
    name = make_queue()
    for action in ("produce", "consume"):  # another user made the queue: this one is granted what it does
        Grant.objects.create(user=user, queue=Queue.objects.get(name=name), action=action)
    for message, code in BAD:
        # when a bad message comes alone, or after a good one in a batch that reserves a dedup_id
        single = client.post(f"{API}/{name}/enqueue", message, format="json")
        batch = client.post(
            f"{API}/{name}/enqueue",
            {"messages": [{"body": "good", "dedup_id": "d-1", "group": "g"}, message]},
            format="json",
        )
        # then each is refused with its code
        for r in (single, batch):
            assert r.status_code == 400, (message, r.status_code, r.content)
            assert r.json()["error"] == code, (message, r.json())
    # and nothing was stored, nor the dedup_id reserved
    assert stats(client, name)["depth"] == 0
    r = client.post(f"{API}/{name}/enqueue", {"body": "good", "dedup_id": "d-1"}, format="json")
    assert r.status_code == 201, r.content
    (m,) = dequeue(client, name, max=10)
    assert m["id"] == r.json()["id"] and m["body"] == "good"


# --- node processes ---------------------------------------------------------------------------
def wait_served(clients: list[Client], queue: str, timeout: float = 20) -> None:
    """Until every partition of ``queue`` is open on one of these nodes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live: set[int] = set()
        total = 0
        for c in clients:
            parts = c.get(f"queues/{queue}/stats").json()["partitions"]
            total = len(parts)
            live |= {p["index"] for p in parts if p["live"]}
        if total and len(live) == total:
            return
        time.sleep(0.1)
    raise AssertionError(f"{queue}: not every partition is served within {timeout}s")


def drain(clients: list[Client], queue: str, idle: float = 1.0, limit: float = 30) -> list[dict]:
    """Dequeue and ack through every client until all of them have had nothing for ``idle`` s."""
    out: list[dict] = []
    quiet_since = None
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got_any = False
        for c in clients:
            r = c.post(f"queues/{queue}/dequeue", {"max": 100, "visibility_timeout": 60})
            assert r.status_code == 200, r.text
            got = r.json()["messages"]
            if got:
                got_any = True
                out.extend(got)
                a = c.post(f"queues/{queue}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]})
                assert a.status_code == 200, a.text
        if got_any:
            quiet_since = None
        else:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= idle:
                return out
            time.sleep(0.05)
    raise AssertionError(f"drain of {queue} did not go quiet within {limit}s")


#: The nodes' dedup entries: in Redis db 0 (their messages: db 5, the ``nodes`` fixture's).
DEDUP_REDIS = pytest.mark.node(env={"REDIS_URL": os.environ.get("MQ_TEST_REDIS_URL", "") + "/0"})


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@DEDUP_REDIS
def test_dedup_across_nodes(node_factory, token):
    # given two nodes sharing the database and Redis
    a, b = node_factory(), node_factory()
    ca, cb = Client(a.url, token), Client(b.url, token)
    name = f"dedup-{uuid.uuid4().hex[:8]}"
    r = ca.post("queues", {"name": name, "partitions": 2, "lease_period": 2})
    assert r.status_code == 201, r.text
    # when the same dedup_id goes to one node, then to the other
    r1 = ca.post(f"queues/{name}/enqueue", {"body": "once", "dedup_id": "seq"})
    r2 = cb.post(f"queues/{name}/enqueue", {"body": "once (retry)", "dedup_id": "seq"})
    # then both answer the same ID
    assert (r1.status_code, r2.status_code) == (201, 201), (r1.text, r2.text)
    assert r1.json()["id"] == r2.json()["id"]
    # when, for each of 10 dedup_ids, two threads send it to the two nodes at the same moment
    answers: dict[str, list] = {f"race-{k}": [] for k in range(10)}
    lock = threading.Lock()

    def send(client_url: str, dedup_id: str, barrier: threading.Barrier) -> None:
        c = Client(client_url, token)
        barrier.wait()
        resp = c.post(f"queues/{name}/enqueue", {"body": dedup_id, "dedup_id": dedup_id})
        with lock:
            answers[dedup_id].append((resp.status_code, resp.json().get("id")))

    for dedup_id in answers:
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=send, args=(url, dedup_id, barrier)) for url in (a.url, b.url)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    # then each pair got one ID, and the queue holds one message per dedup_id
    for dedup_id, got in answers.items():
        assert [s for s, _ in got] == [201, 201], (dedup_id, got)
        assert got[0][1] == got[1][1], (dedup_id, got)
    wait_served([ca, cb], name)
    delivered = drain([ca, cb], name)
    bodies = sorted(m["body"] for m in delivered)
    assert bodies == sorted(["once", *answers]), bodies
    assert {m["id"] for m in delivered} == {r1.json()["id"], *(got[0][1] for got in answers.values())}


# --- replication: KV_MIN_REPLICAS with a real Redis replica ------------------------------------
def services(*args: str) -> None:
    env = dict(os.environ)
    # the replica follows the test Redis: take its port from the URL the suite was given
    env.setdefault("MQ_REDIS_PORT", str(urlsplit(os.environ["MQ_TEST_REDIS_URL"]).port or 6379))
    done = subprocess.run(
        [str(ROOT / "scripts" / "services.sh"), *args], env=env, check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"services.sh {' '.join(args)}: {done.stderr[-2000:]}"


@pytest.fixture
def replica(redis_client):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed: no replica can be started")
    port = free_port()
    state = {"running": False}

    def start() -> None:
        services("redis-replica", "start", str(port))
        state["running"] = True

    def stop() -> None:
        services("redis-replica", "stop", str(port))
        state["running"] = False

    start()
    yield start, stop
    if state["running"]:
        stop()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@DEDUP_REDIS
def test_min_replicas_refuses_unreplicated_enqueues_and_never_delivers_them(node_factory, token, replica):
    start_replica, stop_replica = replica
    # given a node that needs one Redis replica to confirm every write, and a running replica
    first = node_factory(KV_MIN_REPLICAS="1")
    c = Client(first.url, token)
    name = f"repl-{uuid.uuid4().hex[:8]}"
    r = c.post("queues", {"name": name, "partitions": 1, "block_size": 4, "lease_period": 2})
    assert r.status_code == 201, r.text
    confirmed: dict[str, str] = {}
    for i in range(6):
        r = c.post(f"queues/{name}/enqueue", {"body": f"ok-{i}"})
        # then enqueues are confirmed
        assert r.status_code == 201, r.text
        confirmed[r.json()["id"]] = f"ok-{i}"
    # when the replica goes away
    stop_replica()
    failed: list[str] = []
    for i in range(6):  # single messages and a batch: message writes and block allocations
        payload = {"body": f"lost-{i}"} if i < 4 else {"messages": [{"body": f"lost-{i}-{k}"} for k in range(5)]}
        t0 = time.monotonic()
        r = c.post(f"queues/{name}/enqueue", payload)
        took = time.monotonic() - t0
        # then every enqueue fails with 503, within a couple of WAIT timeouts (1 s), never 201
        assert r.status_code == 503, (i, r.status_code, r.text)
        # (a message write waits 1 s, and so does taking it back from the primary)
        assert took < 3.5, f"enqueue {i} took {took:.1f}s to fail"
        failed.extend([payload["body"]] if "body" in payload else [m["body"] for m in payload["messages"]])
    # when the replica is back
    start_replica()
    # then the node confirms enqueues again (once it has reopened the partition)
    deadline = time.monotonic() + 10
    while True:
        r = c.post(f"queues/{name}/enqueue", {"body": "after"})
        if r.status_code == 201:
            confirmed[r.json()["id"]] = "after"
            break
        assert r.status_code == 503 and time.monotonic() < deadline, r.text
        time.sleep(0.1)
    # when a node without KV_MIN_REPLICAS takes the partition over and drains it
    first.stop()
    second = Client(node_factory().url, token)
    wait_served([second], name)
    delivered = drain([second], name, idle=1.5)
    # then every confirmed message comes back and no refused one ever does
    bodies = [m["body"] for m in delivered]
    assert not set(bodies) & set(failed), sorted(set(bodies) & set(failed))
    assert sorted(bodies) == sorted(confirmed.values()), bodies
