"""The base of every serializer of the HTTP entrances: strict about what a body may hold."""

from __future__ import annotations

from typing import Any, TypeVar

from rest_framework import serializers

_Instance = TypeVar("_Instance")
#: a serializer's field, whatever its types
AnyField = serializers.Field[Any, Any, Any, Any]


def _json_type_ok(field: AnyField, value: Any) -> bool:
    """Whether ``value`` has the JSON type the schema gives ``field`` (DRF would coerce
    ``"5"`` to 5, ``0`` to false, 5 to ``"5"``: the schema says integer, boolean, string)."""
    if value is None:
        return True  # DRF decides (allow_null)
    if isinstance(field, serializers.BooleanField):
        return isinstance(value, bool)
    if isinstance(field, serializers.IntegerField):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(field, (serializers.FloatField, serializers.DecimalField)):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(field, (serializers.CharField, serializers.ChoiceField, serializers.DateTimeField)):
        return isinstance(value, str)
    if isinstance(field, serializers.RelatedField):
        return isinstance(value, str)
    if isinstance(field, serializers.ListField):
        return isinstance(value, list) and all(_json_type_ok(field.child, v) for v in value)
    if isinstance(field, (serializers.ListSerializer, serializers.ManyRelatedField)):
        return isinstance(value, list)
    return True


def _bad_text(value: Any) -> bool:
    """Text PostgreSQL cannot store: a NUL, or a lone surrogate (not Unicode)."""
    if isinstance(value, str):
        if "\x00" in value:
            return True
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, list):
        return any(_bad_text(v) for v in value)
    return False


class StrictSerializer(serializers.Serializer[_Instance]):
    """Unknown fields are an error, not silently dropped: a typo must not pass unnoticed.
    Values must have the JSON type of their field (no ``"5"`` for 5, no 0 for false), and text
    is taken as sent (not trimmed): the API accepts what its OpenAPI schema says, no more."""

    def get_fields(self) -> dict[str, AnyField]:
        fields = super().get_fields()
        for field in fields.values():
            for f in (field, getattr(field, "child", None)):
                if isinstance(f, serializers.CharField):
                    f.trim_whitespace = False
        return fields

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            wrong = {
                name: ["wrong JSON type for this field"]
                for name, value in data.items()
                if name in self.fields and not _json_type_ok(self.fields[name], value)
            }
            wrong.update(
                {
                    name: ["text with a NUL character or a lone surrogate (not Unicode)"]
                    for name, value in data.items()
                    if name not in wrong and _bad_text(value)
                }
            )
            if wrong:
                raise serializers.ValidationError(wrong, code="invalid")
            unknown = set(data) - set(self.fields)
            # Read-only fields (name on PATCH, created_at) would be dropped silently: refuse them.
            read_only = {name for name in set(data) & set(self.fields) if self.fields[name].read_only}
            if unknown or read_only:
                raise serializers.ValidationError(
                    {
                        **{name: ["unknown field"] for name in sorted(unknown)},
                        **{name: ["read-only field; it cannot be set here"] for name in sorted(read_only)},
                    },
                    code="unknown_field",
                )
        return super().to_internal_value(data)
