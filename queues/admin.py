"""The admin for now: queues, partitions with their owners, nodes (the console grows later)."""

from django.contrib import admin, messages
from django.db.models import Count
from django.utils import timezone
from django.utils.safestring import mark_safe

from .models import Node, Partition, Queue


class PartitionInline(admin.TabularInline):
    model = Partition
    extra = 0
    can_delete = False
    fields = ["index", "owner", "epoch", "head_block", "depth", "in_flight", "tree_height", "live_blocks"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    list_display = ["name", "partitions", "strict", "dead_letter_queue", "max_receives", "block_size",
                    "visibility_timeout", "lease_period", "dead_lettered_total", "expired_total"]
    search_fields = ["name"]
    inlines = [PartitionInline]
    actions = ["redrive"]

    @admin.action(description="Redrive dead letters back to their source queues (up to 1,000 each)")
    def redrive(self, request, queryset):
        from .api import calls

        for q in queryset:
            try:
                _, result = calls.redrive(q.name, {"max": 1000})
            except Exception as exc:  # noqa: BLE001 - shown to the operator
                self.message_user(request, f"{q.name}: redrive failed: {exc}", level=messages.ERROR)
                continue
            self.message_user(request, f"{q.name}: moved {result['moved']} back, "
                                       f"skipped {result['skipped']} without a source")


@admin.register(Partition)
class PartitionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "owner", "epoch", "lease_age", "head_block", "depth", "in_flight",
                    "tree_height", "live_blocks"]
    list_filter = ["queue", "owner"]
    list_select_related = ["queue", "owner"]
    readonly_fields = ["tree", *[f.name for f in Partition._meta.fields]]

    @admin.display(description="append tree (newest 40 blocks; live/size per block; dashed: pruned)")
    def tree(self, obj):
        from consoles.tree_svg import partition_svg

        from .kv import get_store

        try:
            svg = partition_svg(obj, get_store())
        except Exception as exc:  # noqa: BLE001 - the store may be down: say so, keep the page
            return f"cannot read the tree from the store: {exc}"
        return mark_safe(f'<div style="overflow-x:auto;max-width:100%">{svg}</div>')  # noqa: S308 - escaped in tree_svg

    @admin.display(description="lease age")
    def lease_age(self, obj):
        if obj.lease_acquired_at is None:
            return "-"
        return f"{(timezone.now() - obj.lease_acquired_at).total_seconds():.0f} s"

    def has_add_permission(self, request):
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["address", "id", "alive", "held", "cooling", "heartbeat_at", "started_at", "stopped_at", "pid"]
    list_filter = ["cooling", ("stopped_at", admin.EmptyFieldListFilter)]
    readonly_fields = [f.name for f in Node._meta.fields]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(held_count=Count("partitions"))

    @admin.display(description="partitions held", ordering="held_count")
    def held(self, obj):
        return obj.held_count

    @admin.display(boolean=True, description="alive")
    def alive(self, obj):
        return obj.stopped_at is None and (timezone.now() - obj.heartbeat_at).total_seconds() < 5

    def has_add_permission(self, request):
        return False
