"""The SQS JSON protocol's request decoding (``sqs.wire``): nesting is bounded."""

from __future__ import annotations

import json

import pytest

from sqs import wire
from sqs.errors import SQSError

HEADERS = {"x-amz-target": "AmazonSQS.SendMessageBatch"}


def _nested(depth: int) -> bytes:
    return b'{"Entries": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_the_deepest_sqs_input_decodes():
    entries = [{"Id": "a", "MessageAttributes": {"k": {"DataType": "String", "StringListValues": ["x"]}}}]
    assert wire.decode(HEADERS, json.dumps({"Entries": entries}).encode())[1]["Entries"] == entries
    assert wire.decode(HEADERS, _nested(wire.MAX_DEPTH))[0] == "SendMessageBatch"


@pytest.mark.parametrize("depth", [wire.MAX_DEPTH + 1, 5000, 200_000])
def test_nesting_past_the_bound_is_a_400(depth):
    with pytest.raises(SQSError) as exc:
        wire.decode(HEADERS, _nested(depth))
    assert (exc.value.code, exc.value.status) == ("MalformedQueryString", 400)


def test_a_body_that_is_no_object_is_refused():
    for body in (b"null", b"[]", b"3"):
        with pytest.raises(SQSError) as exc:
            wire.decode(HEADERS, body)
        assert exc.value.status == 400


def test_brackets_inside_strings_do_not_pass_for_nesting():
    # more brackets than the bound, all in text: walked, and taken
    body = json.dumps({"Entries": [{"Id": "a", "MessageBody": "[{" * 40}]}).encode()
    assert wire.decode(HEADERS, body)[1]["Entries"][0]["MessageBody"] == "[{" * 40
