"""Checks for the message calls, written by hand for the hot path.

A DRF serializer costs tens of microseconds per item; a batch of 1,000 messages would spend
most of its time there. These functions check the same things in plain Python and raise
:class:`InvalidRequest` with a precise message. Everything is checked before anything is stored.
"""

from __future__ import annotations

import math
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Any, Literal, TypeVar, overload

from mq_client.tracing import MAX_TRACESTATE, TRACEPARENT, TRACESTATE, checked_tracestate, valid_traceparent
from queues.engine.ids import MessageId, parse_message_id
from queues.public import LIMITS
from queues.service.errors import InvalidRequest
from queues.service.limits import MAX_BATCH, MAX_WAIT
from queues.service.types import MessageDraft, QueueConfig

#: a JSON object of a request body, before it is checked
JSONObject = dict[str, Any]

_Default = TypeVar("_Default", bound=float | None)


def object_of(data: Any, what: str = "request body") -> JSONObject:
    if not isinstance(data, dict):
        raise InvalidRequest(f"the {what} must be a JSON object")
    return data


def no_extra(data: JSONObject, allowed: AbstractSet[str], where: str) -> None:
    extra = set(data) - allowed
    if extra:
        raise InvalidRequest(f"unknown field(s) in {where}: {', '.join(sorted(extra))}", "unknown_field")


def _batch(data: JSONObject, key: str, code: str) -> list[Any]:
    """``data[key]`` as a list of 1 to ``MAX_BATCH`` items."""
    items = data[key]
    if not isinstance(items, list) or not items:
        raise InvalidRequest(f"{key} must be a non-empty list", code)
    if len(items) > MAX_BATCH:
        raise InvalidRequest(f"at most {MAX_BATCH} {key} per call, got {len(items)}", "batch_too_large")
    return items


@overload
def number(
    data: JSONObject, name: str, low: float, high: float, default: _Default, *, integer: Literal[True]
) -> int | _Default: ...
@overload
def number(
    data: JSONObject, name: str, low: float, high: float, default: _Default, *, integer: Literal[False] = False
) -> float | _Default: ...
def number(
    data: JSONObject, name: str, low: float, high: float, default: float | None, *, integer: bool = False
) -> float | None:
    if name not in data or data[name] is None:
        return default
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"{name} must be a number", "invalid_number")
    if integer and not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        raise InvalidRequest(f"{name} must be a whole number", "invalid_number")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(f"{name} must be finite", "invalid_number")
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}, got {value}", "out_of_range")
    return int(value) if integer else value


def _body(item: JSONObject, cfg: QueueConfig, where: str) -> str:
    if "body" not in item:
        raise InvalidRequest(f"{where}: body is required", "missing_body")
    body = item["body"]
    if not isinstance(body, str):
        raise InvalidRequest(f"{where}: body must be a string (encode other data as JSON text)", "invalid_body")
    if not body:
        raise InvalidRequest(f"{where}: body is empty", "empty_body")
    # Cheap bound first: a str of n code points is at most 4n bytes of UTF-8.
    if len(body) * 4 > cfg.max_message_size:
        size = len(body.encode("utf-8", "surrogatepass"))
        if size > cfg.max_message_size:
            raise InvalidRequest(
                f"{where}: body is {size} bytes, over the queue's max_message_size of {cfg.max_message_size}",
                "body_too_large",
            )
    if body.isascii():
        return body  # (no surrogate: no need to encode it to find out)
    try:
        body.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"{where}: body is not valid Unicode (lone surrogate)", "invalid_body") from None
    return body


MESSAGE_FIELDS = {"body", "group", "fairness_key", "dedup_id", "delay", "not_before", "attributes", "size", "estimates"}
MAX_ATTRIBUTES = 16


def _short_text(item: JSONObject, name: str, where: str) -> str | None:
    value = item.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 128 or "\x00" in value:
        raise InvalidRequest(f"{where}: {name} must be a string of 1 to 128 characters", f"invalid_{name}")
    return value


def _not_before(item: JSONObject, cfg: QueueConfig, now: float, where: str) -> float | None:
    if "delay" in item and "not_before" in item:  # even with one null: the schema says "not both"
        raise InvalidRequest(f"{where}: give delay or not_before, not both", "invalid_delay")
    horizon = LIMITS["delay"][1]
    if item.get("not_before") is not None:
        value = item["not_before"]
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise InvalidRequest(
                    f"{where}: not_before must be epoch seconds or ISO 8601", "invalid_delay"
                ) from None
        value = number({"not_before": value}, "not_before", 0, now + horizon, None)
        assert value is not None  # it was given: a number, or InvalidRequest
        return value if value > now else None
    delay = number(item, "delay", 0, horizon, cfg.delay)
    return now + delay if delay else None


#: The longest attribute name a node forwards: the SQS API's (see :func:`_attributes`).
NODE_ATTRIBUTE_NAME = 256


def _attributes(item: JSONObject, where: str, trusted: bool = False) -> dict[str, Any] | None:
    """A message's attributes. ``trusted`` (a node's forwarded message): what one of the
    service's entrances accepted there, checked for form only. The SQS API's attributes have
    names of up to 256 characters and values up to the message's size, and a message stored by
    an earlier version may hold an object; a client's message was checked by the entrance it
    came through (these limits, or the SQS API's)."""
    value = item.get("attributes")
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_ATTRIBUTES:
        raise InvalidRequest(
            f"{where}: attributes must be an object of at most {MAX_ATTRIBUTES} entries", "invalid_attributes"
        )
    longest = NODE_ATTRIBUTE_NAME if trusted else 64
    for key, v in value.items():
        if not 1 <= len(key) <= longest or "\x00" in key:
            raise InvalidRequest(f"{where}: attribute names are 1 to {longest} characters", "invalid_attributes")
        if isinstance(v, str):
            if (len(v) > 1024 and not trusted) or "\x00" in v:
                raise InvalidRequest(f"{where}: attribute {key!r} is over 1,024 characters", "invalid_attributes")
        elif trusted and isinstance(v, dict):
            continue
        elif not isinstance(v, (bool, int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            raise InvalidRequest(
                f"{where}: attribute {key!r} must be a string, number or boolean", "invalid_attributes"
            )
    if not trusted and (TRACEPARENT in value or TRACESTATE in value):
        _trace_context(value, where)
    return value


def _trace_context(attributes: dict[str, Any], where: str) -> None:
    """A message's own trace context (``traceparent``, ``tracestate``) in W3C's form: the node
    and every consumer read it as such, so one that is not is refused rather than stored."""
    parent = attributes.get(TRACEPARENT)
    if parent is not None and not (isinstance(parent, str) and valid_traceparent(parent)):
        raise InvalidRequest(
            f"{where}: attribute 'traceparent' must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)",
            "invalid_attributes",
        )
    state = attributes.get(TRACESTATE)
    if state is not None and not (
        isinstance(state, str) and len(state) <= MAX_TRACESTATE and checked_tracestate(state) is not None
    ):
        raise InvalidRequest(
            f"{where}: attribute 'tracestate' must be a W3C tracestate (key=value list members, at most "
            f"32) of at most {MAX_TRACESTATE} characters",
            "invalid_attributes",
        )


def _estimates(item: JSONObject, where: str) -> dict[str, float] | None:
    value = item.get("estimates")
    if value is None:
        return None
    if not isinstance(value, dict) or not value or set(value) - {"preprocess", "process"}:
        raise InvalidRequest(
            f"{where}: estimates is an object with preprocess and/or process (seconds)", "invalid_estimates"
        )
    # null is "not given" (the schema's nullable): the queue's estimate, as for a key left out,
    # so a delivery always answers numbers
    given = {k: number(value, k, *LIMITS["estimate"], None) for k in value}
    return {k: v for k, v in given.items() if v is not None} or None


#: What only a node may send with a message: a dead letter's history, the one subscription of
#: a topic that reads it (a redriven dead letter).
NODE_FIELDS = frozenset({"history", "subscription"})


def _message(item: JSONObject, cfg: QueueConfig, now: float, where: str, trusted: bool = False) -> MessageDraft:
    if len(item) != 1:
        no_extra(item, MESSAGE_FIELDS | (NODE_FIELDS if trusted else set()), where)
    draft = MessageDraft(_body(item, cfg, where))
    if trusted and isinstance(item.get("history"), dict):
        draft.history = item["history"]
    if trusted and isinstance(item.get("subscription"), str):
        draft.subscription = item["subscription"]
    if len(item) == 1 and not cfg.strict and not cfg.delay:
        return draft
    draft.group = _short_text(item, "group", where)
    if cfg.strict and draft.group is None:
        raise InvalidRequest(f"{where}: queue {cfg.name!r} is strict: every message needs a group", "missing_group")
    draft.fairness_key = _short_text(item, "fairness_key", where)
    draft.dedup_id = _short_text(item, "dedup_id", where)
    draft.not_before = _not_before(item, cfg, now, where)
    draft.attributes = _attributes(item, where, trusted)
    if item.get("size") is not None:
        draft.size = number(item, "size", 0, 1 << 50, None, integer=True)
    draft.estimates = _estimates(item, where)
    return draft


#: Each message's name in an error ("messages[i]"), made once rather than for every message.
_WHERE = tuple(f"messages[{i}]" for i in range(MAX_BATCH))


def enqueue_request(data: Any, cfg: QueueConfig, now: float, trusted: bool = False) -> tuple[list[MessageDraft], bool]:
    """The checked messages to enqueue, and whether the call was a batch."""
    data = object_of(data)
    if "messages" in data:
        no_extra(data, {"messages"}, "the request")
        items = _batch(data, "messages", "invalid_messages")
        drafts = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise InvalidRequest(f"messages[{i}] must be an object with a body", "invalid_messages")
            drafts.append(_message(item, cfg, now, _WHERE[i], trusted))
        return drafts, True
    return [_message(data, cfg, now, "message", trusted)], False


def dequeue_request(data: Any) -> tuple[int, float | None, float]:
    data = object_of(data)
    no_extra(data, {"max", "visibility_timeout", "wait"}, "the request")
    max_messages = number(data, "max", 1, MAX_BATCH, 1, integer=True)
    visibility_timeout = number(data, "visibility_timeout", *LIMITS["visibility_timeout"], None)
    wait = number(data, "wait", 0, MAX_WAIT, 0)
    return max_messages, visibility_timeout, wait


def message_id(value: Any, cfg: QueueConfig, where: str) -> MessageId:
    mid = parse_message_id(value)
    if mid is None:
        raise InvalidRequest(
            f"{where}: {value!r} is not a message ID (<queue>/<partition>/<block>/<index>)", "invalid_id"
        )
    if mid.queue != cfg.name:
        raise InvalidRequest(
            f"{where}: message {value} belongs to queue {mid.queue!r}, not {cfg.name!r}", "wrong_queue"
        )
    if mid.partition >= cfg.partitions:
        raise InvalidRequest(f"{where}: queue {cfg.name!r} has no partition {mid.partition}", "invalid_id")
    return mid


#: The longest receipt an ack or a visibility change may carry (ours are 16 characters).
RECEIPT_MAX = 64


def _receipt(value: Any, where: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= RECEIPT_MAX:
        raise InvalidRequest(f"{where}: receipt must be the string returned by dequeue", "invalid_receipt")
    return value


def ack_request(data: Any, cfg: QueueConfig) -> list[tuple[MessageId, str | None]]:
    data = object_of(data)
    if cfg.strict and "ids" in data:
        raise InvalidRequest(
            f"queue {cfg.name!r} is strict: acknowledge with messages [{{id, receipt}}]", "receipt_required"
        )
    if ("ids" in data) == ("messages" in data):
        raise InvalidRequest(
            "give either ids (a list of message IDs) or messages (a list of {id, receipt})", "invalid_ack"
        )
    if "ids" in data:
        no_extra(data, {"ids"}, "the request")
        ids = _batch(data, "ids", "invalid_ack")
        return [(message_id(v, cfg, f"ids[{i}]"), None) for i, v in enumerate(ids)]
    no_extra(data, {"messages"}, "the request")
    items = _batch(data, "messages", "invalid_ack")
    out = []
    for i, item in enumerate(items):
        # The checks of a well-formed item first, without building its name ("messages[i]")
        # or a set of its keys: a batch ack runs this for every message. They are those of
        # _ack_item (its _receipt, its message_id); anything they do not pass goes there.
        if type(item) is dict and item.keys() <= _ACK_FIELDS:
            receipt = item.get("receipt")
            mid = parse_message_id(item.get("id"))
            if (
                ((type(receipt) is str and 1 <= len(receipt) <= RECEIPT_MAX) or (receipt is None and not cfg.strict))
                and mid is not None
                and mid.queue == cfg.name
                and mid.partition < cfg.partitions
            ):
                out.append((mid, receipt))
                continue
        out.append(_ack_item(item, cfg, f"messages[{i}]"))  # raises InvalidRequest, saying why
    return out


_ACK_FIELDS = frozenset({"id", "receipt"})


def _ack_item(item: Any, cfg: QueueConfig, where: str) -> tuple[MessageId, str | None]:
    """One item of an ack's ``messages``, checked with the errors it earns."""
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where} must be an object with id and receipt", "invalid_ack")
    no_extra(item, _ACK_FIELDS, where)
    receipt = _receipt(item["receipt"], where) if item.get("receipt") is not None else None
    if receipt is None and cfg.strict:
        raise InvalidRequest(f"{where}: queue {cfg.name!r} is strict: a receipt is required", "receipt_required")
    return message_id(item.get("id"), cfg, where), receipt


def visibility_request(data: Any, cfg: QueueConfig) -> tuple[MessageId, str | None, float]:
    data = object_of(data)
    no_extra(data, {"id", "receipt", "visibility_timeout"}, "the request")
    mid = message_id(data.get("id"), cfg, "id")
    receipt = _receipt(data["receipt"], "receipt") if data.get("receipt") is not None else None
    if data.get("visibility_timeout") is None:
        raise InvalidRequest("visibility_timeout is required (seconds from now; 0 makes it visible)", "missing_field")
    visibility_timeout = number(data, "visibility_timeout", *LIMITS["visibility_timeout"], None)
    assert visibility_timeout is not None  # required above
    return mid, receipt, visibility_timeout
