"""Bodies of callers not yet known, slow clients, stuck processes and replays, on real nodes.

- A call that only claims to be a node's (a forged ``X-MQ-Cluster-Signature``) is refused on
  its headers, before a byte of its body is read or waited for; an anonymous body past a few
  KB is refused by its ``Content-Length``, unread (``queues.http.bodies``); smaller ones are
  read at most ``API_ANONYMOUS_BODY_READERS`` at once by the node's front, the next is 429.
- 192 anonymous 8 MiB bodies leave the node's memory where it was.
- 100 clients trickling bodies (a byte every 2 s) to ``/sqs/`` and to the fast path with a
  forged signature: an ordinary client's calls are still answered within 1 s, and the node keeps
  its lease.
- A process whose request threads are all stuck (long polls) gives its leases up within one lease period,
  and another node serves its partitions (``queues.cluster.watchdog``).
- A signed call captured before a node restarted is refused after it (``queues.cluster.peerauth``).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest
import requests
from rest_framework.authtoken.models import Token

from tests.integration.nodes import member_ids
from tests.launcher import wait_until

API = "/api/v1/queues"
FORGED = {
    "X-MQ-Cluster-Signature": "0" * 64,
    "X-MQ-Cluster-Timestamp": "0",
    "X-MQ-Cluster-Nonce": "n",
    "X-MQ-Cluster-Content-SHA256": "0" * 64,
}


def _open(port: int, path: str, length: int, headers: dict[str, str], timeout: float = 5) -> socket.socket:
    """A connection that has sent ``POST path`` with its headers and none of its body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
    return sock


def _status(sock: socket.socket) -> int | None:
    """The status of the answer on ``sock``, None when none came (closed or timed out)."""
    try:
        first = sock.recv(64)
    except OSError:
        return None
    parts = first.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else None


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _make_queue(url: str, token: str, **fields) -> str:
    name = f"bodies-{uuid.uuid4().hex[:8]}"
    r = requests.post(
        f"{url}{API}",
        json={"name": name, "partitions": 1, **fields},
        headers={"Authorization": f"Token {token}"},
        timeout=10,
    )
    assert r.status_code == 201, r.text
    return name


def _owners(name: str) -> set[str | None]:
    from queues.models import Partition

    return set(Partition.objects.filter(queue__name=name).values_list("owner_id", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_claimed_signature_and_an_anonymous_body_are_refused_before_the_body(node_factory, token):
    node = node_factory()
    name = _make_queue(node.url, token)
    json_type = {"Content-Type": "application/json"}
    cases = [
        # (path, headers, Content-Length, expected status): no byte of the body is ever sent
        (f"{API}/{name}/enqueue", {**FORGED, **json_type}, 1000, 401),  # the fast path
        (API, {**FORGED, **json_type}, 1000, 401),  # DRF
        (f"{API}/{name}/enqueue", {"Authorization": "Token nope", **json_type}, 1000, 401),
        # the SQS view refuses an unsigned call (MissingAuthenticationToken) before its body
        ("/sqs/", {"Content-Type": "application/x-www-form-urlencoded"}, 1 << 20, 403),
        ("/", {"Content-Type": "application/x-amz-json-1.0"}, 1 << 20, 403),
        ("/api/v1/topics", json_type, 1 << 20, 401),  # any API call without credentials
        ("/admin/login/", {"Content-Type": "application/x-www-form-urlencoded"}, 1 << 20, 413),
    ]
    for path, headers, length, expected in cases:
        started = time.monotonic()
        sock = _open(node.port, path, length, headers, timeout=4)
        try:
            status = _status(sock)
        finally:
            sock.close()
        assert status == expected, f"{path}: {status}, expected {expected} without the body"
        assert time.monotonic() - started < 3, path

    # while a genuine node's call (signed over its body's hash) and a token's are served
    from tests.integration.nodes import peer_request

    r = peer_request("GET", f"{node.url}/api/v1/healthz", hops=0)
    assert r.status_code == 200 and "node" in r.json(), r.text
    r = requests.post(
        f"{node.url}{API}/{name}/enqueue",
        json={"messages": [{"body": "x" * 20_000}]},
        headers={"Authorization": f"Token {token}"},
        timeout=10,
    )
    assert r.status_code == 201, r.text


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_anonymous_8_mib_bodies_leave_the_nodes_memory_where_it_was(node_factory, token):
    node = node_factory()
    name = _make_queue(node.url, token)
    (pid,) = node.member_pids()
    body = b"x" * (8 << 20)
    targets = [
        (f"{API}/{name}/enqueue", {**FORGED, "Content-Type": "application/json"}),
        ("/sqs/", {"Content-Type": "application/x-www-form-urlencoded"}),
        ("/", {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"}),
        (API, {**FORGED, "Content-Type": "application/json"}),
    ]

    def send(i: int) -> int | None:
        path, headers = targets[i % len(targets)]
        sock = _open(node.port, path, len(body), headers)
        try:
            try:
                sock.sendall(body)  # all of it, as the attacker does, unless the node hangs up
            except OSError:
                pass
            return _status(sock)
        finally:
            sock.close()

    def burst(n: int) -> list[int | None]:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(send, range(n)))

    burst(8)  # the first few allocations of any process (thread stacks, buffers)
    time.sleep(1)
    before = _rss(pid)

    statuses = burst(192)

    time.sleep(1)
    grown = _rss(pid) - before
    answered = [s for s in statuses if s is not None]
    # refused on its credentials (401, SQS's 403), by its length (413), or past the sender's
    # share of bodies held (429, SQS's RequestThrottled 400): never read whole and kept
    assert all(s in (400, 401, 403, 413, 429) for s in answered), statuses
    assert grown < 100 << 20, f"the node's RSS grew by {grown >> 20} MiB over 192 anonymous 8 MiB bodies"
    assert node.healthy()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_slow_bodies_do_not_take_the_node_out(node_factory, token):
    node = node_factory()
    name = _make_queue(node.url, token)
    wait_until(lambda: None not in _owners(name), 30, "the node to serve the queue")
    owners = _owners(name)
    stop = threading.Event()
    attackers: list[threading.Thread] = []

    def trickle(path: str, headers: dict[str, str]) -> None:
        try:
            sock = _open(node.port, path, 1000, headers, timeout=2)
        except OSError:
            return
        with sock:
            while not stop.wait(2.0):
                try:
                    sock.sendall(b"x")
                except OSError:
                    return

    # when 100 clients send bodies a byte every 2 s, half to /sqs/, half to the fast path
    # with a forged signature
    for i in range(100):
        if i % 2:
            target = (f"{API}/{name}/enqueue", {**FORGED, "Content-Type": "application/json"})
        else:
            target = ("/sqs/", {"Content-Type": "application/x-www-form-urlencoded"})
        attackers.append(threading.Thread(target=trickle, args=target, daemon=True))
    for t in attackers:
        t.start()
    try:
        # then an ordinary client's calls are answered within 1 s all along, and the lease is kept
        client = requests.Session()
        client.headers["Authorization"] = f"Token {token}"
        slowest = 0.0
        calls = 0
        until = time.monotonic() + 20
        while time.monotonic() < until:
            started = time.monotonic()
            r = client.post(f"{node.url}{API}/{name}/enqueue", json={"messages": [{"body": "b"}]}, timeout=5)
            assert r.status_code == 201, r.text
            r = client.post(f"{node.url}{API}/{name}/dequeue", json={"max": 1}, timeout=5)
            assert r.status_code == 200, r.text
            slowest = max(slowest, time.monotonic() - started)
            calls += 2
            time.sleep(0.1)
        assert slowest < 1.0, f"the slowest of {calls} calls took {slowest:.2f} s"
        assert _owners(name) == owners, "the node lost its lease while it served"
    finally:
        stop.set()
        for t in attackers:
            t.join(timeout=5)
    assert not any(t.is_alive() for t in attackers)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.cluster
@pytest.mark.node(env={"API_BODY_READS_PER_CALLER": "2"})
def test_one_callers_trickled_bodies_hold_a_few_request_threads_only(node_factory, token):
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    try:
        node = node_factory()
        name = _make_queue(node.url, token)
        other = Token.objects.create(user=User.objects.create(username=f"o-{uuid.uuid4().hex[:8]}")).key
        headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        # when a user has two bodies on their way (a byte every 2 s) ...
        held = [_open(node.port, f"{API}/{name}/enqueue", 1000, headers) for _ in range(2)]
        try:
            time.sleep(0.5)
            # ... then its third is answered 429 at once, unread
            third = _open(node.port, f"{API}/{name}/enqueue", 1000, headers, timeout=3)
            with third:
                assert _status(third) == 429
            # and another user's calls are served
            r = requests.post(
                f"{node.url}{API}/{name}/enqueue",
                json={"messages": [{"body": "x"}]},
                headers={"Authorization": f"Token {other}"},
                timeout=5,
            )
            assert r.status_code in (201, 403, 404), r.text  # (its rights are its own: not 503, not waiting)
        finally:
            for sock in held:
                sock.close()
        # once they are gone (the node sees the connections closed a moment later), the user's
        # calls are read again
        deadline = time.monotonic() + 10
        while True:
            r = requests.post(
                f"{node.url}{API}/{name}/enqueue",
                json={"messages": [{"body": "x"}]},
                headers={"Authorization": f"Token {token}"},
                timeout=5,
            )
            if r.status_code != 429 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 201, r.text
    finally:
        node_factory.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.node(env={"API_ANONYMOUS_BODY_READERS": "1"}, processes=1)
def test_trickled_anonymous_bodies_hold_only_the_anonymous_readers(node_factory, token):
    node = node_factory()
    name = _make_queue(node.url, token)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    # when an anonymous client sends a small body to the console's login, and none of its bytes
    held = _open(node.port, "/admin/login/", 1000, form)
    try:
        time.sleep(0.5)
        # then the next anonymous body is answered 429, unread (no body is ever sent: an
        # answer that waited for it would time out and be None)
        second = _open(node.port, "/admin/login/", 1000, form, timeout=3)
        with second:
            assert _status(second) == 429
        # while a known caller's call with a body is served
        r = requests.post(
            f"{node.url}{API}/{name}/enqueue",
            json={"messages": [{"body": "x"}]},
            headers={"Authorization": f"Token {token}"},
            timeout=5,
        )
        assert r.status_code == 201, r.text
    finally:
        held.close()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.cluster
@pytest.mark.node(env={"NODE_STUCK_AFTER": "2", "LONG_POLL_MAX_PER_NODE": "16", "LONG_POLL_MAX_PER_USER": "16"})
def test_a_process_whose_request_threads_are_stuck_gives_up_its_leases(node_factory, token):
    # A's request threads: 4, all held by long polls on an empty queue (its bounds on them raised
    # past the threads: one user stands for many here). Bodies on their way hold none.
    try:
        a = node_factory(NODE_THREADS="4")
        (a_id,) = member_ids(a)
        name = _make_queue(a.url, token, lease_period=5)
        wait_until(lambda: _owners(name) == {a_id}, 30, "A to serve the queue")
        b = node_factory()
        (b_id,) = member_ids(b)
        time.sleep(2)
        assert _owners(name) == {a_id}, "B took the partition while A served"

        stop = threading.Event()

        def hold() -> None:
            while not stop.is_set():
                try:
                    requests.post(
                        f"{a.url}{API}/{name}/dequeue",
                        json={"max": 1, "wait": 8},
                        headers={"Authorization": f"Token {token}"},
                        timeout=3,
                    )
                except requests.RequestException:
                    pass

        holders = [threading.Thread(target=hold, daemon=True) for _ in range(8)]
        for t in holders:
            t.start()
        try:
            # then within one lease period (5 s) of its threads being stuck (found after 2 s),
            # A gives the partition up and B serves it
            stuck_at = time.monotonic()
            wait_until(lambda: _owners(name) == {b_id}, 2 + 5 + 2, "B to take the partition over from a stuck A")
            assert time.monotonic() - stuck_at < 2 + 5 + 2
            r = requests.post(
                f"{b.url}{API}/{name}/enqueue",
                json={"messages": [{"body": "served"}]},
                headers={"Authorization": f"Token {token}"},
                timeout=5,
            )
            assert r.status_code == 201, r.text
        finally:
            stop.set()
            for t in holders:
                t.join(timeout=5)
        # and A, answering again, heartbeats again
        from queues.models import Node

        def heartbeats() -> bool:
            row = Node.objects.get(pk=a_id)
            return (time.time() - row.heartbeat_at.timestamp()) < 1.0

        wait_until(heartbeats, 20, "A to heartbeat again once it answers calls (its polls over)")
    finally:
        node_factory.stop()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.cluster
@pytest.mark.node(env={"NODE_STUCK_AFTER": "2"})
def test_a_process_with_idle_clients_past_its_connection_limit_keeps_its_leases(node_factory, token, tmp_path):
    # A: 2 request threads, so its server takes 8 connections at once (runnode's backpressure)
    idle: list[socket.socket] = []
    try:
        a = node_factory(NODE_THREADS="2")
        (a_id,) = member_ids(a)
        name = _make_queue(a.url, token, lease_period=5)
        wait_until(lambda: _owners(name) == {a_id}, 30, "A to serve the queue")
        b = node_factory()
        member_ids(b)
        # given 12 clients that made a call each and keep their connections open, idle (the
        # last ones wait to be accepted), every request thread free
        for _ in range(12):
            sock = socket.create_connection(("127.0.0.1", a.port), timeout=1)
            sock.sendall(b"GET /-/alive HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            idle.append(sock)
        # then for well past the time that says stuck (2 s) and a lease period, A keeps the
        # partition: B never takes it
        until = time.monotonic() + 2 + 5 + 2
        while time.monotonic() < until:
            assert _owners(name) == {a_id}, "A gave its partition up while it served calls"
            time.sleep(0.2)
        assert "does not answer" not in "".join(p.read_text() for p in Path(tmp_path).glob("node-*.log"))
    finally:
        for sock in idle:
            sock.close()
        node_factory.stop()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_signed_call_captured_before_a_restart_is_refused_after_it(node_factory):
    from queues.cluster import peerauth

    node = node_factory()
    path = "/api/v1/healthz"
    signed = peerauth.sign("GET", path, b"", 0, None, to=f"127.0.0.1:{node.port}")
    r = requests.get(f"{node.url}{path}", headers=signed, timeout=5)
    assert r.status_code == 200 and "node" in r.json(), r.text
    signed_at = time.time()

    node.stop()
    node.start()

    # when the captured call is sent again to the restarted node (within the timestamp window)
    r = requests.get(f"{node.url}{path}", headers=signed, timeout=5)
    assert time.time() - signed_at < 30
    # then it is not taken for a node's call (healthz answers a stranger its bare status),
    # while a call signed now is
    assert r.status_code == 200 and "node" not in r.json(), r.text
    fresh = peerauth.sign("GET", path, b"", 0, None, to=f"127.0.0.1:{node.port}")
    r = requests.get(f"{node.url}{path}", headers=fresh, timeout=5)
    assert r.status_code == 200 and "node" in r.json(), r.text


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_nodes_call_whose_body_comes_late_is_checked_once_and_served(node_factory, token):
    from queues.cluster import peerauth

    node = node_factory()
    name = _make_queue(node.url, token)
    user = str(Token.objects.get(key=token).user.pk)
    for size in (100, 200_000):  # (a small body read in one go; a large one chunk by chunk)
        # given a node's forwarded enqueue, signed, whose body comes a moment after its headers
        body = orjson.dumps({"messages": [{"body": "x" * size}]})
        path = f"{API}/{name}/enqueue"
        signed = peerauth.sign("POST", path, body, 1, user, to=f"127.0.0.1:{node.port}")
        with _open(node.port, path, len(body), {**signed, "Content-Type": "application/json"}) as sock:
            time.sleep(0.3)  # (its caller is looked up meanwhile: the signature's nonce is taken)
            sock.sendall(body)
            # then it is served: the signature checked before the body counts, not as a replay
            assert _status(sock) == 201
