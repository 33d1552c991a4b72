"""The console's form fields where Django's answered 500 to a value a user may type: a JSON
value, and a choice of several rows (every model admin's forms use them:
``admin_site.ConsoleSite.register``).

Django's ``forms.JSONField`` reads the text with ``json.loads`` and catches its
``JSONDecodeError`` only: an integer of more than 4,300 digits (a ValueError: Python's limit
for text to int) or arrays nested thousands deep (a RecursionError) answered 500. And a value
that parses may still be one PostgreSQL's ``jsonb`` refuses (a NUL, ``\\u0000``; a lone
surrogate, ``\\ud800``, which is no UTF-8): the save failed. Each is "Enter a valid JSON." here,
as any text that is not JSON.

Django's ``forms.ModelMultipleChoiceField`` looks its values up with ``pk__in``: on SQLite (the
embedded default) an integer past 64 bits raised OverflowError there. A value past the key
column's range (:func:`within_range`) is refused as a key that is none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.core.exceptions import ValidationError
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model
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


def within_range(field: Field[Any, Any], value: Any, connection: BaseDatabaseWrapper) -> bool:
    """Whether ``value`` (an int, or text of one) fits the column of ``field`` on ``connection``
    when that is an integer column (a relation's: its target's); anything else is the field's
    own check to refuse, and True here."""
    target = getattr(field, "target_field", field)
    internal = target.get_internal_type()
    if internal not in connection.ops.integer_field_ranges:
        return True
    try:
        number = int(str(value).strip())
    except ValueError:  # not an integer (or past 4,300 digits): to_python refuses it
        return True
    low, high = connection.ops.integer_field_range(internal)
    return (low is None or number >= low) and (high is None or number <= high)


if TYPE_CHECKING:
    # django-stubs' field takes its model as a type argument; Django's cannot be subscripted.
    _ModelMultipleChoiceField = forms.ModelMultipleChoiceField[Model]
else:
    _ModelMultipleChoiceField = forms.ModelMultipleChoiceField


class ModelMultipleChoiceField(_ModelMultipleChoiceField):
    """``forms.ModelMultipleChoiceField`` that refuses a key past its column's range as one
    that is no key (``invalid_pk_value``) before any lookup."""

    def _check_values(self, value: Any) -> Any:
        key = self.to_field_name or "pk"
        assert self.queryset is not None  # a model admin's many-to-many field always has its rows
        meta = self.queryset.model._meta
        field = meta.pk if key == "pk" else meta.get_field(key)
        connection = connections[self.queryset.db]
        if isinstance(field, Field) and isinstance(value, list | tuple):  # (a key is a column: no relation)
            for pk in value:
                if not within_range(field, pk, connection):
                    raise ValidationError(
                        self.error_messages["invalid_pk_value"], code="invalid_pk_value", params={"pk": pk}
                    )
        return super()._check_values(value)  # type: ignore[misc]  # Django's, private: not in its stubs
