"""SQS's message attributes over the service's message ``attributes``: their check, how they
are stored and read back, and SQS's MD5 digests of them and of a body.

Message attributes are stored with the message's ``attributes`` (name -> text, so the REST
API reads them too); the data types other than ``String`` and what SQS reports about the sender
under the one key :data:`META`, a string (``meta``: its form, and why the sender in it is
sealed).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import Any

from sqs import meta as sqs_meta
from sqs.attributes import MAX_MESSAGE_ATTRIBUTES
from sqs.context import invalid
from sqs.errors import SQSError
from sqs.query import INVALID_CHARS

#: the key of a message's ``attributes`` that keeps what SQS knows beyond name -> text.
META = sqs_meta.KEY
#: the message system attributes ReceiveMessage may be asked for.
SYSTEM_ATTRIBUTES = {
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "SequenceNumber",
    "MessageDeduplicationId",
    "MessageGroupId",
    "AWSTraceHeader",
    "DeadLetterQueueSourceArn",
}

#: a message attribute's name: SQS takes alphanumeric characters (Unicode letters and digits
#: too, not ASCII only), ``_``, ``-`` and ``.``, up to 256.
_ATTRIBUTE_NAME = re.compile(r"^[\w.-]{1,256}$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _digest_part(h: Any, data: bytes) -> None:
    h.update(len(data).to_bytes(4, "big"))
    h.update(data)


def md5_of_attributes(attrs: dict[str, tuple[str, str | bytes]]) -> str:
    """SQS's MD5 of message attributes: by name, each as length-prefixed name, data type, a
    transport byte (1 string/number, 2 binary) and length-prefixed value."""
    h = hashlib.md5(usedforsecurity=False)  # the protocol's checksum, not a security hash
    for name in sorted(attrs):
        data_type, value = attrs[name]
        _digest_part(h, name.encode("utf-8"))
        _digest_part(h, data_type.encode("utf-8"))
        if isinstance(value, bytes):
            h.update(b"\x02")
            _digest_part(h, value)
        else:
            h.update(b"\x01")
            _digest_part(h, value.encode("utf-8"))
    return h.hexdigest()


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def checked_message_attributes(value: Any, where: str = "") -> dict[str, tuple[str, str | bytes]]:
    """MessageAttributes checked: name -> (data type, text or bytes)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{where}MessageAttributes must be a map")
    if len(value) > MAX_MESSAGE_ATTRIBUTES:
        raise invalid(f"{where}Number of message attributes [{len(value)}] exceeds the allowed maximum [10].")
    out: dict[str, tuple[str, str | bytes]] = {}
    for name, attr in value.items():
        low = name.lower()
        if (
            not _ATTRIBUTE_NAME.fullmatch(name)
            or low.startswith(("aws.", "amazon."))
            or name.startswith(".")
            or name.endswith(".")
            or ".." in name
        ):
            raise invalid(f"{where}Message attribute name '{name}' is invalid.")
        if not isinstance(attr, dict):
            raise invalid(f"{where}Message attribute '{name}' must be a structure")
        data_type = attr.get("DataType")
        if not isinstance(data_type, str) or not data_type:
            raise invalid(f"{where}The message attribute '{name}' must contain a non-empty message attribute type.")
        base = data_type.split(".", 1)[0]
        if base not in ("String", "Number", "Binary") or len(data_type) > 256:
            raise invalid(f"{where}The type of message attribute '{name}' is invalid ({data_type}).")
        if base == "Binary":
            raw = attr.get("BinaryValue")
            if isinstance(raw, str):
                try:
                    raw = base64.b64decode(raw, validate=True)
                except (binascii.Error, ValueError):
                    raise invalid(f"{where}Message attribute '{name}' has a BinaryValue that is not base64") from None
            if not isinstance(raw, bytes) or not raw:
                raise invalid(f"{where}The message attribute '{name}' must contain a non-empty value of type Binary")
            out[name] = (data_type, raw)
        else:
            text = attr.get("StringValue")
            if not isinstance(text, str) or not text:
                raise invalid(f"{where}The message attribute '{name}' must contain a non-empty value of type {base}")
            if base == "Number" and not _NUMBER.fullmatch(text.strip()):
                raise invalid(f"{where}Message attribute '{name}' is not a number: {text!r}")
            # SQS API reference, MessageAttributeValue: a string value has "the same restrictions
            # on the content as the message body", whose error is InvalidMessageContents (SendMessage)
            if INVALID_CHARS.search(text):
                raise SQSError("InvalidMessageContents", f"{where}Message attribute '{name}' has invalid characters")
            out[name] = (data_type, text)
    return out


def stored_attributes(
    attrs: dict[str, tuple[str, str | bytes]],
    meta: dict[str, Any],
    *,
    queue: str,
    body: str,
    body_hash: str | None = None,
) -> dict[str, Any] | None:
    """As the service stores them: name -> text (binary as base64), the rest under ``META``
    (a string: ``meta.encode``) for a message of ``queue`` with ``body`` (``body_hash``: its
    SHA-256, hex, when the caller has it)."""
    if not attrs and not meta:
        return None
    if not attrs:  # (most messages: the sender's metadata only)
        sender = meta.get("sender")
        if body_hash is not None and len(meta) == 1 and sender and isinstance(sender, str):
            return {META: sqs_meta.sender_only(queue, sender, body_hash)}
        return {META: sqs_meta.encode({}, meta, queue=queue, body=body, body_hash=body_hash)}
    out: dict[str, Any] = {}
    types = {}
    for name, (data_type, value) in attrs.items():
        out[name] = base64.b64encode(value).decode() if isinstance(value, bytes) else value
        if data_type != "String":
            types[name] = data_type
    if types:
        meta = {**meta, "types": types}
    if meta:
        out[META] = sqs_meta.encode(out, meta, queue=queue, body=body, body_hash=body_hash)
    return out


def read_attributes(
    stored: dict[str, Any] | None, *, body: str, queues: tuple[str, ...]
) -> tuple[dict[str, tuple[str, str | bytes]], dict[str, Any]]:
    """A stored message's attributes as SQS's, and its ``META`` (``meta.decode``: its sender
    only if sealed for one of ``queues``); a REST message's numbers are Number, its booleans
    String."""
    if not stored:
        return {}, {}
    meta = sqs_meta.decode(stored, body=body, queues=queues)
    types = meta.get("types") or {}
    out: dict[str, tuple[str, str | bytes]] = {}
    for name, value in stored.items():
        if name == META:
            continue
        data_type = types.get(name) if isinstance(value, str) else None
        if data_type is None:
            if isinstance(value, bool):
                data_type, value = "String", "true" if value else "false"
            elif isinstance(value, (int, float)):
                data_type, value = "Number", str(value)
            else:
                data_type, value = "String", str(value)
        if data_type.startswith("Binary"):
            try:
                out[name] = (data_type, base64.b64decode(value))
            except (binascii.Error, ValueError):
                out[name] = ("String", str(value))
        else:
            out[name] = (data_type, str(value))
    return out, meta


def attributes_json(attrs: dict[str, tuple[str, str | bytes]]) -> dict[str, Any]:
    out = {}
    for name, (data_type, value) in attrs.items():
        if isinstance(value, bytes):
            out[name] = {"DataType": data_type, "BinaryValue": base64.b64encode(value).decode()}
        else:
            out[name] = {"DataType": data_type, "StringValue": value}
    return out


def attributes_size(attrs: dict[str, tuple[str, str | bytes]]) -> int:
    return sum(
        len(n.encode()) + len(t.encode()) + len(v if isinstance(v, bytes) else v.encode())
        for n, (t, v) in attrs.items()
    )


def wanted_attribute(name: str, wanted: list[str]) -> bool:
    return any(w in ("All", ".*") or w == name or (w.endswith(".*") and name.startswith(w[:-1])) for w in wanted)
