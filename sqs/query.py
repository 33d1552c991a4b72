"""SQS's query protocol (``Action=...`` form posts, XML answers) as a pure codec.

The SQS app's canonical form is the AWS JSON 1.0 protocol's: an action takes a params dict shaped
as botocore's JSON protocol sends it and returns a result dict shaped as it expects. This module
turns a query form into that shape (``decode``) and a result or an error back into the XML SQS
answers with (``encode``, ``encode_error``), driven by the static shape description
``sqs.query_shapes`` (generated from botocore's model: botocore is not a runtime dependency).

Wire rules, as botocore's query serializer and parser apply them:
- a structure member goes under its wire name: ``QueueUrl``, ``Attribute`` (for ``Attributes``);
- a flattened list's elements are numbered from 1 under the element's name when it has one
  (``AttributeName.1``, ``SendMessageBatchRequestEntry.2.Id``), else under the member's; a list
  that is not flattened nests them (``Name.member.1``); an empty list is sent as ``Name=``;
- a map's entries are numbered the same way with their key and value under their names
  (``Attribute.1.Name``, ``Attribute.1.Value``, ``MessageAttribute.1.Value.DataType``);
- integers and longs as decimals, booleans as ``true``/``false``, blobs as base64 (which is
  also how the JSON protocol carries them, so they stay base64 strings in the params).
"""

from __future__ import annotations

import base64
import codecs
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote_to_bytes
from xml.sax.saxutils import escape

from sqs.errors import SQSError
from sqs.query_shapes import ERROR_CODES, OPERATIONS, SHAPES, XML_NAMESPACE

__all__ = [
    "INVALID_CHARS",
    "NOT_AT_A_QUEUE_URL",
    "QueryError",
    "decode",
    "encode",
    "encode_error",
    "parse_form",
    "query_error_code",
    "valid_text",
]

_INDEX = re.compile(r"[1-9][0-9]{0,5}")
#: characters XML 1.0 cannot carry, which SQS refuses in what it keeps and answers with (a
#: body, an attribute's or a tag's text): the query protocol's answers are XML.
INVALID_CHARS = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_INTEGER = re.compile(r"-?[0-9]+")
#: the most characters of an integer's text (a long has 19 digits; leading zeros are taken).
_MAX_DIGITS = 64

#: The actions SQS refuses (``InvalidAction``) at a queue's URL: they act on no queue. Every
#: other action is served there, ``GetQueueUrl`` included (of any queue, as SQS answers it).
NOT_AT_A_QUEUE_URL = frozenset({"CreateQueue", "ListQueues"})

#: The query protocol's own wording of an error's message, by its code and the JSON protocol's
#: wording, where SQS words it apart.
_QUERY_MESSAGES = {
    ("AWS.SimpleQueueService.NonExistentQueue", "The specified queue does not exist."): (
        "The specified queue does not exist for this wsdl version."
    ),
}


class QueryError(SQSError):
    """A query request this codec cannot read: the SQS error to answer with (400, the
    sender's fault, unless said). ``code`` is the JSON protocol's (``encode_error`` gives the
    query protocol's)."""

    def __init__(self, code: str, message: str, status: int = 400, sender_fault: bool = True) -> None:
        super().__init__(code, message, status, sender_fault)


def query_error_code(code: str) -> str:
    """The query protocol's code for a JSON-protocol error code: ``QueueDoesNotExist`` ->
    ``AWS.SimpleQueueService.NonExistentQueue``; codes SQS shares between the two (such as
    ``InvalidParameterValue``) and codes already in query form pass through."""
    query_code: str = ERROR_CODES.get(code, code)  # (the generated table's values are text)
    return query_code


def valid_text(text: str) -> bool:
    """Whether ``text`` has none of :data:`INVALID_CHARS` (printable ASCII, most texts, is
    told without the pattern)."""
    return (text.isascii() and text.isprintable()) or not INVALID_CHARS.search(text)


# -- decode -------------------------------------------------------------------------------------


def _unquote(raw: bytes, encoding: str) -> str:
    """``raw`` (one key or value of a form) with ``+`` as a space and its percent-escapes
    decoded, as ``urllib.parse.unquote_plus`` reads it. The escapes are decoded in C, as
    ``\\xNN`` escapes (``codecs.escape_decode``; the backslashes of the text doubled first):
    urllib decodes them one by one in Python, slow on a large non-ASCII text (figures in
    ``docs/explanation/performance.md``). A ``%`` not followed by two hex digits stays, as urllib leaves it."""
    raw = raw.replace(b"+", b" ")
    if b"%" in raw:
        try:
            raw = codecs.escape_decode(raw.replace(b"\\", b"\\\\").replace(b"%", b"\\x"))[0]
        except ValueError:  # an escape that is not one: urllib's reading, escape by escape
            raw = unquote_to_bytes(raw)
    return raw.decode(encoding, "replace")


def parse_form(body: bytes, encoding: str = "utf-8", max_fields: int | None = None) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body's fields, one value a key (the last), as
    Django's ``QueryDict(...).dict()`` reads a form of ASCII (every client's): pairs split at
    ``&``, blank values kept, a pair with no ``=`` a key with an empty value. Bytes that are
    not ``encoding`` read as U+FFFD each (Django reads the whole body again as Latin-1).
    QueryError (400) past ``max_fields``, counted before the body is split."""
    out: dict[str, str] = {}
    if not body:
        return out
    fields = body.count(b"&") + 1
    if max_fields is not None and fields > max_fields:
        raise QueryError("MalformedQueryString", f"the form has {fields} fields, over the limit of {max_fields}")
    pairs = body.split(b"&")
    for pair in pairs:
        if not pair:
            continue
        key, _, value = pair.partition(b"=")
        out[_unquote(key, encoding)] = _unquote(value, encoding)
    return out


def _single_values(form: Mapping[str, Any]) -> dict[str, str]:
    """One value per key, the last one as Django's ``QueryDict`` reads it; accepts a QueryDict,
    a ``parse_qs`` dict of lists, or a plain dict of strings."""
    lists: Iterable[tuple[str, Any]] = form.lists() if hasattr(form, "lists") else form.items()
    flat = {}
    for key, values in lists:
        if isinstance(values, str):
            flat[key] = values
        elif values:
            flat[key] = values[-1]
    return flat


#: The most parts (``.``-separated) of a key whose prefixes are indexed, and the longest key
#: indexed. SQS's deepest key has 7 parts and about 80 characters
#: (``SendMessageBatchRequestEntry.10.MessageAttribute.10.Value.StringListValue.1``); a deeper
#: or longer one names nothing an action reads, and indexing every prefix of a key costs its
#: parts times its length: a key of 20,000 dots took 2 s, the 4 MiB a body may hold hours.
MAX_KEY_PARTS = 16
MAX_KEY_LENGTH = 1024


class _Form:
    """The flat form with, per prefix, the indices numbered under it (``Attribute`` -> {1, 2}).
    Cost: O(keys x ``MAX_KEY_PARTS``) prefixes, each at most a key long."""

    def __init__(self, flat: dict[str, str]) -> None:
        self.flat = flat
        self.indices: dict[str, set[int]] = {}
        self.prefixes: set[str] = set()
        for key in flat:
            if len(key) > MAX_KEY_LENGTH:
                continue  # (still read as it is: no shape's key is as long)
            # (the last part holds the rest of a deeper key: no index, its prefixes not kept)
            parts = key.split(".", MAX_KEY_PARTS)
            for end in range(1, len(parts)):
                prefix = ".".join(parts[:end])
                self.prefixes.add(prefix)
                if _INDEX.fullmatch(parts[end]):
                    self.indices.setdefault(prefix, set()).add(int(parts[end]))

    def present(self, key: str) -> bool:
        return key in self.flat or key in self.prefixes


def _shown(text: str, limit: int = 64) -> str:
    """A caller's text as an error quotes it: at most ``limit`` characters."""
    return text if len(text) <= limit else f"{text[:limit]}..."


def _scalar(kind: str, key: str, text: str) -> Any:
    if kind == "string":
        return text
    if kind in ("integer", "long"):
        # ASCII digits only (int() also reads "1_000" and other scripts' digits), and few
        # enough: more are past any range, and int() refuses text of more than 4,300
        digits = text.strip()
        if _INTEGER.fullmatch(digits) and len(digits) <= _MAX_DIGITS:
            return int(digits)
        raise QueryError("InvalidParameterValue", f"Value {_shown(text)!r} for parameter {key} is not an integer.")
    if kind == "boolean":
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise QueryError("InvalidParameterValue", f"Value {_shown(text)!r} for parameter {key} is not a boolean.")
    if kind == "blob":
        try:
            return base64.b64encode(base64.b64decode(text, validate=True)).decode("ascii")
        except ValueError:  # binascii.Error, or a character that is not ASCII
            raise QueryError("InvalidParameterValue", f"Value for parameter {key} is not valid base64.") from None
    raise QueryError("InvalidParameterValue", f"Parameter {key} has a type this service does not read ({kind}).")


def _decode_value(form: _Form, shape_name: str, key: str) -> Any:
    """The value of ``shape_name`` sent under ``key`` (which is present)."""
    shape = SHAPES[shape_name]
    if shape[0] == "structure":
        return _decode_structure(form, shape_name, key + ".")
    if key not in form.flat:
        raise QueryError("InvalidParameterValue", f"Parameter {key} must be a single value.")
    return _scalar(shape[0], key, form.flat[key])


def _decode_structure(form: _Form, shape_name: str, prefix: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for member, (target, wire, flattened) in SHAPES[shape_name][1].items():
        shape = SHAPES[target]
        key = prefix + wire
        if shape[0] == "list":
            base = prefix + (shape[2] or wire) if flattened else f"{key}.{shape[2] or 'member'}"
            indices = sorted(form.indices.get(base, ()))
            if indices:
                params[member] = [_decode_value(form, shape[1], f"{base}.{i}") for i in indices]
            elif form.flat.get(key) == "":
                params[member] = []
        elif shape[0] == "map":
            _, key_shape, key_name, value_shape, value_name = shape
            base = key if flattened else f"{key}.entry"
            entries = {}
            for i in sorted(form.indices.get(base, ())):
                entry_key = f"{base}.{i}.{key_name}"
                if entry_key not in form.flat:
                    raise QueryError("MissingParameter", f"The request must contain the parameter {entry_key}.")
                name = _scalar(SHAPES[key_shape][0], entry_key, form.flat[entry_key])
                value_key = f"{base}.{i}.{value_name}"
                if not form.present(value_key):
                    raise QueryError("MissingParameter", f"The request must contain the parameter {value_key}.")
                entries[name] = _decode_value(form, value_shape, value_key)
            if entries:
                params[member] = entries
        elif shape[0] == "structure":
            if form.present(key):
                params[member] = _decode_structure(form, target, key + ".")
        elif key in form.flat:
            params[member] = _scalar(shape[0], key, form.flat[key])
    return params


def decode(form: Mapping[str, Any], queue_url: str | None = None) -> tuple[str, dict[str, Any]]:
    """The action of a query request and its params in the JSON protocol's shape.

    ``form`` is the request's form (the body of a POST, the query string of a GET): a Django
    ``QueryDict``, a ``urllib.parse.parse_qs`` dict of lists, or a dict of strings. Keys the
    action does not take (``Version``, the signature's) are ignored; values are typed by the
    action's input shape. ``queue_url``: the queue's URL the request was sent to (None: the
    service's endpoint), as SQS takes it: the ``QueueUrl`` of an action that takes one and whose
    form names none (one the form names wins), and ``InvalidAction`` for the actions of
    ``NOT_AT_A_QUEUE_URL``. Raises ``QueryError`` (``MissingAction``, ``InvalidAction``,
    ``InvalidParameterValue``, ``MissingParameter``) for a form it cannot read. Cost: O(keys x
    key depth) to index the form, then O(members) per structure.
    """
    flat = _single_values(form)
    action = flat.get("Action")
    if not action:
        raise QueryError("MissingAction", "The request must contain the parameter Action.")
    if action not in OPERATIONS or (queue_url is not None and action in NOT_AT_A_QUEUE_URL):
        raise QueryError("InvalidAction", f"The action {action} is not valid for this endpoint.")
    request_shape = OPERATIONS[action][0]
    if request_shape is None:
        return action, {}
    params = _decode_structure(_Form(flat), request_shape, "")
    if queue_url is not None and "QueueUrl" in SHAPES[request_shape][1] and "QueueUrl" not in params:
        params["QueueUrl"] = queue_url
    return action, params


# -- encode -------------------------------------------------------------------------------------


def _text(value: str) -> str:
    # A carriage return would come back as a line feed from any XML parser: SQS escapes it.
    # A character XML cannot carry (a control character, a lone surrogate), which SQS refuses
    # in what it keeps but an error may quote or another entrance may have stored, is U+FFFD:
    # the answer stays XML that any client reads.
    if not valid_text(value):
        value = INVALID_CHARS.sub("\ufffd", value)
    return escape(value).replace("\r", "&#xD;")


def _encode_scalar(kind: str, value: Any) -> str:
    if kind == "boolean":
        return "true" if value else "false"
    if kind in ("integer", "long"):
        return str(int(value))
    if kind == "blob" and isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    return _text(str(value)) if kind != "blob" else str(value)


def _encode_value(out: list[str], shape_name: str, tag: str, value: Any) -> None:
    shape = SHAPES[shape_name]
    out.append(f"<{tag}>")
    if shape[0] == "structure":
        _encode_structure(out, shape_name, value)
    else:
        out.append(_encode_scalar(shape[0], value))
    out.append(f"</{tag}>")


def _encode_structure(out: list[str], shape_name: str, values: Mapping[str, Any]) -> None:
    for member, (target, wire, flattened) in SHAPES[shape_name][1].items():
        value = values.get(member)
        if value is None:
            continue
        shape = SHAPES[target]
        if shape[0] == "list":
            if flattened:
                for element in value:
                    _encode_value(out, shape[1], shape[2] or wire, element)
            else:
                out.append(f"<{wire}>")
                for element in value:
                    _encode_value(out, shape[1], shape[2] or "member", element)
                out.append(f"</{wire}>")
        elif shape[0] == "map":
            _, key_shape, key_name, value_shape, value_name = shape
            if not flattened:
                out.append(f"<{wire}>")
            entry = wire if flattened else "entry"
            for key, item in value.items():
                out.append(f"<{entry}>")
                _encode_value(out, key_shape, key_name, key)
                _encode_value(out, value_shape, value_name, item)
                out.append(f"</{entry}>")
            if not flattened:
                out.append(f"</{wire}>")
        else:
            _encode_value(out, target, wire, value)


def encode(action: str, result: Mapping[str, Any] | None, request_id: str) -> bytes:
    """The XML body SQS's query protocol answers ``action`` with, for a result dict in the JSON
    protocol's shape (blobs as base64 strings or bytes): ``<{Action}Response><{Action}Result>...
    </{Action}Result><ResponseMetadata><RequestId>...``. An action without a result shape
    (DeleteQueue, ...) answers with the metadata alone. ``KeyError`` for an unknown action."""
    result_shape = OPERATIONS[action][1]
    out = [f'<?xml version="1.0"?><{action}Response xmlns="{XML_NAMESPACE}">']
    if result_shape is not None:
        out.append(f"<{action}Result>")
        _encode_structure(out, result_shape, result or {})
        out.append(f"</{action}Result>")
    out.append(f"<ResponseMetadata><RequestId>{_text(request_id)}</RequestId></ResponseMetadata>")
    out.append(f"</{action}Response>")
    return "".join(out).encode("utf-8")


def encode_error(code: str, message: str, sender_fault: bool, request_id: str) -> bytes:
    """SQS's query-protocol error body for a JSON-protocol error ``code`` (mapped by
    ``query_error_code``, its message worded as SQS words it in this protocol):
    ``<ErrorResponse><Error><Type>Sender|Receiver</Type><Code>..``."""
    kind = "Sender" if sender_fault else "Receiver"
    code = query_error_code(code)
    message = _QUERY_MESSAGES.get((code, message), message)
    return (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{XML_NAMESPACE}"><Error><Type>{kind}</Type>'
        f"<Code>{_text(code)}</Code><Message>{_text(message)}</Message><Detail/></Error>"
        f"<RequestId>{_text(request_id)}</RequestId></ErrorResponse>"
    ).encode()
