"""What the console shows a staff user: the rows of the queues it may read, as the REST API does.

A model permission (``view_queue``, ``view_archivedmessage``...) opens a list in the console; which
rows it shows is the grants' call (``queues.service.permitted_queues``), with the console's user as
the caller: a superuser sees every row, anyone else the rows of the queues and topics it has a
grant on (or created). Being staff gives no right on queues. A row the user may not see is absent
from its list, its list filters and its related lists, its page answers as if it did not exist,
and an action or delete cannot reach it (Django filters them through ``get_queryset`` too).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model, QuerySet
from django.http import HttpRequest

from queues import service
from queues.access import Caller
from queues.models import Queue


def request_caller(request: HttpRequest) -> Caller:
    """The console's user as the service sees it, once per request."""
    caller: Caller | None = getattr(request, "_mq_console_caller", None)
    if caller is None:
        caller = Caller.of(request.user)
        request._mq_console_caller = caller  # type: ignore[attr-defined]
    return caller


class QueueChoices:
    """A ``ModelAdmin`` mixin: a form's choice of a queue (a dead-letter queue, a grant's queue)
    offers the queues the user may take ``choice_action`` on, not every queue's name."""

    choice_action: str = "read"

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.related_model is Queue:
            kwargs["queryset"] = service.permitted_queues(request_caller(request), self.choice_action)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)  # type: ignore[misc]


class ByGrant(QueueChoices):
    """A ``ModelAdmin`` mixin: its rows are those of the queues the user may take
    ``grant_action`` on, found through ``grant_queue`` (a foreign key to the queue, ``"pk"`` for
    the queue itself), ``grant_incarnation`` (a column holding the queue row's id: history) or
    ``grant_name`` (a column holding the queue's name)."""

    grant_queue: str = ""
    grant_incarnation: str = ""
    grant_name: str = ""
    grant_action: str = "read"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows: QuerySet[Model] = super().get_queryset(request)  # type: ignore[misc]
        return service.only_permitted(
            rows,
            request_caller(request),
            queue=self.grant_queue,
            incarnation=self.grant_incarnation,
            name=self.grant_name,
            action=self.grant_action,
        )
