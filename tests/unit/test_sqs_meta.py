"""What SQS keeps of a message beyond name -> text (``sqs.meta``): stored as a string the REST
API's validation takes as it is (a node forwards a message through it), read back from that and
from the nested form stored before, and its sender read only when sealed for the message."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from queues.http.validation import enqueue_request
from queues.service import InvalidRequest
from queues.service.types import QueueConfig
from sqs import meta
from sqs.message_attributes import read_attributes, stored_attributes

CFG = QueueConfig(1, "q", 4, 256, 10, 30, 262_144, 86_400)
ATTRS = {
    "kind": ("String", "order"),
    "n": ("Number", "42"),
    "blob": ("Binary", b"\x00\xff"),
    "j": ("String.json", "{}"),
}
TRACE = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
META = {"sender": "AIDEXAMPLE", "dedup": "d-1", "trace": TRACE}


def _stored(queue: str = "orders", body: str = "hello") -> dict:
    stored = stored_attributes(ATTRS, dict(META), queue=queue, body=body)
    assert stored is not None
    return stored


def test_the_metadata_is_one_string_the_rest_validation_takes_as_it_is():
    stored = _stored()
    assert isinstance(stored[meta.KEY], str)
    # as a node forwards it: a REST message, checked as a client's would be (not trusted)
    (draft,), _ = enqueue_request({"body": "hello", "attributes": stored}, CFG, 0.0)
    assert draft.attributes == stored


def test_what_was_sent_is_read_back():
    attrs, got = read_attributes(_stored(), body="hello", queues=("orders",))
    assert attrs == ATTRS
    assert got == {**META, "types": {"n": "Number", "blob": "Binary", "j": "String.json"}}


def test_a_dead_letter_keeps_its_sender_sealed_for_the_queue_it_came_from():
    _, got = read_attributes(_stored(), body="hello", queues=("orders-dlq", "orders"))
    assert got["sender"] == META["sender"]


@pytest.mark.parametrize(
    "queues, body, change",
    [
        (("other",), "hello", {}),  # copied into another queue
        (("orders",), "other body", {}),  # beside another body
        (("orders",), "hello", {"kind": "refund"}),  # beside other attributes
        (("orders",), "hello", {"extra": "x"}),
    ],
)
def test_a_copied_sender_is_not_read(queues, body, change):
    stored = {**_stored(), **change}
    attrs, got = read_attributes(stored, body=body, queues=queues)
    assert "sender" not in got
    # the rest is the producer's own word: kept
    assert got["dedup"] == "d-1" and got["types"]["blob"] == "Binary"
    assert attrs["blob"] == ("Binary", b"\x00\xff")


def test_a_rest_client_cannot_forge_a_sender():
    forged = json.dumps({"sender": "AIDALICE", "seal": "0" * 32, "types": {"x": "Number"}, "dedup": "mine"})
    _, got = read_attributes({meta.KEY: forged, "x": "7"}, body="b", queues=("orders",))
    assert got == {"types": {"x": "Number"}, "dedup": "mine"}
    # nor edit a sealed one: another sender, or other metadata, breaks the seal
    stored = _stored()
    for edit in ({"sender": "AIDALICE"}, {"dedup": "d-2"}, {"types": {}}):
        text = json.dumps({**json.loads(stored[meta.KEY]), **edit})
        _, got = read_attributes({**stored, meta.KEY: text}, body="hello", queues=("orders",))
        assert "sender" not in got, edit


def test_a_lone_surrogate_beside_a_seal_is_no_error():
    stored = {**_stored(), "odd": "\ud800"}
    _, got = read_attributes(stored, body="hello", queues=("orders",))
    assert "sender" not in got


def test_the_nested_form_stored_before_is_read_as_it_was():
    old = {
        "kind": "order",
        "blob": "AP8=",
        meta.KEY: {"sender": "AIDOLD", "dedup": "d-0", "types": {"blob": "Binary"}, "trace": TRACE},
    }
    attrs, got = read_attributes(old, body="anything", queues=("anywhere",))
    assert attrs == {"kind": ("String", "order"), "blob": ("Binary", b"\x00\xff")}
    assert got == {"sender": "AIDOLD", "dedup": "d-0", "types": {"blob": "Binary"}, "trace": TRACE}


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        "[1, 2]",
        '"text"',
        '{"types": [1]}',
        '{"types": {"n": 5, "b": "Bogus", "x": "Binary"}, "dedup": 3, "sender": ["a"]}',
        7,
        None,
    ],
)
def test_a_malformed_metadata_attribute_is_ignored(value):
    stored = {meta.KEY: value, "n": 5, "x": True}
    attrs, got = read_attributes(stored, body="b", queues=("orders",))
    # a type given for a value that is no text is ignored too
    assert attrs == {"n": ("Number", "5"), "x": ("String", "true")}
    assert "sender" not in got and "dedup" not in got


def test_only_a_node_forwards_attributes_past_the_rest_limits():
    sqs_sized = {"a" * 200: "v" * 5000, meta.KEY: {"types": {}}}
    with pytest.raises(InvalidRequest) as err:
        enqueue_request({"body": "b", "attributes": sqs_sized}, CFG, 0.0)
    assert err.value.code == "invalid_attributes"
    (draft,), _ = enqueue_request({"body": "b", "attributes": sqs_sized}, CFG, 0.0, trusted=True)
    assert draft.attributes == sqs_sized
    with pytest.raises(InvalidRequest):
        enqueue_request({"body": "b", "attributes": {"x": [1]}}, CFG, 0.0, trusted=True)


def test_a_seal_made_with_the_body_hash_at_hand_is_the_one_made_from_the_body():
    body = "hello"
    digest = hashlib.sha256(body.encode()).hexdigest()
    for attrs, given in (({}, {"sender": "AIDEXAMPLE"}), ({"kind": "x"}, dict(META))):
        plain = meta.encode(attrs, given, queue="orders", body=body)
        assert meta.encode(attrs, given, queue="orders", body=body, body_hash=digest) == plain
        # the canonical text: keys sorted, no spaces
        assert plain == json.dumps(json.loads(plain), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert meta.decode({**attrs, meta.KEY: plain}, body=body, queues=("orders",))["sender"] == given["sender"]
    # a sender-only message stores the metadata alone, sealed as any other
    stored = stored_attributes({}, {"sender": "AIDEXAMPLE"}, queue="orders", body=body, body_hash=digest)
    assert stored == {meta.KEY: meta.encode({}, {"sender": "AIDEXAMPLE"}, queue="orders", body=body)}


def test_the_sender_only_seal_is_the_general_one_and_rfc_2104s_hmac():
    # (the fast path copies precomputed HMAC states: the same seal as hmac.digest would make,
    # so seals stored before are still read, and a wrong state would be refused, not accepted)
    from django.conf import settings

    for body in ("hello", "x" * 500, "é ✓"):
        digest = hashlib.sha256(body.encode()).hexdigest()
        fast = stored_attributes({}, {"sender": "AIDEXAMPLE"}, queue="orders", body=body, body_hash=digest)
        assert fast == {meta.KEY: meta.encode({}, {"sender": "AIDEXAMPLE"}, queue="orders", body=body)}
        message = b"\n".join((b"orders", digest.encode(), b"{}", b'{"sender":"AIDEXAMPLE"}'))
        reference = hmac.digest(meta._key(settings.CLUSTER_SECRET), message, "sha256").hex()[:32]
        assert json.loads(fast[meta.KEY])["seal"] == reference
        assert meta.decode(fast, body=body, queues=("orders",))["sender"] == "AIDEXAMPLE"
        assert "sender" not in meta.decode(fast, body=body, queues=("other",))
