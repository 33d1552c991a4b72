"""Several node processes on loopback over PostgreSQL + Redis: failover, fencing, scale-out.

Producers and consumers run through the API against every node; nodes are killed
(SIGKILL), paused past their lease (SIGSTOP/SIGCONT) or added under load. Every enqueue
answered 201 must come back unless its ack was answered, no message ID may be issued twice,
and every partition must end up served again.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from itertools import cycle

import pytest

from tests.integration.nodes import Client, database_url, member_addresses, member_ids, node_info, peer_request
from tests.launcher import NodeProcess, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEASE = 2
#: ``runnode --processes`` of the failover tests (kill, pause, join): each process is a member
#: of the cluster of its own, and killing or pausing a node stops all of them at once.
PROCESSES = 2


class Load:
    """Producers and consumers over a set of nodes, with the bookkeeping the checks need."""

    def __init__(self, nodes: list[NodeProcess], token: str, queue: str, batch: int = 50):
        self.urls = [n.url for n in nodes]
        self.token, self.queue, self.batch = token, queue, batch
        self.confirmed: dict[str, str] = {}
        self.issued_twice: list[str] = []
        self.acked: set[str] = set()  # ack answered 200: must never come back
        self.ack_sent: set[str] = set()  # ack sent, answer lost: may or may not come back
        self.ack_refusals: list[int] = []  # the load's acks answered other than 200
        self.delivered: dict[str, int] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.seq = 0

    def add_node(self, node: NodeProcess) -> None:
        with self.lock:
            self.urls = [*self.urls, node.url]

    def _clients(self):
        for url in cycle(list(self.urls)):
            yield Client(url, self.token)

    def _produce(self, k: int) -> None:
        clients = self._clients()
        c = next(clients)
        while not self.stop.is_set():
            with self.lock:
                self.seq += 1
                n = self.seq
            bodies = [f"{k}:{n}:{i}" for i in range(self.batch)]
            try:
                r = c.post(f"queues/{self.queue}/enqueue", {"messages": [{"body": b} for b in bodies]}, timeout=10)
            except Exception:  # noqa: BLE001 - a node died or is paused: next node
                c = next(clients)
                continue
            if r.status_code == 201:
                with self.lock:
                    for mid, body in zip(r.json()["ids"], bodies):
                        if mid in self.confirmed:
                            self.issued_twice.append(mid)
                        self.confirmed[mid] = body
            else:
                c = next(clients)
                time.sleep(0.02)

    def _consume(self) -> None:
        clients = self._clients()
        c = next(clients)
        while not self.stop.is_set():
            try:
                r = c.post(f"queues/{self.queue}/dequeue", {"max": 50, "visibility_timeout": 30}, timeout=10)
                got = r.json().get("messages", []) if r.status_code == 200 else []
                if not got:
                    c = next(clients)
                    continue
                self.record(got)
                with self.lock:
                    self.ack_sent.update(m["id"] for m in got)
                a = c.post(
                    f"queues/{self.queue}/ack",
                    {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]},
                    timeout=10,
                )
                with self.lock:
                    if a.status_code == 200:
                        self.acked.update(m["id"] for m in got)
                    else:
                        self.ack_refusals.append(a.status_code)
            except Exception:  # noqa: BLE001 - a node being killed: move to the next one
                c = next(clients)

    def record(self, got: list[dict]) -> None:
        with self.lock:
            for m in got:
                self.delivered[m["id"]] = self.delivered.get(m["id"], 0) + 1
                assert m["body"] == self.confirmed.get(m["id"], m["body"]), "body changed"

    def start(self, producers: int = 3, consumers: int = 2) -> Load:
        for k in range(producers):
            self.threads.append(threading.Thread(target=self._produce, args=(k,), daemon=True))
        for _ in range(consumers):
            self.threads.append(threading.Thread(target=self._consume, daemon=True))
        for t in self.threads:
            t.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def drain(self, quiet: float = 1.5) -> None:
        """Dequeue and ack through the live nodes until nothing comes back for a while.

        First the load's deliveries whose ack failed (it timed out, or met a partition between
        owners) are acked by ID: the consumer did process them, and they would otherwise stay
        in flight for its 30 s visibility timeout, past the quiet, and be found afterwards (a
        CI run on a slow day met one such batch of 50)."""
        idle_since = None
        clients = self._clients()
        with self.lock:  # (a consumer that outlived finish()'s join may still be answering)
            unacked = sorted(set(self.delivered) - self.acked)
            refusals = list(self.ack_refusals)
        # A failed ack may only be one that says "retry": receipts void after a change of owner
        # (409), a partition between owners or an owner unreachable (502-504), a rate (429), a
        # body its node did not read in time (408: the node's front, paused mid-read, wakes past
        # the read's deadline; nothing was acked).
        assert all(status in (408, 409, 429, 502, 503, 504) for status in refusals), refusals
        for i in range(0, len(unacked), 100):
            ids = unacked[i : i + 100]
            for _ in range(100):
                a = next(clients).post(f"queues/{self.queue}/ack", {"ids": ids})
                if a.status_code != 503:  # 503 = a partition between owners: retry
                    break
                time.sleep(0.1)
            assert a.status_code == 200, a.text
            with self.lock:
                self.acked.update(ids)
        while True:
            c = next(clients)
            r = c.post(f"queues/{self.queue}/dequeue", {"max": 100, "visibility_timeout": 60, "wait": 0.2})
            got = r.json().get("messages", []) if r.status_code == 200 else []
            if got:
                idle_since = None
                self.record(got)
                body = {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]}
                for _ in range(100):
                    a = c.post(f"queues/{self.queue}/ack", body)
                    if a.status_code == 409:
                        # The partition changed owner since this delivery (rebalancing after
                        # the pause): its receipts are void, and this consumer did process
                        # the messages, so it acks them by ID.
                        body = {"ids": [m["id"] for m in got]}
                    elif a.status_code != 503:  # 503 = a partition between owners: retry
                        break
                    time.sleep(0.1)
                assert a.status_code == 200, a.text
                with self.lock:
                    self.acked.update(m["id"] for m in got)
                continue
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > quiet and _all_served(c, self.queue):
                return

    def check(self, label: str) -> dict:
        lost = set(self.confirmed) - self.ack_sent - set(self.delivered)
        figures = {
            "confirmed": len(self.confirmed),
            "delivered": len(self.delivered),
            "redelivered": sum(n - 1 for n in self.delivered.values()),
        }
        print(f"\n[{label}] " + " ".join(f"{k}={v}" for k, v in figures.items()))
        assert not self.issued_twice, f"message IDs issued twice: {self.issued_twice[:3]}"
        assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:3]}"
        return figures


def _partitions(c: Client, queue: str) -> list[dict]:
    r = c.get(f"queues/{queue}/partitions")
    assert r.status_code == 200, r.text
    return r.json()["partitions"]


def _all_served(c: Client, queue: str, excluding: str | set[str] | None = None) -> bool:
    parts = _partitions(c, queue)
    gone = {excluding} if isinstance(excluding, str) else excluding or set()
    return all(p["owner"] and p["owner"] not in gone for p in parts)


def _owners(c: Client, queue: str) -> set[str]:
    return {p["owner"] for p in _partitions(c, queue)} - {None}


def _node_id(node: NodeProcess) -> str:
    return node_info(node.url)["node"]


_wait = wait_until


def _make_queue(node: NodeProcess, token: str, partitions: int, lease: int = LEASE) -> str:
    name = f"cl-{uuid.uuid4().hex[:8]}"
    r = Client(node.url, token).post(
        "queues", {"name": name, "partitions": partitions, "lease_period": lease, "block_size": 64}
    )
    assert r.status_code == 201, r.text
    return name


def test_sigkill_one_of_three_nodes_mid_load(node_factory, token):
    # given three nodes sharing six partitions, two each
    # (each node of PROCESSES processes, one partition per process)
    started = [node_factory(PROCESSES), node_factory(PROCESSES), node_factory(PROCESSES)]
    name = _make_queue(started[0], token, 6)
    c0 = Client(started[0].url, token)
    _wait(lambda: len(_owners(c0, name)) == 3 * PROCESSES, 20, "every process an owner")
    load = Load(started, token, name).start()
    _wait(lambda: len(load.confirmed) >= 2000, 60, "2,000 confirmed enqueues")
    # when one node is killed (every process of it)
    victim = started[2]
    victim_ids = member_ids(victim)
    victim_parts = {p["index"] for p in _partitions(c0, name) if p["owner"] in victim_ids}
    # a group whose stable hash lands in one of the victim's partitions, to aim enqueues there
    from queues.engine.ids import group_partition

    group = next(f"g{i}" for i in range(10_000) if group_partition(f"g{i}", 6) in victim_parts)
    # every process of the survivors, at its own address: a process serves its own partitions
    # first, and a client on the node's shared port keeps its connection to one of them
    survivors = cycle([Client(f"http://{a}", token) for n in started[:2] for a in member_addresses(n)])
    victim.kill()
    load.urls = [n.url for n in started[:2]]

    # then its partitions serve enqueues and dequeues again, on the other nodes
    aimed: list[str] = []

    def enqueue_lands() -> bool:
        r = c0.post(f"queues/{name}/enqueue", {"body": "aimed", "group": group})
        if r.status_code == 201:
            aimed.append(r.json()["id"])
        return r.status_code == 201

    to_enqueue = _wait(enqueue_lands, 30, "an enqueue into a dead node's partition")
    from_victim: list[dict] = []

    def dequeue_from_victim() -> bool:
        # The load's consumers race us for what the dead node's partitions hold (on a slow
        # machine they may drain them before each of our calls): a delivery to them of the
        # message aimed there after the kill counts as well.
        with load.lock:
            if any(mid in load.delivered for mid in aimed):
                return True
        # through every surviving process: any of them may hold the dead node's partitions
        c = next(survivors)
        got = c.post(f"queues/{name}/dequeue", {"max": 100, "visibility_timeout": 30}).json()["messages"]
        load.record(got)
        with load.lock:
            load.ack_sent.update(m["id"] for m in got)
        a = c.post(f"queues/{name}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]})
        if got and a.status_code == 200:
            with load.lock:
                load.acked.update(m["id"] for m in got)
        from_victim.extend(m for m in got if int(m["id"].split("/")[1]) in victim_parts)
        return bool(from_victim)

    to_dequeue = to_enqueue + _wait(dequeue_from_victim, 30, "a dequeue from a dead node's partition")
    _wait(lambda: len(load.confirmed) >= 4000, 60, "load to go on")
    load.finish()
    load.drain()
    figures = load.check("sigkill")
    print(
        f"[sigkill] after the kill (lease {LEASE} s): enqueues into its partitions again after "
        f"{to_enqueue:.2f}s, dequeues from them after {to_dequeue:.2f}s; redelivered={figures['redelivered']}"
    )
    assert figures["confirmed"] >= 4000


def test_sigstop_past_the_lease_then_sigcont(node_factory, token):
    # given three nodes under load
    started = [node_factory(PROCESSES), node_factory(PROCESSES), node_factory(PROCESSES)]
    name = _make_queue(started[0], token, 6)
    c0 = Client(started[0].url, token)
    _wait(lambda: len(_owners(c0, name)) == 3 * PROCESSES, 20, "every process an owner")
    load = Load(started, token, name).start()
    _wait(lambda: len(load.confirmed) >= 1500, 60, "1,500 confirmed enqueues")
    # when an owner is paused for three lease periods (every process of it), its partitions are taken over...
    paused = started[1]
    paused_ids = member_ids(paused)
    paused.signal(signal.SIGSTOP)
    taken = _wait(lambda: _all_served(c0, name, excluding=paused_ids), 30, "takeover of the paused node's partitions")
    time.sleep(max(0.0, 3 * LEASE - taken))
    # ...and it wakes up with requests still in its buffers
    paused.signal(signal.SIGCONT)
    _wait(lambda: len(load.confirmed) >= 4000, 60, "load to go on")
    load.finish()
    load.drain()
    load.check("sigstop")
    # then no tree is corrupted: a fresh node takes every partition and finds nothing left
    for node in started:
        node.stop()
    fresh = node_factory()
    fc = Client(fresh.url, token)
    _wait(lambda: _all_served(fc, name), 20, "a fresh node to open every partition")
    r = fc.post(f"queues/{name}/dequeue", {"max": 100, "wait": 0.5})
    assert r.status_code == 200 and r.json()["messages"] == []
    r = fc.post(f"queues/{name}/enqueue", {"body": "after"})
    assert r.status_code == 201
    stats = fc.get(f"queues/{name}/stats").json()
    assert stats["depth"] == 1 and all(p["live"] for p in stats["partitions"])


def test_a_fourth_node_joins_under_load(node_factory, token):
    # given three nodes holding eight partitions under load
    # (each node of PROCESSES processes)
    started = [node_factory(PROCESSES), node_factory(PROCESSES), node_factory(PROCESSES)]
    name = _make_queue(started[0], token, 8)
    c0 = Client(started[0].url, token)
    _wait(lambda: _all_served(c0, name), 20, "every partition served")
    load = Load(started, token, name).start()
    _wait(lambda: len(load.confirmed) >= 1000, 60, "1,000 confirmed enqueues")
    # when a fourth node starts
    newcomer = node_factory(PROCESSES)
    newcomer_ids = member_ids(newcomer)
    load.add_node(newcomer)
    # then it ends up owning its share (two: one per process) without anyone restarting
    joined = _wait(
        lambda: sum(p["owner"] in newcomer_ids for p in _partitions(c0, name)) >= 2,
        30,
        "the newcomer to own two partitions",
    )
    _wait(lambda: len(load.confirmed) >= 3000, 60, "load to go on")
    load.finish()
    load.drain()
    load.check("scale-out")
    node_of = {m: k for k, node in enumerate([*started, newcomer]) for m in member_ids(node)}
    owners = [node_of.get(p["owner"]) for p in _partitions(c0, name)]
    print(
        f"[scale-out] newcomer owned its share {joined:.2f}s after start; owners {sorted(owners.count(o) for o in set(owners))}"
    )
    assert all(owners.count(o) == 2 for o in set(owners))


def test_forwarding_is_authenticated_and_bounded(node_factory, token):
    # given two nodes, the queue's partitions on both
    a, b = node_factory(), node_factory()
    name = _make_queue(a, token, 2)
    ca, cb = Client(a.url, token), Client(b.url, token)
    _wait(lambda: len({p["owner"] for p in _partitions(ca, name)} - {None}) == 2, 20, "two owners")
    # an ack sent to the node that does not own the message's partition is forwarded
    ids = []
    for _ in range(6):
        ids.append(ca.post(f"queues/{name}/enqueue", {"body": "x"}).json()["id"])
    got = cb.post(f"queues/{name}/dequeue", {"max": 10, "wait": 1}).json()["messages"]
    while len(got) < 6:
        more = ca.post(f"queues/{name}/dequeue", {"max": 10, "wait": 1}).json()["messages"]
        assert more, "dequeue lost messages"
        got += more
    r = cb.post(f"queues/{name}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]})
    assert r.status_code == 200 and r.json()["acked"] == 6
    # a forged cluster secret or signature is refused, and a spent hop count is never forwarded again
    import requests
    from rest_framework.authtoken.models import Token

    forged = requests.post(
        f"{a.url}/api/v1/queues/{name}/enqueue", json={"body": "x"}, headers={"X-MQ-Cluster-Secret": "wrong"}, timeout=5
    )
    assert forged.status_code == 401
    user_id = str(Token.objects.get(key=token).user_id)
    forged = peer_request(
        "POST",
        f"{a.url}/api/v1/queues/{name}/enqueue",
        {"body": "x"},
        on_behalf=user_id,
        headers={"X-MQ-Cluster-Signature": "0" * 64},
    )
    assert forged.status_code == 401
    parts = {p["index"]: p["address"] for p in _partitions(ca, name)}
    mid = ids[0]
    owner = parts[int(mid.split("/")[1])]
    elsewhere = b if owner == a.url.removeprefix("http://") else a
    spent = peer_request(
        "POST",
        f"{elsewhere.url}/api/v1/queues/{name}/visibility",
        {"id": mid, "visibility_timeout": 5},
        hops=2,
        on_behalf=user_id,
    )
    assert spent.status_code == 503 and spent.json()["error"] == "unavailable"


def test_a_cooling_node_sends_enqueues_elsewhere_and_still_serves_dequeues(node_factory, token):
    # given two nodes, one of which cools once it has more than five messages in flight
    hot = node_factory(NODE_COOLING_IN_FLIGHT="5")
    cold = node_factory()
    name = _make_queue(hot, token, 2)
    ch, cc = Client(hot.url, token), Client(cold.url, token)
    _wait(lambda: len({p["owner"] for p in _partitions(ch, name)} - {None}) == 2, 20, "two owners")
    hot_id = _node_id(hot)
    hot_partition = next(p["index"] for p in _partitions(ch, name) if p["owner"] == hot_id)
    for _ in range(20):
        assert cc.post(f"queues/{name}/enqueue", {"body": "x"}).status_code == 201
        assert ch.post(f"queues/{name}/enqueue", {"body": "x"}).status_code == 201
    held = []
    while len(held) < 10:
        got = ch.post(f"queues/{name}/dequeue", {"max": 10, "visibility_timeout": 60}).json()["messages"]
        held += [m for m in got if int(m["id"].split("/")[1]) == hot_partition]
    # when its housekeeping sees the load
    _wait(lambda: any(p["cooling"] for p in _partitions(cc, name)), 10, "the hot node to cool")
    # then an enqueue sent to it is stored in the other node's partition...
    for _ in range(5):
        r = ch.post(f"queues/{name}/enqueue", {"body": "while cooling"})
        assert r.status_code == 201
        assert int(r.json()["id"].split("/")[1]) != hot_partition
    # ...while it still serves dequeues and acks of its own partition
    r = ch.post(f"queues/{name}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in held]})
    assert r.status_code == 200 and r.json()["acked"] == len(held)
    # and it stops cooling once the load is gone
    _wait(lambda: not any(p["cooling"] for p in _partitions(cc, name)), 10, "cooling to end")


def test_cluster_command_starts_and_stops_k_nodes(tmp_path, token):
    import subprocess
    import sys

    from tests.launcher import ROOT, free_ports

    base = free_ports(3)
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "MQ_DATA_DIR": str(tmp_path / "data"),
        "KV_URL": f"file://{tmp_path / 'kv'}",
        "NODE_HEARTBEAT": "0.3",
    }
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "cluster", "--nodes", "3", "--base-port", str(base)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        urls = [f"http://127.0.0.1:{base + i}" for i in range(3)]

        def all_up() -> bool:
            try:
                return all(Client(u, token).get("healthz", timeout=1).status_code == 200 for u in urls)
            except Exception:  # noqa: BLE001 - not up yet (refused, reset, timeout)
                return False

        _wait(all_up, 40, "three nodes to answer")
        name = _make_queue(type("N", (), {"url": urls[0]})(), token, 3)
        c = Client(urls[0], token)
        _wait(lambda: len({p["owner"] for p in _partitions(c, name)} - {None}) == 3, 20, "one partition each")
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=40)
    assert proc.returncode == 0, out
    from queues.models import Node, Partition

    # every node stopped gracefully and handed its leases back
    assert Partition.objects.filter(queue__name=name, owner__isnull=False).count() == 0
    assert not Node.objects.filter(address__in=[u.removeprefix("http://") for u in urls], stopped_at=None).exists()


def test_dead_letters_move_to_a_queue_owned_by_another_node(node_factory, token):
    # given a dead-letter queue served by node B and a source queue served by node A
    b = node_factory()
    cb = Client(b.url, token)
    dlq = f"dlq-{uuid.uuid4().hex[:6]}"
    assert cb.post("queues", {"name": dlq, "partitions": 1}).status_code == 201
    a = node_factory()
    ca = Client(a.url, token)
    source = f"src-{uuid.uuid4().hex[:6]}"
    assert (
        ca.post("queues", {"name": source, "partitions": 1, "dead_letter_queue": dlq, "max_receives": 2}).status_code
        == 201
    )
    a_id, b_id = _node_id(a), _node_id(b)
    assert [p["owner"] for p in _partitions(ca, source)] == [a_id]
    assert [p["owner"] for p in _partitions(ca, dlq)] == [b_id]
    mid = ca.post(f"queues/{source}/enqueue", {"body": "poison"}).json()["id"]
    # when a handler fails it twice (visibility 0: it comes straight back)
    for attempt in (1, 2):
        got = ca.post(f"queues/{source}/dequeue", {"visibility_timeout": 0}).json()["messages"]
        assert [(m["id"], m["receive_count"]) for m in got] == [(mid, attempt)]
    ca.post(f"queues/{source}/dequeue", {"wait": 0.2})  # the third delivery moves it instead
    # then it is in the other node's dead-letter queue, with its history, and gone from the source
    got = cb.post(f"queues/{dlq}/dequeue", {"wait": 2}).json()["messages"]
    assert [m["body"] for m in got] == ["poison"]
    assert got[0]["history"]["source"] == source and got[0]["history"]["id"] == mid
    assert got[0]["history"]["receive_count"] == 2
    assert ca.post(f"queues/{source}/dequeue", {"wait": 0.5}).json()["messages"] == []
    # and a client cannot forge a history
    r = ca.post(f"queues/{source}/enqueue", {"body": "x", "history": {"source": "y"}})
    assert r.status_code == 400 and r.json()["error"] == "unknown_field"
