"""The console's form field for JSON values: Django's, bounded (every model admin's JSON fields
use it: ``admin_site.ConsoleSite.register``).

Django's ``forms.JSONField`` reads the text with ``json.loads`` and catches its
``JSONDecodeError`` only: an integer of more than 4,300 digits (a ValueError: Python's limit
for text to int) or arrays nested thousands deep (a RecursionError) answered 500. And a value
that parses may still be one PostgreSQL's ``jsonb`` refuses (a NUL, ``\\u0000``; a lone
surrogate, ``\\ud800``, which is no UTF-8): the save failed. Each is "Enter a valid JSON." here,
as any text that is not JSON.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms.fields import InvalidJSONInput

#: The deepest nesting of objects and arrays a value may have (no field of the console's
#: models holds more than a few levels: tags, a consumer's queues, a message's attributes).
MAX_DEPTH = 32


def storable(value: Any) -> bool:
    """Whether ``value`` nests at most :data:`MAX_DEPTH` deep and every text in it (keys too)
    is one ``jsonb`` holds: UTF-8 without NUL. Walked level by level, without recursion."""
    if isinstance(value, str):
        return _text_ok(value)
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(MAX_DEPTH):
        deeper: list[Any] = []
        for item in level:
            for child in [*item.keys(), *item.values()] if isinstance(item, dict) else item:
                if isinstance(child, dict | list):
                    deeper.append(child)
                elif isinstance(child, str) and not _text_ok(child):
                    return False
        if not deeper:
            return True
        level = deeper
    return False


def _text_ok(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class JSONField(forms.JSONField):
    """``forms.JSONField`` that refuses, as text that is not JSON, what ``json.loads`` raises
    on past its own error and what PostgreSQL cannot store (:func:`storable`)."""

    def to_python(self, value: Any) -> Any:
        try:
            converted = super().to_python(value)
        except (ValueError, RecursionError):
            raise ValidationError(self.error_messages["invalid"], code="invalid", params={"value": value}) from None
        if not self.disabled and not storable(converted):
            raise ValidationError(self.error_messages["invalid"], code="invalid", params={"value": value})
        return converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            bound = super().bound_data(data, initial)
        except (ValueError, RecursionError):
            return InvalidJSONInput(data)
        if not self.disabled and not isinstance(bound, InvalidJSONInput) and not storable(bound):
            return InvalidJSONInput(data)  # (shown again as it was typed)
        return bound
