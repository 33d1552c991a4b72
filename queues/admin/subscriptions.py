"""The subscriptions' admin and their figures (a topic's subscriptions inline too)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from queues import access, service
from queues.access import Caller
from queues.admin.common import _age, _refusal, _SubscriptionAdmin, _SubscriptionForm, _SubscriptionInline
from queues.admin.reads import ByGrant
from queues.models import Partition, Queue, Subscription


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
    # Where it started, when, and its dead-letter queue are on its page.
    list_display = ["__str__", "held", "in_flight", "archived", "created"]
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

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Subscription) -> str:
        return _age(obj.created_at) + " ago"

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
