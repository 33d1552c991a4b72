"""The archive in the admin: browse archived messages, replay them into their queue."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from archive.models import ArchivedMessage, ArchiverLock
from archive.replay import PartialReplay, replay
from queues.access import Caller
from queues.admin.common import _age
from queues.admin.reads import ByGrant

if TYPE_CHECKING:
    # django-stubs' ModelAdmin takes its model as a type argument; Django's cannot be subscripted.
    _ArchivedMessageAdmin = admin.ModelAdmin[ArchivedMessage]
    _ArchiverLockAdmin = admin.ModelAdmin[ArchiverLock]
else:
    _ArchivedMessageAdmin = _ArchiverLockAdmin = admin.ModelAdmin


class AckedFilter(admin.SimpleListFilter):
    title = "acknowledged"
    parameter_name = "acked"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> Sequence[tuple[str, str]]:
        return (("yes", "acknowledged"), ("no", "not acknowledged"))

    def queryset(self, request: HttpRequest, queryset: QuerySet[ArchivedMessage]) -> QuerySet[ArchivedMessage]:
        if self.value() == "yes":
            return queryset.filter(acked_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(acked_at__isnull=True)
        return queryset


class ReplayedFilter(admin.SimpleListFilter):
    title = "replayed"
    parameter_name = "replayed"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> Sequence[tuple[str, str]]:
        return (("yes", "replayed"), ("no", "never replayed"))

    def queryset(self, request: HttpRequest, queryset: QuerySet[ArchivedMessage]) -> QuerySet[ArchivedMessage]:
        if self.value() == "yes":
            return queryset.filter(replay_count__gt=0)
        if self.value() == "no":
            return queryset.filter(replay_count=0)
        return queryset


@admin.register(ArchivedMessage)
class ArchivedMessageAdmin(ByGrant, _ArchivedMessageAdmin):
    grant_incarnation = "incarnation"  # the archive of the queues the user may read
    # The queue is in the message's ID; the group and the exact times are on its page.
    list_display = (
        "message_id",
        "short_body",
        "enqueued",
        "latency_s",
        "replay_count",
    )
    list_filter = ("queue", AckedFilter, ReplayedFilter)
    search_fields = ("=message_id", "group")
    date_hierarchy = "enqueued_at"
    ordering = ("-id",)
    actions = ("replay_into_source",)
    show_full_result_count = False

    def get_readonly_fields(self, request: HttpRequest, obj: ArchivedMessage | None = None) -> list[str]:
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ArchivedMessage | None = None) -> bool:
        return False  # a copy of a message as it was: shown, replayed (the action), never edited

    def has_delete_permission(self, request: HttpRequest, obj: ArchivedMessage | None = None) -> bool:
        # A row may be the only copy of a message a slow subscription still has to read
        # (retention moved it out of the key-value store): the archive is append-only here.
        return False

    @admin.display(description="body")
    def short_body(self, obj: ArchivedMessage) -> str:
        return obj.body if len(obj.body) <= 40 else obj.body[:37] + "..."

    @admin.display(description="enqueued", ordering="enqueued_at")
    def enqueued(self, obj: ArchivedMessage) -> str:
        return _age(obj.enqueued_at) + " ago" if obj.enqueued_at else "-"

    @admin.display(description="latency (s)")
    def latency_s(self, obj: ArchivedMessage) -> float | None:
        return None if obj.latency is None else round(obj.latency, 3)

    def has_replay_permission(self, request: HttpRequest) -> bool:
        # Its own permission: viewing the archive is not enough; the service still checks
        # ``manage`` on the queue replayed into and ``read`` on the sources.
        return request.user.has_perm("archive.replay_archivedmessage")

    @admin.action(description="Replay into the source queue", permissions=["replay"])
    def replay_into_source(self, request: HttpRequest, queryset: QuerySet[ArchivedMessage]) -> None:
        by_queue: dict[str, list[ArchivedMessage]] = {}
        for row in queryset.order_by("enqueued_at", "sequence", "id")[:10_000]:
            by_queue.setdefault(row.queue, []).append(row)
        for queue, rows in by_queue.items():
            try:
                answer = replay(rows, queue, caller=Caller.of(request.user))
            except PartialReplay as exc:
                self.message_user(request, f"{queue}: {exc.replayed} replayed, then: {exc}", messages.ERROR)
            except Exception as exc:  # noqa: BLE001 - shown to the operator
                detail = getattr(exc, "detail", None) or str(exc) or type(exc).__name__
                self.message_user(request, f"{queue}: nothing replayed: {detail}", messages.ERROR)
            else:
                self.message_user(request, f"{queue}: {answer.replayed} message(s) replayed")


@admin.register(ArchiverLock)
class ArchiverLockAdmin(ByGrant, _ArchiverLockAdmin):
    grant_name = "queue"
    list_display = ("queue", "holder", "expires_at")
    readonly_fields = ("queue", "holder", "expires_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ArchiverLock | None = None) -> bool:
        return False  # the archiver's lease: taken and given up by the archiver only

    def has_delete_permission(self, request: HttpRequest, obj: ArchiverLock | None = None) -> bool:
        return False
