"""Consumers and their attempts, with links between messages, attempts, workers and partitions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from queues import service
from queues.admin.common import _age
from queues.admin.reads import ByGrant, request_caller
from queues.service.rows import partition_row_id
from workers.models import AttemptLog, Consumer

if TYPE_CHECKING:
    from django.utils.safestring import SafeString

    # django-stubs' ModelAdmin takes its model as a type argument; Django's cannot be subscripted.
    _ConsumerAdmin = admin.ModelAdmin[Consumer]
    _AttemptLogAdmin = admin.ModelAdmin[AttemptLog]
else:
    _ConsumerAdmin = _AttemptLogAdmin = admin.ModelAdmin


@admin.register(Consumer)
class ConsumerAdmin(_ConsumerAdmin):
    list_display = [
        "__str__",
        "hostname",
        "pid",
        "last_heartbeat",
        "alive",
        "load",
        "capacity",
        "in_flight_count",
        "asleep",
        "attempts_link",
    ]
    search_fields = ["id", "name", "hostname"]
    readonly_fields = [f.name for f in Consumer._meta.fields]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Consumer]:
        """A user's own workers, and those that consume only queues it may read (a worker's
        page names every queue it consumes and every message it has in flight); all to a superuser."""
        rows = super().get_queryset(request)
        caller = request_caller(request)
        if caller.unrestricted:
            return rows
        readable = set(service.permitted_queues(caller).values_list("name", flat=True))
        shown = [
            pk
            for pk, user_id, queues in rows.values_list("pk", "user_id", "queues")
            if user_id == caller.user_id
            or (queues and all(isinstance(q, str) and q.partition("/")[0] in readable for q in queues))
        ]
        return rows.filter(pk__in=shown)

    @admin.display(boolean=True)
    def alive(self, obj: Consumer) -> bool:
        return (timezone.now() - obj.last_heartbeat).total_seconds() < 30

    @admin.display(description="in flight")
    def in_flight_count(self, obj: Consumer) -> int:
        return len(obj.held)

    @admin.display(boolean=True)
    def asleep(self, obj: Consumer) -> bool:
        return bool(obj.asleep_until and obj.asleep_until > timezone.now())

    @admin.display(description="attempts")
    def attempts_link(self, obj: Consumer) -> SafeString:
        url = reverse("admin:workers_attemptlog_changelist") + f"?worker__id__exact={obj.pk}"
        return format_html('<a href="{}">attempts</a>', url)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Consumer | None = None) -> bool:
        return False  # written by the consumer's own heartbeats

    def has_delete_permission(self, request: HttpRequest, obj: Consumer | None = None) -> bool:
        return False


@admin.register(AttemptLog)
class AttemptLogAdmin(ByGrant, _AttemptLogAdmin):
    grant_incarnation = "incarnation"  # the attempts on the queues the user may read
    # The group, the times of each stage (the processing time) and the traceback are on the
    # attempt's page.
    list_display = [
        "recorded",
        "message_link",
        "outcome_of_attempt",
        "partition_link",
        "worker_link",
        "short_error",
    ]
    list_filter = ["outcome", "queue", ("worker", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["message_id", "group", "error"]
    date_hierarchy = "recorded_at"
    readonly_fields = ["process_seconds", *[f.name for f in AttemptLog._meta.fields]]
    list_select_related = ["worker"]

    @admin.display(description="recorded", ordering="recorded_at")
    def recorded(self, obj: AttemptLog) -> str:
        return _age(obj.recorded_at) + " ago" if obj.recorded_at else "-"

    @admin.display(description="outcome (attempt)", ordering="outcome")
    def outcome_of_attempt(self, obj: AttemptLog) -> str:
        return f"{obj.get_outcome_display()} ({obj.attempt})"

    @admin.display(description="error", ordering="error")
    def short_error(self, obj: AttemptLog) -> str:
        if len(obj.error) <= 60:
            return obj.error
        return format_html('<span title="{}">{}...</span>', obj.error, obj.error[:57])

    @admin.display(description="message")
    def message_link(self, obj: AttemptLog) -> SafeString:
        url = reverse("admin:workers_attemptlog_changelist") + f"?message_id={obj.message_id}"
        return format_html('<a href="{}" title="all attempts of this message">{}</a>', url, obj.message_id)

    @admin.display(description="worker")
    def worker_link(self, obj: AttemptLog) -> str:
        if obj.worker_id is None:
            return "-"
        url = reverse("admin:workers_consumer_change", args=[obj.worker_id])
        return format_html('<a href="{}">{}</a>', url, obj.worker or obj.worker_id[:12])

    @admin.display(description="partition")
    def partition_link(self, obj: AttemptLog) -> str:
        # The partition of the queue row the record was written for, not of a queue created
        # since under the name.
        p = partition_row_id(obj.incarnation, obj.partition) if obj.incarnation is not None else None
        if p is None:
            return f"{obj.queue}/{obj.partition}"
        return format_html(
            '<a href="{}">{}/{}</a>', reverse("admin:queues_partition_change", args=[p]), obj.queue, obj.partition
        )

    @admin.display(description="processing s")
    def process_seconds(self, obj: AttemptLog) -> str:
        if obj.process_started_at and obj.process_ended_at:
            return f"{(obj.process_ended_at - obj.process_started_at).total_seconds():.3f}"
        return "-"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AttemptLog | None = None) -> bool:
        return False  # the record of an attempt, as the service wrote it

    def has_delete_permission(self, request: HttpRequest, obj: AttemptLog | None = None) -> bool:
        return False
