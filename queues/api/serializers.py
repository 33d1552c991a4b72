"""Serializers for the queue resource, and shapes that document the message calls.

The message calls validate by hand (see ``validation``); the ``*Doc`` serializers only
describe their JSON for the OpenAPI schema.
"""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from rest_framework import serializers

from queues.http.serializers import StrictSerializer
from queues.models import (
    QUEUE_SETTINGS,
    Queue,
    dead_letter_pairing_error,
    own_dead_letter_error,
    partitions_shrink_error,
)
from queues.public import LIMITS, QUEUE_NAME_RE
from queues.service.limits import MAX_BATCH, MAX_WAIT

NAME_RULE = "letters, digits, '_' and '-', at most 80"


class QueueSerializer(StrictSerializer[Queue], serializers.ModelSerializer[Queue]):
    dead_letter_queue = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Queue.objects.all(),
        required=False,
        allow_null=True,
        help_text="name of the queue that receives messages after max_receives deliveries",
    )

    class Meta:
        model = Queue
        fields = ["name", *QUEUE_SETTINGS, "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        # No uniqueness check here: a taken name is a conflict (409 already_exists), found by
        # the database itself so that two concurrent creates cannot both pass it.
        extra_kwargs = {"name": {"validators": [RegexValidator(QUEUE_NAME_RE, NAME_RULE)]}}

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        def current(field: str) -> Any:
            if field in attrs:
                return attrs[field]
            return getattr(self.instance, field) if self.instance is not None else None

        dlq, max_receives = current("dead_letter_queue"), current("max_receives")
        why = dead_letter_pairing_error(dlq, max_receives)
        if why:
            raise serializers.ValidationError({"max_receives": why}, code="invalid")
        name = self.instance.name if self.instance is not None else attrs.get("name")
        why = own_dead_letter_error(name, dlq.name if dlq is not None else None)
        if why:
            raise serializers.ValidationError({"dead_letter_queue": why}, code="invalid")
        return attrs


class PartitionsOnlyGrow:
    """For a serializer that changes a queue's or topic's settings: the number of partitions
    may not go down."""

    instance: Any  # the serializer's: the queue or topic changed (None when creating)

    def validate_partitions(self, value: int) -> int:
        why = partitions_shrink_error(self.instance.partitions, value) if self.instance is not None else None
        if why:
            raise serializers.ValidationError(why)
        return value


class QueueUpdateSerializer(QueueSerializer, PartitionsOnlyGrow):
    class Meta(QueueSerializer.Meta):
        read_only_fields = ["name", "created_at", "updated_at"]


class MessageInDoc(serializers.Serializer[dict[str, Any]]):
    body = serializers.CharField(help_text="the message, UTF-8 text up to the queue's max_message_size")


class EnqueueDoc(serializers.Serializer[dict[str, Any]]):
    body = serializers.CharField(required=False, help_text="one message")
    messages = MessageInDoc(many=True, required=False, help_text=f"or a batch of up to {MAX_BATCH:,}")


class EnqueueResultDoc(serializers.Serializer[dict[str, Any]]):
    id = serializers.CharField(required=False, help_text="for a single message")
    ids = serializers.ListField(child=serializers.CharField(), required=False, help_text="for a batch, in order")


class DequeueDoc(serializers.Serializer[dict[str, Any]]):
    max = serializers.IntegerField(required=False, min_value=1, max_value=MAX_BATCH, default=1)
    visibility_timeout = serializers.FloatField(
        required=False,
        min_value=0,
        max_value=LIMITS["visibility_timeout"][1],
        help_text="seconds; default: the queue's",
    )
    wait = serializers.FloatField(
        required=False,
        min_value=0,
        max_value=MAX_WAIT,
        default=0,
        help_text="long poll: seconds to wait for a first message",
    )


class DeliveredDoc(serializers.Serializer[dict[str, Any]]):
    """A delivered message, as ``calls.delivery_json`` answers it."""

    id = serializers.CharField()
    receipt = serializers.CharField(help_text="carry it in ack and visibility calls")
    body = serializers.CharField()
    receive_count = serializers.IntegerField()
    enqueued_at = serializers.DateTimeField()
    sequence = serializers.IntegerField(help_text="its position in its partition")
    group = serializers.CharField(allow_null=True)
    fairness_key = serializers.CharField(required=False, help_text="as enqueued (absent when none)")
    attributes = serializers.DictField(help_text="as enqueued ({} when none)")
    size = serializers.IntegerField(allow_null=True)
    estimates = serializers.DictField(
        child=serializers.FloatField(), help_text="preprocess and process seconds: the message's, else the queue's"
    )
    history = serializers.JSONField(required=False, help_text="a dead letter's: where it came from")
    archived = serializers.BooleanField(required=False, help_text="true when it was read from the archive")


class DequeueResultDoc(serializers.Serializer[dict[str, Any]]):
    messages = DeliveredDoc(many=True)


class AckItemDoc(serializers.Serializer[dict[str, Any]]):
    id = serializers.CharField()
    receipt = serializers.CharField(required=False)


class AckDoc(serializers.Serializer[dict[str, Any]]):
    ids = serializers.ListField(child=serializers.CharField(), required=False)
    messages = AckItemDoc(many=True, required=False)


class AckResultDoc(serializers.Serializer[dict[str, Any]]):
    acked = serializers.IntegerField(help_text="messages removed by this call")
    not_found = serializers.IntegerField(help_text="IDs no longer stored (acknowledged before)")


class VisibilityDoc(serializers.Serializer[dict[str, Any]]):
    id = serializers.CharField()
    receipt = serializers.CharField(required=False)
    visibility_timeout = serializers.FloatField(min_value=0, max_value=LIMITS["visibility_timeout"][1])


class ErrorDoc(serializers.Serializer[dict[str, Any]]):
    error = serializers.CharField(help_text="a stable code, e.g. queue_not_found, body_too_large")
    detail = serializers.JSONField(help_text="what is wrong, for people")
