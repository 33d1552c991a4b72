"""The partitions' admin: owners, leases, append-tree depth and the tree drawn."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, JsonResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from queues import service
from queues.access import Caller
from queues.admin.common import _age, _PartitionAdmin, _refusal
from queues.admin.reads import ByGrant, request_caller
from queues.admin.tree_svg import partition_svg
from queues.engine import keys
from queues.kv import get_store
from queues.models import Partition


@admin.register(Partition)
class PartitionAdmin(ByGrant, _PartitionAdmin):
    grant_queue = "queue"  # the partitions of the queues the user may read
    # Who serves it and how much it holds; its block IDs (head, enqueue and dequeue positions),
    # its delayed messages, the age of its figures and the tree are on its page.
    list_display = [
        "__str__",
        "owner_link",
        "epoch",
        "lease_age",
        "tree_height",
        "live_blocks",
        "depth",
        "in_flight",
    ]
    list_filter = [("queue", admin.RelatedOnlyFieldListFilter), "owner"]
    list_select_related = ["queue", "owner"]
    readonly_fields = ["tree", "lease_age", "stats_age", *[f.name for f in Partition._meta.fields]]
    actions = ["release_lease"]

    def has_change_permission(self, request: HttpRequest, obj: Partition | None = None) -> bool:
        return False  # its owner writes the row (lease, figures): the page only shows it

    def has_delete_permission(self, request: HttpRequest, obj: Partition | None = None) -> bool:
        return False  # a partition goes with its queue, never alone

    @admin.display(description="append tree (newest 40 blocks; live/size per block; dashed: pruned)")
    def tree(self, obj: Partition) -> str:
        try:
            svg = partition_svg(obj, get_store().within(keys.incarnation(obj.queue_id)))
        except Exception as exc:  # noqa: BLE001 - the store may be down: say so, keep the page
            return f"cannot read the tree from the store: {exc}"
        # Zoomed in the page (consoles/static/consoles/tree.js): its buttons scale the drawing,
        # which scrolls inside its box when wider than it. A block clicked shows its messages
        # in the panel beside it, read from the owner (``block_json``).
        controls = (
            '<div class="tree-controls" hidden>'
            '<button type="button" data-zoom="out" title="zoom out">\u2212</button>'
            '<button type="button" data-zoom="in" title="zoom in">+</button>'
            '<button type="button" data-zoom="fit" title="the whole drawing in the box">fit</button>'
            '<button type="button" data-zoom="1" title="actual size">100%</button>'
            '<span class="tree-scale"></span>'
            '<button type="button" data-goto="head" title="scroll to the newest block, list its messages">head</button>'
            '<button type="button" data-goto="oldest" title="scroll to the oldest block holding messages, list them">'
            "oldest live</button></div>"
        )
        url = reverse("admin:queues_partition_block", args=[obj.pk, "BLOCK"])
        panel = (
            '<aside class="tree-block-panel" hidden aria-live="polite"><header>'
            '<strong class="tree-block-title"></strong>'
            '<button type="button" class="tree-block-close" title="close">\u00d7</button></header>'
            '<p class="tree-block-summary"></p><ol class="tree-block-messages"></ol></aside>'
        )
        return mark_safe(  # noqa: S308 - partition_svg escapes; the URL is reverse()'s
            f'<div class="tree-zoom" data-block-url="{url}">{controls}'
            f'<div class="tree-area"><div class="tree-box">{svg}</div>{panel}</div></div>'
        )

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "<path:object_id>/blocks/<str:block>.json",
                self.admin_site.admin_view(self.block_json),
                name="queues_partition_block",
            )
        ]
        return own + super().get_urls()

    def block_json(self, request: HttpRequest, object_id: str, block: str) -> JsonResponse:
        """A block's messages and their states (``service.block_messages``: read at the
        partition's owner, as the console's user), for the panel beside the tree drawing. A
        partition the user may not see answers 404, as its page does."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        partition = self.get_object(request, object_id)
        if partition is None:
            return JsonResponse({"error": "not_found", "detail": "no such partition"}, status=404)
        try:
            listing: Any = service.block_messages(
                partition.queue.name, partition.index, block, caller=request_caller(request)
            )
        except service.ServiceError as exc:
            if isinstance(exc, service.Fault):
                raise  # a bug: answered as any other, without its words (json_500)
            return JsonResponse(exc.body(), status=exc.status, headers=exc.headers())  # the answer it carries
        response = JsonResponse(listing)
        response["Cache-Control"] = "no-store"
        return response

    class Media:
        js = ["consoles/tree.js"]

    @admin.display(description="owner", ordering="owner__address")
    def owner_link(self, obj: Partition) -> str:
        if obj.owner is None:
            return "-"
        return format_html('<a href="{}">{}</a>', reverse("admin:queues_node_change", args=[obj.owner_id]), obj.owner)

    @admin.display(description="lease age")
    def lease_age(self, obj: Partition) -> str:
        return _age(obj.lease_acquired_at) if obj.owner_id else "-"

    @admin.display(description="stats age", ordering="stats_at")
    def stats_age(self, obj: Partition) -> str:
        return _age(obj.stats_at) if obj.stats_at else "-"

    def has_release_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queues.release_partition")

    @admin.action(
        description="Release the lease (another node takes the partition)",
        permissions=["release"],
    )
    def release_lease(self, request: HttpRequest, queryset: QuerySet[Partition]) -> None:
        for p in queryset.select_related("queue"):
            try:
                node = service.release_partition(p.queue.name, p.index, caller=Caller.of(request.user))
            except service.Conflict as exc:
                self.message_user(request, f"{p}: {exc.detail}", level=messages.WARNING)
            except service.Refused as exc:
                self.message_user(request, f"{p}: not released: {_refusal(exc)}", level=messages.ERROR)
            except service.RemoteError as exc:
                self.message_user(request, f"{p}: {exc.payload.get('detail', exc.payload)}", level=messages.WARNING)
            except Exception as exc:  # noqa: BLE001 - shown to the operator
                self.message_user(request, f"{p}: release failed: {exc}", level=messages.ERROR)
            else:
                self.message_user(request, f"{p}: released by {node}")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
