"""What the apps read of queue and partition rows, and the lock a queue's job starts under.

The apps (``sqs``, ``workers``, ``archive``, ``consoles``) never query the core's models: what
they need of them is here. The reads check no permission and take no lock (unless said): they
are the service's own bookkeeping (a worker's heartbeat, the dashboards' job, an admin page's
link), whose callers already hold the right to what they read, or they are the checks
themselves (:func:`require_on_queue`, :func:`require_on_incarnations`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import transaction
from django.db.models import Sum

from queues.access import Caller, audit, require
from queues.models import Partition, Queue
from queues.service.errors import QueueNotFound

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ServedPartition:
    """A partition with messages and an owner, as its owner last published it."""

    queue: str
    index: int
    #: the owner node's address.
    owner: str
    #: messages stored (the owner's figure at its last heartbeat).
    depth: int


def queue_fields(name: str, *fields: str) -> tuple[Any, ...] | None:
    """The values of ``fields`` (a queue's columns: ``visibility_timeout``, ``partitions``,
    ``process_estimate``...) of the queue or topic named ``name`` now; None if there is none.
    One read."""
    return Queue.objects.filter(name=name).values_list(*fields).first()


def queue_name(incarnation: int) -> str | None:
    """The name of the queue row ``incarnation`` (its id); None if it is gone. One read."""
    return Queue.objects.filter(pk=incarnation).values_list("name", flat=True).first()


def total_depth(names: Iterable[str]) -> int:
    """Messages stored in the queues and topics named, as their partitions' owners last
    published them (0 for none). One read."""
    return int(Partition.objects.filter(queue__name__in=set(names)).aggregate(d=Sum("depth"))["d"] or 0)


def served_partitions(names: Iterable[str]) -> list[ServedPartition]:
    """The partitions of the queues named that hold messages and have an owner now, by queue
    name and index. One read."""
    rows = (
        Partition.objects.filter(queue__name__in=set(names), depth__gt=0, owner__isnull=False)
        .select_related("queue", "owner")
        .order_by("queue__name", "index")
    )
    return [ServedPartition(p.queue.name, p.index, p.owner.address, p.depth) for p in rows if p.owner is not None]


def partition_row_id(incarnation: int, index: int) -> int | None:
    """The id of partition ``index``'s row of the queue row ``incarnation`` (not of a queue
    created since under its name), for a link to its admin page; None if it is gone."""
    return Partition.objects.filter(queue_id=incarnation, index=index).values_list("pk", flat=True).first()


def require_on_queue(caller: Caller, action: str, name: str) -> None:
    """``action`` on the queue or topic named ``name`` now; when there is none, only an
    unrestricted caller passes (what is kept under a name that is gone, such as its archived
    messages, is theirs alone). Raises QueueNotFound, Forbidden."""
    q = Queue.objects.filter(name=name).only("pk", "name", "created_by_id").first()
    if q is None:
        if not caller.unrestricted:
            raise QueueNotFound(name)
    else:
        require(caller, action, q.pk, q.name, q.created_by_id)


def require_on_incarnations(caller: Caller, action: str, rows: Iterable[tuple[int | None, str]]) -> None:
    """``action`` on each queue row of ``rows`` (``(incarnation, name)``: a record's row, not a
    queue created since under its name); a row that is gone (or None): only an unrestricted
    caller passes. Checked in the order of ``(incarnation, name)``. Raises QueueNotFound (the
    name of the first row refused), Forbidden."""
    wanted = sorted({(incarnation or 0, name) for incarnation, name in rows})
    if caller.unrestricted or not wanted:
        return
    found = {q.pk: q for q in Queue.objects.filter(pk__in={i for i, _ in wanted}).only("pk", "name", "created_by_id")}
    for incarnation, name in wanted:
        q = found.get(incarnation)
        if q is None:
            raise QueueNotFound(name)
        require(caller, action, q.pk, q.name, q.created_by_id)


def start_queue_job(q: Queue, *, caller: Caller, action: str, start: Callable[[], tuple[_T, dict[str, Any]]]) -> _T:
    """Start a job on queue ``q`` (a row as ``get_queue`` returns it; such as SQS's message
    move task) that must be one at a time per queue: in one transaction, holding SELECT FOR
    UPDATE on the queue's row (so two starts at once queue on it, and the second sees the
    first's job), run ``start``, which checks for a running job, makes its own and returns it
    with the details to record; then record ``action`` on the queue as ``caller`` in the audit
    trail, in the same transaction. Checks no permission: the caller checked it. What ``start``
    raises rolls all of it back and propagates. Raises QueueNotFound (the row is gone)."""
    with transaction.atomic():
        if not Queue.objects.select_for_update().filter(pk=q.pk).values_list("pk", flat=True):
            raise QueueNotFound(q.name)
        job, detail = start()
        audit.record(caller, action, q.name, **detail)
    return job
