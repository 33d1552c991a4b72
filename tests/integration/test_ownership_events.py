"""Node processes report when they serve a partition (``OWNERSHIP_EVENTS``), and answers say who
served them (``SERVED_BY_HEADER``): what the nemesis run's ownership checks read.

Two nodes on PostgreSQL + Redis send their events to a datagram socket this test binds; it
stamps each with its own monotonic clock on receipt, as the run does. A node paused past its
lease reports, once woken, that it stopped when its lease lapsed: before the other node's
claim. Answers name the owner's node, partition and epoch, also through a node that forwarded
the call.
"""

from __future__ import annotations

import signal
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from queues.engine.ids import group_partition
from tests.integration.nodes import Client, node_info
from tests.launcher import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEASE = 2
PARTITIONS = 4
#: Seconds by which a stop, as the paused node dates it, may come after the other node's claim
#: (the datagram's way: a stop is stamped on receipt, then its ``ago`` is taken off). The lease
#: rule leaves 20 % of a period (0.4 s here) between the two.
SLACK = 0.05


@dataclass(frozen=True)
class Event:
    at: float  # this process's monotonic clock on receipt
    event: str
    node: str
    partition: str
    epoch: int
    ago: float
    pid: int
    address: str

    @property
    def stopped_at(self) -> float:
        return self.at - self.ago


class Observer:
    """A bound UNIX datagram socket and a thread that keeps what arrives, stamped."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="own-", dir="/tmp"))  # (AF_UNIX: a short path)
        self.path = str(self.folder / "events.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.events: list[Event] = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.done.is_set():
            try:
                raw = self.sock.recv(65536)
            except TimeoutError:
                continue
            at = time.monotonic()
            e = orjson.loads(raw)
            with self.lock:
                self.events.append(
                    Event(at, e["event"], e["node"], e["partition"], e["epoch"], e["ago"], e["pid"], e["address"])
                )

    def of(self, node: str | None = None, partition: str | None = None) -> list[Event]:
        with self.lock:
            return [
                e
                for e in self.events
                if (node is None or e.node == node) and (partition is None or e.partition == partition)
            ]

    def latest(self, partition: str) -> Event | None:
        found = self.of(partition=partition)
        return found[-1] if found else None

    def close(self) -> None:
        self.done.set()
        self.thread.join(5)
        self.sock.close()
        Path(self.path).unlink(missing_ok=True)
        self.folder.rmdir()


@pytest.fixture
def observer():
    o = Observer()
    yield o
    o.close()


def _rows(name: str) -> dict[str, tuple[str | None, int]]:
    from queues.models import Partition

    return {
        f"{name}/{index}": (owner, epoch)
        for index, owner, epoch in Partition.objects.filter(queue__name=name).values_list("index", "owner_id", "epoch")
    }


def _served_by(r) -> list[str]:
    value = r.headers.get("X-MQ-Served-By")
    return [e.strip() for e in value.split(",")] if value else []


def _group_for(index: int) -> str:
    return next(f"g{i}" for i in range(10_000) if group_partition(f"g{i}", PARTITIONS) == index)


def test_nodes_report_serving_and_answers_name_who_served(node_factory, token, observer):
    # given two nodes that report to the observer and name who served each call
    env = {"OWNERSHIP_EVENTS": observer.path, "SERVED_BY_HEADER": "1"}
    a, b = node_factory(**env), node_factory(**env)
    a_id, b_id = node_info(a.url)["node"], node_info(b.url)["node"]
    ca, cb = Client(a.url, token), Client(b.url, token)
    name = f"own-{uuid.uuid4().hex[:8]}"
    r = ca.post("queues", {"name": name, "partitions": PARTITIONS, "lease_period": LEASE, "block_size": 64})
    assert r.status_code == 201, r.text
    parts = [f"{name}/{i}" for i in range(PARTITIONS)]

    # then once each node holds its share, the latest event of every partition is its owner's
    # serve, under the epoch of the row
    def settled() -> bool:
        rows = _rows(name)
        if sorted(owner for owner, _ in rows.values()) != sorted([a_id, a_id, b_id, b_id]):
            return False
        latest = {p: observer.latest(p) for p in parts}
        return all(e is not None and e.event == "serve" and (e.node, e.epoch) == rows[p] for p, e in latest.items())

    wait_until(settled, 30, "each node to serve two partitions, as its serve events say")
    rows = _rows(name)
    from queues.models import Node

    registered = {n.pk: (n.address, n.pid) for n in Node.objects.filter(pk__in=[a_id, b_id])}
    assert {(e.node, e.address, e.pid) for e in observer.of()} == {(k, *v) for k, v in registered.items()}
    owned_by_b = sorted(p for p, (owner, _) in rows.items() if owner == b_id)
    p_b = owned_by_b[0]
    index_b = int(p_b.rsplit("/", 1)[1])
    b_entry = f"{b_id}:{p_b}:{rows[p_b][1]}"

    # when an enqueue for one of b's partitions is sent to a (the fast path), and to a through
    # Django (a query string sends it there)
    group = _group_for(index_b)
    r = ca.post(f"queues/{name}/enqueue", {"body": "forwarded", "group": group})
    assert r.status_code == 201, r.text
    # then a forwarded it, and the answer names b's manager
    assert _served_by(r) == [b_entry]
    r = ca.session.post(f"{a.url}/api/v1/queues/{name}/enqueue?format=json", json={"body": "drf", "group": group})
    assert r.status_code == 201, r.text
    assert _served_by(r) == [b_entry]

    # when a dequeue is sent to a, which holds nothing of its own: it asks b
    r = ca.post(f"queues/{name}/dequeue", {"max": 10, "wait": 0})
    got = r.json()["messages"]
    assert r.status_code == 200 and len(got) == 1, r.text  # (one group: one message in flight)
    assert _served_by(r) == [b_entry]
    # and so do a change of visibility and an ack of it through a
    r = ca.post(
        f"queues/{name}/visibility", {"id": got[0]["id"], "receipt": got[0]["receipt"], "visibility_timeout": 30}
    )
    assert r.status_code == 200 and _served_by(r) == [b_entry], r.text
    r = ca.post(f"queues/{name}/ack", {"messages": [{"id": got[0]["id"], "receipt": got[0]["receipt"]}]})
    assert r.status_code == 200 and _served_by(r) == [b_entry], r.text
    r = ca.post(f"queues/{name}/dequeue", {"max": 10, "wait": 1})  # the group's second message
    got = r.json()["messages"]
    assert r.status_code == 200 and len(got) == 1 and _served_by(r) == [b_entry], r.text
    r = cb.post(f"queues/{name}/ack", {"messages": [{"id": got[0]["id"], "receipt": got[0]["receipt"]}]})
    assert r.status_code == 200 and _served_by(r) == [b_entry], r.text

    # when every partition holds a message and b is asked for ten
    for index in range(PARTITIONS):
        assert ca.post(f"queues/{name}/enqueue", {"body": f"m{index}", "group": _group_for(index)}).status_code == 201
    r = cb.post(f"queues/{name}/dequeue", {"max": 10, "wait": 0})
    got = r.json()["messages"]
    # then its answer names the partitions it delivered from, with their owners and epochs
    delivered = sorted({"/".join(m["id"].split("/")[:2]) for m in got})
    assert got and sorted(_served_by(r)) == sorted(f"{rows[p][0]}:{p}:{rows[p][1]}" for p in delivered), r.headers

    # when b is paused past its lease
    before = {p: rows[p][1] for p in owned_by_b}
    paused_at = time.monotonic()
    b.signal(signal.SIGSTOP)

    def taken_over() -> list[Event]:
        found = []
        for p in owned_by_b:
            serve = [e for e in observer.of(a_id, p) if e.event == "serve" and e.epoch > before[p]]
            if not serve:
                return []
            found.append(serve[0])
        return found

    wait_until(taken_over, 30, "a's serve of b's partitions under newer epochs")
    claims = {e.partition: e for e in taken_over()}
    time.sleep(0.5)
    woken_at = time.monotonic()  # (before: b may report before this thread runs again)
    b.signal(signal.SIGCONT)

    # then once woken, b reports each of them stopped, dated when its lease lapsed: during the
    # pause, before a's claim
    def stops() -> list[Event]:
        found = []
        for p in owned_by_b:
            stop = [e for e in observer.of(b_id, p) if e.event == "unserve" and e.epoch == before[p]]
            if not stop:
                return []
            found.append(stop[0])
        return found

    wait_until(stops, 30, "b's unserve of the partitions it held when paused")
    for stop in stops():
        claim = claims[stop.partition]
        assert stop.ago > 0, stop
        assert stop.at >= woken_at, (stop, woken_at)  # (nothing was sent while it was paused)
        assert paused_at - LEASE <= stop.stopped_at < claim.at + SLACK, (stop, claim)  # (this pause's)
        print(
            f"[ownership] {stop.partition}: paused {woken_at - paused_at:.2f}s; b stopped {stop.ago:.2f}s before "
            f"its report, {claim.at - stop.stopped_at:.3f}s before a's claim (epoch {before[stop.partition]} -> {claim.epoch})"
        )
    # and nobody else reported serving them under the old epochs meanwhile
    for p in owned_by_b:
        assert [e.node for e in observer.of(partition=p) if e.event == "serve" and e.epoch == before[p]] == [b_id]

    # when a stops gracefully
    held = [p for p in parts if (latest := observer.of(a_id, p)) and latest[-1].event == "serve"]
    assert held
    a.stop()

    # then it reported each partition it served stopped (while its lease was valid: now), and
    # serves none
    def all_stopped() -> bool:
        return all(not (mine := observer.of(a_id, p)) or mine[-1].event == "unserve" for p in parts)

    wait_until(all_stopped, 10, "a's unserve of every partition it held")
    assert all(observer.of(a_id, p)[-1].ago == 0 for p in held)


def test_off_by_default_no_header(node_factory, token):
    # given a node without the settings
    node = node_factory()
    c = Client(node.url, token)
    name = f"own-{uuid.uuid4().hex[:8]}"
    assert c.post("queues", {"name": name, "partitions": 2}).status_code == 201
    wait_until(lambda: c.post(f"queues/{name}/enqueue", {"body": "warm"}).status_code == 201, 30, "served")
    # then no answer says who served it, on the fast path or through Django
    r = c.post(f"queues/{name}/enqueue", {"body": "x"})
    assert r.status_code == 201 and "X-MQ-Served-By" not in r.headers
    r = c.session.post(f"{node.url}/api/v1/queues/{name}/enqueue?format=json", json={"body": "y"})
    assert r.status_code == 201 and "X-MQ-Served-By" not in r.headers
    r = c.post(f"queues/{name}/dequeue", {"max": 10})
    assert r.status_code == 200 and r.json()["messages"] and "X-MQ-Served-By" not in r.headers


def test_topic_and_sqs_answers_name_who_served(node_factory):
    # given a node that names who served each call, and a user with a token and an SQS key
    import boto3
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from sqs.models import AccessKey

    node = node_factory(SERVED_BY_HEADER="1")
    node_id = node_info(node.url)["node"]
    user = User.objects.create(username=f"own-{uuid.uuid4().hex[:8]}")
    c = Client(node.url, Token.objects.create(user=user).key)
    key = AccessKey.issue(user)
    topic = f"own-{uuid.uuid4().hex[:8]}"
    assert c.post("topics", {"name": topic, "partitions": 1}).status_code == 201
    assert c.post(f"topics/{topic}/subscriptions", {"name": "s"}).status_code == 201

    def entry() -> str:
        return f"{node_id}:{topic}/0:{_rows(topic)[f'{topic}/0'][1]}"

    # when a message is published and read through the subscription
    wait_until(lambda: c.post(f"topics/{topic}/publish", {"body": "x"}).status_code == 201, 30, "the topic served")
    r = c.post(f"topics/{topic}/publish", {"body": "y"})
    # then each answer names the topic's partition
    assert r.status_code == 201 and _served_by(r) == [entry()], r.text
    r = c.post(f"topics/{topic}/subscriptions/s/dequeue", {"max": 10})
    got = r.json()["messages"]
    assert r.status_code == 200 and len(got) == 2 and _served_by(r) == [entry()], r.text
    r = c.post(
        f"topics/{topic}/subscriptions/s/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]}
    )
    assert r.status_code == 200 and _served_by(r) == [entry()], r.text

    # and an SQS queue's send, receive and delete say so too
    sqs = boto3.client(
        "sqs",
        endpoint_url=f"{node.url}/sqs",
        region_name="eu-west-1",
        aws_access_key_id=key.access_key_id,
        aws_secret_access_key=key.secret,
    )
    url = sqs.create_queue(QueueName=f"own-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    name = url.rsplit("/", 1)[1]
    wait_until(lambda: _sqs_send(sqs, url), 30, "the SQS queue served")
    sent = sqs.send_message(QueueUrl=url, MessageBody="z")
    served = _served_by_sqs(sent)
    assert len(served) == 1 and served[0].startswith(f"{node_id}:{name}/"), sent["ResponseMetadata"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    assert got["Messages"] and _served_by_sqs(got), got["ResponseMetadata"]
    gone = sqs.delete_message(QueueUrl=url, ReceiptHandle=got["Messages"][0]["ReceiptHandle"])
    assert _served_by_sqs(gone), gone["ResponseMetadata"]
    # (what the header names is what the rows say)
    rows = _rows(name)
    for e in [*served, *_served_by_sqs(got), *_served_by_sqs(gone)]:
        owner, partition, epoch = e.split(":")
        assert rows[partition] == (owner, int(epoch)), (e, rows)


def _sqs_send(sqs, url: str) -> bool:
    try:
        sqs.send_message(QueueUrl=url, MessageBody="warm")
    except Exception:  # noqa: BLE001 - not served yet
        return False
    return True


def _served_by_sqs(response: dict) -> list[str]:
    value = response["ResponseMetadata"]["HTTPHeaders"].get("x-mq-served-by")
    return [e.strip() for e in value.split(",")] if value else []
