"""Replay: archived messages enqueued again, as copies, into a queue (their own or another).

Copies go through the normal enqueue path (``queues.service.enqueue``: the queue's rules, group
routing, forwarding to the owners), in batches of 1,000 in archive order (enqueue time, then
sequence), so a group's copies keep their order. Every batch is validated against the target
queue before the first is enqueued: bad input changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import F, QuerySet
from django.utils import timezone

from archive.archiver import message_of
from archive.models import ArchivedMessage
from queues import service
from queues.access import Caller, audit
from queues.service import MessageDraft, Unavailable
from queues.service.rows import require_on_incarnations, require_on_queue

MAX_REPLAY = 10_000


def readable(rows: QuerySet[ArchivedMessage], caller: Caller) -> QuerySet[ArchivedMessage]:
    """Those of ``rows`` that came from a queue row ``caller`` may read: a queue deleted and
    created again under its name does not hand its history to the new one's readers; a
    deleted queue's history is read by unrestricted callers only."""
    ids = service.readable_queue_ids(caller)
    return rows if ids is None else rows.filter(incarnation__in=ids)


def select(
    source: str,
    *,
    caller: Caller,
    ids: list[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 1000,
) -> list[ArchivedMessage]:
    """Rows archived from queues named ``source`` that ``caller`` may read (see :func:`readable`)."""
    rows = readable(ArchivedMessage.objects.filter(queue=source), caller)
    if ids is not None:
        rows = rows.filter(message_id__in=ids)
    if since is not None:
        rows = rows.filter(enqueued_at__gte=since)
    if until is not None:
        rows = rows.filter(enqueued_at__lt=until)
    return list(rows.order_by("enqueued_at", "sequence", "id")[:limit])


def draft_of(row: ArchivedMessage) -> MessageDraft:
    m = message_of(row)
    return MessageDraft(
        m.body, group=m.group, attributes=m.attributes, size=m.size, estimates=m.estimates, fairness_key=m.fairness_key
    )


@dataclass(frozen=True)
class ReplayResult:
    #: copies enqueued.
    replayed: int
    #: their new message IDs, in archive order.
    ids: list[str]


class PartialReplay(Unavailable):
    """A batch failed after earlier ones were enqueued (those are counted and marked): 503,
    retry the rest."""

    def __init__(self, cause: Exception, replayed: int, ids: list[str], *, queue: str = "", into: str = ""):
        super().__init__(str(cause))
        self.cause, self.replayed, self.ids = cause, replayed, ids
        #: the queue the rows came from ("" when several) and the one they were replayed into.
        self.queue, self.into = queue, into

    @property
    def detail(self) -> str:
        return f"stopped part-way, retry the rest: {self}"

    def body(self) -> dict[str, Any]:
        """The answer says what was replayed before the failure, so that a client retries the rest."""
        named = {"queue": self.queue, "into": self.into} if self.into else {}
        return {**super().body(), **named, "replayed": self.replayed, "ids": self.ids}


def require_source(caller: Caller, source: str) -> None:
    """``read`` on the queue named ``source`` now (gone: only an unrestricted caller reads
    what is archived under the name). Raises QueueNotFound."""
    require_on_queue(caller, "read", source)


def require_rows(caller: Caller, rows: list[ArchivedMessage]) -> None:
    """``read`` on the queue row each of ``rows`` came from (its incarnation, not a queue
    created since under its name; a deleted one: only an unrestricted caller). Raises
    QueueNotFound."""
    require_on_incarnations(caller, "read", [(r.incarnation, r.queue) for r in rows])


def replay(rows: list[ArchivedMessage], into: str, *, caller: Caller, hops: int = 0) -> ReplayResult:
    """Enqueue copies of ``rows`` into ``into``, in batches of ``service.MAX_BATCH``; each
    batch's rows are marked replayed (count, time) once it is stored. ``caller`` needs
    ``manage`` on ``into`` and ``read`` on every queue row the rows came from (see
    :func:`require_rows`); the replay is recorded in the audit trail. ``hops``: a node's
    signed hop count, never a client's (0: forwarding and cooling apply).

    Raises the service's errors (QueueNotFound, ``access.Forbidden``, InvalidRequest: a message
    the target refuses) before anything is enqueued, and :class:`PartialReplay` if the store
    fails part-way.
    """
    service.authorize(into, "manage", caller=caller)
    require_rows(caller, rows)
    drafts = [draft_of(r) for r in rows]
    batches = [
        (rows[i : i + service.MAX_BATCH], drafts[i : i + service.MAX_BATCH])
        for i in range(0, len(drafts), service.MAX_BATCH)
    ]
    for _, chunk in batches:
        service.check_drafts(service.queue_config(into), chunk)
    ids: list[str] = []
    for batch_rows, chunk in batches:
        try:
            answer = service.enqueue(into, chunk, caller=caller, hops=hops)
        except Unavailable as exc:
            if ids:
                sources = sorted({r.queue for r in rows})
                audit.record(caller, "replay", into, sources=sources, replayed=len(ids))
                queue = sources[0] if len(sources) == 1 else ""
                raise PartialReplay(exc, len(ids), ids, queue=queue, into=into) from exc
            raise
        ids.extend(answer)
        ArchivedMessage.objects.filter(pk__in=[r.pk for r in batch_rows]).update(
            replay_count=F("replay_count") + 1, last_replayed_at=timezone.now()
        )
    if ids:
        audit.record(caller, "replay", into, sources=sorted({r.queue for r in rows}), replayed=len(ids))
    return ReplayResult(len(ids), ids)
