"""What a client can check of a message before sending it: the REST API's rules for a message
(``queues/http/validation.py`` on the service's side) in plain Python, so that a buffered producer
(:mod:`mq_client.producer`) fails a bad message alone, at once, instead of having the whole batch
it would have joined refused.

What depends on the queue is checked only as far as the caller says (``max_message_size``;
a strict queue's missing group is left to the service).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_NAME",
    "MAX_ATTRIBUTE_VALUE",
    "MAX_DELAY",
    "MAX_SHORT_TEXT",
    "MESSAGE_FIELDS",
    "Refusal",
    "check_message",
    "refused_index",
]

#: The fields a message may carry.
MESSAGE_FIELDS = frozenset(
    {"body", "group", "fairness_key", "dedup_id", "delay", "not_before", "attributes", "size", "estimates"}
)
#: At most this many attributes a message.
MAX_ATTRIBUTES = 16
#: An attribute's name: 1 to this many characters.
MAX_ATTRIBUTE_NAME = 64
#: A string attribute's value: at most this many characters.
MAX_ATTRIBUTE_VALUE = 1024
#: ``group``, ``dedup_id`` and ``fairness_key``: 1 to this many characters.
MAX_SHORT_TEXT = 128
#: A message's ``delay`` (and how far ahead ``not_before`` may be), seconds.
MAX_DELAY = 900


class Refusal(ValueError):
    """What is wrong with a message: ``code`` is the code the API would answer, ``detail`` why."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def check_message(item: Mapping[str, Any], max_message_size: int | None = None) -> None:
    """Raise :class:`Refusal` if the API would refuse the message ``item`` (its JSON object)
    whatever the queue; its body's size too when ``max_message_size`` is given."""
    extra = set(item) - MESSAGE_FIELDS
    if extra:
        raise Refusal("unknown_field", f"unknown field(s) in the message: {', '.join(sorted(extra))}")
    body = item.get("body")
    if not isinstance(body, str):
        raise Refusal("invalid_body", "body must be a string (encode other data as JSON text)")
    if not body:
        raise Refusal("empty_body", "body is empty")
    try:
        size = len(body) if body.isascii() else len(body.encode("utf-8"))
    except UnicodeEncodeError:
        raise Refusal("invalid_body", "body is not valid Unicode (lone surrogate)") from None
    if max_message_size is not None and size > max_message_size:
        raise Refusal(
            "body_too_large", f"body is {size} bytes, over the queue's max_message_size of {max_message_size}"
        )
    for name in ("group", "fairness_key", "dedup_id"):
        value = item.get(name)
        if value is not None and (
            not isinstance(value, str) or not 1 <= len(value) <= MAX_SHORT_TEXT or "\x00" in value
        ):
            raise Refusal(f"invalid_{name}", f"{name} must be a string of 1 to {MAX_SHORT_TEXT} characters")
    if "delay" in item and "not_before" in item:
        raise Refusal("invalid_delay", "give delay or not_before, not both")
    delay = item.get("delay")
    if delay is not None and (
        isinstance(delay, bool)
        or not isinstance(delay, (int, float))
        or not math.isfinite(delay)
        or not 0 <= delay <= MAX_DELAY
    ):
        raise Refusal("out_of_range", f"delay must be a number from 0 to {MAX_DELAY}")
    _check_attributes(item.get("attributes"))


def _check_attributes(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping) or len(value) > MAX_ATTRIBUTES:
        raise Refusal("invalid_attributes", f"attributes must be an object of at most {MAX_ATTRIBUTES} entries")
    for key, v in value.items():
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_ATTRIBUTE_NAME or "\x00" in key:
            raise Refusal("invalid_attributes", f"attribute names are 1 to {MAX_ATTRIBUTE_NAME} characters")
        if isinstance(v, str):
            if len(v) > MAX_ATTRIBUTE_VALUE or "\x00" in v:
                raise Refusal("invalid_attributes", f"attribute {key!r} is over {MAX_ATTRIBUTE_VALUE:,} characters")
        elif not isinstance(v, (bool, int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            raise Refusal("invalid_attributes", f"attribute {key!r} must be a string, number or boolean")


_INDEX = re.compile(r"^messages\[(\d+)\]")


def refused_index(detail: Any) -> int | None:
    """The index of the message a refused batch names (the API's ``"messages[i]: ..."``), or None."""
    if not isinstance(detail, str):
        return None
    match = _INDEX.match(detail)
    return int(match.group(1)) if match else None
