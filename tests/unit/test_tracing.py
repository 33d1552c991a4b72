"""Trace context in messages (mq_client.tracing) and the worker's attempt spans, without a
server: the W3C/X-Ray mapping, the context a message carries, and a pipeline whose client
traces into the SDK's in-memory exporter."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import get_current_span

from mq_client import Client, tracing
from tests.unit.test_pipeline import FakeClient, make_pipeline, sleeping_handler, wait_for

TRACE_ID = "5759e988bd862e3fe1be46a994272793"
XRAY = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
TRACEPARENT = f"00-{TRACE_ID}-53995c3f42cd8ad8-01"


def span_ids(ctx) -> tuple[str, str]:
    sc = get_current_span(ctx).get_span_context()
    return f"{sc.trace_id:032x}", f"{sc.span_id:016x}"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (XRAY, TRACEPARENT),
        ("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0", TRACEPARENT[:-2] + "00"),
        ("Parent=53995c3f42cd8ad8;Root=1-5759e988-bd862e3fe1be46a994272793", TRACEPARENT[:-2] + "00"),
        ("Root=1-5759e988-bd862e3fe1be46a994272793", None),  # no parent: nothing to continue
        ("Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8", None),
        ("garbage", None),
    ],
)
def test_an_xray_header_maps_to_a_traceparent(header, expected):
    assert tracing.traceparent_of_xray(header) == expected


def test_a_traceparent_maps_back_to_the_xray_header():
    assert tracing.xray_of_traceparent(TRACEPARENT) == XRAY
    assert tracing.xray_of_traceparent("00-short-53995c3f42cd8ad8-01") is None


def test_a_message_context_comes_from_its_traceparent_or_its_sqs_trace_header():
    assert span_ids(tracing.context_of({"traceparent": TRACEPARENT})) == (TRACE_ID, "53995c3f42cd8ad8")
    sqs = {"sqs:meta": json.dumps({"trace": XRAY, "sender": "x"})}
    assert span_ids(tracing.context_of(sqs)) == (TRACE_ID, "53995c3f42cd8ad8")
    assert tracing.context_of({"traceparent": "00-" + "0" * 32 + "-53995c3f42cd8ad8-01"}) is None  # invalid ID
    assert tracing.context_of({"k": "v"}) is None
    assert tracing.context_of(None) is None


def test_a_client_without_an_sdk_makes_no_span_and_sends_no_header():
    # given no OpenTelemetry SDK configured in this process
    assert not tracing.enabled()
    client = Client("http://127.0.0.1:9", "t")
    # then the client has no tracer and its requests carry no trace context
    assert client.tracer is None and client._transport.traced is False


def test_each_attempt_is_a_process_span_in_the_messages_trace(exporter):
    # given a worker whose client traces, and two messages created in a known trace, one that fails
    client = FakeClient()
    client.tracer = exporter.tracer
    ok = client.add("jobs", {})
    bad = client.add("jobs", {"fail": True})
    for stored in client.queues["jobs"]:
        stored.message = replace(stored.message, attributes={"traceparent": TRACEPARENT})
    pipe = make_pipeline(client, sleeping_handler(), retry_backoff=60).start()
    try:
        wait_for(lambda: len(exporter.get_finished_spans()) >= 2, what="two attempts")
    finally:
        pipe.stop()
    # then each attempt is a CONSUMER span, the child of the message's context
    spans = {s.attributes["messaging.message.id"]: s for s in exporter.get_finished_spans()}
    for mid in (ok, bad):
        span = spans[mid]
        assert span.name == "process jobs" and span.kind.name == "CONSUMER"
        assert f"{span.context.trace_id:032x}" == TRACE_ID and f"{span.parent.span_id:016x}" == "53995c3f42cd8ad8"
        assert span.attributes["messaging.operation.type"] == "process"
        assert span.attributes["messaging.destination.name"] == "jobs"
    assert spans[ok].attributes["mq.outcome"] == "succeeded" and spans[ok].status.status_code.name == "UNSET"
    # and the failed one says why
    assert spans[bad].attributes["mq.outcome"] == "failed"
    assert spans[bad].attributes["error.type"] == "ValueError" and spans[bad].status.status_code.name == "ERROR"


def test_trace_context_is_added_only_where_it_fits():
    from queues.http.validation import MAX_ATTRIBUTES

    carried = {"traceparent": TRACEPARENT}
    assert tracing.MAX_ATTRIBUTES == MAX_ATTRIBUTES  # the API's limit: tracing never gets a call refused
    assert tracing.with_context(None, carried) == carried
    assert tracing.with_context({"k": "v"}, carried) == {"k": "v", **carried}
    own = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    assert tracing.with_context(own, carried) is own  # a message's own context is kept
    full = {f"a{i}": i for i in range(MAX_ATTRIBUTES)}
    assert tracing.with_context(full, carried) is full
    assert tracing.with_context({"k": "v"}, {}) == {"k": "v"}


def test_a_celery_task_carries_its_senders_context_only_when_tracing_is_on():
    from celery import Celery
    from celery.signals import after_task_publish

    from workers import celery_tracing

    app = Celery("traced", broker="memory://", set_as_current=False)
    sent: list[dict] = []

    def published(headers=None, **kwargs):
        sent.append(dict(headers))

    after_task_publish.connect(published, weak=False)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("shop")
    try:
        # with no SDK: no trace context, even inside a span
        assert celery_tracing.use(None) is False
        with tracer.start_as_current_span("checkout"):
            app.send_task("anything", (1,))
        # with one: the current span's
        assert celery_tracing.use(provider) is True
        with tracer.start_as_current_span("checkout") as span:
            app.send_task("anything", (2,))
        app.send_task("anything", (3,))  # no span current: nothing to carry
    finally:
        celery_tracing.use(None)
        after_task_publish.disconnect(published)
    ctx = span.get_span_context()
    parents = [h.get("traceparent") for h in sent]
    assert [p and p.split("-")[1:3] for p in parents] == [None, [f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"], None]
