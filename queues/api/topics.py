"""Topics and their subscriptions: the API.

A topic is a queue whose messages are read through named subscriptions; it shares the
queue's partitions, append trees, leases and routing (``queues.engine.partition`` keeps one cursor
per subscription). The message calls are the queue's, on the target ``"<topic>/<subscription>"``.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queues import service
from queues.api import calls
from queues.api.serializers import (
    AckDoc,
    AckResultDoc,
    DequeueDoc,
    DequeueResultDoc,
    EnqueueDoc,
    EnqueueResultDoc,
    ErrorDoc,
    PartitionsOnlyGrow,
    QueueSerializer,
    VisibilityDoc,
)
from queues.api.views import ERRORS, CallView, IsClusterPeerOrStaff, _hops, caller
from queues.http.serializers import StrictSerializer
from queues.models import TOPIC_SETTINGS, Queue, Subscription, dead_letter_pairing_error


class TopicSerializer(QueueSerializer):
    # (many=True: DRF makes a ManyRelatedField of these; the stubs type the call as the field itself)
    subscriptions: serializers.SlugRelatedField[Subscription] = serializers.SlugRelatedField(
        slug_field="name", many=True, read_only=True
    )

    class Meta(QueueSerializer.Meta):
        fields = ["name", *TOPIC_SETTINGS, "subscriptions", "created_at"]
        read_only_fields = ["subscriptions", "created_at"]


class TopicUpdateSerializer(TopicSerializer, PartitionsOnlyGrow):
    class Meta(TopicSerializer.Meta):
        read_only_fields = ["name", "subscriptions", "created_at"]


class SubscriptionSerializer(StrictSerializer[Subscription], serializers.ModelSerializer[Subscription]):
    dead_letter_queue = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Queue.objects.filter(kind=Queue.Kind.QUEUE),
        required=False,
        allow_null=True,
        help_text="queue that receives this subscription's messages after max_receives deliveries",
    )

    class Meta:
        model = Subscription
        fields = ["name", "start", "starts_at", "visibility_timeout", "dead_letter_queue", "max_receives", "created_at"]
        read_only_fields = ["starts_at", "created_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        why = dead_letter_pairing_error(attrs.get("dead_letter_queue"), attrs.get("max_receives"))
        if why:
            raise serializers.ValidationError({"max_receives": why}, code="invalid")
        return attrs


def _topic(request: Request, name: str) -> Queue:
    return service.get_queue(name, Queue.Kind.TOPIC, caller=caller(request))


def _subscription(request: Request, topic: str, name: str) -> Subscription:
    return service.get_subscription(topic, name, caller=caller(request))


class TopicListView(APIView):
    @extend_schema(responses={200: TopicSerializer(many=True)}, summary="List topics")
    def get(self, request: Request) -> Response:
        topics = service.list_queues(Queue.Kind.TOPIC, caller=caller(request))
        return Response(TopicSerializer(topics, many=True).data)

    @extend_schema(request=TopicSerializer, responses={201: TopicSerializer, **ERRORS}, summary="Create a topic")
    def post(self, request: Request) -> Response:
        who = caller(request)
        ser = TopicSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        q = service.create_queue(kind=Queue.Kind.TOPIC, caller=who, **ser.validated_data)
        return Response(TopicSerializer(q).data, status=status.HTTP_201_CREATED)


class TopicDetailView(APIView):
    @extend_schema(responses={200: TopicSerializer, **ERRORS}, summary="A topic's settings and subscriptions")
    def get(self, request: Request, name: str) -> Response:
        return Response(TopicSerializer(_topic(request, name)).data)

    @extend_schema(
        request=TopicUpdateSerializer,
        responses={200: TopicSerializer, **ERRORS},
        summary="Change a topic's settings (partitions may only grow)",
    )
    def patch(self, request: Request, name: str) -> Response:
        q = _topic(request, name)
        service.authorize(q.name, "manage", caller=caller(request))  # before the body is looked at
        ser = TopicUpdateSerializer(q, data=request.data, partial=True)
        ser.is_valid(raise_exception=True)
        return Response(TopicSerializer(service.update_queue(q, caller=caller(request), **ser.validated_data)).data)

    @extend_schema(responses={204: None, **ERRORS}, summary="Delete a topic, its subscriptions and messages")
    def delete(self, request: Request, name: str) -> Response:
        service.delete_queue(_topic(request, name), caller=caller(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    post=extend_schema(
        request=EnqueueDoc,
        responses={201: EnqueueResultDoc, **ERRORS},
        summary="Publish one message or a batch (stored once, read by every subscription)",
    )
)
class PublishView(CallView):
    call = calls.publish


class RefreshView(APIView):
    """A queue or topic was created or changed through another node (``service.reload``)."""

    permission_classes = [IsClusterPeerOrStaff]

    # Between nodes only, not part of the public API (and not in its schema).
    @extend_schema(exclude=True)
    def post(self, request: Request, name: str) -> Response:
        who = caller(request, node_only=True)
        status_code, payload = calls.refresh(name, {}, _hops(request), caller=who)
        return Response(payload, status=status_code)


class SubscriptionCallView(CallView):
    """A message call on a topic's subscription: the service's target is ``topic/subscription``."""

    def target(self, **kwargs: str) -> str:
        return f"{kwargs['topic']}/{kwargs['name']}"


class SubscriptionListView(APIView):
    @extend_schema(responses={200: SubscriptionSerializer(many=True), **ERRORS}, summary="A topic's subscriptions")
    def get(self, request: Request, topic: str) -> Response:
        return Response(SubscriptionSerializer(_topic(request, topic).subscriptions.all(), many=True).data)

    @extend_schema(
        request=SubscriptionSerializer,
        responses={201: SubscriptionSerializer, 409: ErrorDoc, **ERRORS},
        summary="Create a subscription, starting at the newest message or the oldest retained one",
    )
    def post(self, request: Request, topic: str) -> Response:
        t = _topic(request, topic)
        service.authorize(t.name, "manage", caller=caller(request))  # before the body is looked at
        ser = SubscriptionSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        sub = service.create_subscription(t, caller=caller(request), **ser.validated_data)
        return Response(SubscriptionSerializer(sub).data, status=status.HTTP_201_CREATED)


class SubscriptionDetailView(APIView):
    @extend_schema(responses={200: SubscriptionSerializer, **ERRORS}, summary="A subscription")
    def get(self, request: Request, topic: str, name: str) -> Response:
        return Response(SubscriptionSerializer(_subscription(request, topic, name)).data)

    @extend_schema(responses={204: None, **ERRORS}, summary="Delete a subscription (its acks and positions)")
    def delete(self, request: Request, topic: str, name: str) -> Response:
        service.delete_subscription(_subscription(request, topic, name), caller=caller(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    post=extend_schema(
        request=DequeueDoc,
        responses={200: DequeueResultDoc, **ERRORS},
        summary="Receive up to max messages of the topic, for this subscription",
    )
)
class SubscriptionDequeueView(SubscriptionCallView):
    call = calls.dequeue


@extend_schema_view(
    post=extend_schema(
        request=AckDoc,
        responses={200: AckResultDoc, 409: ErrorDoc, **ERRORS},
        summary="Acknowledge for this subscription (the message goes when every subscription has)",
    )
)
class SubscriptionAckView(SubscriptionCallView):
    call = calls.ack


@extend_schema_view(
    post=extend_schema(
        request=VisibilityDoc,
        responses={200: VisibilityDoc, 409: ErrorDoc, **ERRORS},
        summary="Extend or shorten the visibility timeout of a message in flight",
    )
)
class SubscriptionVisibilityView(SubscriptionCallView):
    call = calls.visibility


class SubscriptionStatsView(APIView):
    @extend_schema(responses={200: dict, **ERRORS}, summary="Held (not acked) and in flight of the subscription")
    def get(self, request: Request, topic: str, name: str) -> Response:
        sub = _subscription(request, topic, name)
        return Response(service.subscription_stats(sub.topic.name, sub.name, caller=caller(request)))
