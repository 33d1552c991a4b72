"""Operators' actions against live traffic on two real node processes, for a bounded time.

While producers and consumers work on both nodes, an operator purges the queue, grows its
partitions, deletes and re-creates it and replays archived messages into it; on a second queue
whose dead letters go to a third, consumers give messages back so they are dead-lettered, and
the operator redrives them (and grows that queue too). Checked: no answer is a 5xx other than
503 with Retry-After; every 4xx is a clear race answer (404, 409); every message enqueued with
201 is delivered unless a purge or delete ended after its enqueue began; none enqueued before
a purge or delete is delivered by a dequeue sent after it ended; every message of the redrive
flow is acknowledged in the end. The forced, one-at-a-time versions are ``test_races.py``.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from itertools import cycle

import pytest
import requests

from tests.integration.nodes import Client
from tests.launcher import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: seconds the operator works against the traffic (then a quiet phase and the drains).
DURATION = float(os.environ.get("MQ_RACE_SECONDS", "15"))
LEASE = 2
#: what a race may answer besides success: (status, error code).
RACE_ANSWERS = {
    (404, "queue_not_found"),
    (409, "receipt_mismatch"),
    (409, "partitions_changed"),
    (409, "already_exists"),
    (409, "not_owned"),
    # an ack of a deleted queue's message, once a new queue of the name has fewer partitions
    (400, "invalid_id"),
}


@pytest.fixture
def ops_token(transactional_db) -> str:
    """A committed token of a superuser (it may purge, redrive, replay, delete)."""
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    user = User.objects.create(username=f"ops-{uuid.uuid4().hex[:8]}", is_staff=True, is_superuser=True)
    return Token.objects.create(user=user).key


class Ledger:
    """What every thread saw, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        #: (start, end, what) of each purge or delete + re-create of the main queue.
        self.removals: list[tuple[float, float, str]] = []
        #: main queue: message id -> (request sent, answer received) of its 201.
        self.enqueued: dict[str, tuple[float, float]] = {}
        #: main queue: message id -> send time of the first dequeue that delivered it.
        self.delivered: dict[str, float] = {}
        #: redrive flow: bodies enqueued with 201, bodies acked.
        self.flow_enqueued: set[str] = set()
        self.flow_acked: set[str] = set()
        self.answers: Counter[tuple[str, int, str]] = Counter()
        self.bad: list[str] = []
        self.actions: Counter[str] = Counter()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def note(self, call: str, r: requests.Response) -> bool:
        """Count the answer; a 5xx other than 503 with Retry-After, or a 4xx that is not a
        race's answer, is recorded as bad. True for a 2xx."""
        code = ""
        if r.status_code >= 400:
            try:
                code = r.json().get("error", "")
            except ValueError:
                code = "not json"
        with self.lock:
            self.answers[(call, r.status_code, code)] += 1
            if (r.status_code >= 500 and not (r.status_code == 503 and r.headers.get("Retry-After"))) or (
                400 <= r.status_code < 500 and (r.status_code, code) not in RACE_ANSWERS
            ):
                self.bad.append(f"{call}: {r.status_code} {r.text[:300]}")
        return r.status_code < 300


class Traffic:
    def __init__(self, urls: list[str], token: str, ledger: Ledger):
        self.urls, self.token, self.ledger = urls, token, ledger
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def clients(self):
        return cycle([Client(u, self.token) for u in self.urls])

    def run(self, target, *args) -> None:
        def loop():
            clients = self.clients()
            while not self.stop.is_set():
                try:
                    target(next(clients), *args)
                except requests.RequestException as exc:  # a timeout: counted, not fatal
                    with self.ledger.lock:
                        self.ledger.answers[(target.__name__, 0, type(exc).__name__)] += 1

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        self.threads.append(t)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def produce(c: Client, ledger: Ledger, queue: str, k: int) -> None:
    bodies = [f"{k}:{uuid.uuid4().hex[:8]}:{i}" for i in range(10)]
    sent = ledger.now()
    r = c.post(f"queues/{queue}/enqueue", {"messages": [{"body": b} for b in bodies]}, timeout=10)
    answered = ledger.now()
    if ledger.note("enqueue", r):
        with ledger.lock:
            for mid in r.json()["ids"]:
                ledger.enqueued[mid] = (sent, answered)
    else:
        time.sleep(0.05)


def consume(c: Client, ledger: Ledger, queue: str) -> None:
    sent = ledger.now()
    r = c.post(f"queues/{queue}/dequeue", {"max": 20, "visibility_timeout": 30}, timeout=10)
    if not ledger.note("dequeue", r):
        time.sleep(0.05)
        return
    got = r.json()["messages"]
    if not got:
        time.sleep(0.02)
        return
    with ledger.lock:
        for m in got:
            ledger.delivered.setdefault(m["id"], sent)
    a = c.post(f"queues/{queue}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]}, timeout=10)
    ledger.note("ack", a)


def produce_flow(c: Client, ledger: Ledger, queue: str) -> None:
    bodies = [f"flow:{uuid.uuid4().hex[:10]}" for _ in range(5)]
    r = c.post(f"queues/{queue}/enqueue", {"messages": [{"body": b} for b in bodies]}, timeout=10)
    if ledger.note("enqueue", r):
        with ledger.lock:
            ledger.flow_enqueued.update(bodies)
    time.sleep(0.05)


def consume_flow(c: Client, ledger: Ledger, queue: str, bounced: set[str]) -> None:
    """Acks what came back from the dead-letter queue; gives every other new message back
    (visibility 0) so that its next delivery moves it to the dead-letter queue."""
    r = c.post(f"queues/{queue}/dequeue", {"max": 10, "visibility_timeout": 30}, timeout=10)
    if not ledger.note("dequeue", r):
        time.sleep(0.05)
        return
    got = r.json()["messages"]
    if not got:
        time.sleep(0.02)
        return
    done = []
    for m in got:
        if m["body"] not in bounced and hash(m["body"]) % 2 == 0:
            bounced.add(m["body"])
            v = c.post(f"queues/{queue}/visibility", {"id": m["id"], "receipt": m["receipt"], "visibility_timeout": 0})
            ledger.note("visibility", v)
        else:
            done.append(m)
    if done:
        a = c.post(f"queues/{queue}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in done]})
        if ledger.note("ack", a):
            with ledger.lock:
                ledger.flow_acked.update(m["body"] for m in done)


def archived_rows(source: str, n: int) -> None:
    """Rows of a queue long gone, to replay: committed, so the nodes see them."""
    from archive.models import ArchivedMessage

    now = datetime.now(UTC)
    ArchivedMessage.objects.bulk_create(
        [
            ArchivedMessage(
                message_id=f"{source}/0/00000000-{uuid.uuid4().hex[:16]}/{j}",
                queue=source,
                partition=0,
                body=f"archived-{j}",
                enqueued_at=now,
            )
            for j in range(n)
        ]
    )


def test_operators_actions_against_live_traffic_on_two_nodes(two_nodes, ops_token):
    # given two nodes, a queue with traffic on both, and a dead-letter flow
    urls = [n.url for n in two_nodes]
    a, b = Client(urls[0], ops_token), Client(urls[1], ops_token)
    name = f"race-{uuid.uuid4().hex[:8]}"
    settings = {"partitions": 2, "lease_period": LEASE, "block_size": 16}
    assert a.post("queues", {"name": name, **settings}).status_code == 201
    dlq, flow = f"{name}-dlq", f"{name}-flow"
    assert a.post("queues", {"name": dlq, **settings}).status_code == 201
    r = a.post("queues", {"name": flow, **settings, "dead_letter_queue": dlq, "max_receives": 1})
    assert r.status_code == 201, r.text
    source = f"{name}-gone"
    archived_rows(source, 20)
    wait_until(
        lambda: all(
            p["owner"] for q in (name, dlq, flow) for p in a.get(f"queues/{q}/partitions").json()["partitions"]
        ),
        20,
        "every partition served",
    )
    ledger = Ledger()
    traffic = Traffic(urls, ops_token, ledger)
    bounced: set[str] = set()
    for k in range(2):
        traffic.run(produce, ledger, name, k)
    for _ in range(2):
        traffic.run(consume, ledger, name)
    traffic.run(produce_flow, ledger, flow)
    traffic.run(consume_flow, ledger, flow, bounced)

    # when operators act on both queues through both nodes for DURATION seconds
    operators = cycle([a, b])  # shared by both operator threads: either may use either node
    partitions = {name: 2, flow: 2}

    def removal(what: str, act) -> None:
        start = ledger.now()
        act()
        with ledger.lock:
            ledger.removals.append((start, ledger.now(), what))
            ledger.actions[what] += 1

    def purge() -> None:
        ledger.note("purge", next(operators).post(f"queues/{name}/purge", {}))

    def delete_and_recreate() -> None:
        c = next(operators)
        ledger.note("delete", c.session.delete(f"{c.base}/api/v1/queues/{name}", timeout=30))
        r = next(operators).post("queues", {"name": name, **settings})
        ledger.note("create", r)
        partitions[name] = 2

    def grow(queue: str) -> None:
        if partitions[queue] >= 6:
            return
        c = next(operators)
        r = c.session.patch(f"{c.base}/api/v1/queues/{queue}", json={"partitions": partitions[queue] + 1}, timeout=30)
        if ledger.note("grow", r):
            partitions[queue] += 1
            ledger.actions["grow"] += 1

    def replay() -> None:
        sent = ledger.now()
        r = next(operators).post("archive/replay", {"queue": source, "into": name, "max": 20})
        answered = ledger.now()
        if ledger.note("replay", r):
            with ledger.lock:
                for mid in r.json()["ids"]:
                    ledger.enqueued[mid] = (sent, answered)
                ledger.actions["replay"] += 1

    def redrive() -> None:
        # on both nodes: a redrive moves the dead letters of the partitions its node holds
        for c in (a, b):
            r = c.post(f"queues/{dlq}/redrive", {"max": 50})
            if ledger.note("redrive", r):
                ledger.actions["redriven"] += r.json()["moved"]

    # two operators at once, so that their actions race each other too (a purge against a
    # delete, a growth against a purge...)
    def operate(steps: list) -> None:
        deadline = time.monotonic() + DURATION
        for step in cycle(steps):
            if time.monotonic() >= deadline:
                return
            step()
            time.sleep(0.15)

    first = threading.Thread(target=operate, args=([lambda: removal("purge", purge), replay, redrive],))
    second = threading.Thread(
        target=operate, args=([lambda: removal("delete", delete_and_recreate), lambda: grow(name), lambda: grow(flow)],)
    )
    first.start()
    second.start()
    first.join(DURATION + 60)
    second.join(DURATION + 60)
    replay()  # some enqueued after the last removal, through the archive too
    time.sleep(3)  # traffic alone for a while
    traffic.finish()

    # then: drain both queues through both nodes (redriving what is dead-lettered)
    drain_clients = cycle([a, b])

    def drained(queue: str) -> bool:
        c = next(drain_clients)
        sent = ledger.now()
        r = c.post(f"queues/{queue}/dequeue", {"max": 100, "visibility_timeout": 60, "wait": 0.2})
        ledger.note("dequeue", r)
        got = r.json().get("messages", []) if r.status_code == 200 else []
        if got:
            with ledger.lock:
                for m in got:
                    ledger.delivered.setdefault(m["id"], sent)
            ack = c.post(f"queues/{queue}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]})
            if ledger.note("ack", ack) and queue == flow:
                ledger.flow_acked.update(m["body"] for m in got)
        return not got and r.status_code == 200

    quiet = []
    wait_until(lambda: quiet.append(drained(name)) or quiet[-4:] == [True] * 4, 60, f"{name} drained")

    def flow_done() -> bool:
        redriven = [c.post(f"queues/{dlq}/redrive", {"max": 100}) for c in (a, b)]
        for r in redriven:
            ledger.note("redrive", r)
        return drained(flow) and ledger.flow_enqueued <= ledger.flow_acked

    try:
        wait_until(flow_done, 90, f"{flow} drained, its dead letters redriven")
    except AssertionError:
        missing = ledger.flow_enqueued - ledger.flow_acked
        print(f"\n[races] redrive flow: {len(missing)} never acked, e.g. {sorted(missing)[:3]}")
        print(f"[races] {flow}: {a.get(f'queues/{flow}/stats').text[:1500]}")
        print(f"[races] {dlq}: {a.get(f'queues/{dlq}/stats').text[:1500]}")
        print("[races] answers: " + ", ".join(f"{k}: {n}" for k, n in sorted(ledger.answers.items())))
        raise

    removals = sorted(ledger.removals)
    last_removal = max((end for _, end, _ in removals), default=0.0)
    lost = [mid for mid, (sent, _) in ledger.enqueued.items() if mid not in ledger.delivered and sent > last_removal]
    removed = [
        mid
        for mid, (sent, _) in ledger.enqueued.items()
        if mid not in ledger.delivered and any(end > sent for _, end, _ in removals)
    ]
    resurrected = [
        mid
        for mid, at in ledger.delivered.items()
        if mid in ledger.enqueued and any(ledger.enqueued[mid][1] < start and at > end for start, end, _ in removals)
    ]
    print(
        f"\n[races] {DURATION:.0f}s: actions {dict(ledger.actions)}; main queue: enqueued "
        f"{len(ledger.enqueued)}, delivered {len([m for m in ledger.enqueued if m in ledger.delivered])}, "
        f"removed by a purge/delete {len(removed)}, enqueued after the last one "
        f"{sum(1 for s, _ in ledger.enqueued.values() if s > last_removal)}; redrive flow: enqueued "
        f"{len(ledger.flow_enqueued)}, bounced {len(bounced)}, acked {len(ledger.flow_acked)}"
    )
    print(
        "[races] answers: "
        + ", ".join(f"{c} {s} {e}".strip() + f": {n}" for (c, s, e), n in sorted(ledger.answers.items()))
    )
    assert not ledger.bad, f"{len(ledger.bad)} bad answers, e.g. {ledger.bad[:5]}"
    assert ledger.actions["purge"] and ledger.actions["delete"] and ledger.actions["grow"]
    assert ledger.actions["replay"] and ledger.actions["redriven"]
    assert not lost, f"{len(lost)} messages enqueued after the last purge/delete were never delivered: {lost[:5]}"
    assert not resurrected, f"delivered after the purge/delete that removed them: {resurrected[:5]}"
    assert ledger.flow_enqueued <= ledger.flow_acked, "the redrive flow lost messages"


@pytest.mark.node(env={"NODE_HEARTBEAT": "30"})
def test_enqueues_through_a_node_that_still_holds_a_deleted_queues_manager_are_delivered(node_factory, ops_token):
    """A node that missed the delete (it was not told: unreachable) still holds the old
    queue's partition manager when the queue is created again under the name; producers keep
    sending to it. Every enqueue it answers with 201 must be delivered from the new queue, and
    a dedup_id retried there is a new message."""
    from queues.models import Node, Partition

    # given two nodes that tick rarely (the stale one keeps its manager until its next pass)
    a, b = node_factory(), node_factory()
    ca, cb = Client(a.url, ops_token), Client(b.url, ops_token)
    name = f"again-{uuid.uuid4().hex[:6]}"
    # a queue created through b, whose only partition b holds
    assert cb.post("queues", {"name": name, "partitions": 1, "lease_period": 60}).status_code == 201
    r = cb.post(f"queues/{name}/enqueue", {"body": "old", "dedup_id": "order-7"})
    assert r.status_code == 201, r.text
    b_node = Node.objects.get(address=b.url.removeprefix("http://"), stopped_at=None)
    assert Partition.objects.get(queue__name=name).owner_id == b_node.pk
    # when the queue is deleted through a while b cannot be told (its address unreachable),
    # and created again through a (which claims the new partition)
    Node.objects.filter(pk=b_node.pk).update(address="127.0.0.1:1")
    assert ca.session.delete(f"{a.url}/api/v1/queues/{name}", timeout=30).status_code == 204
    assert ca.post("queues", {"name": name, "partitions": 1, "lease_period": 60}).status_code == 201
    # and producers send to b, which still holds the old manager
    confirmed: dict[str, str] = {}
    answers: Counter[int] = Counter()
    for i in range(20):
        draft = {"body": f"new{i}", **({"dedup_id": "order-7"} if i % 5 == 0 else {})}
        r = cb.post(f"queues/{name}/enqueue", {"messages": [draft]})
        answers[r.status_code] += 1
        assert r.status_code in (201, 404, 503), r.text
        if r.status_code == 201:
            confirmed.setdefault(r.json()["ids"][0], f"new{i}")  # (a dedup_id retried: its first)
    Node.objects.filter(pk=b_node.pk).update(address=b.url.removeprefix("http://"))
    # then every message b confirmed is delivered from the new queue (through a), and the
    # old one is not
    delivered = {m["id"]: m["body"] for m in drain_all(ca, name)}
    # (b answers 503 while it learns that its description is of the deleted queue, then
    # forwards to the new queue's owner, rather than 503 until its next pass)
    assert answers[201] >= 15, (answers, r.text)
    assert {i: confirmed[i] for i in confirmed if i not in delivered} == {}, answers
    assert "old" not in delivered.values()


def drain_all(c: Client, name: str) -> list[dict]:
    from tests.integration.nodes import drain

    return drain(c, f"queues/{name}", timeout=90)
