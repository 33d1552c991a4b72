"""What SQS knows of a message beyond its attributes' name -> text, stored with the message.

A message's SQS attributes are the service's ``attributes`` (name -> text, a binary value as
base64), so the REST API reads them too. The rest lives under the one attribute :data:`KEY`
(``sqs:meta``), as a *string*: a compact JSON object with

- ``types``: name -> data type of each attribute whose type is not plain ``String``;
- ``dedup``: a FIFO message's deduplication ID as the producer gave it (or the body's hash);
- ``trace``: its ``AWSTraceHeader`` (read only when it is an X-Ray trace header);
- ``sender``: its ``SenderId``, and ``seal`` (below).

A string, not a nested object, because every node checks a message it is handed as a REST
message: a node that does not own a partition forwards the message to the one that does, and a
dead letter is moved to a dead-letter queue served elsewhere, through the REST API's enqueue,
whose validation takes attributes of strings, numbers and booleans only. A string passes it as
any attribute does, so a forwarded SQS message needs no trust of its own.

Who may write it. Any producer may give a REST message an attribute ``sqs:meta``. The types,
the deduplication ID and the trace header are the producer's own words about its own message,
which an SQS producer chooses as freely, so they are read whoever wrote them (checked for form
only: a malformed entry is ignored). The sender is different: it names who sent the message,
and a consumer may act on that. It is read only with a valid ``seal``: an HMAC, under a key
derived from the cluster secret (``settings.CLUSTER_SECRET``, which every node shares and no
client knows), over the queue, the body, the other attributes and the rest of the metadata. A
REST producer cannot make one, and one copied from a message it read fits no other message
(another body, other attributes, another queue). A dead letter's seal fits the queue it came
from: its ``history.source``, which only a node sets. A sender without a valid seal is dropped,
the rest kept. So a message carried on by other means (replayed from the archive into another
queue, a dead letter moved on from a dead-letter queue) shows no ``SenderId``, and an exact
copy of a message (same body and attributes) into the same queue keeps it, as a duplicate
delivery of that message would.

Messages stored before kept this as a nested object under the same name. No REST client can
store one (the validation refuses it), so such an object is read as it is, sender included.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from django.conf import settings

from mq_client.tracing import valid_xray
from sqs import wire

#: the key of a message's ``attributes`` that holds the metadata.
KEY = "sqs:meta"
#: the data types an attribute may have (``Number.float``, ``String.json``: custom suffixes).
_TYPES = ("String", "Number", "Binary")
_SEAL = "seal"
_LABEL = b"sqs:meta sender seal v1"


@lru_cache(maxsize=4)
def _key(secret: str) -> bytes:
    """The seal's key: derived from the cluster secret, so it is never the key of its
    signatures between nodes (``queues.cluster.peerauth``)."""
    return hmac.new(secret.encode(), _LABEL, hashlib.sha256).digest()


#: SHA-256's block, and the translations that XOR a key's bytes with HMAC's ipad and opad.
_BLOCK = hashlib.sha256().block_size
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


@lru_cache(maxsize=4)
def _pads(secret: str) -> tuple[Any, Any]:
    """HMAC-SHA256's inner and outer hashes (RFC 2104) under the seal's key, with the key's
    block already hashed: a seal copies them and hashes its message only (a third of
    ``hmac.digest``'s time, which sets up both for every message; the same digest)."""
    key = _key(secret).ljust(_BLOCK, b"\0")  # (32 bytes: under SHA-256's block, never hashed first)
    return hashlib.sha256(key.translate(_IPAD)), hashlib.sha256(key.translate(_OPAD))


def _mac(message: bytes) -> str:
    """The seal of ``message``: HMAC-SHA256 under :func:`_key`, its first 128 bits in hex."""
    inner, outer = _pads(settings.CLUSTER_SECRET)
    h = inner.copy()
    h.update(message)
    o = outer.copy()
    o.update(h.digest())
    seal: str = o.hexdigest()[:32]
    return seal


#: ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``, made once.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _text(value: Any) -> str:
    return _ENCODER.encode(value)


def _canonical(value: Any) -> bytes:
    # surrogatepass: a REST message's attribute may hold a lone surrogate (a JSON parser let it
    # through); it must not make the seal's check fail with an error.
    return _text(value).encode("utf-8", "surrogatepass")


@lru_cache(maxsize=256)
def _sender_only(sender: str) -> bytes:
    """``_canonical({"sender": sender})``: the metadata of most messages, made once a sender."""
    return _canonical({"sender": sender})


def _seal(
    queue: str, body: str, attributes: Mapping[str, Any], meta: Mapping[str, Any], body_hash: str | None = None
) -> str:
    """``body_hash``: the body's SHA-256 (hex) when the caller has it already."""
    if body_hash is None:
        body_hash = hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()
    others = {k: v for k, v in attributes.items() if k != KEY}
    rest = {k: v for k, v in meta.items() if k != _SEAL}
    sender = rest.get("sender")
    message = b"\n".join(
        (
            queue.encode(),
            body_hash.encode(),
            _canonical(others) if others else b"{}",
            _sender_only(sender) if len(rest) == 1 and isinstance(sender, str) else _canonical(rest),
        )
    )
    return _mac(message)


@lru_cache(maxsize=1024)
def _around(queue: str, sender: str) -> tuple[bytes, bytes]:
    """What a sender-only seal's message holds before and after the body's hash."""
    return queue.encode() + b"\n", b"\n{}\n" + _sender_only(sender)


def sender_only(queue: str, sender: str, body_hash: str) -> str:
    """:func:`encode` of metadata that is ``{"sender": sender}`` alone, for a message of
    ``queue`` without attributes whose body's SHA-256 (hex) is ``body_hash``: most SQS sends."""
    before, after = _around(queue, sender)
    return _sealed_sender(_mac(before + body_hash.encode() + after), sender)


def _sealed_sender(seal: str, sender: str) -> str:
    """``_text({"seal": seal, "sender": sender})`` (keys sorted; the seal is hex digits)."""
    return f'{{"seal":"{seal}","sender":{_json_string(sender)}}}'


def encode(
    attributes: Mapping[str, Any], meta: Mapping[str, Any], *, queue: str, body: str, body_hash: str | None = None
) -> str:
    """The text of :data:`KEY` for a message of ``queue`` with ``body`` and ``attributes`` (the
    stored ones, without :data:`KEY`); a ``sender`` in ``meta`` is sealed. ``body_hash``: the
    body's SHA-256 (hex), when the caller has it already."""
    out = dict(meta)
    out.pop(_SEAL, None)
    sender = out.get("sender")
    if sender:
        seal = _seal(queue, body, attributes, out, body_hash)
        if len(out) == 1 and isinstance(sender, str):
            return _sealed_sender(seal, sender)
        out[_SEAL] = seal
    return _text(out)


@lru_cache(maxsize=256)
def _json_string(text: str) -> str:
    return _text(text)


def decode(attributes: Mapping[str, Any] | None, *, body: str, queues: Iterable[str]) -> dict[str, Any]:
    """The metadata of a stored message (``{}`` if none), checked for form; its ``sender`` only
    if sealed for one of ``queues`` (the message's queue, and the one a dead letter came from)."""
    if not attributes:
        return {}
    raw = attributes.get(KEY)
    if isinstance(raw, dict):  # stored by an earlier version: only a node could write it
        return _checked(raw)
    if not isinstance(raw, str):
        return {}
    try:
        parsed = wire.loads(raw)  # (bounded: a REST client may name an attribute so)
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    meta = _checked(parsed)
    seal = parsed.get(_SEAL)
    sealed = isinstance(seal, str) and any(
        hmac.compare_digest(seal, _seal(q, body, attributes, parsed)) for q in dict.fromkeys(queues) if q
    )
    if not sealed:
        meta.pop("sender", None)
    return meta


def _checked(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a metadata object that have the expected form; the rest ignored."""
    out: dict[str, Any] = {}
    for name in ("dedup", "trace", "sender"):
        value = raw.get(name)
        if isinstance(value, str) and value:
            out[name] = value
    if "trace" in out and not valid_xray(out["trace"]):
        # (an X-Ray header is what SQS answers as AWSTraceHeader: anything else, stored by an
        # earlier version or written by a REST producer, is ignored)
        del out["trace"]
    types = raw.get("types")
    if isinstance(types, dict):
        kept = {
            n: t for n, t in types.items() if isinstance(n, str) and isinstance(t, str) and t.split(".", 1)[0] in _TYPES
        }
        if kept:
            out["types"] = kept
    return out
