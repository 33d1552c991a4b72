"""Views: parse, check, call the service, shape the answer. No messaging logic here."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth import get_user
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queues import service, tracing
from queues.access import Caller
from queues.api import calls
from queues.api.serializers import (
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
from queues.http import served_header
from queues.http.auth import CachedTokenAuthentication, ClusterAuthentication, ClusterPeer, request_caller, request_hops
from queues.models import Queue
from queues.service import served

ERRORS = {
    400: OpenApiResponse(ErrorDoc, description="bad input; nothing was changed"),
    401: OpenApiResponse(ErrorDoc, description="no or bad token"),
    403: OpenApiResponse(ErrorDoc, description="the caller may see the queue but lacks the permission (`missing`)"),
    404: OpenApiResponse(ErrorDoc, description="no such queue, or one the caller may not see"),
    503: OpenApiResponse(ErrorDoc, description="partition not available on this node now; retry"),
}


def _hops(request: Request) -> int:
    """A node's signed hop count; a client's ``X-MQ-Hops`` is ignored (0)."""
    return request_hops(request.user)


def caller(request: Request, *, node_only: bool = False) -> Caller:
    """Who the request acts as (``auth.request_caller``)."""
    return request_caller(request.user, node_only=node_only)


class HealthView(APIView):
    """Liveness, for anyone (load balancers, ``NodeProcess``): ``{"status": "ok"}`` and nothing
    about the node. Staff (a token or a session) and nodes also get its ID, address and
    partition count. A bad token is not refused here: liveness answers regardless."""

    permission_classes = [AllowAny]
    authentication_classes: list[type[BaseAuthentication]] = []  # asked below, so a bad token cannot make it answer 401

    @extend_schema(
        responses={200: dict}, summary="Liveness of this node (no authentication; details to staff and nodes)"
    )
    def get(self, request: Request) -> Response:
        if not self._insider(request):
            return Response({"status": "ok"})
        rt = service.get_runtime()
        return Response({"status": "ok", "node": rt.node_id, "address": rt.address, "partitions": len(rt.managers)})

    @staticmethod
    def _insider(request: Request) -> bool:
        # The console session's user, from the session itself (DRF has put its own caller, with no
        # authenticators here anonymous, in the place AuthenticationMiddleware put it).
        if getattr(get_user(request), "is_staff", False):
            return True
        for auth in (CachedTokenAuthentication(), ClusterAuthentication()):
            try:
                found = auth.authenticate(request)
            except Exception:  # noqa: BLE001, S112 - a bad credential is an anonymous caller here
                continue
            if found is not None:
                user = found[0]
                return isinstance(user, ClusterPeer) or bool(getattr(user, "is_staff", False))
        return False


class QueueListView(APIView):
    @extend_schema(responses={200: QueueSerializer(many=True)}, summary="List queues")
    def get(self, request: Request) -> Response:
        queues = service.list_queues(Queue.Kind.QUEUE, caller=caller(request))
        return Response(QueueSerializer(queues, many=True).data)

    @extend_schema(request=QueueSerializer, responses={201: QueueSerializer, **ERRORS}, summary="Create a queue")
    def post(self, request: Request) -> Response:
        who = caller(request)
        ser = QueueSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        q = service.create_queue(caller=who, **ser.validated_data)
        return Response(QueueSerializer(q).data, status=status.HTTP_201_CREATED)


class QueueDetailView(APIView):
    @extend_schema(responses={200: QueueSerializer, **ERRORS}, summary="A queue's settings")
    def get(self, request: Request, name: str) -> Response:
        return Response(QueueSerializer(self._get(request, name)).data)

    @extend_schema(
        request=QueueUpdateSerializer,
        responses={200: QueueSerializer, **ERRORS},
        summary="Change a queue's settings (partitions may only grow)",
    )
    def patch(self, request: Request, name: str) -> Response:
        q = self._get(request, name)
        service.authorize(q.name, "manage", caller=caller(request))  # before the body is looked at
        ser = QueueUpdateSerializer(q, data=request.data, partial=True)
        ser.is_valid(raise_exception=True)
        q = service.update_queue(q, caller=caller(request), **ser.validated_data)
        return Response(QueueSerializer(q).data)

    @extend_schema(responses={204: None, **ERRORS}, summary="Delete a queue and all its messages")
    def delete(self, request: Request, name: str) -> Response:
        service.delete_queue(self._get(request, name), caller=caller(request))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @staticmethod
    def _get(request: Request, name: str) -> Queue:
        return service.get_queue(name, caller=caller(request))


class CallView(APIView):
    """A POST that runs one of ``calls`` on the queue (or ``topic/subscription``) in the URL."""

    call: Callable[..., calls.Answer]
    #: who served the call (``queues.service.served``), for its answer's header, error or not.
    served_by: tuple[str, ...] = ()

    def target(self, **kwargs: str) -> str:
        return kwargs["name"]

    def node_only(self, request: Request) -> bool:
        """Whether this request is one a node may make for itself (no user named)."""
        return False

    def body_limit(self, request: Request) -> int:
        """The most bytes this call's body may have: ``FastJSONParser`` refuses a longer one by
        its Content-Length before reading it (the caller's right is checked first)."""
        name = type(self).call.__name__
        who = caller(request) if name in calls.MESSAGE_CALLS else None
        return calls.body_limit(name, self.target(**self.kwargs), caller=who)

    def post(self, request: Request, **kwargs: str) -> Response:
        trace_token = tracing.attach_meta(request.META) if tracing.ON else None  # the caller's traceparent
        served_token = served.begin()
        try:
            status_code, payload = type(self).call(
                self.target(**kwargs),
                request.data,
                _hops(request),
                trusted=isinstance(request.user, ClusterPeer),
                caller=caller(request, node_only=self.node_only(request)),
            )
        finally:
            tracing.detach(trace_token)
            self.served_by = tuple(served.end(served_token))
        return Response(payload, status=status_code)

    def finalize_response(self, request: Request, response: Response, *args: object, **kwargs: object) -> Response:
        for name, value in served_header.header_items(self.served_by):
            response[name] = value
        return super().finalize_response(request, response, *args, **kwargs)


@extend_schema_view(
    post=extend_schema(
        request=EnqueueDoc,
        responses={201: EnqueueResultDoc, **ERRORS},
        summary="Enqueue one message, or a batch of up to 1,000 (stored in order)",
        description=(
            "All or nothing for refusals: a batch whose messages go to partitions on several nodes is "
            "checked by every owner before any message is stored, so a 4xx (from this node or an owner) "
            "stores nothing. A 5xx may leave part of a batch stored: retry with dedup_id."
        ),
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
        description=(
            "Every receipt is checked, on this node and at every other owner, before any message is "
            "removed: a 409 (or any 4xx) acknowledges nothing anywhere."
        ),
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
    def get(self, request: Request, name: str) -> Response:
        return Response({"queue": name, "partitions": service.partition_owners(name, caller=caller(request))})


@extend_schema_view(
    post=extend_schema(
        request=dict,
        responses={200: dict, **ERRORS},
        summary="On a dead-letter queue: move up to max messages back to where they came from",
        description=(
            "Each dead letter goes back to its history.source (a queue, or topic/subscription: then only "
            "that subscription reads it again), in its group, as a new message. Every source a round "
            "names is checked before anything is copied (404 / 403 naming it); each source's share is "
            "stored there, then removed here. Dead letters without a source are skipped and deliverable "
            "again when the call ends, their receive counts unchanged. The answer: moved, skipped, and "
            "sources (moved per source). The dead-letter queue's partitions on other nodes are asked too."
        ),
    )
)
class RedriveView(CallView):
    call = calls.redrive


class IsClusterPeerOrStaff(BasePermission):
    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return isinstance(user, ClusterPeer) or bool(
            getattr(user, "is_staff", False) or getattr(user, "is_superuser", False)
        )


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

    def node_only(self, request: Request) -> bool:
        return True


@extend_schema_view(
    post=extend_schema(
        request=dict,
        responses={200: dict, **ERRORS},
        summary="Delete every message of the queue, in flight ones too (manage)",
    )
)
class PurgeView(CallView):
    call = calls.purge

    def node_only(self, request: Request) -> bool:
        return isinstance(request.data, dict) and request.data.get("close_only") is True


class ReleasePartitionView(APIView):
    @extend_schema(
        request=None,
        responses={200: dict, 409: ErrorDoc, **ERRORS},
        summary="The owner gives up the partition's lease; another node takes it (manage)",
    )
    def post(self, request: Request, name: str, index: int) -> Response:
        status_code, payload = calls.release_partition(name, index, _hops(request), caller=caller(request))
        return Response(payload, status=status_code)


class BlockView(APIView):
    """A block of a partition's append tree, read at the partition's owner
    (``service.block_messages``): the console's tree drawing asks it of the owner when this
    node is not. Between nodes (and staff), not part of the public API (nor in its schema)."""

    permission_classes = [IsClusterPeerOrStaff]

    @extend_schema(exclude=True)
    def post(self, request: Request, name: str, index: int, block: str) -> Response:
        status_code, payload = calls.block_messages(
            name, index, block, request.data, _hops(request), caller=caller(request)
        )
        return Response(payload, status=status_code)


class StatsView(APIView):
    @extend_schema(responses={200: dict, **ERRORS}, summary="Depth, in flight, oldest age, per partition")
    def get(self, request: Request, name: str) -> Response:
        return Response(service.queue_stats(name, caller=caller(request)))
