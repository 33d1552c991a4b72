"""The SQS JSON protocol's request decoding (``sqs.wire``): nesting is bounded, in a body and
in the JSON texts inside its parameters; integer parameters (``sqs.context``) are read
without Python's 4,300-digit limit ever being met."""

from __future__ import annotations

import json

import pytest

from sqs import wire
from sqs.context import integer_of, integer_param
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


# --- JSON texts inside parameters, integers past Python's digit limit --------------------------
@pytest.mark.parametrize("depth", [wire.MAX_DEPTH + 1, 5_000])
def test_json_text_nested_past_the_bound_is_too_deep_not_a_recursion_error(depth):
    for text in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
        with pytest.raises(wire.TooDeep):
            wire.loads(text)
        with pytest.raises(ValueError):  # (TooDeep is a ValueError: what callers catch already)
            wire.loads(text.encode())


def test_json_text_within_the_bound_is_json_loads_answer():
    text = '{"deadLetterTargetArn": "arn:aws:sqs:r:1:q", "maxReceiveCount": 5, "x": [[["é"]]]}'
    assert wire.loads(text) == json.loads(text)
    assert wire.loads("[" * wire.MAX_DEPTH + "]" * wire.MAX_DEPTH) is not None
    assert wire.loads('"[[[[[[[[[[[[[[[[[[[[[[["') == "[" * 23  # brackets in text nest nothing


def test_an_integer_past_the_digit_limit_is_a_huge_integer_in_a_body_and_not_json_elsewhere():
    body = b'{"MaxNumberOfMessages": ' + b"9" * 4_301 + b"}"
    params = wire.decode({"x-amz-target": "AmazonSQS.ReceiveMessage"}, body)[1]
    huge = params["MaxNumberOfMessages"]
    assert isinstance(huge, wire.HugeInteger) and not isinstance(huge, int | str)
    assert str(huge) == "9999999999999999...(4301 digits)"
    with pytest.raises(ValueError):
        wire.loads(body)


@pytest.mark.parametrize(
    ("value", "number"),
    [
        (7, 7),
        ("7", 7),
        (" 7 ", 7),
        ("-3", -3),
        ("0" * 40 + "1", 1),
        (True, None),
        (1.0, None),
        ("1.0", None),
        ("²", None),  # str.isdigit() says yes; int() refused it (a 500)
        ("٣", None),  # int() takes it; SQS does not
        ("1_000", None),
        ("9" * 33, None),  # past any range: never converted
        ("9" * 4_301, None),  # int() refused it (a 500)
        (wire.HugeInteger("9" * 4_301), None),
        (None, None),
    ],
)
def test_an_integer_parameter_is_ascii_digits_or_an_int(value, number):
    assert integer_of(value) == number


def test_an_integer_parameter_past_its_range_is_invalid_and_quoted_short():
    with pytest.raises(SQSError) as exc:
        integer_param({"MaxNumberOfMessages": "9" * 4_301}, "MaxNumberOfMessages", 1, 10)
    assert exc.value.code == "InvalidParameterValue" and len(exc.value.message) < 200
