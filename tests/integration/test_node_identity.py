"""Node identity (issue 14): no published cluster secret, signed forwarded calls (no replay, no
stale timestamp, no client-sent hop count), loopback hosts by default, a healthz that tells
anonymous callers nothing about the node.

The in-process tests run through both entrances (DRF and the WSGI fast path); the forwarded
calls they replay are recorded from the real ``HttpPeers`` on a stand-in server, as an attacker
on the wire would see them.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import pytest
import requests

from queues import service
from queues.access import SYSTEM, Caller
from queues.service import MessageDraft
from tests.integration.nodes import Client, node_info
from tests.integration.wsgi_client import TRANSPORTS, make_client, token_client

PUBLISHED_DEFAULT = "embedded-insecure-secret-change-me"


def _meta(headers: dict[str, str]) -> dict[str, str]:
    """Headers as test-client keyword arguments (``HTTP_X_...``)."""
    return {"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}


def _depth(name: str) -> int:
    return service.queue_stats(name, caller=SYSTEM)["depth"]


@pytest.fixture
def owned_queue(runtime, purge_kv, user):
    """A queue of ``user`` with two messages in it."""
    owner = Caller.of(user)
    name = f"id-{uuid.uuid4().hex[:8]}"
    service.create_queue(caller=owner, name=name, partitions=1)
    service.enqueue(name, [MessageDraft("a"), MessageDraft("b")], caller=owner)
    return name


class Recorder:
    """A stand-in peer that records the forwarded calls it gets (as a wire tap would) and
    answers an enqueue's 201."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str], bytes]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.calls.append((self.path, dict(self.headers.items()), body))
                answer = b'{"ids": ["recorded/0/0"]}'
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def forwarded_enqueue(self, queue: str, body: str, user) -> tuple[str, dict[str, str], bytes]:
        """What the real HttpPeers sends to forward an enqueue for ``user``."""
        from queues.api.peers import HttpPeers

        HttpPeers().enqueue(self.address, queue, [MessageDraft(body)], 0, Caller.of(user))
        return self.calls[-1]


@pytest.fixture
def recorder():
    r = Recorder()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _deliver(transport: str, call: tuple[str, dict[str, str], bytes], **changed: str):
    """Send a recorded forwarded call to this process's node, headers ``changed`` (by name)."""
    path, headers, body = call
    headers = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length", "content-type")}
    for name, value in changed.items():
        headers = {k: v for k, v in headers.items() if k.lower() != name.lower()}
        headers[name] = value
    return make_client(transport).post(path, body, content_type="application/json", **_meta(headers))


# --- the published default secret ------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("on_behalf", ["system", None])
def test_the_published_default_secret_opens_nothing(transport, owned_queue, on_behalf):
    # given a client with no token, only the old default secret header (acting as the service itself)
    client = make_client(transport)
    forged = {"X-MQ-Cluster-Secret": PUBLISHED_DEFAULT, "X-MQ-Hops": "1"}
    if on_behalf is not None:
        forged["X-MQ-On-Behalf-Of"] = on_behalf
    meta = _meta(forged)
    # when it lists, enqueues, purges and deletes
    answers = {
        "list": client.get("/api/v1/queues", **meta),
        "enqueue": client.post(f"/api/v1/queues/{owned_queue}/enqueue", {"body": "x"}, format="json", **meta),
        "purge": client.post(f"/api/v1/queues/{owned_queue}/purge", {}, format="json", **meta),
        "close": client.post(f"/api/v1/queues/{owned_queue}/purge", {"close_only": True}, format="json", **meta),
        "delete": client.delete(f"/api/v1/queues/{owned_queue}", **meta),
    }
    # then every call is refused and nothing changed
    assert {k: r.status_code for k, r in answers.items()} == dict.fromkeys(answers, 401), {
        k: r.content for k, r in answers.items()
    }
    assert _depth(owned_queue) == 2


# --- signed forwarded calls ------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_replayed_forwarded_call_is_refused(transport, owned_queue, user, recorder):
    # given a forwarded enqueue as the real HttpPeers sends it, taken off the wire
    call = recorder.forwarded_enqueue(owned_queue, "once", user)
    assert not any(k.lower() == "x-mq-cluster-secret" for k in call[1]), "the secret itself travels"
    # when it reaches the node, and is sent again
    first = _deliver(transport, call)
    again = _deliver(transport, call)
    # then the first is stored and the replay refused: one message more, not two
    assert first.status_code == 201, first.content
    assert again.status_code == 401 and "replayed" in again.json()["detail"], again.content
    assert _depth(owned_queue) == 3


@pytest.mark.django_db
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("offset", [-120.0, 120.0])
def test_a_forwarded_call_signed_out_of_the_window_is_refused(transport, owned_queue, user, recorder, offset):
    # given a forwarded enqueue signed two minutes off this node's clock (past or future)
    with mock.patch("time.time", return_value=time.time() + offset):
        call = recorder.forwarded_enqueue(owned_queue, "stale", user)
    # when it reaches the node
    r = _deliver(transport, call)
    # then it is refused, nothing stored
    assert r.status_code == 401 and "timestamp" in r.json()["detail"], r.content
    assert _depth(owned_queue) == 2


@pytest.mark.django_db
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_forwarded_call_with_a_changed_header_or_body_is_refused(transport, owned_queue, user, recorder):
    # given a fresh forwarded enqueue
    call = recorder.forwarded_enqueue(owned_queue, "fresh", user)
    path, headers, body = call
    # when its timestamp is moved into the window, its hop count, user or body changed
    stamp = {k.lower(): v for k, v in headers.items()}["x-mq-cluster-timestamp"]
    changed = [
        _deliver(transport, call, **{"X-MQ-Cluster-Timestamp": f"{float(stamp) + 1:.3f}"}),
        _deliver(transport, call, **{"X-MQ-Hops": "2"}),
        _deliver(transport, call, **{"X-MQ-On-Behalf-Of": "system"}),
        _deliver(transport, (path, headers, body.replace(b"fresh", b"fresH"))),
        _deliver(transport, (path.replace("/enqueue", "/enqueue?x=1"), headers, body)),
    ]
    # then each is refused, nothing stored
    assert [r.status_code for r in changed] == [401] * len(changed), [r.content for r in changed]
    assert _depth(owned_queue) == 2


@pytest.mark.django_db
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_nodes_own_call_may_make_only_the_node_only_calls(transport, owned_queue, runtime):
    from queues.cluster import peerauth

    client = make_client(transport)

    def signed(method: str, path: str, payload: dict | None = None, on_behalf: str | None = None):
        body = b"" if payload is None else json.dumps(payload).encode()
        meta = _meta(peerauth.sign(method, path, body, 1, on_behalf))
        return client.generic(method, path, body, "application/json", **meta)

    # a node's call naming no user: the user's calls are refused ...
    assert signed("GET", "/api/v1/queues").status_code == 403
    assert signed("POST", f"/api/v1/queues/{owned_queue}/purge", {}).status_code == 403
    assert signed("DELETE", f"/api/v1/queues/{owned_queue}").status_code == 403
    assert signed("POST", f"/api/v1/queues/{owned_queue}/enqueue", {"body": "x"}).status_code == 403
    assert _depth(owned_queue) == 2
    # ... what forwarding needs is served
    r = signed("POST", f"/api/v1/queues/{owned_queue}/purge", {"close_only": True})
    assert r.status_code == 200 and r.json() == {"closed": True}, r.content
    r = signed("POST", f"/api/v1/queues/{owned_queue}/expire", {})
    assert r.status_code == 200, r.content


# --- several nodes: the client's hop count, the Host header -----------------------------------------


def _partitions(c: Client, name: str) -> list[dict]:
    r = c.get(f"queues/{name}/partitions")
    assert r.status_code == 200, r.text
    return r.json()["partitions"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_client_sent_hop_count_is_ignored(node_factory, token):
    from tests.launcher import wait_until

    # given two nodes, a partition on each, and a message held by a consumer
    a, b = node_factory(), node_factory()
    name = f"hops-{uuid.uuid4().hex[:8]}"
    ca = Client(a.url, token)
    assert ca.post("queues", {"name": name, "partitions": 2}).status_code == 201
    wait_until(lambda: len({p["owner"] for p in _partitions(ca, name)} - {None}) == 2, 30, "two owners")
    clients = [ca, Client(b.url, token)]
    ids = [c.post(f"queues/{name}/enqueue", {"body": str(i)}).json()["id"] for i in range(3) for c in clients]
    got: list[dict] = []
    deadline = time.monotonic() + 30
    while len(got) < len(ids) and time.monotonic() < deadline:
        for c in clients:
            got += c.post(f"queues/{name}/dequeue", {"max": 10, "visibility_timeout": 60}).json()["messages"]
    owners = {p["index"]: p["address"] for p in _partitions(ca, name)}
    # a message of each node's partition, to send to the other node (whose call must be forwarded)
    for node, other in ((a, b), (b, a)):
        theirs = [m for m in got if owners[int(m["id"].split("/")[1])] == other.url.removeprefix("http://")]
        assert theirs, (owners, [m["id"] for m in got])
        held = theirs[0]
        for query in ("", "?format=json"):  # the fast path, and DRF
            # when a client sends it to the node that does not own it, claiming two hops already
            r = requests.post(
                f"{node.url}/api/v1/queues/{name}/visibility{query}",
                json={"id": held["id"], "receipt": held["receipt"], "visibility_timeout": 30},
                headers={"Authorization": f"Token {token}", "X-MQ-Hops": "2"},
                timeout=15,
            )
            # then the count is not believed: the call is forwarded to the owner, as hop 0's
            assert r.status_code == 200, (node.url, query, r.text)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_node_answers_only_loopback_host_names_by_default(node_factory, token):
    # given a node on the embedded defaults (no ALLOWED_HOSTS)
    assert "ALLOWED_HOSTS" not in os.environ, "the test checks the embedded default"
    node = node_factory()
    name = f"host-{uuid.uuid4().hex[:8]}"
    c = Client(node.url, token)
    assert c.post("queues", {"name": name, "partitions": 1}).status_code == 201
    url = f"{node.url}/api/v1"
    auth = {"Authorization": f"Token {token}"}
    # when a page reaches it under another name (DNS rebinding), through Django and the fast path
    evil = {"Host": "evil.example"}
    health = requests.get(f"{url}/healthz", headers=evil, timeout=10)
    listed = requests.get(f"{url}/queues", headers={**auth, **evil}, timeout=10)
    enqueued = requests.post(f"{url}/queues/{name}/enqueue", json={"body": "x"}, headers={**auth, **evil}, timeout=10)
    # then it is refused, nothing stored
    assert [health.status_code, listed.status_code, enqueued.status_code] == [400, 400, 400]
    port = node.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        assert requests.get(f"{url}/healthz", headers={"Host": host}, timeout=10).status_code == 200
    assert c.get(f"queues/{name}/stats").json()["depth"] == 0


# --- healthz -------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_healthz_tells_anonymous_callers_nothing_about_the_node(transport, runtime, user):
    from django.contrib.auth.models import User

    from queues.cluster import peerauth

    # anyone (no token, a bad token, an ordinary user's token): liveness only
    anonymous = make_client(transport)
    bad = make_client(transport)
    bad.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    ordinary = token_client(transport, user)
    for client in (anonymous, bad, ordinary):
        r = client.get("/api/v1/healthz")
        assert r.status_code == 200 and r.json() == {"status": "ok"}, r.content
    # staff and nodes: the node's ID and address too
    staff = token_client(transport, User.objects.create(username=f"s-{uuid.uuid4().hex[:6]}", is_staff=True))
    peer = make_client(transport).get("/api/v1/healthz", **_meta(peerauth.sign("GET", "/api/v1/healthz", b"", 0, None)))
    for r in (staff.get("/api/v1/healthz"), peer):
        assert r.status_code == 200 and r.json()["node"] == runtime.node_id, r.content


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_nodes_healthz_hides_its_identity(node_factory):
    node = node_factory()
    r = requests.get(f"{node.url}/api/v1/healthz", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert node_info(node.url)["address"] == node.url.removeprefix("http://")


@pytest.mark.django_db
def test_healthz_tells_a_staff_console_session_about_the_node(runtime):
    from django.contrib.auth.models import User
    from django.test import Client as DjangoClient

    # given a console session (no token): a staff user's, then an ordinary user's
    for is_staff, detailed in ((True, True), (False, False)):
        client = DjangoClient()
        client.force_login(User.objects.create(username=f"c-{uuid.uuid4().hex[:6]}", is_staff=is_staff))
        r = client.get("/api/v1/healthz")
        assert r.status_code == 200
        assert ("node" in r.json()) is detailed, r.content
