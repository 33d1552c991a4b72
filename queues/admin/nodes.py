"""The nodes' admin: which node process is alive, its address and its partitions."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from queues.admin.common import _age, _NodeAdmin
from queues.cluster import clock
from queues.models import Node

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class _NodeCounts(TypedDict):
    owned_count: int


@admin.register(Node)
class NodeAdmin(_NodeAdmin):
    # Its ID and exact times are on its page; the list shows ages.
    list_display = ["address", "alive", "owned", "cooling_mark", "heartbeat_age", "up", "pid"]
    list_filter = ["cooling", ("stopped_at", admin.EmptyFieldListFilter)]
    readonly_fields = [f.name for f in Node._meta.fields]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WithAnnotations[Node, _NodeCounts]]:
        return super().get_queryset(request).annotate(owned_count=Count("partitions"))

    @admin.display(description="partitions owned", ordering="owned_count")
    def owned(self, obj: WithAnnotations[Node, _NodeCounts]) -> SafeString:
        url = reverse("admin:queues_partition_changelist") + f"?owner__id__exact={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, obj.owned_count)

    @admin.display(description="cooling", ordering="cooling")
    def cooling_mark(self, obj: Node) -> SafeString:
        """Cooling is a state a node passes through, not a fault: a word when it is, nothing when not."""
        if obj.cooling:
            return format_html(
                '<span class="mark-warn" title="{}">cooling</span>', "sending enqueues elsewhere (overload)"
            )
        return format_html('<span class="mark-quiet">{}</span>', "-")

    @admin.display(description="heartbeat", ordering="-heartbeat_at")
    def heartbeat_age(self, obj: Node) -> str:
        return _age(obj.heartbeat_at)

    @admin.display(description="up", ordering="started_at")
    def up(self, obj: Node) -> str:
        return "stopped" if obj.stopped_at is not None else _age(obj.started_at)

    @admin.display(boolean=True, description="alive")
    def alive(self, obj: Node) -> bool:
        return obj.stopped_at is None and (clock.now() - obj.heartbeat_at).total_seconds() < 5

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Node | None = None) -> bool:
        return False  # each node registers and heartbeats its own row

    def has_delete_permission(self, request: HttpRequest, obj: Node | None = None) -> bool:
        return False  # a node's row names the leases it holds: it is never removed by hand
