"""The AWS JSON 1.0 protocol of SQS (``X-Amz-Target: AmazonSQS.<Action>``): what boto3 and
current SDKs send. A request is an action name and a JSON object of parameters, the answer a
JSON object; both are the canonical shapes ``actions`` takes and returns (the query protocol,
``query``, is translated to and from them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from queues.errors import Refused
from sqs.errors import SQSError

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
#: The deepest nesting of objects and arrays a request may have. SQS's deepest input is 6 levels
#: (SendMessageBatch: entries, an entry, its attributes, one attribute, its list of values);
#: anything past this is refused (400) before an action or a recursive walk sees it. The JSON
#: texts inside parameters (a RedrivePolicy, a Policy) are bounded alike (:func:`loads`).
MAX_DEPTH = 16


def is_json_request(headers: Mapping[str, str]) -> bool:
    """``headers`` in lower case."""
    return "x-amz-target" in headers or headers.get("content-type", "").startswith(CONTENT_TYPE)


def decode(headers: Mapping[str, str], body: bytes) -> tuple[str, dict[str, Any]]:
    """(action, params). Raises SQSError (InvalidAction, MalformedQueryString)."""
    target = headers.get("x-amz-target", "")
    prefix, dot, action = target.partition(".")
    if not dot or prefix != TARGET_PREFIX[:-1] or not action:
        raise SQSError("InvalidAction", f"X-Amz-Target must be AmazonSQS.<Action>, got {target!r}")
    if not body.strip():
        return action, {}
    try:
        params = loads(body, huge_integers=True)
    except TooDeep:
        raise SQSError(
            "MalformedQueryString", f"the body nests objects and arrays more than {MAX_DEPTH} deep"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise SQSError("MalformedQueryString", f"the body is not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise SQSError("MalformedQueryString", "the body must be a JSON object")
    return action, params


class TooDeep(Refused, ValueError):
    """JSON text that nests objects and arrays past :data:`MAX_DEPTH` (a ValueError too: what
    the readers of a parameter's JSON text catch for text that is not JSON)."""

    code = "too_deep"


class HugeInteger:
    """An integer of a request's body past the digits Python converts (``sys.int_info``'s
    ``default_max_str_digits``, 4,300): past any parameter's range, refused by the action as
    an invalid value of that parameter (it is no ``int``, no ``str``). Shown shortened."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal

    def __str__(self) -> str:
        return f"{self.literal[:16]}...({len(self.literal.lstrip('-'))} digits)"

    __repr__ = __str__


def _integer(literal: str) -> int | HugeInteger:
    try:
        return int(literal)
    except ValueError:  # past the digit limit (the literal is digits: the parser matched it)
        return HugeInteger(literal)


def loads(text: bytes | str, *, huge_integers: bool = False) -> Any:
    """JSON text as ``json.loads`` reads it, nested at most :data:`MAX_DEPTH` deep (else
    :class:`TooDeep`, a ValueError). What every JSON text of a caller is read with: a request's
    body, and the JSON inside its parameters (a RedrivePolicy, a Policy, a TaskHandle), where
    an unbounded parse would recurse past Python's stack (RecursionError). An integer past
    Python's digit limit is a :class:`HugeInteger` with ``huge_integers``, else a ValueError.

    orjson parses where it can; a text it refuses (NaN, an integer past a double, a lone
    surrogate, its own nesting bound) is parsed again by ``json``, which decides. Cost: one
    parse, and a walk of the value only when the text has more brackets than the bound."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            value = json.loads(text, parse_int=_integer if huge_integers else None)
        except RecursionError:
            raise TooDeep(f"nested past {MAX_DEPTH}") from None
    # (a text with no more brackets than MAX_DEPTH nests no deeper: most texts need no walk)
    brackets = text.count(b"{") + text.count(b"[") if isinstance(text, bytes) else text.count("{") + text.count("[")
    if brackets > MAX_DEPTH and _too_deep(value):
        raise TooDeep(f"nested past {MAX_DEPTH}")
    return value


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests dicts and lists past ``MAX_DEPTH`` (walked without recursion)."""
    level: list[Any] = [value] if isinstance(value, dict | list) else []
    for _ in range(MAX_DEPTH):
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def encode(result: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of a successful answer."""
    return 200, {"Content-Type": CONTENT_TYPE}, _dumps(result)


def _dumps(result: dict[str, Any]) -> bytes:
    """The answer in JSON (orjson; ``json`` for what orjson does not take: an integer past 64 bits)."""
    try:
        return orjson.dumps(result)
    except TypeError:
        return json.dumps(result, separators=(",", ":")).encode("utf-8")


def encode_error(err: SQSError) -> tuple[int, dict[str, str], bytes]:
    """SQS's JSON error: ``__type`` the shape, ``x-amzn-query-error`` the query code and fault
    (botocore reads the code from it and raises e.g. ``QueueDoesNotExist``)."""
    headers = {
        "Content-Type": CONTENT_TYPE,
        "x-amzn-query-error": f"{err.query_code};{'Sender' if err.sender_fault else 'Receiver'}",
    }
    if err.retry_after is not None:
        headers["Retry-After"] = f"{err.retry_after:g}"
    body = {"__type": f"com.amazonaws.sqs#{err.code}", "message": err.message}
    return err.status, headers, json.dumps(body).encode("utf-8")
