"""The client SDK (``mq_client``) against real node processes over PostgreSQL + Redis.

Every call round trips through a node; batching is counted in HTTP calls; errors come back
typed; a dead node or one answering 503 is skipped; acks and visibility changes go straight to
the partition's owner, so they succeed even when the only node the client was given is gone.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import mq_client as sdk
from mq_client import Client, Message, NewMessage
from tests.launcher import free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def unavailable_node():
    """A stand-in node that answers every call with 503 and Retry-After, counting the calls."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            hits.append(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            body = b'{"error": "unavailable", "detail": "partition not served here; retry"}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Retry-After", "0.2")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PATCH = do_DELETE = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    server.hits = hits
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield server
    server.shutdown()
    server.server_close()


def _name(prefix: str = "sdk") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _served(client: Client, queue: str, owners: int = 1) -> bool:
    parts = client.partitions(queue)
    return all(p.address for p in parts) and len({p.owner for p in parts}) >= owners


def _record_calls(client: Client) -> list[tuple[str, str, str, object]]:
    """Wrap the client's single-request function: (method, base URL, path, payload) per HTTP call."""
    calls: list[tuple[str, str, str, object]] = []
    once = client._transport.once

    def recording(method, base, path, payload, timeout):
        calls.append((method, base, path, payload))
        return once(method, base, path, payload, timeout)

    client._transport.once = recording
    return calls


def _drain(client: Client, queue: str, expected: int) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + 20
    while len(got) < expected and time.monotonic() < deadline:
        got += client.dequeue(queue, 1000, visibility_timeout=60, wait=1)
    return got


def test_every_call_round_trips_with_typed_results(node_factory, token):
    node = node_factory()
    mq = Client(node.url, token)
    # queues: create, read, list, change
    dlq = mq.create_queue(_name("dlq"), partitions=1)
    name = _name()
    q = mq.create_queue(
        name, partitions=2, visibility_timeout=45, dead_letter_queue=dlq.name, max_receives=2, process_estimate=3.5
    )
    assert isinstance(q, sdk.Queue) and q.partitions == 2 and q.visibility_timeout == 45
    assert q.dead_letter_queue == dlq.name and q.max_receives == 2 and isinstance(q.created_at, datetime)
    assert mq.get_queue(name) == q
    assert {name, dlq.name} <= {x.name for x in mq.list_queues()}
    q2 = mq.update_queue(name, partitions=3, preprocess_estimate=1.25)
    assert q2.partitions == 3 and q2.preprocess_estimate == 1.25 and q2.updated_at >= q.updated_at
    _wait(lambda: _served(mq, name), 20, "the node to serve every partition")
    assert [p.index for p in mq.partitions(name)] == [0, 1, 2]
    # an ordinary user learns liveness only, nothing about the node (staff and nodes see more)
    assert mq.health() == mq.health(node.url) == sdk.Health(status="ok")

    # enqueue with every field, then a batch of plain bodies, NewMessages and dicts
    mid = mq.enqueue(
        name,
        "first",
        group="g1",
        dedup_id="d-1",
        attributes={"kind": "order", "n": 3, "ok": True},
        size=42,
        estimates={"preprocess": 0.5},
    )
    assert mid.startswith(f"{name}/") and sdk.message_queue(mid) == name
    assert mq.enqueue(name, "first again", group="g1", dedup_id="d-1") == mid  # deduplicated
    later = mq.enqueue(name, "later", delay=600)
    future = mq.enqueue(name, "future", not_before=datetime.now(UTC) + timedelta(minutes=10))
    ids = mq.enqueue_batch(name, ["a", NewMessage("b", attributes={"x": 1}), {"body": "c", "size": 7}])
    assert len(ids) == 3 and len({sdk.message_partition(i) for i in ids}) == 1  # one partition, in order

    # dequeue: typed messages, the delayed ones held back
    got = _drain(mq, name, 4)
    by_body = {m.body: m for m in got}
    assert set(by_body) == {"first", "a", "b", "c"}, "delayed messages must not be delivered yet"
    first = by_body["first"]
    assert isinstance(first, Message) and first.id == mid and first.receive_count == 1 and first.receipt
    assert first.group == "g1" and first.attributes == {"kind": "order", "n": 3, "ok": True} and first.size == 42
    assert first.estimates == sdk.Estimates(preprocess=0.5, process=3.5)  # the queue's default fills in
    assert isinstance(first.enqueued_at, datetime) and first.enqueued_at.tzinfo is not None
    assert isinstance(first.sequence, int) and first.history is None and first.queue == name
    assert [by_body[b].id for b in "abc"] == ids and by_body["b"].attributes == {"x": 1}
    assert by_body["a"].sequence < by_body["b"].sequence < by_body["c"].sequence

    # visibility: extend one, give another back (delivered again, receive count 2)
    v = mq.change_visibility(name, by_body["a"], 120)
    assert v == sdk.VisibilityResult(id=ids[0], visibility_timeout=120)
    mq.give_back(name, by_body["b"])
    again = mq.dequeue(name, 10, wait=2)
    assert [m.body for m in again] == ["b"] and again[0].receive_count == 2

    # stats: figures per partition
    st = mq.stats(name)
    assert isinstance(st, sdk.Stats) and st.queue == name and len(st.partitions) == 3
    assert st.in_flight == 4 and st.depth == 2 and all(isinstance(p, sdk.PartitionStats) for p in st.partitions)

    # ack by receipts and by IDs
    assert mq.ack(name, [first, (by_body["a"].id, by_body["a"].receipt), again[0]]) == sdk.AckResult(3, 0)
    assert mq.ack_ids(name, [by_body["c"].id, later, future]) == sdk.AckResult(3, 0)
    assert mq.ack_ids(name, [later]) == sdk.AckResult(0, 1)
    assert mq.stats(name).depth == 0

    # dead letters and redrive: delivered twice unacked, the message moves to the DLQ
    poison = mq.enqueue(name, "poison")
    for _ in range(2):
        assert [m.id for m in mq.dequeue(name, visibility_timeout=0, wait=2)] == [poison]
    assert mq.dequeue(name) == []
    _wait(lambda: mq.stats(dlq.name).depth == 1, 10, "the dead letter")
    dead = mq.dequeue(dlq.name, visibility_timeout=0)
    assert dead[0].body == "poison" and dead[0].history.source == name and dead[0].history.id == poison
    assert dead[0].history.receive_count >= 2 and isinstance(dead[0].history.dead_lettered_at, datetime)
    assert mq.redrive(dlq.name, 10) == sdk.RedriveResult(moved=1, skipped=0, sources={name: 1})
    assert [m.body for m in mq.dequeue(name, wait=2)] == ["poison"]

    # delete
    mq.delete_queue(name)
    with pytest.raises(sdk.NotFound):
        mq.get_queue(name)
    assert name not in {x.name for x in mq.list_queues()}


def test_enqueue_takes_a_fairness_key_and_a_receive_answers_it(node_factory, token):
    mq = Client(node_factory().url, token)
    name = mq.create_queue(_name(), partitions=1).name
    _wait(lambda: _served(mq, name), 20, "the node to serve every partition")
    for i in range(3):
        mq.enqueue(name, f"noisy{i}", fairness_key="noisy")
    mq.enqueue(name, "quiet", fairness_key="quiet")
    got = mq.dequeue(name, 2)
    # the quiet tenant's turn comes after the flood's first message, not after its backlog
    assert [(m.body, m.fairness_key) for m in got] == [("noisy0", "noisy"), ("quiet", "quiet")]


def test_enqueue_many_splits_2500_messages_into_three_calls(node_factory, token):
    node = node_factory()
    mq = Client(node.url, token)
    name = mq.create_queue(_name(), partitions=2).name
    _wait(lambda: _served(mq, name), 20, "the node to serve every partition")
    calls = _record_calls(mq)
    ids = mq.enqueue_many(name, (f"m{i}" for i in range(2500)))
    enqueues = [c for c in calls if c[2].endswith("/enqueue")]
    assert [len(c[3]["messages"]) for c in enqueues] == [1000, 1000, 500]
    assert len(ids) == 2500 and len(set(ids)) == 2500
    assert mq.stats(name).depth == 2500
    # the IDs come back in the caller's order: each batch is stored in order in one partition
    got = _drain(mq, name, 2500)
    body_of = {m.id: m.body for m in got}
    assert [body_of[i] for i in ids] == [f"m{i}" for i in range(2500)]
    calls.clear()
    assert mq.ack(name, got) == sdk.AckResult(2500, 0)
    acks = [c for c in calls if c[2].endswith("/ack")]
    assert sorted(len(c[3]["messages"]) for c in acks) == [500, 1000, 1000]  # one node: 1,000 a call
    assert mq.stats(name).depth == 0 and mq.stats(name).in_flight == 0
    with pytest.raises(ValueError):
        mq.enqueue_batch(name, ["x"] * 1001)


def test_errors_are_typed_and_4xx_are_not_retried(node_factory, token):
    node = node_factory()
    mq = Client(node.url, token, retries=3)
    name = mq.create_queue(_name(), partitions=1, max_message_size=16).name
    _wait(lambda: _served(mq, name), 20, "the node to serve the partition")
    calls = _record_calls(mq)
    # 404
    with pytest.raises(sdk.NotFound) as exc:
        mq.enqueue(_name("missing"), "x")
    assert exc.value.status == 404 and exc.value.code == "queue_not_found"
    assert len(calls) == 1, "a 4xx must not be retried"
    # 400 with a code
    with pytest.raises(sdk.BadRequest) as exc:
        mq.enqueue(name, "x" * 17)
    assert exc.value.status == 400 and exc.value.code == "body_too_large" and "max_message_size" in exc.value.detail
    with pytest.raises(sdk.BadRequest) as exc:
        mq.dequeue(name, 0)
    assert exc.value.code == "out_of_range"
    with pytest.raises(sdk.Conflict) as exc:
        mq.create_queue(name)  # taken
    assert exc.value.status == 409 and exc.value.code == "already_exists" and name in exc.value.detail
    assert len(calls) == 4
    # 409: a stale receipt, after the message was delivered again
    mid = mq.enqueue(name, "x")
    old = mq.dequeue(name, visibility_timeout=0)[0]
    new = mq.dequeue(name, visibility_timeout=30)[0]
    assert old.id == new.id == mid and old.receipt != new.receipt
    with pytest.raises(sdk.Conflict) as exc:
        mq.ack(name, [old])
    assert exc.value.status == 409 and exc.value.code == "receipt_mismatch" and exc.value.message_id == mid
    with pytest.raises(sdk.Conflict):
        mq.change_visibility(name, old, 10)
    assert mq.ack(name, [new]).acked == 1
    # 401
    with pytest.raises(sdk.Unauthorized) as exc:
        Client(node.url, "not-a-token").list_queues()
    assert exc.value.status == 401


def test_dead_and_unavailable_nodes_are_skipped(node_factory, token, unavailable_node):
    node = node_factory()
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    # a dead node first in the list: the call goes on to the next node at once
    mq = Client(f"{closed},{node.url}", token, retries=2, backoff=0.05)
    calls = _record_calls(mq)
    name = mq.create_queue(_name(), partitions=1).name
    assert [c[1] for c in calls] == [closed, node.url]
    _wait(lambda: _served(mq, name), 20, "the node to serve the partition")
    calls.clear()
    t0 = time.monotonic()
    for i in range(5):
        mq.enqueue(name, f"m{i}")
    assert time.monotonic() - t0 < 5
    assert {c[1] for c in calls} == {node.url}, "a node that refused connections is skipped for a while"

    # a node answering 503 (Retry-After 0.2 s) first: retried on the next node after the delay
    mq = Client([unavailable_node.url, node.url], token, retries=2, backoff=0.01)
    t0 = time.monotonic()
    got = mq.dequeue(name, 10)
    elapsed = time.monotonic() - t0
    assert len(got) == 5 and len(unavailable_node.hits) == 1 and elapsed >= 0.2

    # nobody serving: Unavailable after 1 + retries tries, each honouring Retry-After
    unavailable_node.hits.clear()
    mq = Client([unavailable_node.url], token, retries=2, backoff=0.01)
    t0 = time.monotonic()
    with pytest.raises(sdk.Unavailable) as exc:
        mq.stats(name)
    assert exc.value.status == 503 and exc.value.code == "unavailable"
    assert len(unavailable_node.hits) == 3 and time.monotonic() - t0 >= 0.4
    # nobody listening: ConnectionFailed (an Unavailable) after the retries
    with pytest.raises(sdk.ConnectionFailed) as exc:
        Client(closed, token, retries=1, backoff=0.01).stats(name)
    assert isinstance(exc.value, sdk.Unavailable) and exc.value.status == 0


def test_acks_and_visibility_go_straight_to_the_owner(node_factory, token):
    a, b = node_factory(), node_factory()
    admin = Client([a.url, b.url], token)
    name = admin.create_queue(_name(), partitions=2, lease_period=2).name
    _wait(lambda: _served(admin, name, owners=2), 20, "one partition on each node")
    owner_of = {p.index: p.address for p in admin.partitions(name)}
    a_address = a.url.removeprefix("http://")
    a_partition = next(i for i, addr in owner_of.items() if addr == a_address)
    admin.enqueue_many(name, [f"m{i}" for i in range(40)], batch_size=5)
    got = _drain(admin, name, 40)
    assert len(got) == 40 and {m.partition for m in got} == {0, 1}
    on_a = [m for m in got if m.partition == a_partition]
    on_b = [m for m in got if m.partition != a_partition]

    # a client that knows only node B learns the owners; acks of B's messages go to B...
    mq = Client(b.url, token, retries=1, backoff=0.01)
    via_a = Client(a.url, token, retries=2, backoff=0.01)
    via_a.owners(name)  # cached now: B's partition -> B
    calls = _record_calls(mq)
    assert mq.ack(name, on_b[:3]).acked == 3
    assert {c[1] for c in calls if c[2].endswith("/ack")} == {b.url}
    # ...and those of A's messages straight to A, not through B
    calls.clear()
    assert mq.ack(name, on_a[:3]).acked == 3
    assert [c[1] for c in calls if c[2].endswith("/ack")] == [a.url]
    assert mq.change_visibility(name, on_a[3], 60).visibility_timeout == 60
    assert [c[1] for c in calls if c[2].endswith("/visibility")] == [a.url]
    # a grouped enqueue goes to the owner of the group's partition too
    group = next(f"g{i}" for i in range(1000) if sdk.group_partition(f"g{i}", 2) == a_partition)
    calls.clear()
    assert sdk.message_partition(mq.enqueue(name, "grouped", group=group)) == a_partition
    assert [c[1] for c in calls if c[2].endswith("/enqueue")] == [a.url]

    # when B, the only node the client was given, stops, acks of A's messages still succeed
    b.stop()
    calls.clear()
    assert mq.ack(name, on_a[3:]) == sdk.AckResult(len(on_a) - 3, 0)
    assert {c[1] for c in calls} == {a.url}
    # ...and a call with no owner to go to fails typed, after its retries
    with pytest.raises(sdk.ConnectionFailed):
        mq.stats(name)

    # a cached owner that is gone: the call falls back to the round robin, the cache is refreshed
    _wait(lambda: _served(Client(a.url, token), name), 30, "A to take over B's partition")
    calls = _record_calls(via_a)
    rest = [m.id for m in on_b[3:]]
    assert via_a.ack_ids(name, rest) == sdk.AckResult(len(rest), 0)
    assert [c[1] for c in calls if c[2].endswith("/ack")] == [b.url, a.url]
    assert set(via_a.owners(name).values()) == {a_address}
    assert [m.body for m in _drain(via_a, name, 1)] == ["grouped"]


def _attempts(mid: str) -> list[tuple[int, str, str | None]]:
    from workers.models import AttemptLog

    return [(a.attempt, a.outcome, a.worker_id) for a in AttemptLog.objects.filter(message_id=mid).order_by("attempt")]


def test_a_message_given_back_is_logged_given_back_and_one_timed_out_abandoned(node_factory, token):
    """Needs the core to send ``queues.signals`` (the workers app keeps the log from them)."""
    node = node_factory()
    mq = Client(node.url, token)
    name = mq.create_queue(_name(), partitions=1).name
    _wait(lambda: _served(mq, name), 20, "the node to serve the queue")
    mid = mq.enqueue(name, "x")
    # given a delivered message its consumer says it holds
    consumer = uuid.uuid4().hex
    (m,) = mq.dequeue(name, visibility_timeout=60, wait=2)
    beat = mq.heartbeat({"consumer": consumer, "queues": [name], "held": [{"id": m.id, "receipt": m.receipt}]})
    assert beat["extended"] == [mid]
    # when the consumer gives it back and it is delivered again
    mq.give_back(name, m)
    (again,) = mq.dequeue(name, visibility_timeout=0, wait=2)
    assert again.id == mid and again.receive_count == 2
    # then attempt 1 was given back, not abandoned
    assert _attempts(mid) == [(1, "given_back", consumer)]
    # and attempt 2, whose visibility ran out (0 s), is abandoned when it is delivered a third time
    (third,) = mq.dequeue(name, visibility_timeout=60, wait=2)
    assert third.receive_count == 3
    assert _attempts(mid) == [(1, "given_back", consumer), (2, "abandoned", consumer)]


def test_heartbeats_extend_held_messages_at_their_owner(node_factory, token):
    """A heartbeat to one node extends a message held from the other's partition (the core's
    ``change_visibility`` forwards to the owner)."""
    a, b = node_factory(), node_factory()
    admin = Client([a.url, b.url], token)
    name = admin.create_queue(_name(), partitions=2, visibility_timeout=2, lease_period=2).name
    _wait(lambda: _served(admin, name, owners=2), 20, "one partition on each node")
    a_address = a.url.removeprefix("http://")
    a_partition = next(p.index for p in admin.partitions(name) if p.address == a_address)
    group = next(f"g{i}" for i in range(1000) if sdk.group_partition(f"g{i}", 2) == a_partition)
    mid = admin.enqueue(name, "long job", group=group)
    (m,) = Client(a.url, token).dequeue(name, visibility_timeout=2, wait=2)
    assert m.id == mid
    # when its worker heartbeats to B only, for twice the visibility timeout
    via_b = Client(b.url, token)
    held = [{"id": m.id, "receipt": m.receipt}]
    for _ in range(4):
        beat = via_b.heartbeat({"consumer": "w-far", "queues": [name], "held": held})
        assert beat["extended"] == [mid] and beat["lost"] == []
        assert Client(a.url, token).dequeue(name, visibility_timeout=30) == [], "delivered twice while held"
        time.sleep(1)
    # then the message is still the worker's
    assert admin.ack(name, [m]).acked == 1
