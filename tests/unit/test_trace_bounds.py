"""Trace data in W3C's and X-Ray's forms and bounds (``mq_client.tracing``): what is taken,
what is cut as W3C says, what is dropped, and that OpenTelemetry never sees (and so never logs)
a value that is not W3C's."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.trace import get_current_span

from mq_client import tracing
from queues.http.validation import enqueue_request
from queues.service import InvalidRequest
from queues.service.types import QueueConfig

TRACE_ID = "5759e988bd862e3fe1be46a994272793"
PARENT = f"00-{TRACE_ID}-53995c3f42cd8ad8-01"
XRAY = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
FORGED = "k=v\n2025-01-01 00:00:00,000 ERROR queues forged line\x1b[2J"
CFG = QueueConfig(1, "q", 4, 256, 10, 30, 262_144, 86_400)


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (PARENT, True),
        (f"00-{TRACE_ID}-53995c3f42cd8ad8-00", True),
        (f"01-{TRACE_ID}-53995c3f42cd8ad8-01-more", True),  # a later version may add fields
        (f"00-{TRACE_ID}-53995c3f42cd8ad8-01-more", False),  # version 00 has exactly four
        (f"ff-{TRACE_ID}-53995c3f42cd8ad8-01", False),
        (f"00-{'0' * 32}-53995c3f42cd8ad8-01", False),
        (f"00-{TRACE_ID}-{'0' * 16}-01", False),
        (f"00-{TRACE_ID.upper()}-53995c3f42cd8ad8-01", False),  # W3C: lowercase hex
        (f" 00-{TRACE_ID}-53995c3f42cd8ad8-01", False),
        (f"00-{TRACE_ID}-53995c3f42cd8ad8-01\n", False),
        (f"01-{TRACE_ID}-53995c3f42cd8ad8-01-" + "a" * 500, False),  # over 512 characters
        ("", False),
    ],
)
def test_a_traceparent_is_w3cs(value, valid):
    assert tracing.valid_traceparent(value) is valid


def test_a_tracestate_is_kept_when_it_is_w3cs_and_cut_as_w3c_says():
    assert tracing.checked_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE") == (
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    )
    # spaces around members and empty members are allowed, and left out
    assert tracing.checked_tracestate(" rojo=1 ,, congo=2\t") == "rojo=1,congo=2"
    assert tracing.checked_tracestate("tenant@vendor=x") == "tenant@vendor=x"
    assert tracing.checked_tracestate("") == ""
    # over 512 characters: the members over 128 go first, then members from the end
    long = "big=" + "x" * 200
    small = [f"k{i}=" + "v" * 20 for i in range(20)]  # 20 members of 24: 499 with their commas
    cut = tracing.checked_tracestate(",".join([small[0], long, *small[1:]]))
    assert cut == ",".join(small)
    more = [f"k{i}=" + "v" * 20 for i in range(30)]  # 30 short members: 749 characters
    assert tracing.checked_tracestate(",".join(more)) == ",".join(more[:20])


@pytest.mark.parametrize(
    "value",
    [
        FORGED,
        "k=v\x1b[31m",
        "Upper=1",  # keys are lowercase
        "k=v,k=w",  # a key twice
        "k=",  # a value has at least one character
        "k=a,b",
        "k=v=w",
        ",".join(f"k{i}=v" for i in range(33)),  # over 32 members
        "k=" + "v" * 257,
        "x" * 9000,
    ],
)
def test_a_tracestate_that_is_not_w3cs_is_dropped_whole(value):
    assert tracing.checked_tracestate(value) is None


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (XRAY, True),
        ("Root=1-5759e988-bd862e3fe1be46a994272793", True),
        ("Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=?", True),
        ("Self=1-67891234-12456789abcdef012345678;Root=1-67891233-abcdef012345678912345678;CalledFrom=app", True),
        (XRAY + ";Lineage=a87bd80c:1|68fd508a:5|c512fbe3:2", True),
        ("Root=1-5759e988-bd862e3fe1be46a994272793; Parent=53995c3f42cd8ad8 ;", True),
        ("Parent=53995c3f42cd8ad8;Sampled=1", False),  # no Root
        ("Root=2-5759e988-bd862e3fe1be46a994272793", False),
        ("Root=1-abc", False),
        ("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=xyz", False),
        ("Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=yes", False),
        ("Root=1-5759e988-bd862e3fe1be46a994272793;Root=1-5759e988-bd862e3fe1be46a994272794", False),
        ("Root=1-5759e988-bd862e3fe1be46a994272793\nERROR forged", False),
        ("Root=1-5759e988-bd862e3fe1be46a994272793;Note=a b", False),
        (XRAY + ";Pad=" + "x" * 1000, False),  # over 1,024 characters
        ("garbage", False),
        ("", False),
    ],
)
def test_an_xray_header_is_xrays(value, valid):
    assert tracing.valid_xray(value) is valid


def test_an_xray_header_maps_only_when_valid():
    upper = "Root=1-5759E988-BD862E3FE1BE46A994272793;Parent=53995C3F42CD8AD8;Sampled=1"
    assert tracing.traceparent_of_xray(upper) == PARENT  # W3C's is lowercase
    assert tracing.traceparent_of_xray(XRAY + ";Pad=" + "x" * 1000) is None
    assert tracing.xray_of_traceparent(f"00-{'z' * 32}-53995c3f42cd8ad8-01") is None
    assert tracing.xray_of_traceparent("00-" + "\n" * 32 + "-53995c3f42cd8ad8-01") is None


def test_extract_gives_opentelemetry_only_w3c_values_and_so_logs_nothing(caplog):
    caplog.set_level(logging.DEBUG)
    # a malformed tracestate is dropped: the parent stands without it
    ctx = tracing.extract({"traceparent": PARENT, "tracestate": FORGED})
    sc = get_current_span(ctx).get_span_context()
    assert f"{sc.trace_id:032x}" == TRACE_ID and len(sc.trace_state) == 0
    # a valid one is kept
    ctx = tracing.extract({"traceparent": PARENT, "tracestate": "rojo=1"})
    assert dict(get_current_span(ctx).get_span_context().trace_state) == {"rojo": "1"}
    # a traceparent that is not W3C's is no context
    assert tracing.extract({"traceparent": PARENT + "\n" + FORGED}) is None
    assert tracing.extract({"traceparent": "x" * 600}) is None
    # and OpenTelemetry had nothing to warn about
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")], caplog.records


def test_injected_context_never_carries_a_tracestate_over_w3cs_limit():
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState, set_span_in_context

    members = [(f"k{i}", "v" * 30) for i in range(30)]  # about 1,000 characters
    span = SpanContext(int(TRACE_ID, 16), 0x53995C3F42CD8AD8, True, TraceFlags(1), TraceState(members))
    carrier: dict[str, str] = {}
    tracing.inject(carrier, set_span_in_context(NonRecordingSpan(span)))
    assert carrier["traceparent"] == PARENT
    assert len(carrier["tracestate"]) <= tracing.MAX_TRACESTATE
    assert carrier["tracestate"].startswith("k0=")  # members were cut from the end


@pytest.mark.parametrize(
    "attributes",
    [
        {"traceparent": "not a traceparent"},
        {"traceparent": 7},
        {"traceparent": PARENT, "tracestate": FORGED},
        {"tracestate": "k=" + "v" * 200 + "," + "m=" + "v" * 200 + "," + "n=" + "v" * 200},  # over 512
    ],
)
def test_a_rest_message_with_trace_context_not_w3cs_is_refused(attributes):
    with pytest.raises(InvalidRequest) as refused:
        enqueue_request({"body": "b", "attributes": attributes}, CFG, 0.0)
    assert refused.value.code == "invalid_attributes"
    assert "\n" not in str(refused.value.detail)


def test_a_rest_message_with_w3c_trace_context_is_taken_as_it_came():
    attributes = {"traceparent": PARENT, "tracestate": "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"}
    (draft,), _ = enqueue_request({"body": "b", "attributes": attributes}, CFG, 0.0)
    assert draft.attributes == attributes
    # a node's forwarded message was checked where it came in (an SQS message's attributes
    # are the producer's own: read as trace context only when they are W3C's)
    trusted = {"traceparent": "anything an SQS producer named so"}
    (draft,), _ = enqueue_request({"body": "b", "attributes": trusted}, CFG, 0.0, trusted=True)
    assert draft.attributes == trusted
