"""The workers' side of the API: attempt logs in, heartbeats in, instructions out."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Sum
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from queues.api.errors import BadRequest
from queues.api.serializers import StrictSerializer
from queues.messages import parse_message_id
from queues.models import Partition, Queue

from .models import AttemptLog, Consumer

MAX_RECORDS = 1000
#: A consumer whose last heartbeat is older than this is not counted as covering the load.
CONSUMER_ALIVE = timedelta(seconds=30)
SLEEP_SECONDS = 5


class AttemptIn(StrictSerializer):
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

    def validate_message_id(self, value):
        if parse_message_id(value) is None:
            raise serializers.ValidationError("not a message ID (<queue>/<partition>/<block>/<index>)")
        return value

    def validate(self, attrs):
        for a, b in (("preprocess_started_at", "preprocess_ended_at"), ("process_started_at", "process_ended_at")):
            if attrs.get(a) and attrs.get(b) and attrs[b] < attrs[a]:
                raise serializers.ValidationError({b: f"ends before {a}"})
        return attrs


class LogsIn(StrictSerializer):
    records = AttemptIn(many=True, allow_empty=False, max_length=MAX_RECORDS)


class AttemptOut(serializers.ModelSerializer):
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


def attempt_row(record: dict) -> AttemptLog:
    mid = parse_message_id(record["message_id"])
    return AttemptLog(
        message_id=record["message_id"],
        queue=mid.queue,
        partition=mid.partition,
        group=record.get("group") or "",
        worker_id=record.get("worker") or None,
        attempt=record["attempt"],
        enqueued_at=record.get("enqueued_at"),
        preprocess_started_at=record.get("preprocess_started_at"),
        preprocess_ended_at=record.get("preprocess_ended_at"),
        process_started_at=record.get("process_started_at"),
        process_ended_at=record.get("process_ended_at"),
        outcome=record["outcome"],
        error=record.get("error", ""),
        traceback=record.get("traceback", ""),
        size=record.get("size"),
    )


class LogsView(APIView):
    @extend_schema(request=LogsIn, responses={201: dict}, summary="Store attempt records (batches of up to 1,000)")
    def post(self, request):
        ser = LogsIn(data=request.data)
        ser.is_valid(raise_exception=True)
        rows = AttemptLog.objects.bulk_create([attempt_row(r) for r in ser.validated_data["records"]])
        return Response({"stored": len(rows)}, status=status.HTTP_201_CREATED)

    @extend_schema(
        responses={200: AttemptOut(many=True)},
        summary="Attempt records, newest first: ?queue= &message= &worker= &outcome= &limit=",
    )
    def get(self, request):
        params = request.query_params
        unknown = set(params) - {"queue", "message", "worker", "outcome", "limit"}
        if unknown:
            raise BadRequest(f"unknown filter(s): {', '.join(sorted(unknown))}", "unknown_field")
        rows = AttemptLog.objects.all()
        for param, field in (
            ("queue", "queue"),
            ("message", "message_id"),
            ("worker", "worker_id"),
            ("outcome", "outcome"),
        ):
            if params.get(param):
                rows = rows.filter(**{field: params[param]})
        try:
            limit = int(params.get("limit", 100))
        except ValueError:
            raise BadRequest("limit must be a whole number", "invalid_number") from None
        if not 1 <= limit <= MAX_RECORDS:
            raise BadRequest(f"limit must be between 1 and {MAX_RECORDS}", "out_of_range")
        return Response({"records": AttemptOut(rows[:limit], many=True).data})


class HeldIn(StrictSerializer):
    id = serializers.CharField(max_length=200)
    receipt = serializers.CharField(max_length=64)
    #: what it was dequeued from: the queue, or "topic/subscription" (default: the ID's queue)
    queue = serializers.CharField(max_length=161, required=False)


class HeartbeatIn(StrictSerializer):
    consumer = serializers.CharField(max_length=64)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    hostname = serializers.CharField(max_length=200, required=False, allow_blank=True)
    pid = serializers.IntegerField(required=False, min_value=0)
    queues = serializers.ListField(child=serializers.CharField(max_length=161), max_length=100, required=False)
    load = serializers.FloatField(min_value=0, max_value=1, required=False)
    capacity = serializers.IntegerField(min_value=1, max_value=100_000, required=False)
    held = HeldIn(many=True, required=False, max_length=MAX_RECORDS)


class HeartbeatView(APIView):
    @extend_schema(
        request=HeartbeatIn,
        responses={200: dict},
        summary="A worker is alive: extend what it holds; continue, take these partitions, or sleep",
    )
    def post(self, request):
        ser = HeartbeatIn(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        held = data.get("held", [])
        queues = data.get("queues", [])
        now = timezone.now()
        extended, lost = self._extend(held)
        instruction, sleep = self._decide(data["consumer"], queues, held, now)
        take = self._assign(data["consumer"], queues, now) if instruction == "continue" else []
        if take:
            instruction = "take"
        Consumer.objects.update_or_create(
            pk=data["consumer"],
            defaults={
                "name": data.get("name", ""),
                "hostname": data.get("hostname", ""),
                "pid": data.get("pid"),
                "queues": queues,
                "load": data.get("load", 0.0),
                "capacity": data.get("capacity", 1),
                "held": [h["id"] for h in held],
                "last_heartbeat": now,
                "asleep_until": now + timedelta(seconds=sleep) if sleep else None,
            },
        )
        return Response({"instruction": instruction, "sleep": sleep, "take": take, "extended": extended, "lost": lost})

    @staticmethod
    def _assign(consumer: str, queues: list[str], now) -> list[dict]:
        """Spread the queues' non-empty partitions over their live consumers (the seed's
        consumer assignment): this consumer takes every n-th, by its rank among them, and
        dequeues from their owners first. Everyone may still take from anywhere."""
        if not queues:
            return []
        live = sorted(
            {
                c.pk
                for c in Consumer.objects.filter(last_heartbeat__gte=now - CONSUMER_ALIVE)
                if set(c.queues) & set(queues)
            }
            | {consumer}
        )
        rank, n = live.index(consumer), len(live)
        rows = (
            Partition.objects.filter(queue__name__in=queues, depth__gt=0, owner__isnull=False)
            .select_related("queue", "owner")
            .order_by("queue__name", "index")
        )
        return [
            {"queue": p.queue.name, "partition": p.index, "node": p.owner.address, "depth": p.depth}
            for k, p in enumerate(rows)
            if k % n == rank
        ]

    @staticmethod
    def _extend(held: list[dict]) -> tuple[list[str], list[str]]:
        """Push each held message's visibility out by its queue's timeout, at its owner.

        A message whose receipt is no longer current (redelivered to someone else) is "lost":
        the worker should abandon it rather than ack a message another worker holds.
        """
        from queues.api import calls
        from queues.partition import ReceiptMismatch

        extended, lost = [], []
        timeouts: dict[str, int] = {}
        for h in held:
            mid = parse_message_id(h["id"])
            # A topic's message is held through a subscription ("topic/subscription").
            target = h.get("queue") or (mid.queue if mid is not None else "")
            if mid is None or target.partition("/")[0] != mid.queue:
                lost.append(h["id"])
                continue
            if mid.queue not in timeouts:
                q = Queue.objects.filter(name=mid.queue).values_list("visibility_timeout", flat=True).first()
                timeouts[mid.queue] = q if q is not None else -1
            if timeouts[mid.queue] < 0:
                lost.append(h["id"])
                continue
            try:
                calls.visibility(
                    target, {"id": h["id"], "receipt": h["receipt"], "visibility_timeout": max(timeouts[mid.queue], 1)}
                )
                extended.append(h["id"])
            except (ReceiptMismatch, BadRequest):
                lost.append(h["id"])
            except Exception:  # noqa: BLE001 - owner unreachable now: try again next beat
                continue
        return extended, lost

    @staticmethod
    def _decide(consumer: str, queues: list[str], held: list[dict], now) -> tuple[str, int]:
        """Sleep when this worker holds nothing, its queues are empty, and other live workers
        consume them (the seed's consumer sleep): fewer idle polls against the nodes."""
        if held or not queues:
            return "continue", 0
        # A subscription ("topic/name") counts its topic's depth: an upper bound of its own.
        names = {q.partition("/")[0] for q in queues}
        depth = Partition.objects.filter(queue__name__in=names).aggregate(d=Sum("depth"))["d"] or 0
        if depth:
            return "continue", 0
        others = Consumer.objects.filter(last_heartbeat__gte=now - CONSUMER_ALIVE).exclude(pk=consumer)
        covering = [c for c in others if set(c.queues) & set(queues) and not (c.asleep_until and c.asleep_until > now)]
        return ("sleep", SLEEP_SECONDS) if covering else ("continue", 0)
