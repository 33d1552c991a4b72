"""The workers' side of the API: attempt logs in, heartbeats in, instructions out.

The views parse (serializers), call :mod:`workers.services`, and shape the answer.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queues.http.auth import request_caller
from queues.http.serializers import StrictSerializer
from queues.public import parse_message_id
from queues.service import InvalidRequest
from workers import services
from workers.models import AttemptLog
from workers.services import MAX_RECORDS


class AttemptIn(StrictSerializer[dict[str, Any]]):
    message_id = serializers.CharField(max_length=200)
    group = serializers.CharField(max_length=128, required=False, allow_blank=True, allow_null=True)
    worker = serializers.CharField(max_length=64, required=False, allow_null=True)
    attempt = serializers.IntegerField(min_value=1, max_value=1_000_000)
    enqueued_at = serializers.DateTimeField(required=False, allow_null=True)
    preprocess_started_at = serializers.DateTimeField(required=False, allow_null=True)
    preprocess_ended_at = serializers.DateTimeField(required=False, allow_null=True)
    process_started_at = serializers.DateTimeField(required=False, allow_null=True)
    process_ended_at = serializers.DateTimeField(required=False, allow_null=True)
    outcome = serializers.ChoiceField(choices=AttemptLog.Outcome.choices)
    error = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    traceback = serializers.CharField(required=False, allow_blank=True, max_length=100_000)
    size = serializers.IntegerField(required=False, allow_null=True, min_value=0)

    def validate_message_id(self, value: str) -> str:
        if parse_message_id(value) is None:
            raise serializers.ValidationError("not a message ID (<queue>/<partition>/<block>/<index>)")
        return value


class LogsIn(StrictSerializer[dict[str, Any]]):
    # (many=True: DRF makes a ListSerializer, which takes max_length; the stubs type the call as AttemptIn's)
    records = AttemptIn(many=True, allow_empty=False, max_length=MAX_RECORDS)  # type: ignore[call-arg]


class AttemptOut(serializers.ModelSerializer[AttemptLog]):
    class Meta:
        model = AttemptLog
        fields = [
            "id",
            "message_id",
            "queue",
            "partition",
            "group",
            "worker",
            "attempt",
            "enqueued_at",
            "preprocess_started_at",
            "preprocess_ended_at",
            "process_started_at",
            "process_ended_at",
            "outcome",
            "error",
            "traceback",
            "size",
            "recorded_at",
        ]


class LogsView(APIView):
    @extend_schema(
        request=LogsIn,
        responses={201: inline_serializer("Stored", {"stored": serializers.IntegerField()})},
        summary="Store attempt records (batches of up to 1,000)",
    )
    def post(self, request: Request) -> Response:
        ser = LogsIn(data=request.data)
        ser.is_valid(raise_exception=True)
        reports = [services.AttemptReport(**r) for r in ser.validated_data["records"]]
        try:
            stored = services.record_attempts(reports, caller=request_caller(request.user))
        except services.InvalidAttempt as exc:
            raise InvalidRequest(f"records: {exc}") from None
        return Response({"stored": stored}, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[
            OpenApiParameter("queue", str, description="only this queue's"),
            OpenApiParameter("message", str, description="only this message's (its ID)"),
            OpenApiParameter("worker", str, description="only this worker's"),
            OpenApiParameter("outcome", str, enum=[c for c, _ in AttemptLog.Outcome.choices]),
            OpenApiParameter("limit", int, description=f"1..{MAX_RECORDS}, default 100"),
        ],
        responses={200: inline_serializer("AttemptPage", {"records": AttemptOut(many=True)})},
        summary="Attempt records, newest first: ?queue= &message= &worker= &outcome= &limit=",
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        unknown = set(params) - {"queue", "message", "worker", "outcome", "limit"}
        if unknown:
            raise InvalidRequest(f"unknown filter(s): {', '.join(sorted(unknown))}", "unknown_field")
        for name in ("queue", "message", "worker"):
            if "\x00" in params.get(name, ""):  # no text column holds one (PostgreSQL refuses it)
                raise InvalidRequest(f"{name} must not contain a NUL character", "invalid_text")
        outcome = params.get("outcome")
        if outcome is not None and outcome not in AttemptLog.Outcome.values:  # "" too: no such outcome
            raise InvalidRequest(f"outcome must be one of {', '.join(AttemptLog.Outcome.values)}", "invalid_outcome")
        try:
            limit = int(params.get("limit", 100))
        except ValueError:
            raise InvalidRequest("limit must be a whole number", "invalid_number") from None
        rows = services.list_attempts(  # (a limit out of range: LimitOutOfRange, 400 out_of_range)
            caller=request_caller(request.user),
            queue=params.get("queue"),
            message_id=params.get("message"),
            worker=params.get("worker"),
            outcome=params.get("outcome"),
            limit=limit,
        )
        return Response({"records": AttemptOut(rows, many=True).data})


class HeldIn(StrictSerializer[dict[str, Any]]):
    id = serializers.CharField(max_length=200)
    receipt = serializers.CharField(max_length=64)
    #: what it was dequeued from: the queue, or "topic/subscription" (default: the ID's queue)
    queue = serializers.CharField(max_length=161, required=False)


class HeartbeatIn(StrictSerializer[dict[str, Any]]):
    consumer = serializers.CharField(max_length=64)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    hostname = serializers.CharField(max_length=200, required=False, allow_blank=True)
    pid = serializers.IntegerField(required=False, min_value=0, max_value=2**31 - 1)
    queues = serializers.ListField(child=serializers.CharField(max_length=161), max_length=100, required=False)
    load = serializers.FloatField(min_value=0, max_value=1, required=False)
    capacity = serializers.IntegerField(min_value=1, max_value=100_000, required=False)
    held = HeldIn(many=True, required=False, max_length=MAX_RECORDS)  # type: ignore[call-arg]  # (as records)


class TakeOut(serializers.Serializer[dict[str, Any]]):
    queue = serializers.CharField()
    partition = serializers.IntegerField()
    node = serializers.CharField(help_text="the owner's address")
    depth = serializers.IntegerField()


class InstructionsOut(serializers.Serializer[dict[str, Any]]):
    """``services.Instructions`` as the heartbeat answers it."""

    instruction = serializers.ChoiceField(choices=["continue", "take", "sleep"])
    sleep = serializers.IntegerField(help_text="seconds to sleep (0 unless told to sleep)")
    take = TakeOut(many=True, help_text="partitions to dequeue from first, at their owners")
    extended = serializers.ListField(
        child=serializers.CharField(), help_text="held messages whose visibility was pushed out"
    )
    lost = serializers.ListField(
        child=serializers.CharField(), help_text="held messages no longer this consumer's: do not ack"
    )


class HeartbeatView(APIView):
    @extend_schema(
        request=HeartbeatIn,
        responses={200: InstructionsOut},
        summary="A worker is alive: extend what it holds; continue, take these partitions, or sleep",
    )
    def post(self, request: Request) -> Response:
        ser = HeartbeatIn(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        beat = services.Heartbeat(
            consumer=data["consumer"],
            name=data.get("name", ""),
            hostname=data.get("hostname", ""),
            pid=data.get("pid"),
            queues=tuple(data.get("queues", [])),
            load=data.get("load", 0.0),
            capacity=data.get("capacity", 1),
            in_flight=tuple(services.InFlight(h["id"], h["receipt"], h.get("queue")) for h in data.get("held", [])),
        )
        # TooManyHeld (400 too_many_held) and TooManyConsumers (429 throttled, Retry-After 60)
        # are answered as they are
        instructions = services.heartbeat(beat, caller=request_caller(request.user))
        return Response(asdict(instructions))
