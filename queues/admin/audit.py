"""The audit trail's admin: read-only."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Case, F, Q, QuerySet, Value, When
from django.db.models.functions import Left, StrIndex
from django.http import HttpRequest

from queues import service
from queues.admin.common import _AuditEntryAdmin
from queues.admin.reads import request_caller
from queues.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(_AuditEntryAdmin):
    """The audit trail, newest first: read only (the service writes it)."""

    list_display = ["at", "actor", "action", "target", "detail"]
    list_filter = ["action", "actor"]
    search_fields = ["target"]
    ordering = ["-at", "-id"]
    readonly_fields = ["at", "actor", "action", "target", "detail"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditEntry]:
        """What the user did, and what was done to the queues and topics it may manage (the
        trail names who was granted what); all of it to a superuser."""
        rows = super().get_queryset(request)
        caller = request_caller(request)
        if caller.unrestricted:
            return rows
        slash = StrIndex("target", Value("/"))
        queue = Case(When(Q(target__contains="/"), then=Left("target", slash - 1)), default=F("target"))
        managed = service.permitted_queues(caller, "manage").values("name")
        return rows.alias(queue_name=queue).filter(Q(actor=caller.username) | Q(queue_name__in=managed))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditEntry | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditEntry | None = None) -> bool:
        return False
