"""Trace data out of form and out of bounds, against a real node that traces (its spans as JSON
lines) on PostgreSQL + Redis:

- an ``AWSTraceHeader`` that is not an X-Ray header, or one of 900 KB on a queue whose messages
  may have 1,024 bytes, is ``InvalidParameterValue`` and nothing is stored; one of X-Ray's form
  is kept, outside the message's size, as SQS does;
- an ``X-Amzn-Trace-Id`` header that is not an X-Ray header (malformed, or over its bound) is
  dropped: the call's messages are stored without it;
- a ``tracestate`` that holds a line feed and a forged log line, or ANSI escapes, sent as a
  REST attribute (refused), as a REST header or as an SQS message attribute (dropped; the
  ``traceparent`` beside it still makes the trace), never reaches the node's log raw.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
from botocore.exceptions import ClientError
from rest_framework.authtoken.models import Token

from tests.integration.test_sqs_boto3 import _client, _name, _receive_all
from tests.launcher import wait_until

# One node for the module, which traces (TRACES_FILE: <MQ_DATA_DIR>/traces.jsonl).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.cluster,
    pytest.mark.django_db,
    pytest.mark.node(shared=True, env={"TRACES_EXPORT": "jsonl"}),
]

TRACE_ID = "5759e988bd862e3fe1be46a994272793"
SPAN_ID = "53995c3f42cd8ad8"
PARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"
XRAY = f"Root=1-{TRACE_ID[:8]}-{TRACE_ID[8:]};Parent={SPAN_ID};Sampled=1"
#: what a forged record would start with, were it written raw
FORGED_LINE = "2025-01-01 00:00:00 ERROR queues.api forged by a caller"  # (a comma would end the member)
#: a tracestate with a valid first member, a line feed and a forged record
FORGED = f"rojo=00f067aa0ba902b7\n{FORGED_LINE}"
#: a tracestate with ANSI escapes (clear the screen, red)
ANSI = "rojo=1\x1b[2J\x1b[31m"


@pytest.fixture(scope="module")
def rest_headers(committed, key) -> dict[str, str]:
    """The REST API's headers for the access key's user."""
    token = committed(lambda: Token.objects.create(user=key.user))
    return {"Authorization": f"Token {token.key}"}


def _with_header(sqs, name: str, value: str):
    """``sqs`` sending ``name: value`` with every call, unsigned (as SDKs send X-Amzn-Trace-Id)."""

    def add(request, **_kw):
        request.headers[name] = value

    sqs.meta.events.register("before-sign.sqs.*", add)
    return sqs


def _forged_in_log(node) -> list[str]:
    """The lines of the node's log that a caller wrote raw: a forged record, or ANSI escapes."""
    text = Path(node.log_path).read_text(errors="replace")
    return [line for line in text.splitlines() if line.startswith(FORGED_LINE) or "\x1b" in line]


def _spans(node) -> list[dict]:
    path = Path(node.env["MQ_DATA_DIR"]) / "traces.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _span(node, name: str) -> dict:
    wait_until(lambda: any(s["name"] == name for s in _spans(node)), 20, f"span {name!r}")
    return next(s for s in _spans(node) if s["name"] == name)


def _stored(node, rest_headers, url: str, expected: int) -> list[dict]:
    """The stored messages of the SQS queue at ``url``, read over the REST API (what SQS keeps
    of each is its attribute ``sqs:meta``)."""
    name = url.rsplit("/", 1)[1]
    got: list[dict] = []

    def more() -> bool:
        r = requests.post(
            f"{node.url}/api/v1/queues/{name}/dequeue", json={"max": 10}, headers=rest_headers, timeout=30
        )
        assert r.status_code == 200, r.text
        got.extend(r.json()["messages"])
        return len(got) >= expected

    wait_until(more, 30, f"{expected} messages")
    return got


def _code(exc: pytest.ExceptionInfo) -> tuple[str, int]:
    response = exc.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


# --- AWSTraceHeader -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header",
    [
        XRAY + ";Pad=" + "x" * 900_000,  # 900 KB on a queue of 1,024-byte messages
        "Root=1-abc",
        "not an x-ray header",
        XRAY + "\n" + FORGED_LINE,
    ],
)
def test_an_aws_trace_header_out_of_xrays_form_or_bound_is_refused_and_nothing_stored(sqs, header):
    # given a queue whose messages may have 1,024 bytes
    url = sqs.create_queue(QueueName=_name("trace"), Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    system = {"AWSTraceHeader": {"DataType": "String", "StringValue": header}}
    # when a one-byte message comes with that header, alone or in a batch
    with pytest.raises(ClientError) as refused:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageSystemAttributes=system)
    sent = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "bad", "MessageBody": "x", "MessageSystemAttributes": system},
            {"Id": "good", "MessageBody": "y"},
        ],
    )
    # then it is InvalidParameterValue, alone and as its batch entry, and only the other is stored
    assert _code(refused) == ("InvalidParameterValue", 400)
    assert "AWSTraceHeader" in refused.value.response["Error"]["Message"]
    assert len(refused.value.response["Error"]["Message"]) < 300  # (the value is not echoed)
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in sent["Failed"]] == [("bad", "InvalidParameterValue", True)]
    assert [s["Id"] for s in sent["Successful"]] == ["good"]
    got = _receive_all(sqs, url, 1, MessageSystemAttributeNames=["All"])
    assert [(m["Body"], "AWSTraceHeader" in m["Attributes"]) for m in got] == [("y", False)]
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    assert counts == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "1"}


def test_an_aws_trace_header_of_xrays_form_is_kept_outside_the_messages_size(sqs):
    # given a queue of 1,024-byte messages, and an X-Ray header of 1,024 characters with a
    # Lineage and a field of the caller's own
    url = sqs.create_queue(QueueName=_name("trace"), Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    header = XRAY + ";Lineage=a87bd80c:1|68fd508a:5;Pad="
    header += "p" * (1024 - len(header))
    # when a message of 1,024 bytes comes with it
    sqs.send_message(
        QueueUrl=url,
        MessageBody="b" * 1024,
        MessageSystemAttributes={"AWSTraceHeader": {"DataType": "String", "StringValue": header}},
    )
    # then it is stored, and the header comes back as it was sent
    (m,) = _receive_all(sqs, url, 1, MessageSystemAttributeNames=["AWSTraceHeader"])
    assert m["Attributes"]["AWSTraceHeader"] == header
    # but one character more is refused
    with pytest.raises(ClientError) as refused:
        sqs.send_message(
            QueueUrl=url,
            MessageBody="b",
            MessageSystemAttributes={"AWSTraceHeader": {"DataType": "String", "StringValue": header + "p"}},
        )
    assert _code(refused) == ("InvalidParameterValue", 400)


# --- X-Amzn-Trace-Id ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header",
    [
        XRAY + ";Pad=" + "x" * 2048,  # over the bound
        "Root=1-abc;Parent=53995c3f42cd8ad8",
        "garbage",
        "Root=1-5759e988-bd862e3fe1be46a994272793;Root=1-5759e988-bd862e3fe1be46a994272794",
    ],
)
def test_an_x_amzn_trace_id_header_out_of_xrays_form_is_dropped(node, key, rest_headers, header):
    # given a producer whose SDK sends an X-Amzn-Trace-Id header that is not X-Ray's
    sqs = _with_header(_client(node, key), "X-Amzn-Trace-Id", header)
    url = sqs.create_queue(QueueName=_name("trace"))["QueueUrl"]
    # when it sends a batch of 10
    sent = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": f"m{i}", "MessageBody": f"m{i}"} for i in range(10)])
    # then the messages are stored, none with the header
    assert len(sent["Successful"]) == 10 and not sent.get("Failed")
    stored = _stored(node, rest_headers, url, 10)
    assert len(stored) == 10
    assert [m for m in stored if "trace" in json.loads(m["attributes"]["sqs:meta"])] == []


def test_an_x_amzn_trace_id_header_of_500_kb_on_a_batch_is_never_copied_into_its_messages(node, key, rest_headers):
    # given a producer that sends a 500 KB X-Amzn-Trace-Id header (X-Ray's Root and Parent first)
    header = XRAY + ";Pad=" + "x" * 500_000
    url = _client(node, key).create_queue(QueueName=_name("trace"))["QueueUrl"]
    sqs = _with_header(_client(node, key), "X-Amzn-Trace-Id", header)
    # when it sends a batch of 10
    try:
        sent = sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": f"m{i}", "MessageBody": f"m{i}"} for i in range(10)]
        )
    except ClientError as exc:  # the node's front may refuse a header that large (a 4xx, unread)
        status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
        assert 400 <= status < 500, exc.response
        sent = {"Successful": []}
    # then whatever it stored carries none of the header (and nothing of 5 MB is stored)
    stored = _stored(node, rest_headers, url, len(sent["Successful"])) if sent["Successful"] else []
    assert len(stored) == len(sent["Successful"])
    assert [m for m in stored if "trace" in json.loads(m["attributes"]["sqs:meta"])] == []


# --- tracestate and the node's log --------------------------------------------------------------
@pytest.mark.parametrize("state", [FORGED, ANSI])
def test_a_rest_message_whose_tracestate_is_not_w3cs_is_refused_and_nothing_logged(node, rest_headers, state):
    # given a queue
    queue = _name("trace")
    r = requests.post(
        f"{node.url}/api/v1/queues", json={"name": queue, "partitions": 1}, headers=rest_headers, timeout=30
    )
    assert r.status_code == 201, r.text
    # when a message comes with a traceparent and a tracestate attribute that forges a log line
    message = {"body": "hi", "attributes": {"traceparent": PARENT, "tracestate": state}}
    r = requests.post(f"{node.url}/api/v1/queues/{queue}/enqueue", json=message, headers=rest_headers, timeout=30)
    # then it is refused, nothing is stored, and the node's log has nothing of it raw
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "invalid_attributes"
    r = requests.post(f"{node.url}/api/v1/queues/{queue}/dequeue", json={"max": 10}, headers=rest_headers, timeout=30)
    assert r.status_code == 200 and r.json()["messages"] == [], r.text
    assert _forged_in_log(node) == []


def test_a_rest_tracestate_header_not_w3cs_is_dropped_and_nothing_logged(node, rest_headers):
    # given a queue
    queue = _name("trace")
    r = requests.post(
        f"{node.url}/api/v1/queues", json={"name": queue, "partitions": 1}, headers=rest_headers, timeout=30
    )
    assert r.status_code == 201, r.text
    # when a producer sends a traceparent header and a tracestate header that is not W3C's
    # (a header cannot hold a line feed: a member with spaces and capitals stands for it)
    headers = {**rest_headers, "traceparent": PARENT, "tracestate": "rojo=1,ERROR queues.api forged by a caller"}
    r = requests.post(f"{node.url}/api/v1/queues/{queue}/enqueue", json={"body": "hi"}, headers=headers, timeout=30)
    # then the message is stored in the producer's trace, without the tracestate
    assert r.status_code == 201, r.text
    enqueue = _span(node, f"enqueue {queue}")
    assert (enqueue["trace_id"], enqueue["parent_id"]) == (TRACE_ID, SPAN_ID)
    r = requests.post(f"{node.url}/api/v1/queues/{queue}/dequeue", json={"max": 1}, headers=rest_headers, timeout=30)
    (got,) = r.json()["messages"]
    assert got["attributes"] == {"traceparent": f"00-{TRACE_ID}-{enqueue['span_id']}-01"}
    # and nothing of it reached the node's log (OpenTelemetry had nothing to warn about)
    assert "forged by a caller" not in Path(node.log_path).read_text(errors="replace")


def test_a_rest_header_with_ansi_escapes_is_refused_and_nothing_logged(node, rest_headers):
    # given a queue
    queue = _name("trace")
    r = requests.post(
        f"{node.url}/api/v1/queues", json={"name": queue, "partitions": 1}, headers=rest_headers, timeout=30
    )
    assert r.status_code == 201, r.text
    # when a producer sends a tracestate header with ANSI escapes (no HTTP header text)
    headers = {**rest_headers, "traceparent": PARENT, "tracestate": ANSI}
    r = requests.post(f"{node.url}/api/v1/queues/{queue}/enqueue", json={"body": "hi"}, headers=headers, timeout=30)
    # then the node's front refuses the request, nothing is stored, nothing is logged raw
    assert r.status_code == 400, r.text
    r = requests.post(f"{node.url}/api/v1/queues/{queue}/dequeue", json={"max": 1}, headers=rest_headers, timeout=30)
    assert r.status_code == 200 and r.json()["messages"] == [], r.text
    assert _forged_in_log(node) == []


def test_an_sqs_message_whose_tracestate_forges_a_log_line_keeps_its_trace_and_nothing_is_logged(node, sqs):
    # given a queue
    url = sqs.create_queue(QueueName=_name("trace"))["QueueUrl"]
    name = url.rsplit("/", 1)[1]
    # when a message comes with traceparent and tracestate attributes (as OpenTelemetry's SQS
    # instrumentation sends them), the tracestate holding a line feed and a forged record
    attributes = {
        "traceparent": {"DataType": "String", "StringValue": PARENT},
        "tracestate": {"DataType": "String", "StringValue": FORGED},
    }
    sqs.send_message(QueueUrl=url, MessageBody="hi", MessageAttributes=attributes)
    # then it is stored as sent (the attributes are the producer's), the node's enqueue continues
    # its traceparent, and its receive links to it
    (m,) = _receive_all(sqs, url, 1, MessageAttributeNames=["All"], MessageSystemAttributeNames=["AWSTraceHeader"])
    assert m["MessageAttributes"]["tracestate"]["StringValue"] == FORGED
    assert m["Attributes"]["AWSTraceHeader"] == XRAY
    enqueue = _span(node, f"enqueue {name}")
    assert (enqueue["trace_id"], enqueue["parent_id"]) == (TRACE_ID, SPAN_ID)
    wait_until(lambda: any(s["name"] == f"dequeue {name}" and s["links"] for s in _spans(node)), 20, "the receive")
    (dequeue,) = [s for s in _spans(node) if s["name"] == f"dequeue {name}" and s["links"]]
    assert dequeue["links"] == [f"{TRACE_ID}-{SPAN_ID}"]
    # and the node's log has nothing of the tracestate raw
    assert _forged_in_log(node) == []
    # (ANSI escapes are no SQS text at all)
    ansi = {"tracestate": {"DataType": "String", "StringValue": ANSI}}
    with pytest.raises(ClientError) as refused:
        sqs.send_message(QueueUrl=url, MessageBody="hi", MessageAttributes=ansi)
    assert _code(refused)[0] == "InvalidMessageContents"
