"""The query-protocol codec (``sqs.query``) against botocore's own query serializer and parser:
what botocore sends decodes to what its JSON protocol would send, what we encode botocore reads
back as the result, and our errors parse into SQS's query codes."""

from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import botocore.session
import pytest
from botocore.model import ServiceModel
from botocore.parsers import create_parser
from botocore.serialize import create_serializer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sqs import query, query_shapes

_spec = importlib.util.spec_from_file_location(
    "gen_sqs_query_shapes", Path(__file__).resolve().parents[2] / "scripts" / "gen_sqs_query_shapes.py"
)
assert _spec and _spec.loader
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

RAW = botocore.session.get_session().get_component("data_loader").load_service_model("sqs", "service-2")
JSON_MODEL = ServiceModel(RAW, service_name="sqs")
QUERY_MODEL = ServiceModel(gen.query_model(RAW), service_name="sqs")
QUEUE_URL = "http://127.0.0.1:8000/sqs/000000000000/orders"


def query_form(action: str, params: dict[str, Any]) -> dict[str, list[str]]:
    """The form botocore's query serializer sends for ``params``."""
    request = create_serializer("query", include_validation=False).serialize_to_request(
        params, QUERY_MODEL.operation_model(action)
    )
    body = request["body"]
    if isinstance(body, dict):  # botocore leaves the dict for the HTTP layer to urlencode
        return {key: [str(value)] for key, value in body.items()}
    return parse_qs(body if isinstance(body, str) else body.decode(), keep_blank_values=True)


def json_params(action: str, params: dict[str, Any]) -> dict[str, Any]:
    """The params botocore's JSON protocol sends for ``params``: the canonical form."""
    request = create_serializer("json", include_validation=False).serialize_to_request(
        params, JSON_MODEL.operation_model(action)
    )
    return json.loads(request["body"] or b"{}")


def without_empty(shape, value, kinds=("list", "map")):
    """``value`` without the structure members of ``kinds`` that are empty: the query protocol
    sends no key for an empty map, and answers with no element for an empty list or map, so
    those read back as absent (an empty list in a request is sent, as ``Name=``)."""
    if shape.type_name == "structure":
        return {
            name: without_empty(shape.members[name], item, kinds)
            for name, item in value.items()
            if not (shape.members[name].type_name in kinds and not item)
        }
    if shape.type_name == "list":
        return [without_empty(shape.member, item, kinds) for item in value]
    if shape.type_name == "map":
        return {key: without_empty(shape.value, item, kinds) for key, item in value.items()}
    return value


# -- the static description -----------------------------------------------------------------


def test_the_committed_shapes_are_what_the_script_makes_of_botocores_model():
    described = gen.describe(gen.query_model(RAW))
    assert described["OPERATIONS"] == query_shapes.OPERATIONS
    assert described["SHAPES"] == query_shapes.SHAPES
    assert described["ERROR_CODES"] == query_shapes.ERROR_CODES
    assert set(query_shapes.OPERATIONS) == set(JSON_MODEL.operation_names)


def test_the_runtime_codec_does_not_import_botocore():
    # botocore is a development dependency only: a fresh interpreter imports the codec without it.
    code = "import sys, sqs.query; sys.exit('botocore' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2]).returncode == 0


# -- requests: a realistic call of every operation ------------------------------------------

ENTRY_ATTRIBUTES = {
    "trace": {"DataType": "String", "StringValue": "abc-1"},
    "weight": {"DataType": "Number", "StringValue": "12.5"},
    "raw": {"DataType": "Binary", "BinaryValue": b"\x00\xffpayload"},
}
REALISTIC = {
    "AddPermission": {
        "QueueUrl": QUEUE_URL,
        "Label": "l1",
        "AWSAccountIds": ["111", "222"],
        "Actions": ["SendMessage"],
    },
    "CancelMessageMoveTask": {"TaskHandle": "handle-1"},
    "ChangeMessageVisibility": {"QueueUrl": QUEUE_URL, "ReceiptHandle": "rh-1", "VisibilityTimeout": 60},
    "ChangeMessageVisibilityBatch": {
        "QueueUrl": QUEUE_URL,
        "Entries": [{"Id": "a", "ReceiptHandle": "rh-1", "VisibilityTimeout": 0}, {"Id": "b", "ReceiptHandle": "rh-2"}],
    },
    "CreateQueue": {
        "QueueName": "orders.fifo",
        "Attributes": {"FifoQueue": "true", "VisibilityTimeout": "45", "RedrivePolicy": '{"maxReceiveCount":"3"}'},
        "tags": {"team": "payments", "env": "test"},
    },
    "DeleteMessage": {"QueueUrl": QUEUE_URL, "ReceiptHandle": "rh-1"},
    "DeleteMessageBatch": {
        "QueueUrl": QUEUE_URL,
        "Entries": [{"Id": str(i), "ReceiptHandle": f"rh-{i}"} for i in range(10)],
    },
    "DeleteQueue": {"QueueUrl": QUEUE_URL},
    "GetQueueAttributes": {"QueueUrl": QUEUE_URL, "AttributeNames": ["All"]},
    "GetQueueUrl": {"QueueName": "orders", "QueueOwnerAWSAccountId": "000000000000"},
    "ListDeadLetterSourceQueues": {"QueueUrl": QUEUE_URL, "NextToken": "t", "MaxResults": 10},
    "ListMessageMoveTasks": {"SourceArn": "arn:aws:sqs:us-east-1:000000000000:dlq", "MaxResults": 5},
    "ListQueueTags": {"QueueUrl": QUEUE_URL},
    "ListQueues": {"QueueNamePrefix": "ord", "MaxResults": 100, "NextToken": "n1"},
    "PurgeQueue": {"QueueUrl": QUEUE_URL},
    "ReceiveMessage": {
        "QueueUrl": QUEUE_URL,
        "AttributeNames": ["All"],
        "MessageSystemAttributeNames": ["ApproximateReceiveCount", "SentTimestamp"],
        "MessageAttributeNames": ["All"],
        "MaxNumberOfMessages": 10,
        "VisibilityTimeout": 30,
        "WaitTimeSeconds": 20,
        "ReceiveRequestAttemptId": "attempt-1",
    },
    "RemovePermission": {"QueueUrl": QUEUE_URL, "Label": "l1"},
    "SendMessage": {
        "QueueUrl": QUEUE_URL,
        "MessageBody": "héllo\r\n<&>",
        "DelaySeconds": 5,
        "MessageAttributes": ENTRY_ATTRIBUTES,
        "MessageSystemAttributes": {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-abc"}},
        "MessageDeduplicationId": "d1",
        "MessageGroupId": "g1",
    },
    "SendMessageBatch": {
        "QueueUrl": QUEUE_URL,
        "Entries": [
            {"Id": f"m{i}", "MessageBody": f"body {i}", "DelaySeconds": i, "MessageAttributes": ENTRY_ATTRIBUTES}
            for i in range(10)
        ],
    },
    "SetQueueAttributes": {"QueueUrl": QUEUE_URL, "Attributes": {"DelaySeconds": "0", "Policy": "{}"}},
    "StartMessageMoveTask": {"SourceArn": "arn:aws:sqs:us-east-1:000000000000:dlq", "MaxNumberOfMessagesPerSecond": 50},
    "TagQueue": {"QueueUrl": QUEUE_URL, "Tags": {"team": "payments"}},
    "UntagQueue": {"QueueUrl": QUEUE_URL, "TagKeys": ["team", "env"]},
}


def test_every_operation_has_a_realistic_call():
    assert set(REALISTIC) == set(JSON_MODEL.operation_names)


@pytest.mark.parametrize("action", sorted(REALISTIC))
def test_what_botocore_sends_over_query_decodes_to_what_it_sends_over_json(action):
    # given
    params = REALISTIC[action]
    # when
    decoded_action, decoded = query.decode(query_form(action, params))
    # then
    assert decoded_action == action
    assert decoded == json_params(action, params)


def test_the_wire_names_are_sqs_own():
    form = query_form("SendMessageBatch", REALISTIC["SendMessageBatch"])
    assert form["SendMessageBatchRequestEntry.2.Id"] == ["m1"]
    assert form["SendMessageBatchRequestEntry.2.MessageAttribute.1.Name"] == ["trace"]
    assert form["SendMessageBatchRequestEntry.2.MessageAttribute.1.Value.DataType"] == ["String"]
    assert form["SendMessageBatchRequestEntry.2.MessageAttribute.3.Value.BinaryValue"] == [
        base64.b64encode(b"\x00\xffpayload").decode()
    ]
    form = query_form("CreateQueue", REALISTIC["CreateQueue"])
    assert form["Attribute.1.Name"] == ["FifoQueue"] and form["Attribute.1.Value"] == ["true"]
    assert form["Tag.1.Key"] == ["team"] and form["Tag.1.Value"] == ["payments"]
    assert query_form("GetQueueAttributes", REALISTIC["GetQueueAttributes"])["AttributeName.1"] == ["All"]
    assert query_form("DeleteMessageBatch", REALISTIC["DeleteMessageBatch"])[
        "DeleteMessageBatchRequestEntry.10.Id"
    ] == ["9"]
    assert query_form("UntagQueue", REALISTIC["UntagQueue"])["TagKey.2"] == ["env"]
    assert query_form("TagQueue", REALISTIC["TagQueue"])["Tag.1.Key"] == ["team"]


def test_a_hand_written_form_decodes_typed_and_in_index_order():
    # given: entries out of order, numbers as text, a QueryDict-like dict of lists
    form = {
        "Action": ["ChangeMessageVisibilityBatch"],
        "Version": ["2012-11-05"],
        "QueueUrl": [QUEUE_URL],
        "ChangeMessageVisibilityBatchRequestEntry.2.Id": ["b"],
        "ChangeMessageVisibilityBatchRequestEntry.2.ReceiptHandle": ["rh-2"],
        "ChangeMessageVisibilityBatchRequestEntry.10.Id": ["c"],
        "ChangeMessageVisibilityBatchRequestEntry.10.ReceiptHandle": ["rh-3"],
        "ChangeMessageVisibilityBatchRequestEntry.1.Id": ["a"],
        "ChangeMessageVisibilityBatchRequestEntry.1.ReceiptHandle": ["rh-1"],
        "ChangeMessageVisibilityBatchRequestEntry.1.VisibilityTimeout": ["15"],
    }
    # when
    action, params = query.decode(form)
    # then
    assert action == "ChangeMessageVisibilityBatch"
    assert params == {
        "QueueUrl": QUEUE_URL,
        "Entries": [
            {"Id": "a", "ReceiptHandle": "rh-1", "VisibilityTimeout": 15},
            {"Id": "b", "ReceiptHandle": "rh-2"},
            {"Id": "c", "ReceiptHandle": "rh-3"},
        ],
    }


def test_a_django_querydict_decodes():
    from django.http import QueryDict

    form = QueryDict("Action=ReceiveMessage&QueueUrl=u&MaxNumberOfMessages=3&MessageAttributeName.1=All")
    assert query.decode(form) == (
        "ReceiveMessage",
        {"QueueUrl": "u", "MaxNumberOfMessages": 3, "MessageAttributeNames": ["All"]},
    )


@pytest.mark.parametrize(
    ("form", "code"),
    [
        ({"QueueUrl": ["u"]}, "MissingAction"),
        ({"Action": ["DropEverything"]}, "InvalidAction"),
        ({"Action": ["ReceiveMessage"], "QueueUrl": ["u"], "MaxNumberOfMessages": ["ten"]}, "InvalidParameterValue"),
        (
            {"Action": ["SendMessage"], "QueueUrl": ["u"], "MessageBody": ["b"], "MessageAttribute.1.Name": ["n"]},
            "MissingParameter",
        ),
        (
            {
                "Action": ["SendMessage"],
                "QueueUrl": ["u"],
                "MessageBody": ["b"],
                "MessageAttribute.1.Name": ["n"],
                "MessageAttribute.1.Value.DataType": ["Binary"],
                "MessageAttribute.1.Value.BinaryValue": ["not base64!"],
            },
            "InvalidParameterValue",
        ),
    ],
)
def test_a_form_it_cannot_read_is_a_sender_error(form, code):
    with pytest.raises(query.QueryError) as raised:
        query.decode(form)
    assert raised.value.code == code
    assert raised.value.status == 400 and raised.value.sender_fault


def test_at_a_queue_url_the_queue_is_the_path_s_unless_the_form_names_one():
    other = QUEUE_URL.replace("orders", "invoices")
    # an action on a queue, sent to the queue's URL with no QueueUrl: the URL's
    assert query.decode({"Action": "SendMessage", "MessageBody": "b"}, QUEUE_URL) == (
        "SendMessage",
        {"QueueUrl": QUEUE_URL, "MessageBody": "b"},
    )
    assert query.decode({"Action": "DeleteQueue"}, QUEUE_URL) == ("DeleteQueue", {"QueueUrl": QUEUE_URL})
    # one the form names wins, as in SQS
    assert query.decode({"Action": "PurgeQueue", "QueueUrl": other}, QUEUE_URL) == ("PurgeQueue", {"QueueUrl": other})
    # GetQueueUrl is served at any queue's URL, of any queue; it takes no QueueUrl
    assert query.decode({"Action": "GetQueueUrl", "QueueName": "invoices"}, QUEUE_URL) == (
        "GetQueueUrl",
        {"QueueName": "invoices"},
    )
    # at the service's endpoint, nothing is added: a missing QueueUrl is the action's to refuse
    assert query.decode({"Action": "DeleteQueue"}) == ("DeleteQueue", {})


@pytest.mark.parametrize("action", sorted(query.NOT_AT_A_QUEUE_URL))
def test_an_action_on_no_queue_is_invalid_at_a_queue_url(action):
    form = {"Action": action, "QueueName": "q"}
    with pytest.raises(query.QueryError) as raised:
        query.decode(form, QUEUE_URL)
    assert (raised.value.code, raised.value.status) == ("InvalidAction", 400)
    assert raised.value.message == f"The action {action} is not valid for this endpoint."
    # and served at the service's endpoint
    assert query.decode(form)[0] == action


def test_a_queue_that_does_not_exist_is_worded_as_sqs_words_it_in_this_protocol():
    body = query.encode_error("QueueDoesNotExist", "The specified queue does not exist.", True, "req-q")
    parsed = parse_query("GetQueueAttributes", body, status=400)
    assert parsed["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert parsed["Error"]["Message"] == "The specified queue does not exist for this wsdl version."


# -- generated values for any shape -----------------------------------------------------------

# SQS bodies and attribute values are XML characters (#x9 | #xA | #xD | #x20-#xD7FF | ...).
TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"), exclude_characters="\ufffe\uffff")
    | st.sampled_from("\t\n\r"),
    max_size=12,
)


def values_of(shape, depth=0):
    """A hypothesis strategy for Python values of a botocore shape, as a botocore client takes them."""
    kind = shape.type_name
    if kind == "structure":
        members = {name: values_of(member, depth + 1) for name, member in shape.members.items()}
        required = {name: members.pop(name) for name in shape.required_members}
        return st.fixed_dictionaries(required, optional=members)
    if kind == "list":
        return st.lists(values_of(shape.member, depth + 1), max_size=3 if depth < 3 else 1)
    if kind == "map":
        return st.dictionaries(TEXT, values_of(shape.value, depth + 1), max_size=3)
    if kind == "integer":
        return st.integers(-(2**31), 2**31 - 1)
    if kind == "long":
        return st.integers(-(2**63), 2**63 - 1)
    if kind == "boolean":
        return st.booleans()
    if kind == "blob":
        return st.binary(max_size=12)
    assert kind == "string", kind
    return TEXT


def json_shaped(value):
    """A client-side value as the JSON protocol carries it: blobs as base64 text."""
    if isinstance(value, dict):
        return {k: json_shaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_shaped(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("action", sorted(REALISTIC))
@SETTINGS
@given(data=st.data())
def test_any_request_botocore_sends_over_query_decodes_to_its_json_params(action, data):
    input_shape = JSON_MODEL.operation_model(action).input_shape
    params = data.draw(values_of(input_shape))
    expected = without_empty(input_shape, json_params(action, params), kinds=("map",))
    assert query.decode(query_form(action, params)) == (action, expected)


OUTPUT_ACTIONS = sorted(a for a in REALISTIC if JSON_MODEL.operation_model(a).output_shape is not None)


def parse_query(action: str, body: bytes, status: int = 200) -> dict[str, Any]:
    response = {"body": body, "headers": {}, "status_code": status}
    return create_parser("query").parse(response, QUERY_MODEL.operation_model(action).output_shape)


@pytest.mark.parametrize("action", OUTPUT_ACTIONS)
@SETTINGS
@given(data=st.data())
def test_any_result_encoded_is_read_back_by_botocores_query_parser(action, data):
    # given: a result in the JSON protocol's shape
    output_shape = JSON_MODEL.operation_model(action).output_shape
    result = data.draw(values_of(output_shape))
    # when
    parsed = parse_query(action, query.encode(action, json_shaped(result), "req-1"))
    # then
    assert parsed.pop("ResponseMetadata")["RequestId"] == "req-1"
    assert parsed == without_empty(output_shape, result)


def test_a_receive_answers_as_sqs_does():
    result = {
        "Messages": [
            {
                "MessageId": "m1",
                "ReceiptHandle": "rh",
                "MD5OfBody": "5d41402abc4b2a76b9719d911017c592",
                "Body": "hello",
                "Attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000"},
                "MessageAttributes": {"raw": {"DataType": "Binary", "BinaryValue": base64.b64encode(b"\x01").decode()}},
            }
        ]
    }
    body = query.encode("ReceiveMessage", result, "r-9").decode()
    assert body.startswith(
        '<?xml version="1.0"?><ReceiveMessageResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/">'
    )
    assert "<ReceiveMessageResult><Message><MessageId>m1</MessageId>" in body
    assert "<Attribute><Name>ApproximateReceiveCount</Name><Value>1</Value></Attribute>" in body
    assert (
        "<MessageAttribute><Name>raw</Name><Value><BinaryValue>AQ==</BinaryValue><DataType>Binary</DataType></Value>"
        in body
    )
    assert body.endswith("<ResponseMetadata><RequestId>r-9</RequestId></ResponseMetadata></ReceiveMessageResponse>")
    assert (
        parse_query("ReceiveMessage", body.encode())["Messages"][0]["MessageAttributes"]["raw"]["BinaryValue"]
        == b"\x01"
    )


def test_an_action_without_a_result_answers_with_its_metadata():
    body = query.encode("DeleteQueue", {}, "r-1")
    assert body.decode().endswith(
        '<DeleteQueueResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/">'
        "<ResponseMetadata><RequestId>r-1</RequestId></ResponseMetadata></DeleteQueueResponse>"
    )
    assert parse_query("DeleteQueue", body)["ResponseMetadata"]["RequestId"] == "r-1"


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", sorted(s.name for s in QUERY_MODEL.error_shapes))
def test_every_modelled_error_parses_into_its_query_code(shape):
    # given: the JSON protocol's code, which is the error shape's name
    expected = QUERY_MODEL.shape_for(shape).metadata["error"]["code"]
    # when
    body = query.encode_error(shape, "it went <wrong> & stayed", True, "req-e")
    parsed = parse_query("SendMessage", body, status=400)
    # then
    assert parsed["Error"]["Code"] == expected == query.query_error_code(shape)
    assert parsed["Error"]["Message"] == "it went <wrong> & stayed"
    assert parsed["Error"]["Type"] == "Sender"
    assert parsed["ResponseMetadata"]["RequestId"] == "req-e"


@pytest.mark.parametrize(
    ("code", "query_code"),
    [
        ("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"),
        ("QueueNameExists", "QueueAlreadyExists"),
        ("TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
        ("BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
        ("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid"),
        ("InvalidParameterValue", "InvalidParameterValue"),
        ("AWS.SimpleQueueService.NonExistentQueue", "AWS.SimpleQueueService.NonExistentQueue"),
    ],
)
def test_the_query_codes_sqs_clients_know(code, query_code):
    assert query.query_error_code(code) == query_code


def test_a_receiver_fault_says_so():
    body = query.encode_error("InternalFailure", "store down", False, "req-5")
    assert b"<Type>Receiver</Type><Code>InternalFailure</Code><Message>store down</Message><Detail/>" in body
    assert parse_query("SendMessage", body, status=500)["Error"]["Type"] == "Receiver"


# --- the form parser ------------------------------------------------------------------------------
_FORM_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_FORM_TEXT, _FORM_TEXT), max_size=8))
def test_a_form_is_read_as_django_reads_it(pairs):
    """Any form botocore (or a browser) encodes reads as Django's QueryDict reads it."""
    from urllib.parse import urlencode

    from django.http import QueryDict

    body = urlencode(pairs).encode("ascii")
    assert query.parse_form(body) == QueryDict(body).dict()


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"a",
        b"a=",
        b"=b",
        b"&&a=1&&",
        b"a=1&a=2",
        b"a=%zz&b=%4&c=%",
        b"a=%41%42c%43+d%2B",
        b"k%C3%A9y=%E4%B8%AD%E6%96%87",
        b"bad=%FF%FE",
        b"a=b=c",
        b"a=\\x41%41\\%5C&b=\\n%5Cn",
        b"a=%C3%A9%ZZ%C3%A9",
    ],
)
def test_the_form_parser_keeps_djangos_reading_at_the_edges(body):
    from django.http import QueryDict

    assert query.parse_form(body) == QueryDict(body).dict()


def test_a_form_over_the_field_limit_is_refused():
    assert query.parse_form(b"a=1&b=2", max_fields=2) == {"a": "1", "b": "2"}
    with pytest.raises(query.QueryError) as exc:
        query.parse_form(b"a=1&b=2&c=3", max_fields=2)
    assert (exc.value.code, exc.value.status) == ("MalformedQueryString", 400)


def test_a_non_ascii_body_of_a_megabyte_reads_back_whole():
    from urllib.parse import quote_plus

    text = "é中 a+b%" * 40_000
    assert query.parse_form(b"MessageBody=" + quote_plus(text).encode()) == {"MessageBody": text}


@pytest.mark.parametrize(
    "options, charset",
    [
        ("", "utf-8"),
        ("; charset=utf-8", "utf-8"),
        ('; Charset="ISO-8859-1"', "iso8859-1"),
        ("; charset=no-such-thing", "utf-8"),
        # codecs that are no text encoding, or do not write ASCII as ASCII: a form is split at
        # & and = before it is decoded, so these read as UTF-8 (not a server error)
        ("; charset=rot13", "utf-8"),
        ("; charset=base64", "utf-8"),
        ("; charset=utf-16", "utf-8"),
        ("; charset=cp037", "utf-8"),
        ("; charset=idna", "utf-8"),
    ],
)
def test_a_forms_charset_is_taken_only_when_it_reads_ascii_as_ascii(options, charset):
    from sqs.views import _charset

    assert _charset(options) == charset
    assert query.parse_form(b"a=%C3%A9&b=x", _charset(options))["b"] == "x"


# -- hostile forms ------------------------------------------------------------------------------
@pytest.mark.timeout(20)
def test_a_key_of_millions_of_parts_is_read_in_linear_time():
    # every prefix of every key was indexed: a key of 20,000 dots took 2 s, of 2,000,000 hours
    for key in ("SendMessageBatchRequestEntry." + "1." * 2_000_000 + "Id", "x" * 4_000_000, "." * 2_000_000):
        assert query.decode({"Action": "SendMessageBatch", "QueueUrl": "q", key: "a"}) == (
            "SendMessageBatch",
            {"QueueUrl": "q"},
        )


@pytest.mark.parametrize("text", ["9" * 4_301, "²", "٣", "1_000", "1.0", ""])
def test_an_integer_that_is_not_ascii_digits_is_invalid(text):
    with pytest.raises(query.QueryError) as raised:
        query.decode({"Action": "ReceiveMessage", "QueueUrl": "q", "MaxNumberOfMessages": text})
    assert raised.value.code == "InvalidParameterValue" and len(raised.value.message) < 200


@pytest.mark.parametrize("text", ["é", "\ud800", "AA=A", "*"])
def test_a_blob_that_is_not_base64_is_invalid(text):
    # a character that is not ASCII raised ValueError, not binascii.Error: a 500
    form = {"Action": "SendMessage", "QueueUrl": "q", "MessageBody": "m"}
    form |= {"MessageAttribute.1.Name": "a", "MessageAttribute.1.Value.DataType": "Binary"}
    with pytest.raises(query.QueryError) as raised:
        query.decode({**form, "MessageAttribute.1.Value.BinaryValue": text})
    assert raised.value.code == "InvalidParameterValue"


def test_what_xml_cannot_carry_is_replaced_in_an_answer():
    # a control character an error quotes, or one another entrance stored, made the answer no XML
    body = query.encode_error("InvalidParameterValue", "Value \x00\x1b\ud800 is invalid", True, "r-1")
    parsed = parse_query("SendMessage", body, status=400)
    assert parsed["Error"]["Message"] == "Value \ufffd\ufffd\ufffd is invalid"
    result = {"Tags": {"k\x01": "v\x7f\x0b"}}
    assert parse_query("ListQueueTags", query.encode("ListQueueTags", result, "r-2"))["Tags"] == {
        "k\ufffd": "v\x7f\ufffd"
    }
