"""Views: parse, check, call the service, shape the answer. No messaging logic here."""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import service
from ..auth import ClusterPeer
from ..models import Queue
from ..router import hops_of
from . import calls
from .serializers import (
    AckDoc,
    AckResultDoc,
    DequeueDoc,
    DequeueResultDoc,
    EnqueueDoc,
    EnqueueResultDoc,
    ErrorDoc,
    QueueSerializer,
    QueueUpdateSerializer,
    VisibilityDoc,
)

ERRORS = {
    400: OpenApiResponse(ErrorDoc, description="bad input; nothing was changed"),
    401: OpenApiResponse(ErrorDoc, description="no or bad token"),
    404: OpenApiResponse(ErrorDoc, description="no such queue"),
    503: OpenApiResponse(ErrorDoc, description="partition not available on this node now; retry"),
}


def create_named(fields: dict, kind: str = Queue.Kind.QUEUE) -> Queue:
    """``service.create_queue``; a name already taken (by a queue or a topic, found by the
    database, so two concurrent creates cannot both pass) is 409 ``already_exists``."""
    try:
        return service.create_queue(kind=kind, **fields)
    except (IntegrityError, DjangoValidationError):
        if Queue.objects.filter(name=fields.get("name")).exists():
            raise service.Conflict(f"a queue or topic named {fields.get('name')!r} exists", "already_exists") from None
        raise


def _hops(request) -> int:
    return hops_of(request.META.get("HTTP_X_MQ_HOPS"))


class HealthView(APIView):
    permission_classes = [AllowAny]
    authentication_classes: list = []

    @extend_schema(responses={200: dict}, summary="Liveness of this node (no authentication)")
    def get(self, request):
        rt = service.get_runtime()
        return Response({"status": "ok", "node": rt.node_id, "address": rt.address, "partitions": len(rt.managers)})


class QueueListView(APIView):
    @extend_schema(responses={200: QueueSerializer(many=True)}, summary="List queues")
    def get(self, request):
        return Response(QueueSerializer(Queue.objects.filter(kind=Queue.Kind.QUEUE), many=True).data)

    @extend_schema(request=QueueSerializer, responses={201: QueueSerializer, **ERRORS}, summary="Create a queue")
    def post(self, request):
        ser = QueueSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        q = create_named(ser.validated_data)
        return Response(QueueSerializer(q).data, status=status.HTTP_201_CREATED)


class QueueDetailView(APIView):
    @extend_schema(responses={200: QueueSerializer, **ERRORS}, summary="A queue's settings")
    def get(self, request, name):
        return Response(QueueSerializer(self._get(name)).data)

    @extend_schema(
        request=QueueUpdateSerializer,
        responses={200: QueueSerializer, **ERRORS},
        summary="Change a queue's settings (partitions may only grow)",
    )
    def patch(self, request, name):
        q = self._get(name)
        ser = QueueUpdateSerializer(q, data=request.data, partial=True)
        ser.is_valid(raise_exception=True)
        q = service.update_queue(q, **ser.validated_data)
        return Response(QueueSerializer(q).data)

    @extend_schema(responses={204: None, **ERRORS}, summary="Delete a queue and all its messages")
    def delete(self, request, name):
        service.delete_queue(self._get(name))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @staticmethod
    def _get(name):
        return service.get_queue(name)


class CallView(APIView):
    """A POST that runs one of ``calls`` on the queue (or ``topic/subscription``) in the URL."""

    call: Callable[..., calls.Answer]

    def target(self, **kwargs: str) -> str:
        return kwargs["name"]

    def post(self, request, **kwargs):
        status_code, payload = type(self).call(
            self.target(**kwargs), request.data, _hops(request), trusted=isinstance(request.user, ClusterPeer)
        )
        return Response(payload, status=status_code)


@extend_schema_view(
    post=extend_schema(
        request=EnqueueDoc,
        responses={201: EnqueueResultDoc, **ERRORS},
        summary="Enqueue one message, or a batch of up to 1,000 (stored in order)",
    )
)
class EnqueueView(CallView):
    call = calls.enqueue


@extend_schema_view(
    post=extend_schema(
        request=DequeueDoc,
        responses={200: DequeueResultDoc, **ERRORS},
        summary="Receive up to max messages; each stays hidden for visibility_timeout",
    )
)
class DequeueView(CallView):
    call = calls.dequeue


@extend_schema_view(
    post=extend_schema(
        request=AckDoc,
        responses={200: AckResultDoc, 409: ErrorDoc, **ERRORS},
        summary="Acknowledge (delete) messages; a stale receipt refuses the whole call",
    )
)
class AckView(CallView):
    call = calls.ack


@extend_schema_view(
    post=extend_schema(
        request=VisibilityDoc,
        responses={200: VisibilityDoc, 409: ErrorDoc, **ERRORS},
        summary="Extend or shorten the visibility timeout of a message in flight",
    )
)
class VisibilityView(CallView):
    call = calls.visibility


class PartitionsView(APIView):
    @extend_schema(
        responses={200: dict, **ERRORS}, summary="Who serves each partition: clients may call the owner directly"
    )
    def get(self, request, name):
        return Response({"queue": name, "partitions": service.partition_owners(name)})


@extend_schema_view(
    post=extend_schema(
        request=dict,
        responses={200: dict, **ERRORS},
        summary="On a dead-letter queue: move up to max messages back to where they came from",
    )
)
class RedriveView(CallView):
    call = calls.redrive


class IsClusterPeerOrStaff(BasePermission):
    def has_permission(self, request, view):
        return isinstance(request.user, ClusterPeer) or bool(getattr(request.user, "is_staff", False))


@extend_schema_view(
    post=extend_schema(
        request=dict,
        responses={200: dict, **ERRORS},
        summary="Apply the retention rule on this node's partitions (nodes and staff only)",
    )
)
class ExpireView(CallView):
    permission_classes = [IsClusterPeerOrStaff]
    call = calls.expire


@extend_schema_view(
    post=extend_schema(
        request=dict,
        responses={200: dict, **ERRORS},
        summary="Delete every message of the queue, in flight ones too (staff only)",
    )
)
class PurgeView(CallView):
    permission_classes = [IsClusterPeerOrStaff]
    call = calls.purge


class ReleasePartitionView(APIView):
    permission_classes = [IsClusterPeerOrStaff]

    @extend_schema(
        request=None,
        responses={200: dict, 409: ErrorDoc, **ERRORS},
        summary="The owner gives up the partition's lease; another node takes it (staff only)",
    )
    def post(self, request, name, index):
        status_code, payload = calls.release_partition(name, index, _hops(request))
        return Response(payload, status=status_code)


class StatsView(APIView):
    @extend_schema(responses={200: dict, **ERRORS}, summary="Depth, in flight, oldest age, per partition")
    def get(self, request, name):
        return Response(service.queue_stats(name))
