"""What a caller may see: the queues and topics it may read (or manage), and any table kept
by queue cut down to their rows.

One rule for every entrance that shows rows (the REST lists, the console's lists, detail
pages, inlines and dashboards): ``queues.access.granted``. A superuser and the service itself
see everything, rows of queues deleted since included; anyone else sees the rows of the queues
it has a grant on (or created), whether or not it is staff.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Model, QuerySet

from queues.access import Caller, visible
from queues.models import Queue

_M = TypeVar("_M", bound=Model)


def permitted_queues(caller: Caller, action: str = "read") -> QuerySet[Queue]:
    """The queues and topics ``caller`` may take ``action`` on (``read``: see them at all), as
    a query (every row for an unrestricted caller). The grants are read from their cache; the
    queues once, now."""
    rows = Queue.objects.all()
    if caller.unrestricted:
        return rows
    ids = [q.pk for q in visible(caller, rows.only("pk", "name", "created_by_id"), action)]
    return Queue.objects.filter(pk__in=ids)


def only_permitted(
    rows: QuerySet[_M],
    caller: Caller,
    *,
    queue: str = "",
    incarnation: str = "",
    name: str = "",
    action: str = "read",
) -> QuerySet[_M]:
    """``rows`` of the queues ``caller`` may take ``action`` on, found through the field that
    names their queue: ``queue``, a foreign key to it (``"queue"``, ``"topic"``,
    ``"run__queue"``); ``incarnation``, a column holding its row's id (history: the archive, the
    attempt log, so a queue created again under a deleted one's name shows none of the old
    one's); or ``name``, a column holding its name. Unchanged for an unrestricted caller, who
    also sees rows of queues that are gone."""
    if caller.unrestricted:
        return rows
    allowed = permitted_queues(caller, action)
    lookup: dict[str, Any]
    if queue:
        lookup = {f"{queue}__in": allowed}
    elif incarnation:
        lookup = {f"{incarnation}__in": allowed.values("pk")}
    elif name:
        lookup = {f"{name}__in": allowed.values("name")}
    else:
        raise TypeError("only_permitted needs queue= (a foreign key), incarnation= (a row id) or name= (a name column)")
    return rows.filter(**lookup)
