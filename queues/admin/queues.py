"""The queues' admin: settings, partitions, subscriptions and who may do what."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django import forms
from django.contrib import admin, messages
from django.db.models import Min, QuerySet, Sum
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from queues import access, service
from queues.access import Caller
from queues.admin.common import _age, _PartitionInline, _QueueAdmin, _refusal
from queues.admin.grants import GrantInline, save_grants
from queues.admin.reads import ByGrant, request_caller
from queues.admin.subscriptions import SubscriptionInline
from queues.models import Grant, Partition, Queue

if TYPE_CHECKING:
    from django.contrib.admin.options import InlineModelAdmin, _FieldsetSpec
    from django.forms.models import BaseInlineFormSet
    from django_stubs_ext import WithAnnotations


class _QueueFigures(TypedDict):
    """The figures ``QueueAdmin.get_queryset`` sums over a queue's partitions."""

    depth_sum: int | None
    in_flight_sum: int | None
    delayed_sum: int | None
    oldest: datetime | None
    enqueue_rate_sum: float | None
    ack_rate_sum: float | None


class PartitionInline(_PartitionInline):
    model = Partition
    extra = 0
    can_delete = False
    fields = [
        "link",
        "owner",
        "epoch",
        "lease_age",
        "depth",
        "in_flight",
        "delayed",
        "tree_height",
        "live_blocks",
        "enqueue_rate",
        "ack_rate",
    ]
    # the stubs type fields as names or groups of names, readonly_fields as names: one list of names is both
    readonly_fields = fields  # type: ignore[assignment]

    @admin.display(description="lease age")
    def lease_age(self, obj: Partition) -> str:
        return _age(obj.lease_acquired_at) if obj.owner_id else "-"

    @admin.display(description="partition")
    def link(self, obj: Partition) -> SafeString:
        return format_html('<a href="{}">{}</a>', reverse("admin:queues_partition_change", args=[obj.pk]), obj)

    def has_add_permission(self, request: HttpRequest, obj: Queue | None = None) -> bool:
        return False


_MARK = {True: "\u2713", False: "\u2013"}

#: What a new queue is created with from its page: its name, kind and settings (its creator is
#: the user who saves it, its figures start at zero).
_NEW_QUEUE_FIELDS = service.NewQueueFields.__required_keys__ | service.NewQueueFields.__optional_keys__

#: Settings a topic's page leaves out: each subscription has its own dead-letter queue and
#: receive limit, and workers' estimates are learned for queues.
TOPIC_HIDES = frozenset(
    {"dead_letter_queue", "max_receives", "preprocess_estimate", "process_estimate", "dead_lettered_total"}
)


def effective_access_table(q: Queue) -> SafeString:
    """Who may do what to ``q`` now, as ``queues.access.granted`` decides it: the superusers,
    its creator, each user and group a grant on it (by name or pattern) names; a user's row
    includes what its groups are granted."""
    from django.contrib.auth import get_user_model

    grants = access.grants_on(q.pk, q.name)
    users = {g.user_id: g.user for g in grants if g.user_id is not None and g.user is not None}
    groups = {g.group_id: g.group for g in grants if g.group_id is not None and g.group is not None}
    if q.created_by_id is not None and q.created_by is not None:
        users.setdefault(q.created_by_id, q.created_by)
    member_of: dict[int, set[int]] = {}
    for user_id, group_id in (
        get_user_model().groups.through.objects.filter(user_id__in=users).values_list("user_id", "group_id")
    ):
        member_of.setdefault(user_id, set()).add(group_id)
    here = "this topic" if q.kind == Queue.Kind.TOPIC else "this queue"

    def because(g: Grant) -> str:
        return f"{g.action} on {here if g.queue_id is not None else g.pattern}"

    rows = [("superusers", "superusers", frozenset(access.ACTIONS), "superuser")]
    for user in sorted(users.values(), key=lambda u: u.get_username()):
        caller = Caller(
            user.pk, user.get_username(), user.is_superuser, user.is_staff, frozenset(member_of.get(user.pk, ()))
        )
        why = (["creator"] if user.pk == q.created_by_id else []) + (["superuser"] if user.is_superuser else [])
        why += [because(g) for g in grants if g.user_id == user.pk]
        why += [f"group {groups[gid].name}" for gid in sorted(member_of.get(user.pk, set()) & set(groups))]
        have = access.granted(caller, q.pk, q.name, q.created_by_id)
        rows.append((f"user:{user.get_username()}", f"user {user.get_username()}", have, "; ".join(why)))
    for group in sorted(groups.values(), key=lambda g: g.name):
        have = access.granted_to_group(group.pk, q.pk, q.name)
        grounds = "; ".join(because(g) for g in grants if g.group_id == group.pk)
        rows.append((f"group:{group.name}", f"group {group.name}", have, grounds))
    body = format_html_join(
        "",
        '<tr data-principal="{}"><td>{}</td>{}<td>{}</td></tr>',
        (
            (
                key,
                label,
                format_html_join(
                    "",
                    '<td class="action-{}" data-granted="{}">{}</td>',
                    ((a, "yes" if a in have else "no", _MARK[a in have]) for a in access.ACTIONS),
                ),
                why,
            )
            for key, label, have, why in rows
        ),
    )
    head = format_html_join("", "<th>{}</th>", ((a,) for a in access.ACTIONS))
    return format_html(
        '<table class="effective-access"><thead><tr><th>who</th>{}<th>because</th></tr></thead>'
        "<tbody>{}</tbody></table>",
        head,
        body,
    )


def _may_manage(request: HttpRequest, q: Queue) -> bool:
    """Whether the console's user may manage ``q``: who else may act on it (its grants, its
    effective access) is shown only to them."""
    return "manage" in access.granted(request_caller(request), q.pk, q.name, q.created_by_id)


@admin.register(Queue)
class QueueAdmin(ByGrant, _QueueAdmin):
    grant_queue = "pk"  # the queues and topics the user may read
    # The figures an operator scans a list for; the settings (strict, archive, the dead-letter
    # queue, delays, estimates) are on the queue's page. A topic is marked beside its name.
    list_display = [
        "name_and_kind",
        "depth",
        "in_flight",
        "delayed",
        "dead_letters",
        "oldest_age",
        "rates",
        "partition_link",
    ]
    list_filter = ["kind", "strict", "archive"]
    search_fields = ["name"]
    inlines = [SubscriptionInline, GrantInline, PartitionInline]
    readonly_fields = [
        "created_by",
        "dead_lettered_total",
        "expired_total",
        "purged_total",
        "created_at",
        "updated_at",
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: Queue | None = None) -> list[str]:
        # Keys in the store are named after the queue and its block size shapes its trees: they
        # never change; partitions only grow, through save_model (service.update_queue).
        fixed = ["name", "kind", "block_size"] if obj is not None else []
        shown = ["effective_access"] if obj is not None and _may_manage(request, obj) else []
        return [*fixed, *self.readonly_fields, *shown]

    def get_fieldsets(self, request: HttpRequest, obj: Queue | None = None) -> _FieldsetSpec:
        # Who may do what gets its own section under the settings (the figures are above them:
        # change_view). A topic is read through its subscriptions, each with its own
        # dead-letter queue and limit: its page leaves those settings out (and so does its form).
        hidden = {"effective_access"} | (TOPIC_HIDES if obj is not None and obj.kind == Queue.Kind.TOPIC else set())
        fields = [f for f in self.get_fields(request, obj) if f not in hidden]
        if obj is None or not _may_manage(request, obj):
            return [(None, {"fields": fields})]
        return [
            (None, {"fields": fields}),
            (
                "Effective access",
                {
                    "fields": ["effective_access"],
                    "description": "who may do what to it now: its grants below, grants on patterns its name "
                    "matches (made in the grants list), its creator and the superusers",
                },
            ),
        ]

    def get_inlines(self, request: HttpRequest, obj: Queue | None) -> list[type[InlineModelAdmin[Any, Any]]]:
        if obj is None:
            return [PartitionInline]
        grants = [GrantInline] if _may_manage(request, obj) else []
        if obj.kind == Queue.Kind.TOPIC:
            return [SubscriptionInline, *grants, PartitionInline]
        return [*grants, PartitionInline]

    def save_formset(
        self,
        request: HttpRequest,
        form: forms.ModelForm[Queue],
        formset: BaseInlineFormSet[Any, Queue, Any],
        change: bool,
    ) -> None:
        if formset.model is Grant:
            save_grants(request, formset)
        else:
            super().save_formset(request, form, formset, change)

    change_form_template = "admin/queues/queue/change_form.html"

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> Any:
        # What an operator opens a queue's page for, above its settings: its figures, read
        # through the service with the console's user as the caller (none for a queue it may
        # not read: the page itself answers 404 then).
        extra: dict[str, Any] = dict(extra_context or {})
        try:
            pk = int(object_id)
        except ValueError:
            pk = None
        if pk is not None:
            lines = service.cluster_overview(request_caller(request), with_nodes=False, only=[pk])["queues"]
            if lines:
                extra["figures"] = lines[0]
                if lines[0]["kind"] == Queue.Kind.TOPIC:
                    extra["topic_url"] = reverse("admin:topic", args=[lines[0]["name"]])
                    extra["title"] = "Change topic"
        return super().change_view(request, object_id, form_url, extra)

    @admin.display(description="effective access")
    def effective_access(self, obj: Queue) -> SafeString:
        return effective_access_table(obj)

    def save_model(self, request: HttpRequest, obj: Queue, form: forms.ModelForm[Queue], change: bool) -> None:
        fields = {f: form.cleaned_data[f] for f in form.changed_data if f in form.cleaned_data}
        if not change:
            obj.pk = service.create_queue(
                caller=Caller.of(request.user),
                **{f.name: getattr(obj, f.name) for f in Queue._meta.concrete_fields if f.name in _NEW_QUEUE_FIELDS},
            ).pk
            return
        try:
            service.update_queue(Queue.objects.get(pk=obj.pk), caller=Caller.of(request.user), **fields)
        except service.InvalidRequest as exc:
            self.message_user(request, exc.detail, level=messages.ERROR)
        except service.Refused as exc:
            self.message_user(request, f"{obj.name}: not changed: {_refusal(exc)}", level=messages.ERROR)

    def delete_model(self, request: HttpRequest, obj: Queue) -> None:
        try:
            service.delete_queue(obj, caller=Caller.of(request.user))  # its messages leave the store with it
        except service.Refused as exc:
            self.message_user(request, f"{obj.name}: not deleted: {_refusal(exc)}", level=messages.ERROR)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for q in queryset:
            self.delete_model(request, q)

    def get_deleted_objects(
        self, objs: Sequence[Queue] | QuerySet[Queue], request: HttpRequest
    ) -> tuple[list[str], dict[str, int], set[str], list[str]]:
        # The partition rows go with their queue; their own delete permission (refused) must
        # not block the queue's.
        deleted, counts, _perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(), protected

    actions = ["purge", "redrive"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WithAnnotations[Queue, _QueueFigures]]:
        # Figures of partitions with no live owner are the last ones published: still shown
        # (they are what the store holds), the partition page says who serves it.
        rows: QuerySet[WithAnnotations[Queue, _QueueFigures]] = (
            super()
            .get_queryset(request)
            .select_related("dead_letter_queue")
            .annotate(
                depth_sum=Sum("partition_set__depth"),
                in_flight_sum=Sum("partition_set__in_flight"),
                delayed_sum=Sum("partition_set__delayed"),
                oldest=Min("partition_set__oldest_enqueued_at"),
                enqueue_rate_sum=Sum("partition_set__enqueue_rate"),
                ack_rate_sum=Sum("partition_set__ack_rate"),
            )
        )
        return rows

    @admin.display(description="name", ordering="name")
    def name_and_kind(self, obj: Queue) -> SafeString:
        if obj.kind == Queue.Kind.TOPIC:
            return format_html('{} <span class="mark-kind">topic</span>', obj.name)
        return format_html("{}", obj.name)

    @admin.display(description="depth", ordering="depth_sum")
    def depth(self, obj: WithAnnotations[Queue, _QueueFigures]) -> int:
        return obj.depth_sum or 0

    @admin.display(description="in flight", ordering="in_flight_sum")
    def in_flight(self, obj: WithAnnotations[Queue, _QueueFigures]) -> int:
        return obj.in_flight_sum or 0

    @admin.display(description="delayed", ordering="delayed_sum")
    def delayed(self, obj: WithAnnotations[Queue, _QueueFigures]) -> int:
        return obj.delayed_sum or 0

    @admin.display(description="dead letters")
    def dead_letters(self, obj: Queue) -> str:
        """Waiting in the dead-letter queue now / moved there in all."""
        if obj.dead_letter_queue_id is None:
            return "-" if not obj.dead_lettered_total else f"- / {obj.dead_lettered_total}"
        waiting = Partition.objects.filter(queue_id=obj.dead_letter_queue_id).aggregate(n=Sum("depth"))["n"] or 0
        url = reverse("admin:queues_queue_change", args=[obj.dead_letter_queue_id])
        return format_html(
            '<a href="{}" title="waiting now / moved in all">{} / {}</a>', url, waiting, obj.dead_lettered_total
        )

    @admin.display(description="oldest", ordering="oldest")
    def oldest_age(self, obj: WithAnnotations[Queue, _QueueFigures]) -> str:
        return _age(obj.oldest)

    @admin.display(description="enqueued / acked per s", ordering="-enqueue_rate_sum")
    def rates(self, obj: WithAnnotations[Queue, _QueueFigures]) -> str:
        return f"{obj.enqueue_rate_sum or 0:.1f} / {obj.ack_rate_sum or 0:.1f}"

    @admin.display(description="partitions", ordering="partitions")
    def partition_link(self, obj: Queue) -> SafeString:
        url = reverse("admin:queues_partition_changelist") + f"?queue__id__exact={obj.pk}"
        return format_html('<a href="{}">{} partition{}</a>', url, obj.partitions, "" if obj.partitions == 1 else "s")

    # Each action is offered only to a user with its own permission (``queues.purge_queue``,
    # ``queues.redrive_queue``): viewing the queues is not enough. Who may act on which queue is
    # still the service's call (its grant check, with the admin's user as the caller).
    def has_purge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queues.purge_queue")

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queues.redrive_queue")

    @admin.action(
        description="Purge: delete every message, in flight too",
        permissions=["purge"],
    )
    def purge(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for q in queryset:
            try:
                removed = service.purge(q.name, caller=Caller.of(request.user))
            except service.Refused as exc:
                self.message_user(request, f"{q.name}: not purged: {_refusal(exc)}", level=messages.ERROR)
                continue
            except Exception as exc:  # noqa: BLE001 - shown to the operator
                self.message_user(request, f"{q.name}: purge failed: {exc}", level=messages.ERROR)
                continue
            self.message_user(request, f"{q.name}: purged {removed} messages")

    @admin.action(
        description="Redrive dead letters to their sources (1,000 each)",
        permissions=["redrive"],
    )
    def redrive(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for q in queryset:
            try:
                result = service.redrive(q.name, 1000, caller=Caller.of(request.user))
            except service.Refused as exc:
                self.message_user(request, f"{q.name}: not redriven: {_refusal(exc)}", level=messages.ERROR)
                continue
            except Exception as exc:  # noqa: BLE001 - shown to the operator
                self.message_user(request, f"{q.name}: redrive failed: {exc}", level=messages.ERROR)
                continue
            self.message_user(
                request, f"{q.name}: moved {result.moved} back, skipped {result.skipped} without a source"
            )
