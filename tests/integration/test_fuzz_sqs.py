"""Every SQS action fuzzed in both protocols: any parameters, hostile values of every kind, and
never a 5xx (no outage happens in this process: a 503 is a bug too, ``tests/fuzzing.py``);
every answer in its protocol's shape, every refusal in SQS's error shape.

The calls are signed with SigV4 (botocore's signer, as a client's) and go to the node's WSGI
application in this process (``tests/integration/wsgi_client.py``): the AWS JSON 1.0 protocol
(``X-Amz-Target``, a JSON body) and the query protocol (a form, posted, or in a GET's query
string). Each action's parameters are drawn from its input shape (``sqs.query_shapes``, the
table the query codec reads) with values that reach past the first check (the world's queue
URLs, ARNs, receipt handles, task handles and users), then one to three places in them get a
hostile value (``tests/fuzzing.py``: numbers past any range, deep nesting, wrong types, control
characters, huge strings). One test per kind, and one of any mix; the regressions the fuzzing
found are named tests below them.

What is not fuzzed here: a long poll's wait (every receive answers at once: the wait is checked
before it is waited) and a move task's moving (its thread is not started: it would run beside
the test's transaction); both have tests of their own (test_long_polls.py, test_sqs_boto3.py).
"""

from __future__ import annotations

import base64
import json
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_from_bytes, urlencode

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from hypothesis import given
from hypothesis import strategies as st

from queues import service
from sqs import move_tasks
from sqs.models import AccessKey
from sqs.query_shapes import OPERATIONS, SHAPES
from tests import fuzzing
from tests.fuzzing import KINDS, Raw, dumps, fuzz_settings, hostile, replaced, text_of
from tests.integration.wsgi_client import WsgiClient, WsgiResponse

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("purge_kv")]

REGION = "eu-west-1"
JSON_TYPE = "application/x-amz-json-1.0"
FORM_TYPE = "application/x-www-form-urlencoded; charset=utf-8"
NS = "http://queue.amazonaws.com/doc/2012-11-05/"
PROTOCOLS = ("json", "query")
ACTIONS = sorted(OPERATIONS)


# --- the calls ----------------------------------------------------------------------------------
def _form_pairs(shape_name: str | None, value: Any, key: str) -> list[tuple[str, Any]]:
    """``value`` of shape ``shape_name`` sent under ``key`` as the query protocol's form
    (botocore's query serializer's rules, as ``sqs.query`` reads them); a value that is not of
    its shape is sent as its own structure says (an object's keys, an array's indices)."""
    shape = SHAPES.get(shape_name) if shape_name else None
    kind = shape[0] if shape else None
    if kind == "structure" and isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for member, v in value.items():
            target, wire, flattened = shape[1].get(member, (None, str(member), False))
            out += _member_pairs(target, wire, flattened, v, f"{key}." if key else "")
        return out
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _form_pairs(None, v, f"{key}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value, 1) for p in _form_pairs(None, v, f"{key}.{i}")]
    return [(key, value)]


def _member_pairs(target: str | None, wire: str, flattened: bool, value: Any, prefix: str) -> list[tuple[str, Any]]:
    shape = SHAPES.get(target) if target else None
    key = prefix + wire
    if shape and shape[0] == "list" and isinstance(value, list):
        if not value:
            return [(key, "")]
        base = prefix + (shape[2] or wire) if flattened else f"{key}.{shape[2] or 'member'}"
        return [p for i, v in enumerate(value, 1) for p in _form_pairs(shape[1], v, f"{base}.{i}")]
    if shape and shape[0] == "map" and isinstance(value, dict):
        _, _, key_name, value_shape, value_name = shape
        base = key if flattened else f"{key}.entry"
        out: list[tuple[str, Any]] = []
        for i, (k, v) in enumerate(value.items(), 1):
            out.append((f"{base}.{i}.{key_name}", k))
            out += _form_pairs(value_shape, v, f"{base}.{i}.{value_name}")
        return out
    return _form_pairs(target, value, key)


def _quoted(value: Any) -> str:
    # (a lone surrogate goes as the bytes Python would write for it: not UTF-8, as a stranger's)
    return quote_from_bytes(text_of(value).encode("utf-8", "surrogatepass"), safe="")


def _utf8(texts: dict[str, str]) -> bool:
    try:
        for k, v in texts.items():
            k.encode(), v.encode()
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class Sqs:
    """Signed SQS calls of one access key to the node's WSGI application."""

    key: AccessKey
    client: WsgiClient = field(default_factory=lambda: WsgiClient(raise_request_exception=False))

    def call(self, protocol: str, action: str, params: Any, *, get: bool = False) -> WsgiResponse:
        if protocol == "json":
            body = dumps(params).encode("utf-8", "surrogatepass")
            headers = {"Content-Type": JSON_TYPE, "X-Amz-Target": f"AmazonSQS.{action}"}
            return self._send("POST", "/sqs/", body, headers)
        pairs = [("Action", action), ("Version", "2012-11-05"), *_form_pairs(OPERATIONS[action][0], params, "")]
        texts = {k: text_of(v) for k, v in pairs}
        if get and _utf8(texts) and sum(len(k) + len(v) for k, v in texts.items()) < 4_000:
            # (a small form, of text UTF-8 can write: what a GET carries, and botocore signs)
            return self._send("GET", "/sqs/", b"", {}, texts)
        body = "&".join(f"{_quoted(k)}={_quoted(v)}" for k, v in pairs).encode("ascii")
        return self._send("POST", "/sqs/", body, {"Content-Type": FORM_TYPE})

    def _send(
        self, method: str, path: str, body: bytes, headers: dict[str, str], query: dict[str, str] | None = None
    ) -> WsgiResponse:
        request = AWSRequest(method, f"http://testserver{path}", data=body, headers=headers, params=query or {})
        SigV4Auth(Credentials(self.key.access_key_id, self.key.secret), "sqs", REGION).add_auth(request)
        signed = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-type")}
        url = f"{path}?{urlencode(query, quote_via=quote)}" if query else path
        return self.client.generic(method, url, body, headers.get("Content-Type", ""), headers=signed)


def check(protocol: str, action: str, r: WsgiResponse, sent: Any = None, *, counted: bool = True) -> None:
    """No 5xx (``fuzzing.server_error``); an answer in the protocol's shape (XML any parser
    reads), a refusal in SQS's error shape (what botocore reads the error code from). Counted
    per protocol, but for the world's own calls (``counted``)."""
    if counted:
        try:
            code = _error_code(protocol, r) if 400 <= r.status_code < 500 else ""
        except (ValueError, KeyError, ET.ParseError):
            code = "?"  # (refused below, in the shape's checks)
        fuzzing.record(f"sqs-{protocol}", r.status_code, f"{action} {code} {sent!r}")
    where = f"{protocol} {action} -> {r.status_code}: {r.content[:1500]!r}\nsent: {str(sent)[:1500]}"
    problem = fuzzing.server_error(r.status_code, r.headers.get)
    assert problem is None, f"{problem}: {where}"
    if protocol == "json":
        assert r["Content-Type"] == JSON_TYPE, where
        body = json.loads(r.content)
        assert isinstance(body, dict), where
        if r.status_code >= 400:
            assert body["__type"].startswith("com.amazonaws.sqs#") and isinstance(body["message"], str), where
            code, _, fault = r["x-amzn-query-error"].partition(";")
            assert code and fault in ("Sender", "Receiver"), where
        return
    assert r["Content-Type"].startswith("text/xml"), where
    try:
        root = ET.fromstring(r.content)  # well-formed XML, whatever the caller sent
    except ET.ParseError as exc:
        raise AssertionError(f"not XML ({exc}): {where}") from None
    if r.status_code >= 400:
        assert root.tag == f"{{{NS}}}ErrorResponse", where
        assert root.findtext(f"{{{NS}}}Error/{{{NS}}}Type") in ("Sender", "Receiver"), where
        assert root.findtext(f"{{{NS}}}Error/{{{NS}}}Code"), where
        assert root.find(f"{{{NS}}}Error/{{{NS}}}Message") is not None, where
        assert root.findtext(f"{{{NS}}}RequestId"), where
    else:
        assert root.tag == f"{{{NS}}}{action}Response", where


# --- the world --------------------------------------------------------------------------------------
def _arn(name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{django_settings.SQS_ACCOUNT_ID}:{name}"


@dataclass
class World:
    """Queues of every kind with messages in flight, and what calls name them by."""

    owner: Sqs
    stranger: Sqs
    users: list[str]
    names: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    #: two receipts of messages in flight, of each queue of ``names`` in turn
    receipts: list[str] = field(default_factory=list)
    handles: list[str] = field(default_factory=list)
    queues: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    @property
    def arns(self) -> list[str]:
        return [_arn(n) for n in self.names] + [_arn("no-such-queue"), "arn:aws:sqs:x", "not-an-arn"]

    def call(self, protocol: str, action: str, params: Any, *, counted: bool = True) -> WsgiResponse:
        r = self.owner.call(protocol, action, params)
        check(protocol, action, r, params, counted=counted)
        return r

    def build(self) -> World:
        """The queues, a few messages in flight on each (two receipts of each in ``receipts``)."""
        tag = uuid.uuid4().hex[:6]
        dlq, dlq_fifo = f"fz-dlq-{tag}", f"fz-dlqf-{tag}.fifo"
        self.queues = [
            (dlq, {}),
            (dlq_fifo, {"FifoQueue": "true"}),
            (f"fz-std-{tag}", {"RedrivePolicy": json.dumps({"deadLetterTargetArn": _arn(dlq), "maxReceiveCount": 3})}),
            (
                f"fz-fifo-{tag}.fifo",
                {
                    "FifoQueue": "true",
                    "ContentBasedDeduplication": "true",
                    "RedrivePolicy": json.dumps({"deadLetterTargetArn": _arn(dlq_fifo), "maxReceiveCount": 3}),
                },
            ),
        ]
        for name, attrs in self.queues:
            url = self._create(name, attrs)
            self.names.append(name)
            self.urls.append(url)
            self.receipts += self._receive(url, 2)
        self.urls.append(self.urls[0].rsplit("/", 1)[0] + "/no-such-queue")
        self.handles = [move_tasks.task_handle(_arn(self.names[0])), "bm90IGEgaGFuZGxl", ""]
        return self

    def restore(self) -> None:
        """The world's queues that a case deleted, made again under their names (the strategies
        drew their URLs once)."""
        for name, attrs in self.queues:
            r = self.owner.call("json", "GetQueueUrl", {"QueueName": name})
            if r.status_code != 200:
                # (no messages: the runtime claims a queue made again under a deleted one's
                # name on its next pass, which this test's runtime makes when told, below)
                self._create(name, attrs, fill=False)
        service.get_runtime().tick()

    def _create(self, name: str, attrs: dict[str, str], *, fill: bool = True) -> str:
        url: str = json.loads(
            self.call("json", "CreateQueue", {"QueueName": name, "Attributes": attrs}, counted=False).content
        )["QueueUrl"]
        if not fill:
            return url
        entries: list[dict[str, Any]] = [{"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(4)]
        if name.endswith(".fifo"):
            entries = [
                {**e, "MessageGroupId": f"g{i % 2}", "MessageDeduplicationId": f"d{i}"} for i, e in enumerate(entries)
            ]
        self.call("json", "SendMessageBatch", {"QueueUrl": url, "Entries": entries}, counted=False)
        return url

    def _receive(self, url: str, count: int) -> list[str]:
        receipts: list[str] = []
        for _ in range(20):  # (each receive takes from the partitions in turn)
            if len(receipts) == count:
                break
            params = {"QueueUrl": url, "MaxNumberOfMessages": 1, "VisibilityTimeout": 3600}
            got = self.call("json", "ReceiveMessage", params, counted=False)
            receipts += [m["ReceiptHandle"] for m in json.loads(got.content).get("Messages", [])]
        assert len(receipts) == count, url
        return receipts


@pytest.fixture
def sqs_world(runtime, user, monkeypatch) -> World:
    """A world of the test's own, on the test's node runtime, owned by ``user``."""
    # Every receive answers at once (the wait, checked first, is not what is fuzzed), and a
    # move task is recorded but not run (its thread would work beside the test's transaction).
    dequeue = service.dequeue
    monkeypatch.setattr(service, "dequeue", lambda *a, **kw: dequeue(*a, **{**kw, "wait": 0.0}))
    monkeypatch.setattr(move_tasks._Runner, "run", lambda self: None)
    monkeypatch.setattr(move_tasks, "ANSWER_WITHIN", 0)
    stranger = User.objects.create(username=f"stranger-{uuid.uuid4().hex[:6]}")
    return World(Sqs(AccessKey.issue(user)), Sqs(AccessKey.issue(stranger)), [user.username, stranger.username]).build()


# --- the parameters -----------------------------------------------------------------------------
_TEXT = st.text(max_size=12)
_NAME = st.from_regex(r"fz-[a-z0-9]{1,8}(\.fifo)?", fullmatch=True)


def _members(sqs_world: World) -> dict[str, st.SearchStrategy[Any]]:
    """Values that pass a parameter's first check, by member name (any shape's)."""
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "SQS:SendMessage"}],
    }
    attribute_values = {
        "VisibilityTimeout": st.integers(0, 43_200).map(str),
        "MessageRetentionPeriod": st.integers(60, 1_209_600).map(str),
        "DelaySeconds": st.integers(0, 900).map(str),
        "MaximumMessageSize": st.integers(1_024, 262_144).map(str),
        "ReceiveMessageWaitTimeSeconds": st.integers(0, 20).map(str),
        "RedrivePolicy": st.sampled_from(sqs_world.arns).map(
            lambda a: json.dumps({"deadLetterTargetArn": a, "maxReceiveCount": 5})
        )
        | st.just(""),
        "Policy": st.sampled_from([json.dumps(policy), ""]),
        "FifoQueue": st.sampled_from(["true", "false"]),
        "ContentBasedDeduplication": st.sampled_from(["true", "false"]),
        "DeduplicationScope": st.sampled_from(["messageGroup", "queue"]),
        "FifoThroughputLimit": st.sampled_from(["perQueue", "perMessageGroupId"]),
        "KmsMasterKeyId": _TEXT,
        "QueueArn": _TEXT,
        "Unknown": _TEXT,
    }
    queue_attributes = st.lists(st.sampled_from(sorted(attribute_values)), max_size=3, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: attribute_values[n] for n in names})
    )
    data_types = st.sampled_from(["String", "Number", "Binary", "String.custom", "Number.int", "Nope"])
    message_attribute = st.fixed_dictionaries(
        {"DataType": data_types},
        optional={
            "StringValue": st.sampled_from(["x", "12", "1.5e3", ""]) | _TEXT,
            "BinaryValue": st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()),
        },
    )
    system_attribute_names = ["All", "SenderId", "SentTimestamp", "ApproximateReceiveCount", "MessageGroupId", "Nope"]
    return {
        "QueueUrl": st.sampled_from(sqs_world.urls[:-1]) | st.sampled_from(sqs_world.urls),  # (mostly one that exists)
        "QueueName": st.sampled_from(sqs_world.names) | _NAME,
        "QueueNamePrefix": st.sampled_from(["", "fz", "fz-std", "nope"]),
        "ReceiptHandle": st.sampled_from(sqs_world.receipts) | st.just("bm90IGEgcmVjZWlwdA=="),
        "MessageBody": st.text(min_size=1, max_size=40),
        "Attributes": queue_attributes,
        "AttributeNames": st.lists(st.sampled_from(["All", *attribute_values, *system_attribute_names]), max_size=3),
        "MessageSystemAttributeNames": st.lists(st.sampled_from(system_attribute_names), max_size=3),
        "MessageAttributeNames": st.lists(st.sampled_from(["All", "a", "b.*", ".x", "a" * 300]), max_size=3),
        "MaxNumberOfMessages": st.integers(1, 10),
        "VisibilityTimeout": st.integers(0, 43_200),
        "WaitTimeSeconds": st.integers(0, 20),
        "DelaySeconds": st.integers(0, 900),
        "MessageAttributes": st.dictionaries(
            st.sampled_from(["a", "b.c", "n-1", "_x", "é"]), message_attribute, max_size=3
        ),
        "MessageSystemAttributes": st.just(
            {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-5e1b4151-5ac6c58f"}}
        ),
        "MessageGroupId": st.sampled_from(["g1", "g2", "a" * 129]),
        "MessageDeduplicationId": st.text(alphabet="abc", min_size=1, max_size=4),
        "ReceiveRequestAttemptId": _TEXT,
        "Id": st.sampled_from(["e1", "e2", "e3", "bad id"]),
        "MaxResults": st.integers(1, 1_000),
        "NextToken": st.sampled_from(["", base64.urlsafe_b64encode(b"fz").decode(), "!!"]),
        "SourceArn": st.sampled_from(sqs_world.arns),
        "DestinationArn": st.sampled_from(sqs_world.arns),
        "MaxNumberOfMessagesPerSecond": st.integers(1, 500),
        "TaskHandle": st.sampled_from(sqs_world.handles),
        "Label": st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True),
        "AWSAccountIds": st.lists(
            st.sampled_from([*sqs_world.users, "000000000000", "nobody"]), min_size=1, max_size=2
        ),
        "Actions": st.lists(
            st.sampled_from(["SendMessage", "ReceiveMessage", "*", "DeleteMessage", "Nope"]), min_size=1, max_size=2
        ),
        "Tags": st.dictionaries(st.text(min_size=1, max_size=8), _TEXT, max_size=3),
        "TagKeys": st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3),
    }


def _of_shape(shape_name: str, members: dict[str, st.SearchStrategy[Any]], depth: int = 0) -> st.SearchStrategy[Any]:
    shape = SHAPES[shape_name]
    kind = shape[0]
    if kind == "structure":
        optional = {
            m: members[m] if m in members else _of_shape(target, members, depth + 1)
            for m, (target, _, _) in shape[1].items()
        }
        if depth == 0:  # an action's members all given, a few left out by calls()
            return st.fixed_dictionaries(optional)
        return st.fixed_dictionaries({}, optional=optional)
    if kind == "list":
        return st.lists(_of_shape(shape[1], members, depth + 1), min_size=1 if depth == 0 else 0, max_size=3)
    if kind == "map":
        return st.dictionaries(_TEXT, _of_shape(shape[3], members, depth + 1), max_size=2)
    return {
        "integer": st.integers(0, 100),
        "long": st.integers(0, 100),
        "boolean": st.booleans(),
        "blob": st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()),
    }.get(kind, _TEXT)


def params_of(sqs_world: World, action: str) -> st.SearchStrategy[dict[str, Any]]:
    """Parameters of ``action`` that pass its first checks, mostly (its input shape's members,
    the batch actions' entries by the same rules)."""
    request = OPERATIONS[action][0]
    return _of_shape(request, _members(sqs_world)) if request else st.just({})


def _places(action: str, params: dict[str, Any]) -> list[fuzzing.Path]:
    """Where a hostile value may go: every place in ``params``, and each member of the input
    shape the params left out (on its own, and as the first element of a list)."""
    request = OPERATIONS[action][0]
    members = list(SHAPES[request][1]) if request else []
    return [*fuzzing.paths(params)[1:], *((m,) for m in members if m not in params), ("Unknown",)]


@st.composite
def calls(draw: st.DrawFn, sqs_world: World, kind: str | None, actions: list[str] = ACTIONS) -> tuple[str, Any]:
    """(action, params): good parameters with one to three hostile values of ``kind`` (None:
    any kind, or none at all now and then)."""
    action = draw(st.sampled_from(actions))
    params: Any = draw(params_of(sqs_world, action))
    for member in draw(st.sets(st.sampled_from(sorted(params)), max_size=1) if params else st.just(set())):
        del params[member]
    count = draw(st.integers(0 if kind is None else 1, 3))
    for _ in range(count):
        place = draw(st.sampled_from(_places(action, params) if isinstance(params, dict) else [()]))
        params = replaced(params, place, draw(hostile(kind)))
    return action, params


def _run(sqs_world: World, protocol: str, action: str, params: Any, as_stranger: bool, get: bool) -> None:
    caller = sqs_world.stranger if as_stranger else sqs_world.owner
    r = caller.call(protocol, action, params, get=get)
    check(protocol, action, r, params)
    if action == "DeleteQueue" and r.status_code == 200:
        sqs_world.restore()  # a world queue may be gone


# --- the fuzzing --------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_any_call_of_any_action_is_answered_never_with_a_5xx(sqs_world, protocol):
    @fuzz_settings(examples=250)
    @given(call=calls(sqs_world, None), as_stranger=st.sampled_from([False] * 9 + [True]), get=st.booleans())
    def fuzz(call, as_stranger, get):
        _run(sqs_world, protocol, *call, as_stranger and call[0] != "CreateQueue", get)

    fuzz()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_hostile_values_of_each_kind_are_refused_never_with_a_5xx(sqs_world, protocol, kind):
    @fuzz_settings(examples=40)
    @given(call=calls(sqs_world, kind), get=st.booleans())
    def fuzz(call, get):
        _run(sqs_world, protocol, *call, False, get)

    fuzz()


# --- what the fuzzing found ---------------------------------------------------------------------
def _integer_places() -> list[tuple[str, tuple[str, ...]]]:
    """(action, path) of every integer parameter of every action (a batch's in its entries)."""
    out = []
    for action, (request, _) in OPERATIONS.items():
        if request is None:
            continue
        for member, (target, _, _) in SHAPES[request][1].items():
            shape = SHAPES[target]
            if shape[0] in ("integer", "long"):
                out.append((action, (member,)))
            elif shape[0] == "list" and SHAPES[shape[1]][0] == "structure":
                entry = SHAPES[shape[1]][1]
                out += [(action, (member, 0, m)) for m, (t, _, _) in entry.items() if SHAPES[t][0] == "integer"]
    return out


def _error_code(protocol: str, r: WsgiResponse) -> str:
    if protocol == "json":
        return json.loads(r.content)["__type"].removeprefix("com.amazonaws.sqs#")
    return ET.fromstring(r.content).findtext(f"{{{NS}}}Error/{{{NS}}}Code") or ""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_integer_parameter_of_4301_digits_is_an_invalid_value_not_a_500(sqs_world, protocol):
    # Python refuses to read text of more than 4,300 digits as an int (ValueError): the JSON
    # protocol's integer parameters, given as text, answered 500 (MaxNumberOfMessages, and the
    # integers of 6 other actions); a JSON literal of as many digits was "not JSON".
    places = _integer_places()
    assert len(places) >= 10, places  # ReceiveMessage's 3, the batches' entries, MaxResults...
    for action, place in places:
        params = world_params(sqs_world, action)
        literals = [Raw("9" * 4_301), "9" * 4_301, "-" + "1" * 5_000, "²"] if protocol == "json" else ["9" * 4_301, "²"]
        for value in literals:
            r = sqs_world.call(protocol, action, replaced(params, place, value))
            if len(place) == 1 or protocol == "query":  # (a form's integers are read before any action)
                assert (r.status_code, _error_code(protocol, r)) == (400, "InvalidParameterValue"), (action, r.content)
            else:  # a batch's entry fails alone, as SQS fails it
                assert r.status_code == 200, (action, r.content)
                assert b"InvalidParameterValue" in r.content, (action, r.content)


def world_params(sqs_world: World, action: str) -> dict[str, Any]:
    """Parameters of ``action`` that it takes, on the world's standard queue."""
    url, arn = sqs_world.urls[2], _arn(sqs_world.names[2])
    receipt = sqs_world.receipts[4]
    entry = {"Id": "e1", "MessageBody": "m", "ReceiptHandle": receipt, "VisibilityTimeout": 5}
    return {
        "ReceiveMessage": {"QueueUrl": url},
        "SendMessage": {"QueueUrl": url, "MessageBody": "m"},
        "SendMessageBatch": {"QueueUrl": url, "Entries": [{"Id": "e1", "MessageBody": "m"}]},
        "ChangeMessageVisibility": {"QueueUrl": url, "ReceiptHandle": receipt, "VisibilityTimeout": 5},
        "ChangeMessageVisibilityBatch": {"QueueUrl": url, "Entries": [entry]},
        "ListQueues": {},
        "ListDeadLetterSourceQueues": {"QueueUrl": sqs_world.urls[0]},
        "StartMessageMoveTask": {"SourceArn": _arn(sqs_world.names[0])},
        "ListMessageMoveTasks": {"SourceArn": arn},
    }.get(action, {"QueueUrl": url})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_redrive_policy_nested_5000_deep_is_an_invalid_value_not_a_500(sqs_world, protocol):
    # json.loads recursed past the stack (RecursionError) on the policy's text
    for deep in (fuzzing.deep_text(5_000), fuzzing.deep_text(5_000, "{"), fuzzing.deep_text(17)):
        for action, params in (
            ("CreateQueue", {"QueueName": f"fz-deep-{uuid.uuid4().hex[:6]}", "Attributes": {"RedrivePolicy": deep}}),
            ("SetQueueAttributes", {"QueueUrl": sqs_world.urls[2], "Attributes": {"RedrivePolicy": deep}}),
        ):
            r = sqs_world.call(protocol, action, params)
            assert (r.status_code, _error_code(protocol, r)) == (400, "InvalidParameterValue"), r.content
    # maxReceiveCount: infinity (int() raised OverflowError), and a number of 4,301 digits as text
    for count in ("1e999", '"' + "9" * 4_301 + '"', "[]"):
        policy = f'{{"deadLetterTargetArn": "{_arn(sqs_world.names[0])}", "maxReceiveCount": {count}}}'
        r = sqs_world.call(
            protocol, "SetQueueAttributes", {"QueueUrl": sqs_world.urls[2], "Attributes": {"RedrivePolicy": policy}}
        )
        assert (r.status_code, _error_code(protocol, r)) == (400, "InvalidParameterValue"), r.content


def test_json_nested_deep_in_a_policy_or_a_task_handle_is_no_500(sqs_world):
    deep = fuzzing.deep_text(5_000)
    # a Policy is kept as given; AddPermission reads it to add a statement
    r = sqs_world.call("json", "SetQueueAttributes", {"QueueUrl": sqs_world.urls[2], "Attributes": {"Policy": deep}})
    assert r.status_code == 200, r.content
    params = {
        "QueueUrl": sqs_world.urls[2],
        "Label": "l1",
        "AWSAccountIds": [sqs_world.users[1]],
        "Actions": ["SendMessage"],
    }
    assert sqs_world.call("json", "AddPermission", params).status_code == 200
    assert sqs_world.call("json", "RemovePermission", {"QueueUrl": sqs_world.urls[2], "Label": "l1"}).status_code == 200
    # a TaskHandle is base64 of JSON
    handle = base64.b64encode(deep.encode()).decode()
    r = sqs_world.call("json", "CancelMessageMoveTask", {"TaskHandle": handle})
    assert (r.status_code, _error_code("json", r)) == (404, "ResourceNotFoundException"), r.content


def test_a_content_length_of_thousands_of_digits_is_too_large_not_a_500(sqs_world):
    r = sqs_world.owner.client.generic(
        "POST",
        "/sqs/",
        b"",
        FORM_TYPE,
        CONTENT_LENGTH="9" * 5_000,
        HTTP_AUTHORIZATION=_authorization(sqs_world),
        HTTP_X_AMZ_DATE="20260101T000000Z",
    )
    check("query", "-", r)
    assert r.status_code == 413, r.content


def _authorization(sqs_world: World) -> str:
    key = sqs_world.owner.key
    return (
        f"AWS4-HMAC-SHA256 Credential={key.access_key_id}/20260101/{REGION}/sqs/aws4_request, "
        f"SignedHeaders=host;x-amz-date, Signature={'0' * 64}"
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_binary_value_that_is_not_ascii_is_invalid_not_a_500(sqs_world, protocol):
    # the query codec's base64 read raised ValueError (not binascii.Error) for text not ASCII
    for value in ("é", "\ud800", "AAAA\x00"):
        attrs = {"a": {"DataType": "Binary", "BinaryValue": value}}
        r = sqs_world.call(
            protocol, "SendMessage", {"QueueUrl": sqs_world.urls[2], "MessageBody": "m", "MessageAttributes": attrs}
        )
        assert (r.status_code, _error_code(protocol, r)) == (400, "InvalidParameterValue"), r.content


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_account_id_with_a_nul_is_invalid_not_an_outage(sqs_world, protocol):
    # PostgreSQL refuses a NUL in text: the user lookup's error was answered as an outage (503)
    for entry in ("\x00\x00", "a\x00b", "x" * 5_000):
        params = {"QueueUrl": sqs_world.urls[2], "Label": "l1", "AWSAccountIds": [entry], "Actions": ["SendMessage"]}
        r = sqs_world.call(protocol, "AddPermission", params)
        assert (r.status_code, _error_code(protocol, r)) == (400, "InvalidParameterValue"), r.content


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_tag_key_with_a_nul_is_invalid_not_an_outage(sqs_world, protocol):
    # PostgreSQL's JSON refuses \u0000: UntagQueue's audit entry (its removed keys) answered 503
    r = sqs_world.call(protocol, "UntagQueue", {"QueueUrl": sqs_world.urls[2], "TagKeys": ["\x00"]})
    assert (r.status_code, _error_code(protocol, r)) == (400, "InvalidParameterValue"), r.content
    r = sqs_world.call(protocol, "TagQueue", {"QueueUrl": sqs_world.urls[2], "Tags": {"k\x00": "v", "k": "\x1b"}})
    assert (r.status_code, _error_code(protocol, r)) == (400, "InvalidParameterValue"), r.content
