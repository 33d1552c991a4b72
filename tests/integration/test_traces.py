"""Traces across every hop (OpenTelemetry): the SDK's, the nodes' and the worker's spans make
one trace, read back from the SDK's in-memory exporter (this process) and from the JSON lines
each node writes (``TRACES_EXPORT=jsonl``). With no SDK configured, a node adds nothing."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from mq_client import Client
from queues import tracing
from tests.launcher import wait_until
from workers.handlers import Handler
from workers.pipeline import Pipeline

#: a producer's context, as a client sends it (trace ID, span ID, sampled)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def node_traced(exporter):
    """This process's node runtime makes spans into ``exporter`` (none again after)."""
    tracing.use(exporter.provider)
    yield exporter
    tracing.use(None)


def hex_ids(span) -> tuple[str, str]:
    ctx = span.get_span_context()
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


@pytest.mark.transports
def test_a_rest_enqueue_continues_the_callers_trace_and_its_consumer_the_messages(api, make_queue, node_traced):
    # given a node that traces, and a producer that sends only a traceparent header
    queue = make_queue(partitions=1)
    # when it enqueues a message, which is then dequeued and acked
    r = api.post(f"/api/v1/queues/{queue}/enqueue", {"body": "hi"}, format="json", HTTP_TRACEPARENT=PARENT)
    assert r.status_code == 201, r.content
    mid = r.json()["id"]
    (got,) = api.post(f"/api/v1/queues/{queue}/dequeue", {"max": 1}, format="json").json()["messages"]
    r = api.post(f"/api/v1/queues/{queue}/ack", {"messages": [{"id": mid, "receipt": got["receipt"]}]}, format="json")
    assert r.status_code == 200, r.content
    spans = {s.name: s for s in node_traced.get_finished_spans()}
    # then the node's enqueue span is the caller's child, with the conventions' attributes
    send = spans[f"enqueue {queue}"]
    assert hex_ids(send)[0] == TRACE_ID and f"{send.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert send.kind.name == "SERVER"
    assert {
        k: send.attributes[k] for k in ("messaging.system", "messaging.operation.type", "messaging.destination.name")
    } == {
        "messaging.system": "mq",
        "messaging.operation.type": "send",
        "messaging.destination.name": queue,
    }
    assert send.attributes["messaging.message.id"] == mid
    # its store write is its child
    store = spans[f"store {queue}"]
    assert store.parent.span_id == send.get_span_context().span_id
    assert store.attributes["messaging.destination.partition.id"] == "0"
    # the message carries the enqueue span's context, and the dequeue links to it
    assert got["attributes"]["traceparent"] == f"00-{TRACE_ID}-{hex_ids(send)[1]}-01"
    receive = spans[f"dequeue {queue}"]
    assert receive.attributes["messaging.operation.type"] == "receive"
    assert [(f"{link.context.trace_id:032x}", link.context.span_id) for link in receive.links] == [
        (TRACE_ID, send.get_span_context().span_id)
    ]
    assert spans[f"ack {queue}"].attributes["messaging.operation.type"] == "settle"


def test_a_message_with_its_own_context_keeps_it(api, make_queue, node_traced):
    # given a producer whose message carries its creation context, and no header
    queue = make_queue(partitions=1)
    own = f"00-{TRACE_ID}-1111111111111111-01"
    r = api.post(f"/api/v1/queues/{queue}/enqueue", {"body": "hi", "attributes": {"traceparent": own}}, format="json")
    assert r.status_code == 201, r.content
    # then the node's span continues that context, and the message keeps it as it came
    send = next(s for s in node_traced.get_finished_spans() if s.name == f"enqueue {queue}")
    assert hex_ids(send)[0] == TRACE_ID and send.parent.span_id == 0x1111111111111111
    (got,) = api.post(f"/api/v1/queues/{queue}/dequeue", {"max": 1}, format="json").json()["messages"]
    assert got["attributes"] == {"traceparent": own}


@pytest.mark.transports
def test_with_no_sdk_a_node_makes_no_span_and_adds_nothing(api, make_queue):
    # given a node with no OpenTelemetry SDK configured (the test process has none)
    assert not tracing.ON
    queue = make_queue(partitions=1)
    # when a producer sends a traceparent header
    r = api.post(f"/api/v1/queues/{queue}/enqueue", {"body": "hi"}, format="json", HTTP_TRACEPARENT=PARENT)
    assert r.status_code == 201, r.content
    # then its message is stored as it came
    (got,) = api.post(f"/api/v1/queues/{queue}/dequeue", {"max": 1}, format="json").json()["messages"]
    assert got["attributes"] == {}


def node_spans(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.django_db(transaction=True)
def test_producer_nodes_worker_and_its_handlers_enqueue_share_one_trace_across_a_forwarded_call(
    node_factory, token, tmp_path, exporter
):
    # given node B, which owns the only partition of a queue, and node A, which does not; both
    # write their spans as JSON lines
    b = node_factory(TRACES_EXPORT="jsonl", TRACES_FILE=str(tmp_path / "b.jsonl"))
    for name in ("traced", "follow-ups"):
        Client(b.url, token).create_queue(name, partitions=1)
        wait_until(lambda n=name: all(p.owner for p in Client(b.url, token).partitions(n)), 20, f"B to own {name}")
    a = node_factory(TRACES_EXPORT="jsonl", TRACES_FILE=str(tmp_path / "a.jsonl"))
    # and a producer and a worker whose SDK client traces (in memory), both calling A only; the
    # worker's handler enqueues a follow-up message through the same client
    client = Client(a.url, token, owners_ttl=0, tracer_provider=exporter.provider)
    processed = threading.Event()

    def handle(message, prepared) -> None:
        client.enqueue("follow-ups", f"after {message.id}")
        processed.set()

    worker = Pipeline(client, {"traced": Handler("traced", handle)}, wait=0.5, name="w")

    # when the producer enqueues through A (forwarded to B) and the worker processes the message
    mid = client.enqueue("traced", "hello")
    worker.start()
    try:
        assert processed.wait(30), "the worker processed the message"
        spans = exporter.get_finished_spans
        wait_until(lambda: any(s.name == "ack traced" for s in spans()), 10, "the worker's ack")
    finally:
        worker.stop()

    # then one trace holds the producer's span, A's enqueue and forward, B's enqueue and store
    # write, and the worker's attempt, each the child of the one before
    mine = {s.name: s for s in exporter.get_finished_spans()}
    producer = mine["enqueue traced"]
    trace_id, producer_id = hex_ids(producer)
    assert producer.kind.name == "PRODUCER" and producer.attributes["messaging.message.id"] == mid
    at_a = {s["name"]: s for s in node_spans(tmp_path / "a.jsonl") if s["trace_id"] == trace_id}
    at_b = {s["name"]: s for s in node_spans(tmp_path / "b.jsonl") if s["trace_id"] == trace_id}
    assert at_a["enqueue traced"]["parent_id"] == producer_id
    assert at_a["forward enqueue traced"]["parent_id"] == at_a["enqueue traced"]["span_id"]
    assert at_b["enqueue traced"]["parent_id"] == at_a["forward enqueue traced"]["span_id"]
    assert at_b["enqueue traced"]["attributes"]["mq.hops"] == 1
    assert at_b["store traced"]["parent_id"] == at_b["enqueue traced"]["span_id"]
    attempt = mine["process traced"]
    assert hex_ids(attempt)[0] == trace_id and f"{attempt.parent.span_id:016x}" == producer_id
    assert attempt.kind.name == "CONSUMER" and attempt.attributes["messaging.message.id"] == mid
    assert attempt.attributes["messaging.operation.type"] == "process"
    # the worker's ack, inside its attempt, is settled at B in the same trace
    assert mine["ack traced"].parent.span_id == attempt.get_span_context().span_id
    assert "ack traced" in at_b
    # and B's dequeue (in the worker's own receive trace) links to the message's creation
    receive = next(s for s in node_spans(tmp_path / "b.jsonl") if s["name"] == "dequeue traced" and s["links"])
    assert receive["links"] == [f"{trace_id}-{producer_id}"]

    # the handler's enqueue is a PRODUCER span, the child of the attempt, and the follow-up
    # message carries that span's context: its consumer continues the same trace
    follow_up = mine["enqueue follow-ups"]
    assert follow_up.kind.name == "PRODUCER" and follow_up.parent.span_id == attempt.get_span_context().span_id
    (got,) = Client(b.url, token).dequeue("follow-ups", max_messages=1)
    assert got.attributes["traceparent"].split("-")[1:3] == list(hex_ids(follow_up))
