"""The client SDK's own logic against a scripted HTTP stub: parsing, errors, retries, routing."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import mq_client as sdk
from mq_client import Client


class Stub:
    """An HTTP server answering from a script: ``answers`` is a list of (status, body, headers)
    consumed in order (the last one repeats); every request is recorded."""

    def __init__(self):
        self.answers: list[tuple[int, object, dict]] = [(200, {}, {})]
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                with stub.lock:
                    stub.requests.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "json": json.loads(raw) if raw else None,
                            "auth": self.headers.get("Authorization"),
                            "thread": threading.get_ident(),
                        }
                    )
                    status, body, headers = stub.answers[0] if len(stub.answers) == 1 else stub.answers.pop(0)
                data = body if isinstance(body, bytes) else (b"" if body is None else json.dumps(body).encode())
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"http://{self.address}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stubs():
    made: list[Stub] = []

    def make() -> Stub:
        s = Stub()
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _closed_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _client(urls, **kw) -> tuple[Client, list[float]]:
    c = Client(urls, "tok", **{"retries": 3, "backoff": 0.01, **kw})
    slept: list[float] = []
    c._transport.sleep = slept.append
    return c, slept


def test_urls_from_a_comma_separated_string_and_from_env():
    c = Client(" http://a:1/ ,b:2,,http://a:1", "t")
    assert c.urls == ["http://a:1", "http://b:2"]
    c = Client.from_env(
        {
            "QUEUE_API_URL": "http://x:8000,http://y:8000",
            "QUEUE_API_TOKEN": "k",
            "QUEUE_API_TIMEOUT": "3",
            "QUEUE_API_RETRIES": "1",
        }
    )
    assert c.urls == ["http://x:8000", "http://y:8000"] and c.token == "k" and c.timeout == 3 and c.retries == 1
    with pytest.raises(ValueError):
        Client.from_env({"QUEUE_API_URL": "http://x"})
    with pytest.raises(ValueError):
        Client("", "t")


def test_message_parsing_and_message_ids():
    m = sdk.Message.from_json(
        {
            "id": "q/3/00000001-ab/7",
            "receipt": "r",
            "body": "b",
            "receive_count": 2,
            "enqueued_at": "2026-01-02T03:04:05.678Z",
            "sequence": 5,
            "group": None,
            "attributes": {"a": 1},
            "size": None,
            "estimates": {"preprocess": None, "process": 2.0},
            "future_field": 1,
            "history": {
                "source": "src",
                "id": "src/0/x/1",
                "receive_count": 3,
                "group": "g",
                "enqueued_at": "2026-01-01T00:00:00Z",
                "dead_lettered_at": "2026-01-01T00:01:00Z",
            },
        }
    )
    assert m.queue == "q" and m.partition == 3 and m.receive_count == 2
    assert m.enqueued_at == datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    assert m.estimates == sdk.Estimates(None, 2.0) and m.history.source == "src" and m.history.receive_count == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.body = "changed"  # frozen
    assert sdk.group_partition("g1", 4) == sdk.group_partition("g1", 4) < 4
    with pytest.raises(ValueError):
        sdk.message_partition("nonsense")
    nm = sdk.NewMessage(
        "x", group="g", not_before=datetime(2030, 1, 1, tzinfo=UTC), estimates=sdk.Estimates(process=1.0)
    )
    assert nm.to_json() == {
        "body": "x",
        "group": "g",
        "not_before": "2030-01-01T00:00:00+00:00",
        "estimates": {"process": 1.0},
    }


def test_a_partitions_owner_reads_as_id_and_address_in_both_answers():
    node_id, address = "8b3a2ea71fb14b5992076945d99980b9", "10.0.0.5:8000"
    owner = sdk.PartitionOwner.from_json(
        {"index": 0, "owner_id": node_id, "owner_address": address, "owner": node_id, "address": address}
    )
    stats = sdk.PartitionStats.from_json({"index": 0, "owner_id": node_id, "owner_address": address, "owner": address})
    assert (owner.owner_id, owner.owner_address) == (stats.owner_id, stats.owner_address) == (node_id, address)
    # an older server answers only the old fields: the new ones are None, nothing fails
    assert sdk.PartitionOwner.from_json({"index": 1, "owner": node_id, "address": address}).owner_id is None


@pytest.mark.parametrize(
    "status,cls",
    [(400, sdk.BadRequest), (401, sdk.Unauthorized), (404, sdk.NotFound), (409, sdk.Conflict), (413, sdk.BadRequest)],
)
def test_4xx_are_typed_and_never_retried(stubs, status, cls):
    s = stubs()
    s.answers = [(status, {"error": "some_code", "detail": "what", "id": "q/0/b/1"}, {})]
    c, slept = _client(s.url)
    with pytest.raises(cls) as exc:
        c.enqueue("q", "x")
    assert exc.value.status == status and exc.value.code == "some_code" and exc.value.detail == "what"
    assert len(s.requests) == 1 and slept == []
    if cls is sdk.Conflict:
        assert exc.value.message_id == "q/0/b/1"


def test_429_is_retried_honouring_retry_after(stubs):
    """A node's cap on concurrent long polls answers 429 with Retry-After: the poll is tried again."""
    s = stubs()
    s.answers = [
        (429, {"error": "too_many_waits", "detail": "x"}, {"Retry-After": "1"}),
        (200, {"messages": []}, {}),
    ]
    c, slept = _client(s.url)
    assert c.dequeue("q", wait=5) == []
    assert len(s.requests) == 2 and slept == [1.0]


def test_5xx_is_retried_with_backoff_honouring_retry_after(stubs):
    s = stubs()
    s.answers = [
        (503, {"error": "unavailable", "detail": "x"}, {"Retry-After": "1"}),
        (500, b"<html>oops</html>", {}),
        (201, {"id": "q/0/b/0"}, {}),
    ]
    c, slept = _client(s.url)
    assert c.enqueue("q", "x") == "q/0/b/0"
    assert len(s.requests) == 3 and slept[0] == 1.0 and 0 <= slept[1] <= 0.02
    assert s.requests[0]["auth"] == "Token tok" and s.requests[0]["json"] == {"body": "x"}
    # all tries fail: the last error, typed, after 1 + retries tries
    s.answers = [(503, {"error": "unavailable", "detail": "x"}, {"Retry-After": "100"})]
    s.requests.clear()
    c, slept = _client(s.url, max_backoff=2)
    with pytest.raises(sdk.Unavailable) as exc:
        c.stats("q")
    assert exc.value.code == "unavailable" and len(s.requests) == 4 and slept == [2, 2, 2]
    s.answers = [(500, b"not json", {})]
    with pytest.raises(sdk.ServerError) as exc:
        c.stats("q")
    assert exc.value.code == "http_500" and exc.value.detail == "not json"


def test_round_robin_skips_a_dead_node(stubs):
    a, b = stubs(), stubs()
    dead = _closed_url()
    c, slept = _client([dead, a.url, b.url])
    for _ in range(6):
        c.list_queues()
    assert len(a.requests) == 3 and len(b.requests) == 3 and slept == []
    # every node dead: ConnectionFailed after the retries, backing off once all were tried
    c, slept = _client([dead, _closed_url()], retries=3)
    with pytest.raises(sdk.ConnectionFailed) as exc:
        c.list_queues()
    assert exc.value.status == 0 and len(slept) == 2  # tries 1 and 2 on fresh nodes, then waits


def test_enqueue_many_and_ack_batch_by_owner(stubs):
    a, b = stubs(), stubs()
    c, _ = _client(a.url)
    a.answers = [
        (201, {"ids": [f"q/0/b/{i}" for i in range(1000)]}, {}),
        (201, {"ids": [f"q/0/b/{i}" for i in range(1000, 1700)]}, {}),
    ]
    ids = c.enqueue_many("q", ({"body": str(i)} for i in range(1700)))
    assert len(ids) == 1700 and [len(r["json"]["messages"]) for r in a.requests] == [1000, 700]
    assert c.enqueue_many("q", []) == [] and len(a.requests) == 2
    # owners: partition 0 on a, partition 1 on b
    a.requests.clear()
    a.answers = [
        (
            200,
            {
                "queue": "q",
                "partitions": [
                    {"index": 0, "owner": "na", "address": a.address},
                    {"index": 1, "owner": "nb", "address": b.address},
                ],
            },
            {},
        ),
        (200, {"acked": 1000, "not_found": 0}, {}),
        (200, {"acked": 200, "not_found": 1}, {}),
    ]
    b.answers = [(200, {"acked": 5, "not_found": 0}, {})]
    msgs = [(f"q/0/b/{i}", "r") for i in range(1201)] + [(f"q/1/b/{i}", "r") for i in range(5)]
    assert c.ack("q", msgs) == sdk.AckResult(1205, 1)
    assert [r["path"] for r in a.requests] == ["/api/v1/queues/q/partitions"] + ["/api/v1/queues/q/ack"] * 2
    assert [len(r["json"]["messages"]) for r in a.requests[1:]] == [1000, 201]
    assert [r["json"] for r in b.requests] == [{"messages": [{"id": f"q/1/b/{i}", "receipt": "r"} for i in range(5)]}]
    # visibility of a partition-1 message goes to b; the owners stay cached
    b.answers = [(200, {"id": "q/1/b/0", "visibility_timeout": 9}, {})]
    assert c.change_visibility("q", "q/1/b/0", 9, receipt="r") == sdk.VisibilityResult("q/1/b/0", 9)
    assert b.requests[-1]["json"] == {"id": "q/1/b/0", "visibility_timeout": 9, "receipt": "r"}
    assert len(a.requests) == 3
    # the owner fails: the cache is dropped and the call goes round robin
    b.answers = [(503, {"error": "unavailable"}, {"Retry-After": "0"})]
    a.answers = [(200, {"acked": 1, "not_found": 0}, {})]
    assert c.ack_ids("q", ["q/1/b/0"]).acked == 1
    assert a.requests[-1]["json"] == {"ids": ["q/1/b/0"]} and "q" not in c._owners.entries


def test_one_session_per_thread(stubs):
    s = stubs()
    s.answers = [(200, [], {})]
    c, _ = _client(s.url)
    sessions = set()

    def work():
        for _ in range(5):
            c.list_queues()
        sessions.add(id(c._transport.session()))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(sessions) == 4 and len(s.requests) == 20
    c.close()


def test_owner_lookup_gaps_and_unreachable_owners(stubs):
    import time

    a = stubs()
    dead = _closed_url().removeprefix("http://")
    owners = {
        "queue": "q",
        "partitions": [{"index": 0, "owner": "x", "address": dead}, {"index": 1, "owner": None, "address": None}],
    }
    acked = {"acked": 1, "not_found": 0}
    a.answers = [(200, owners, {}), (200, acked, {}), (200, owners, {}), (200, acked, {}), (200, acked, {})]
    c, slept = _client(a.url, owners_ttl=30)
    # partition 0's owner refuses connections: the ack goes round robin at once
    assert c.ack_ids("q", ["q/0/b/1"]).acked == 1 and slept == []
    # the owners are asked again, and the unreachable owner is left alone for a while
    assert c.ack_ids("q", ["q/0/b/2"]).acked == 1
    assert [r["path"].rsplit("/", 1)[1] for r in a.requests] == ["partitions", "ack", "partitions", "ack"]
    # a partition without an owner: the cache is refreshed after about a second, not after the TTL
    assert c.owners("q") == {0: dead, 1: None}
    assert c._owners.entries["q"].fetched < time.monotonic() - 28
    assert c.ack_ids("q", ["q/1/b/0"]).acked == 1 and a.requests[-1]["path"].endswith("/ack")


def test_the_client_package_loads_without_django_or_the_project():
    """Applications import ``mq_client`` alone: loading it (in a fresh interpreter, without Django
    settings) brings in neither Django nor any package of the service, and every public name is there."""
    probe = (
        "import sys, mq_client\n"
        "missing = [n for n in mq_client.__all__ if not hasattr(mq_client, n)]\n"
        "project = ('django', 'rest_framework', 'celery', 'queues', 'workers', 'consoles', 'archive', 'sqs', 'config')\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in project)\n"
        "print(missing, loaded)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", probe], cwd=root, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] []"
