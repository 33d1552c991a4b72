"""A record of a later stored format version (``queues.engine.format``) in a real node's store,
as a node of a newer release would leave it during a rolling upgrade: the node refuses it loudly
(503 with Retry-After, an ERROR line naming the version) and harms nothing else.

A node process on Redis and PostgreSQL; the unit tests of every record kind are in
``tests/unit/test_stored_format.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
import requests

from queues.engine.format import envelope
from queues.engine.keys import head_key, incarnation
from queues.models import Queue
from tests.integration.nodes import Client, backend_store, drain

pytestmark = pytest.mark.cluster


def logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("node-*.log")))


def create(c: Client, name: str) -> None:
    r = c.post("queues", {"name": name, "partitions": 1, "block_size": 4, "lease_period": 3})
    assert r.status_code == 201, r.text


def enqueue(c: Client, name: str, n: int) -> list[str]:
    r = c.post(f"queues/{name}/enqueue", {"messages": [{"body": f"{name}-{i}"} for i in range(n)]})
    assert r.status_code == 201, r.text
    return r.json()["ids"]


def wait_for_line(tmp_path: Path, line: str, call, timeout: float = 30) -> None:
    """Make ``call()`` until the nodes' logs hold ``line``."""
    deadline = time.monotonic() + timeout
    while line not in logs(tmp_path):
        assert time.monotonic() < deadline, f"no {line!r} in the logs:\n{logs(tmp_path)[-3000:]}"
        call()
        time.sleep(0.2)


@pytest.mark.node(backend="redis", env={"BLOCK_GROWTH": "1"})
def test_a_node_refuses_a_later_stored_format_loudly_and_harms_nothing_else(tmp_path, token, request, node_factory):
    nodes = node_factory
    store = backend_store("redis", request, tmp_path)
    # given three queues on a node, each with 12 messages in blocks of 4...
    first = nodes()
    c = Client(first.url, token)
    names = {"deq": "fmt-dequeue", "open": "fmt-open", "ok": "fmt-healthy"}
    ids = {}
    for key, name in names.items():
        create(c, name)
        ids[key] = enqueue(c, name, 12)
    first.stop()
    views = {key: store.within(incarnation(Queue.objects.get(name=name).pk)) for key, name in names.items()}
    # ...and records of a newer release: a message in the second block of one, the head record
    # of another
    later_message = envelope(2, orjson.loads(views["deq"].get(ids["deq"][6])))
    views["deq"].put(ids["deq"][6], later_message)
    head = head_key(names["open"], 0)
    later_head = envelope(2, orjson.loads(views["open"].get(head)))
    views["open"].put(head, later_head)
    # when a node takes them over and serves them
    second = nodes()
    c = Client(second.url, token)
    # then the healthy queue is served as ever
    assert [m["id"] for m in drain(c, f"queues/{names['ok']}")] == ids["ok"]
    # the dequeue that reaches the newer message is refused, after the messages before it
    deadline = time.monotonic() + 30
    while True:
        r = c.post(f"queues/{names['deq']}/dequeue", {"max": 2, "visibility_timeout": 60})
        assert r.status_code in (200, 503), r.text
        if r.status_code == 200 and r.json()["messages"]:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)
    assert [m["id"] for m in r.json()["messages"]] == ids["deq"][:2]
    answers: list[requests.Response] = []

    def dequeue() -> None:
        answers.append(c.post(f"queues/{names['deq']}/dequeue", {"max": 10, "visibility_timeout": 60}))

    wait_for_line(tmp_path, f"{ids['deq'][6]}: message record in stored format version 2", dequeue)
    # (a dequeue of the queue answers with what its other partitions give: here, none)
    assert {r.status_code for r in answers} == {200}, [r.text for r in answers]
    assert not {m["id"] for r in answers for m in r.json()["messages"]} & set(ids["deq"][4:])
    # the partition whose head record is newer is not opened: its calls are answered 503
    line = f"{names['open']}/0/_head: head record in stored format version 2"
    wait_for_line(tmp_path, line, lambda: None)
    r = c.post(f"queues/{names['open']}/enqueue", {"body": "x"}, timeout=60)
    assert r.status_code == 503 and r.headers.get("Retry-After"), r.text
    # and each refusal is logged at ERROR with its key and version, never as a 500
    text = logs(tmp_path)
    assert f"ERROR queues.engine.format {ids['deq'][6]}: message record in stored format version 2" in text
    assert f"ERROR queues.engine.format {head}: head record in stored format version 2" in text
    assert "Internal Server Error" not in text
    # nothing was harmed: the newer records are as they were written, every other message is
    # still stored, and a new message in the healthy queue goes through
    assert views["deq"].get(ids["deq"][6]) == later_message
    assert views["open"].get(head) == later_head
    for key in ("deq", "open"):
        assert all(v is not None for v in views[key].get_many(ids[key])), key
    fresh = enqueue(c, names["ok"], 1)
    assert [m["id"] for m in drain(c, f"queues/{names['ok']}")] == fresh
