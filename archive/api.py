"""The archive API: list archived messages, replay them into a queue.

``GET /api/v1/archive?queue=&since=&until=&acked=&limit=&after=`` and
``POST /api/v1/archive/replay``. Token authentication and the error format of the queue API
(``{"error": code, "detail": ...}``); bad input is a 400 that changes nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal, overload

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from archive.models import ArchivedMessage
from archive.replay import MAX_REPLAY, readable, replay, require_source, select
from queues import service
from queues.http import validation
from queues.http.auth import request_caller, request_hops
from queues.public import QUEUE_NAME_RE, isoformat, parse_message_id
from queues.service import InvalidRequest

MAX_PAGE = 1000
TIMES = "ISO 8601, a time without zone is UTC, or epoch seconds; a time not in years 1 to 9999 once in UTC: 400"


def _time(value: object, name: str) -> datetime | None:
    """ISO 8601 (a naive time is UTC) or epoch seconds, as a UTC time. Anything else, and a
    time that is not one in years 1 to 9999 once in UTC (an offset of up to a day moves it
    past either end), is a 400: the database is given only UTC times it can hold."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, tz=UTC)
        except (OverflowError, OSError, ValueError):
            raise InvalidRequest(f"{name} is out of range", "invalid_time") from None
    if isinstance(value, str):
        text = value.strip()
        try:
            return datetime.fromtimestamp(float(text), tz=UTC)
        except (OverflowError, OSError):
            raise InvalidRequest(f"{name} is out of range", "invalid_time") from None
        except ValueError:
            pass
        try:
            parsed = datetime.fromisoformat(text)  # "Z" included (3.11+)
        except ValueError:
            raise InvalidRequest(
                f"{name} must be an ISO 8601 time or epoch seconds, got {value!r}", "invalid_time"
            ) from None
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=UTC)
        try:
            return parsed.astimezone(UTC)
        except (OverflowError, ValueError):
            raise InvalidRequest(f"{name} is out of range", "invalid_time") from None
    raise InvalidRequest(f"{name} must be an ISO 8601 time or epoch seconds", "invalid_time")


@overload
def _queue_name(value: object, name: str, *, required: Literal[True]) -> str: ...
@overload
def _queue_name(value: object, name: str, *, required: Literal[False]) -> str | None: ...
def _queue_name(value: object, name: str, *, required: bool) -> str | None:
    if value is None or value == "":
        if required:
            raise InvalidRequest(f"{name} is required", f"missing_{name}")
        return None
    if not isinstance(value, str) or not QUEUE_NAME_RE.fullmatch(value):
        raise InvalidRequest(
            f"{name} must be a queue name (letters, digits, '_' and '-', at most 80)", f"invalid_{name}"
        )
    return value


def _range(since: object, until: object) -> tuple[datetime | None, datetime | None]:
    start, end = _time(since, "since"), _time(until, "until")
    if start is not None and end is not None and start > end:
        raise InvalidRequest("since is after until", "invalid_time")
    return start, end


def row_json(r: ArchivedMessage) -> dict[str, object]:
    return {
        "id": r.message_id,
        "queue": r.queue,
        "partition": r.partition,
        "group": r.group,
        "body": r.body,
        "attributes": r.attributes,
        "size": r.size,
        "sequence": r.sequence,
        "enqueued_at": isoformat(r.enqueued_at),
        "acked_at": isoformat(r.acked_at),
        "archived_at": isoformat(r.archived_at),
        "replay_count": r.replay_count,
        "last_replayed_at": isoformat(r.last_replayed_at),
    }


class ArchiveListView(APIView):
    @extend_schema(
        summary="Archived messages, oldest archived first (cursor: `after` = the answer's `next`)",
        parameters=[
            OpenApiParameter("queue", str, description="the queue they were enqueued to"),
            OpenApiParameter("since", str, description=f"enqueued at or after ({TIMES})"),
            OpenApiParameter("until", str, description=f"enqueued before ({TIMES})"),
            OpenApiParameter("acked", bool, description="only acknowledged (true) or not (false)"),
            OpenApiParameter("limit", int, description=f"1..{MAX_PAGE}, default 100"),
            OpenApiParameter("after", int, description="the `next` of the previous page"),
        ],
        responses={200: dict},
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        validation.no_extra(dict(params), {"queue", "since", "until", "acked", "limit", "after", "format"}, "the query")
        queue = _queue_name(params.get("queue"), "queue", required=False)
        since, until = _range(params.get("since"), params.get("until"))
        limit = self._int(params.get("limit"), "limit", 1, MAX_PAGE, 100)
        after = self._int(params.get("after"), "after", 0, 2**63 - 1, 0)
        acked = params.get("acked")
        if acked not in (None, "true", "false", "1", "0"):  # (given empty: no boolean)
            raise InvalidRequest("acked must be true or false", "invalid_acked")
        rows = ArchivedMessage.objects.filter(pk__gt=after)
        # Only what came from queue rows the caller may read: not an earlier incarnation of a
        # name, nor a deleted queue's history (that is for superusers).
        rows = readable(rows, request_caller(request.user))
        if queue is not None:
            rows = rows.filter(queue=queue)
        if since is not None:
            rows = rows.filter(enqueued_at__gte=since)
        if until is not None:
            rows = rows.filter(enqueued_at__lt=until)
        if acked in ("true", "1"):
            rows = rows.filter(acked_at__isnull=False)
        elif acked in ("false", "0"):
            rows = rows.filter(acked_at__isnull=True)
        page = list(rows.order_by("pk")[: limit + 1])
        more = len(page) > limit
        page = page[:limit]
        return Response({"messages": [row_json(r) for r in page], "next": str(page[-1].pk) if more else None})

    @staticmethod
    def _int(value: str | None, name: str, low: int, high: int, default: int) -> int:
        if value is None:
            return default  # (given empty, it is no whole number: the schema says integer)
        try:
            number = int(value)
        except ValueError:
            raise InvalidRequest(f"{name} must be a whole number", "invalid_number") from None
        if not low <= number <= high:
            raise InvalidRequest(f"{name} must be between {low} and {high}, got {number}", "out_of_range")
        return number


class ReplayView(APIView):
    @extend_schema(
        summary="Enqueue copies of archived messages into a queue (default: their own)",
        description=(
            "Body: `queue` (the source), optional `into`, and either `ids` (message IDs of the "
            "source) or `since`/`until` (on the enqueue time); `max` 1..10000 (default 1000). "
            "Copies keep body, group, attributes, size and estimates, in enqueue order."
        ),
        request=dict,
        responses={200: dict},
    )
    def post(self, request: Request) -> Response:
        data = validation.object_of(request.data)
        validation.no_extra(data, {"queue", "into", "since", "until", "ids", "max"}, "the request")
        source = _queue_name(data.get("queue"), "queue", required=True)
        into = _queue_name(data.get("into"), "into", required=False) or source
        limit = validation.number(data, "max", 1, MAX_REPLAY, 1000, integer=True)
        ids = data.get("ids")
        if ids is not None:
            if data.get("since") is not None or data.get("until") is not None:
                raise InvalidRequest("give ids or since/until, not both", "invalid_selection")
            if not isinstance(ids, list) or not ids:
                raise InvalidRequest("ids must be a non-empty list of message IDs", "invalid_ids")
            if len(ids) > MAX_REPLAY:
                raise InvalidRequest(f"at most {MAX_REPLAY} ids per call, got {len(ids)}", "batch_too_large")
            for i, mid in enumerate(ids):
                parsed = parse_message_id(mid)
                if parsed is None or parsed.queue != source:
                    raise InvalidRequest(f"ids[{i}]: not a message ID of queue {source!r}", "invalid_id")
        since, until = _range(data.get("since"), data.get("until"))
        caller = request_caller(request.user)
        service.authorize(into, "manage", caller=caller)  # before anything is selected
        require_source(caller, source)
        rows = select(source, caller=caller, ids=ids, since=since, until=until, limit=limit)
        # A node's signed hop count only: a client's X-MQ-Hops would skip forwarding and the
        # cooling period. A store failing part-way: PartialReplay, 503 with what was replayed.
        answer = replay(rows, into, caller=caller, hops=request_hops(request.user))
        return Response(
            {"queue": source, "into": into, "selected": len(rows), "replayed": answer.replayed, "ids": answer.ids}
        )
