"""The console's JSON form field (``consoles.forms``): what Django's answered 500 to, or what
PostgreSQL's jsonb refuses, is "Enter a valid JSON.", as any text that is not JSON."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import models
from django.forms.fields import InvalidJSONInput

from consoles import forms


@pytest.mark.parametrize(
    "text",
    [
        "9" * 4_301,  # Python's limit for text to int: a ValueError, not a JSONDecodeError
        "[" * 5_000 + "]" * 5_000,  # json.loads recursed past the stack
        "[" * (forms.MAX_DEPTH + 1) + "]" * (forms.MAX_DEPTH + 1),
        '{"a": "\\u0000"}',  # jsonb holds no NUL
        '{"\\u0000": 1}',
        '["\\ud800"]',  # nor a lone surrogate (no UTF-8)
        "{",
    ],
)
def test_json_that_django_or_postgresql_cannot_take_is_invalid(text):
    field = forms.JSONField()
    with pytest.raises(ValidationError) as raised:
        field.clean(text)
    assert raised.value.code == "invalid"
    assert isinstance(field.bound_data(text, None), InvalidJSONInput)


def test_json_within_the_bounds_is_taken():
    field = forms.JSONField()
    deep = "[" * forms.MAX_DEPTH + "]" * forms.MAX_DEPTH
    assert field.clean(deep) is not None
    assert field.clean('{"a": ["é", 1, 2.5, null, {"b": "𝄞"}]}') == {"a": ["é", 1, 2.5, None, {"b": "𝄞"}]}
    assert field.clean("9" * 4_300) == int("9" * 4_300)


def test_every_model_admin_of_the_console_uses_it():
    for model_admin in admin.site._registry.values():
        assert model_admin.formfield_overrides[models.JSONField]["form_class"] is forms.JSONField
