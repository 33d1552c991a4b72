"""bench/serving.py's pieces that run without a server: the option checks, the no-store WSGI
app, and the pipelined Redis protocol's reply matching (replies in order, split anywhere)."""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import serving  # noqa: E402
import serving_apps  # noqa: E402


def test_unknown_model_and_missing_store_are_refused(monkeypatch):
    with pytest.raises(SystemExit):
        serving.parse_args(["--models", "wsgi-threads,fastest", "--redis-url", "redis://x"])
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(SystemExit):
        serving.parse_args([])
    args = serving.parse_args(["--models", "wsgi-1thread, rsgi-protocol", "--redis-url", "redis://x"])
    assert args.models == ["wsgi-1thread", "rsgi-protocol"]


def test_every_model_names_an_app_of_its_interface():
    for interface, target, *_ in serving.MODELS.values():
        app = getattr(serving_apps, target)
        assert asyncio.iscoroutinefunction(app) == (interface == "rsgi")


def test_every_model_sets_only_what_granian_takes():
    import inspect

    from granian import Granian
    from granian.constants import HTTPModes, RuntimeModes

    takes = inspect.signature(Granian.__init__).parameters
    for name, (*_, settings) in serving.MODELS.items():
        assert set(settings) <= set(takes), name
        RuntimeModes(settings.get("runtime_mode", "auto"))
        HTTPModes(settings.get("http", "auto"))
    assert set(serving.DEFAULT_MODELS) <= set(serving.MODELS)


def test_the_nostore_app_reads_the_body_and_answers_json():
    body = io.BytesIO(b'{"body": "x"}')
    seen = []
    out = serving_apps.wsgi_nostore(
        {"CONTENT_LENGTH": "13", "wsgi.input": body}, lambda status, headers: seen.append((status, headers))
    )
    assert body.tell() == 13
    assert seen == [("200 OK", serving_apps.HEADERS)]
    assert b"".join(out) == serving_apps.BODY


def test_pipelined_replies_go_to_the_callers_in_order_however_they_are_split():
    async def run() -> list[bytes]:
        proto = serving_apps._Pipelined()
        written: list[bytes] = []
        proto.connection_made(type("T", (), {"write": staticmethod(written.append)})())
        calls = [asyncio.ensure_future(proto.ping()) for _ in range(3)]
        await asyncio.sleep(0)
        assert written == [serving_apps.PING] * 3
        for chunk in (b"+PO", b"NG\r\n+ONE\r", b"\n+TWO\r\n"):
            proto.data_received(chunk)
        return await asyncio.gather(*calls)

    assert asyncio.run(run()) == [b"+PONG", b"+ONE", b"+TWO"]


def test_a_lost_connection_fails_the_calls_in_flight():
    async def run() -> None:
        proto = serving_apps._Pipelined()
        proto.connection_made(type("T", (), {"write": staticmethod(lambda data: None)})())
        call = asyncio.ensure_future(proto.ping())
        await asyncio.sleep(0)
        proto.connection_lost(None)
        with pytest.raises(ConnectionError):
            await call

    asyncio.run(run())


def test_every_thin_model_names_an_app_of_its_interface_and_is_not_a_serving_model():
    for interface, target, *_ in serving.THIN_MODELS.values():
        assert asyncio.iscoroutinefunction(getattr(serving_apps, target)) == (interface == "rsgi")
    assert not set(serving.THIN_MODELS) & set(serving.MODELS)


def test_the_thin_queue_delivers_a_message_once_written_and_acks_it_by_its_receipt():
    q = serving_apps.ThinQueue()
    ids, bodies, command = q.enqueue_write(
        "/api/v1/queues/bench-a/enqueue", {"messages": [{"body": "x"}, {"body": "y"}]}
    )
    assert command == ("HSET", "mq:thin:bench-a", ids[0], "x", ids[1], "y") and len(set(ids)) == 2
    a, b = "/api/v1/queues/bench-a/dequeue", "/api/v1/queues/bench-b/dequeue"
    assert q.dequeue(a, {"max": 10}) == (200, {"messages": []})  # not deliverable before the write
    assert q.enqueued("/api/v1/queues/bench-a/enqueue", {"messages": []}, ids, bodies) == (201, {"ids": ids})
    assert q.dequeue(b, {"max": 10}) == (200, {"messages": []})  # another queue's (an earlier round's)
    status, answer = q.dequeue(a, {"max": 1})
    (first,) = answer["messages"]
    assert (status, first["id"], first["body"]) == (200, ids[0], "x")
    acked, command = q.ack_delete(
        "/api/v1/queues/bench-a/ack",
        {"messages": [{"id": ids[0], "receipt": "wrong"}, {"id": ids[1], "receipt": "r" + ids[1]}]},
    )
    assert (acked, command) == (0, None)  # a wrong receipt, and a message not delivered: nothing to delete
    data = {"messages": [{"id": ids[0], "receipt": first["receipt"]}]}
    acked, command = q.ack_delete("/api/v1/queues/bench-a/ack", data)
    assert (acked, command) == (1, ("HDEL", "mq:thin:bench-a", ids[0]))
    assert q.acked(data, acked) == (200, {"acked": 1, "not_found": 0})
    assert q.ack_delete("/api/v1/queues/bench-a/ack", data) == (0, None)  # acked once only


def test_the_thin_wsgi_app_makes_one_store_call_an_enqueue_and_an_ack_and_none_a_dequeue(monkeypatch):
    import orjson

    sent: list[tuple] = []
    monkeypatch.setattr(
        serving_apps, "_sync_redis", type("R", (), {"execute_command": lambda self, *c: sent.append(c)})()
    )
    monkeypatch.setattr(serving_apps, "_thin", serving_apps.ThinQueue())
    serving_apps._thin.token = "t"

    def call(action: str, payload: dict, token: str = "t") -> tuple[str, dict]:
        raw = orjson.dumps(payload)
        environ = {
            "PATH_INFO": f"/api/v1/queues/bench-b/{action}",
            "CONTENT_LENGTH": str(len(raw)),
            "wsgi.input": io.BytesIO(raw),
            "HTTP_AUTHORIZATION": f"Token {token}",
        }
        seen = []
        out = serving_apps.thin_wsgi(environ, lambda status, headers: seen.append(status))
        return seen[0][:3], orjson.loads(b"".join(out))

    assert call("enqueue", {"body": "x"}, token="other") == ("401", {"error": "not_authenticated"})
    status, answer = call("enqueue", {"body": "x"})
    assert status == "201" and sent == [("HSET", "mq:thin:bench-b", answer["id"], "x")]
    status, answer = call("dequeue", {"max": 5})
    assert status == "200" and len(sent) == 1
    (m,) = answer["messages"]
    assert call("ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]}]}) == (
        "200",
        {"acked": 1, "not_found": 0},
    )
    assert sent[1] == ("HDEL", "mq:thin:bench-b", m["id"])
