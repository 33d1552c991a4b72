"""The operators' console for the messaging core: queues, partitions and nodes.

Every figure is read from live state: the partition rows, which each owner refreshes at every
heartbeat (depth, in flight, delayed, rates, the append tree's shape), and the key-value store
for the tree drawing. The actions (purge, redrive, release a lease) call the same service
functions as the API, so they route to the owners like any client call.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Case, Count, F, Min, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Left, StrIndex
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from . import access, admin_tokens, keys, service  # noqa: F401 - admin_tokens: the API tokens' admin
from .access import Caller
from .admin_reads import ByGrant, QueueChoices, request_caller
from .kv import get_store
from .models import AuditEntry, Grant, Node, Partition, Queue, Subscription
from .tree_svg import partition_svg

if TYPE_CHECKING:
    from django.contrib.admin.options import InlineModelAdmin, _FieldsetSpec
    from django.forms.models import BaseInlineFormSet
    from django_stubs_ext import WithAnnotations

    # django-stubs' admin and form classes take their models as type arguments; Django's own
    # cannot be subscripted at run time, so the classes below derive from these names.
    _PartitionInline = admin.TabularInline[Partition, Queue]
    _SubscriptionInline = admin.TabularInline[Subscription, Queue]
    _GrantInline = admin.TabularInline[Grant, Queue]
    _SubscriptionForm = forms.ModelForm[Subscription]
    _GrantForm = forms.ModelForm[Grant]
    _SubscriptionAdmin = admin.ModelAdmin[Subscription]
    _QueueAdmin = admin.ModelAdmin[Queue]
    _PartitionAdmin = admin.ModelAdmin[Partition]
    _NodeAdmin = admin.ModelAdmin[Node]
    _GrantAdmin = admin.ModelAdmin[Grant]
    _AuditEntryAdmin = admin.ModelAdmin[AuditEntry]
else:
    _PartitionInline = _SubscriptionInline = _GrantInline = admin.TabularInline
    _SubscriptionForm = _GrantForm = forms.ModelForm
    _SubscriptionAdmin = _QueueAdmin = _PartitionAdmin = _NodeAdmin = _GrantAdmin = _AuditEntryAdmin = admin.ModelAdmin


class _QueueFigures(TypedDict):
    """The figures ``QueueAdmin.get_queryset`` sums over a queue's partitions."""

    depth_sum: int | None
    in_flight_sum: int | None
    delayed_sum: int | None
    oldest: datetime | None
    enqueue_rate_sum: float | None
    ack_rate_sum: float | None


class _NodeCounts(TypedDict):
    owned_count: int


def _refusal(exc: Exception) -> str:
    """What the operator is told when the service refuses them an action (a
    :class:`~queues.errors.Refused`, or a model's validation)."""
    if isinstance(exc, ValidationError):
        return "; ".join(exc.messages)
    if isinstance(exc, service.SubscriptionNotFound):
        return f"{exc.args[0]!r} was deleted meanwhile"
    if isinstance(exc, service.QueueNotFound):
        return f"you may not see {exc.args[0]!r}: it needs a grant on it"
    if isinstance(exc, service.ServiceError):
        return exc.detail
    return str(exc)


def _age(ts: datetime | None) -> str:
    if ts is None:
        return "-"
    seconds = (timezone.now() - ts).total_seconds()
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class PartitionInline(_PartitionInline):
    model = Partition
    extra = 0
    can_delete = False
    fields = [
        "link",
        "owner",
        "epoch",
        "head_block",
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

    @admin.display(description="partition")
    def link(self, obj: Partition) -> SafeString:
        return format_html('<a href="{}">{}</a>', reverse("admin:queues_partition_change", args=[obj.pk]), obj)

    def has_add_permission(self, request: HttpRequest, obj: Queue | None = None) -> bool:
        return False


def subscription_partitions(sub: Subscription) -> list[tuple[int, dict[str, Any]]]:
    """``(partition index, figures)`` of a subscription, as each owner last published them."""
    rows = Partition.objects.filter(queue_id=sub.topic_id).order_by("index").values_list("index", "cursors")
    parts: list[tuple[int, dict[str, Any]]] = []
    for index, cursors in rows:
        figures = dict((cursors or {}).get(sub.name) or {})
        figures.setdefault("held", 0)
        parts.append((index, figures))
    return parts


def subscription_stats(sub: Subscription) -> dict[str, int]:
    """What a subscription holds (not acked yet, in flight included), in flight, acked, and
    of what it holds, how much only the archive has; summed over its partitions (read once per
    object and page: each column of a row asks for it)."""
    cached: dict[str, int] | None = getattr(sub, "_stats", None)
    if cached is not None:
        return cached
    total = {"held": 0, "in_flight": 0, "acked": 0, "archived": 0}
    for _, figures in subscription_partitions(sub):
        for k in total:
            total[k] += figures.get(k, 0)
    sub._stats = total  # type: ignore[attr-defined]  # a cache on the row object, for its page
    return total


class SubscriptionStatsColumns:
    """Columns of a subscription's stats, for its list and for its topic's page."""

    @admin.display(description="held (not acked)")
    def held(self, obj: Subscription) -> int:
        return subscription_stats(obj)["held"]

    @admin.display(description="in flight")
    def in_flight(self, obj: Subscription) -> int:
        return subscription_stats(obj)["in_flight"]

    @admin.display(description="acked")
    def acked(self, obj: Subscription) -> int:
        return subscription_stats(obj)["acked"]

    @admin.display(description="held in the archive")
    def archived(self, obj: Subscription) -> int:
        return subscription_stats(obj)["archived"]


class SubscriptionInline(SubscriptionStatsColumns, _SubscriptionInline):
    model = Subscription
    fk_name = "topic"
    extra = 0
    can_delete = False
    fields = [
        "name",
        "start",
        "starts_at",
        "held",
        "in_flight",
        "acked",
        "archived",
        "dead_letter_queue",
        "max_receives",
    ]
    readonly_fields = fields  # type: ignore[assignment]  # (as PartitionInline's)

    def has_add_permission(self, request: HttpRequest, obj: Queue | None = None) -> bool:
        return False


class SubscriptionForm(_SubscriptionForm):
    """A subscription's settings, checked by the service as the admin's user changes them
    (``manage`` on the topic, ``produce`` on a dead-letter queue it is pointed to), so the form
    says why a change is refused."""

    #: who changes it: set per request (``SubscriptionAdmin.get_form``).
    caller: Caller = access.ANONYMOUS

    class Meta:
        model = Subscription
        fields = service.descriptions.SUBSCRIPTION_SETTINGS

    def changed_settings(self) -> dict[str, Any]:
        return {f: self.cleaned_data[f] for f in self.changed_data if f in self.cleaned_data}

    def clean(self) -> dict[str, Any] | None:
        data = super().clean()
        if self.errors or self.instance.pk is None:
            return data
        try:
            service.check_subscription_update(self.instance, caller=self.caller, **self.changed_settings())
        except service.InvalidRequest as exc:
            raise ValidationError(exc.detail) from exc
        except service.Refused as exc:
            raise ValidationError(f"you may not change this: {_refusal(exc)}") from exc
        return data


@admin.register(Subscription)
class SubscriptionAdmin(ByGrant, SubscriptionStatsColumns, _SubscriptionAdmin):
    form = SubscriptionForm
    grant_queue = "topic"  # the subscriptions of the topics the user may read
    list_display = [
        "__str__",
        "start",
        "starts_at",
        "held",
        "in_flight",
        "archived",
        "dead_letter_queue",
        "created_at",
    ]
    list_filter = [("topic", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["topic", "dead_letter_queue"]
    readonly_fields = [
        "topic",
        "name",
        "start",
        "starts_at",
        "created_at",
        "held",
        "in_flight",
        "acked",
        "archived",
        "positions",
    ]
    fields = [*readonly_fields, "visibility_timeout", "dead_letter_queue", "max_receives"]

    @admin.display(description="positions per partition")
    def positions(self, obj: Subscription) -> SafeString:
        """Where the subscription reads in each partition: its next message and what it holds."""
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    i,
                    f.get("dequeue_id") or "-",
                    f["held"],
                    f.get("in_flight", 0),
                    f.get("acked", 0),
                    f.get("archived", 0),
                )
                for i, f in subscription_partitions(obj)
            ),
        )
        return format_html(
            '<table class="positions"><thead><tr><th>partition</th><th>next to deliver</th><th>held</th>'
            "<th>in flight</th><th>acked</th><th>in the archive</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # through the API: creating one reopens the topic's partitions

    def get_form(
        self, request: HttpRequest, obj: Subscription | None = None, change: bool = False, **kwargs: Any
    ) -> type[forms.ModelForm[Subscription]]:
        form = super().get_form(request, obj, change, **kwargs)
        return type(form.__name__, (form,), {"caller": Caller.of(request.user)})

    def save_model(self, request: HttpRequest, obj: Subscription, form: SubscriptionForm, change: bool) -> None:
        # Its settings through the service (checked, recorded, the topic's owners told), from
        # the row as it is now: the form's instance already holds the new values.
        try:
            service.update_subscription(
                Subscription.objects.select_related("topic").get(pk=obj.pk),
                caller=Caller.of(request.user),
                **form.changed_settings(),
            )
        except (service.Refused, ValidationError) as exc:
            self.message_user(request, f"{obj}: not changed: {_refusal(exc)}", level=messages.ERROR)

    def delete_model(self, request: HttpRequest, obj: Subscription) -> None:
        try:
            service.delete_subscription(obj, caller=Caller.of(request.user))
        except service.Refused as exc:
            self.message_user(request, f"{obj}: not deleted: {_refusal(exc)}", level=messages.ERROR)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Subscription]) -> None:
        for sub in queryset.select_related("topic"):
            self.delete_model(request, sub)


class GrantForm(_GrantForm):
    """A new grant, checked by the service as the admin's user makes it (well formed, and the
    user may grant on that queue or pattern), so the form shows why one is refused."""

    #: who makes the grant: set per request (``GrantAdmin.get_form``, ``GrantInline.get_formset``).
    caller: Caller = access.ANONYMOUS

    class Meta:
        model = Grant
        fields = ["user", "group", "queue", "pattern", "action"]

    def clean(self) -> dict[str, Any] | None:
        data = super().clean()
        if self.instance.pk is not None or self.errors:
            return data  # grants are never edited; a delete is checked when it is made
        assert data is not None  # ModelForm.clean answers cleaned_data
        queue = data.get("queue") if "queue" in data else getattr(self.instance, "queue", None)
        fields = {
            "action": data.get("action", ""),
            "user": data.get("user"),
            "group": data.get("group"),
            "queue": queue,
            "pattern": data.get("pattern", ""),
        }
        try:
            service.check_grant(caller=self.caller, **fields)
        except service.InvalidRequest as exc:
            raise ValidationError(exc.detail) from exc
        except service.Refused as exc:
            raise ValidationError(f"you may not grant this: {exc}") from exc
        if Grant.objects.filter(**fields).exists():
            raise ValidationError("this grant exists already")
        return data

    def _get_validation_exclusions(self) -> set[str]:
        # clean() said in words what the table's constraints (one principal, one target, one
        # row each) would only name: the model need not check them again.
        # (a private method of Django's BaseModelForm: not in the stubs)
        excluded: set[str] = super()._get_validation_exclusions()  # type: ignore[misc]
        return excluded | {"user", "group", "queue", "pattern"}


def _with_caller(form_class: type[forms.ModelForm[Grant]], request: HttpRequest) -> type[forms.ModelForm[Grant]]:
    return type(form_class.__name__, (form_class,), {"caller": Caller.of(request.user)})


def _grant_fields(g: Grant) -> dict[str, Any]:
    return {"action": g.action, "user": g.user, "group": g.group, "queue": g.queue, "pattern": g.pattern}


def save_grants(request: HttpRequest, formset: BaseInlineFormSet[Grant, Queue, Any]) -> None:
    """Save a formset of grants through the service (so each is checked and recorded in the
    audit trail): new rows are granted, deleted ones revoked; rows are never edited."""
    caller = Caller.of(request.user)
    formset.save(commit=False)
    for obj in formset.deleted_objects:
        # the view-only row's form did not post its fields: revoke what the database holds
        current = Grant.objects.select_related("user", "group", "queue").filter(pk=obj.pk).first()
        if current is None:
            continue
        try:
            service.revoke(caller=caller, **_grant_fields(current))
        except service.Refused as exc:
            messages.error(request, f"{current}: not revoked: {exc}")
    for obj in formset.new_objects:
        row, _ = service.grant(caller=caller, **_grant_fields(obj))
        obj.pk, obj._state.adding = row.pk, False


class GrantInline(_GrantInline):
    """The grants on this queue or topic by its name (pattern grants: in the grants list)."""

    model = Grant
    form = GrantForm
    fk_name = "queue"
    extra = 0
    fields = ["user", "group", "action", "created_at", "created_by"]
    readonly_fields = ["created_at", "created_by"]
    verbose_name = "grant on this queue"
    verbose_name_plural = "grants on this queue (user or group, action; pattern grants are in the grants list)"

    def get_formset(
        self, request: HttpRequest, obj: Queue | None = None, **kwargs: Any
    ) -> type[BaseInlineFormSet[Grant, Queue, forms.ModelForm[Grant]]]:
        formset = super().get_formset(request, obj, **kwargs)
        formset.form = _with_caller(formset.form, request)
        return formset

    def has_change_permission(self, request: HttpRequest, obj: Queue | None = None) -> bool:
        return False  # a grant is given or revoked, never edited


_MARK = {True: "\u2713", False: "\u2013"}


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
    list_display = [
        "name",
        "kind",
        "partitions",
        "depth",
        "in_flight",
        "delayed",
        "dead_letters",
        "oldest_age",
        "enqueue_rate",
        "ack_rate",
        "strict",
        "archive",
        "dead_letter_queue",
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
        # Who may do what gets its own section under the settings.
        fields = [f for f in self.get_fields(request, obj) if f != "effective_access"]
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

    @admin.display(description="effective access")
    def effective_access(self, obj: Queue) -> SafeString:
        return effective_access_table(obj)

    def save_model(self, request: HttpRequest, obj: Queue, form: forms.ModelForm[Queue], change: bool) -> None:
        fields = {f: form.cleaned_data[f] for f in form.changed_data if f in form.cleaned_data}
        if not change:
            obj.pk = service.create_queue(
                caller=Caller.of(request.user),
                **{
                    f.name: getattr(obj, f.name)
                    for f in Queue._meta.concrete_fields
                    if f.name not in ("id", "created_at", "updated_at")
                },
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

    @admin.display(description="oldest message", ordering="oldest")
    def oldest_age(self, obj: WithAnnotations[Queue, _QueueFigures]) -> str:
        return _age(obj.oldest)

    @admin.display(description="enqueued/s", ordering="enqueue_rate_sum")
    def enqueue_rate(self, obj: WithAnnotations[Queue, _QueueFigures]) -> str:
        return f"{obj.enqueue_rate_sum or 0:.1f}"

    @admin.display(description="acked/s", ordering="ack_rate_sum")
    def ack_rate(self, obj: WithAnnotations[Queue, _QueueFigures]) -> str:
        return f"{obj.ack_rate_sum or 0:.1f}"

    @admin.display(description="partitions")
    def partition_link(self, obj: Queue) -> SafeString:
        url = reverse("admin:queues_partition_changelist") + f"?queue__id__exact={obj.pk}"
        return format_html('<a href="{}">partitions</a>', url)

    # Each action is offered only to a user with its own permission (``queues.purge_queue``,
    # ``queues.redrive_queue``): viewing the queues is not enough. Who may act on which queue is
    # still the service's call (its grant check, with the admin's user as the caller).
    def has_purge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queues.purge_queue")

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queues.redrive_queue")

    @admin.action(
        description="Purge: delete every message of the selected queues (in flight ones too)",
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
        description="Redrive dead letters back to their source queues (up to 1,000 each)",
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


@admin.register(Partition)
class PartitionAdmin(ByGrant, _PartitionAdmin):
    grant_queue = "queue"  # the partitions of the queues the user may read
    list_display = [
        "__str__",
        "owner_link",
        "epoch",
        "lease_age",
        "head_block",
        "tree_height",
        "live_blocks",
        "depth",
        "in_flight",
        "delayed",
        "enqueue_id",
        "dequeue_id",
        "stats_age",
    ]
    list_filter = [("queue", admin.RelatedOnlyFieldListFilter), "owner"]
    list_select_related = ["queue", "owner"]
    readonly_fields = ["tree", "lease_age", *[f.name for f in Partition._meta.fields]]
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
        return mark_safe(f'<div style="overflow-x:auto;max-width:100%">{svg}</div>')  # noqa: S308 - partition_svg escapes

    @admin.display(description="owner", ordering="owner__address")
    def owner_link(self, obj: Partition) -> str:
        if obj.owner is None:
            return "-"
        return format_html('<a href="{}">{}</a>', reverse("admin:queues_node_change", args=[obj.owner_id]), obj.owner)

    @admin.display(description="lease age")
    def lease_age(self, obj: Partition) -> str:
        return _age(obj.lease_acquired_at) if obj.owner_id else "-"

    @admin.display(description="stats from")
    def stats_age(self, obj: Partition) -> str:
        return _age(obj.stats_at) + " ago" if obj.stats_at else "-"

    def has_release_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queues.release_partition")

    @admin.action(
        description="Release the lease: the owner gives the partition up, another node takes it",
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


@admin.register(Node)
class NodeAdmin(_NodeAdmin):
    list_display = ["address", "id", "alive", "owned", "cooling", "heartbeat_at", "started_at", "stopped_at", "pid"]
    list_filter = ["cooling", ("stopped_at", admin.EmptyFieldListFilter)]
    readonly_fields = [f.name for f in Node._meta.fields]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WithAnnotations[Node, _NodeCounts]]:
        return super().get_queryset(request).annotate(owned_count=Count("partitions"))

    @admin.display(description="partitions owned", ordering="owned_count")
    def owned(self, obj: WithAnnotations[Node, _NodeCounts]) -> SafeString:
        url = reverse("admin:queues_partition_changelist") + f"?owner__id__exact={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, obj.owned_count)

    @admin.display(boolean=True, description="alive")
    def alive(self, obj: Node) -> bool:
        return obj.stopped_at is None and (timezone.now() - obj.heartbeat_at).total_seconds() < 5

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Node | None = None) -> bool:
        return False  # each node registers and heartbeats its own row

    def has_delete_permission(self, request: HttpRequest, obj: Node | None = None) -> bool:
        return False  # a node's row names the leases it holds: it is never removed by hand


@admin.register(Grant)
class GrantAdmin(QueueChoices, _GrantAdmin):
    """Every grant: on a queue or topic by name, or on a name pattern (``billing-*`` covers
    queues made later: made here). Given and revoked through the service, so each change is
    checked and recorded in the audit trail; a grant is never edited."""

    form = GrantForm
    choice_action = "manage"  # a grant on a queue needs manage on it
    list_display = ["principal", "on", "action", "created_at", "created_by"]
    list_filter = ["action", ("user", admin.RelatedOnlyFieldListFilter), ("group", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["pattern", "queue__name"]
    list_select_related = ["user", "group", "queue", "created_by"]
    fields = ["user", "group", "queue", "pattern", "action"]

    def get_form(
        self, request: HttpRequest, obj: Grant | None = None, change: bool = False, **kwargs: Any
    ) -> type[forms.ModelForm[Grant]]:
        return _with_caller(super().get_form(request, obj, change, **kwargs), request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Grant]:
        """A user's own grants (to it or to its groups), and the grants on the queues it may
        manage; pattern grants to others only to a superuser."""
        rows = super().get_queryset(request)
        caller = request_caller(request)
        if caller.unrestricted:
            return rows
        return rows.filter(
            Q(user_id=caller.user_id)
            | Q(group_id__in=caller.group_ids)
            | Q(queue__in=service.permitted_queues(caller, "manage"))
        )

    @admin.display(description="to", ordering="user__username")
    def principal(self, obj: Grant) -> str:
        return f"user {obj.user}" if obj.user_id is not None else f"group {obj.group}"

    @admin.display(description="on", ordering="queue__name")
    def on(self, obj: Grant) -> SafeString:
        if obj.queue is None:
            return format_html("pattern <code>{}</code>", obj.pattern)
        url = reverse("admin:queues_queue_change", args=[obj.queue_id])
        return format_html('{} <a href="{}">{}</a>', obj.queue.kind, url, obj.queue.name)

    def has_change_permission(self, request: HttpRequest, obj: Grant | None = None) -> bool:
        return False  # a grant is given or revoked, never edited

    def save_model(self, request: HttpRequest, obj: Grant, form: forms.ModelForm[Grant], change: bool) -> None:
        row, _ = service.grant(caller=Caller.of(request.user), **_grant_fields(obj))
        obj.pk, obj._state.adding = row.pk, False

    def delete_model(self, request: HttpRequest, obj: Grant) -> None:
        try:
            service.revoke(caller=Caller.of(request.user), **_grant_fields(obj))
        except service.Refused as exc:
            self.message_user(request, f"{obj}: not revoked: {exc}", level=messages.ERROR)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Grant]) -> None:
        for g in queryset.select_related("user", "group", "queue"):
            self.delete_model(request, g)


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
