"""SQS's bounds: where a bound is the service's rule (a queue field's range, a visibility
timeout), the SQS API takes it from the service's ``LIMITS``, so the two cannot drift apart;
only SQS's own bounds (AWS's) are its constants.

The service is stubbed (any queue exists, a change of visibility succeeds): what is tested is
the SQS API's check of a call, not the service.
"""

from __future__ import annotations

import base64
from types import SimpleNamespace

import pytest

from queues import service
from queues.access import SYSTEM
from queues.public import LIMITS
from sqs import actions, attributes
from sqs.context import Context
from sqs.errors import SQSError
from sqs.query import INVALID_CHARS, valid_text

CTX = Context(caller=SYSTEM, base_url="http://node/sqs", account="000000000000", region="eu-west-1")
MESSAGE_ID = "q/0/0123abcd-0123456789abcdef/7"


@pytest.fixture
def changes(monkeypatch) -> list[float]:
    """Every queue exists; the timeouts of the changes of visibility the service was asked for."""
    asked: list[float] = []
    monkeypatch.setattr(service, "get_queue", lambda name, *, caller: SimpleNamespace(name=name, strict=False))
    monkeypatch.setattr(
        service,
        "authorize",
        lambda name, right, *, caller: (SimpleNamespace(name=name, strict=False, kind="queue"), ""),
    )
    monkeypatch.setattr(
        service, "change_visibility", lambda queue, mid, receipt, timeout, *, caller: asked.append(timeout)
    )
    return asked


def _change_visibility(timeout: int) -> dict:
    handle = base64.urlsafe_b64encode(f"{MESSAGE_ID}\nreceipt-1".encode()).decode()
    params = {"QueueUrl": "http://node/sqs/000000000000/q", "ReceiptHandle": handle, "VisibilityTimeout": timeout}
    return actions.run("ChangeMessageVisibility", params, CTX)


def test_a_visibility_timeout_is_bounded_by_the_services_limit(changes, monkeypatch):
    low, high = LIMITS["visibility_timeout"]
    _change_visibility(high)
    assert changes == [float(high)]
    with pytest.raises(SQSError) as exc:
        _change_visibility(high + 1)
    assert exc.value.code == "InvalidParameterValue"

    # the service's limit is the one rule: a change of it is the SQS API's bound at once
    monkeypatch.setitem(LIMITS, "visibility_timeout", (low, 60))
    with pytest.raises(SQSError) as exc:
        _change_visibility(61)
    assert exc.value.code == "InvalidParameterValue"
    assert "between 0 and 60" in exc.value.message
    assert changes == [float(high)]


def test_the_queue_attributes_are_bounded_as_the_queue_fields():
    bounds = {field: (low, high) for field, low, high in attributes.QUEUE_FIELDS.values()}
    for field in ("visibility_timeout", "retention", "delay"):
        assert bounds[field] == LIMITS[field]
    # SQS's smallest maximum message size is its own, its largest the service's
    assert bounds["max_message_size"] == (attributes.MIN_MESSAGE_SIZE, LIMITS["max_message_size"][1])


def test_valid_text_is_the_pattern_s_answer():
    # printable ASCII is told without the pattern; everything else by it
    points = [*range(0x80), 0xA0, 0xD7FF, 0xD800, 0xDFFF, 0xE000, 0xFFFD, 0xFFFE, 0xFFFF, 0x10000, 0x10FFFF]
    for p in points:
        for text in (chr(p), f"ab{chr(p)}cd"):
            assert valid_text(text) == (INVALID_CHARS.search(text) is None), hex(p)
