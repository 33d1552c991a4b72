"""The grants' admin, and the grants inline on a queue: written through the service."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from queues import access, service
from queues.access import Caller
from queues.admin.common import _GrantAdmin, _GrantForm, _GrantInline
from queues.admin.reads import QueueChoices, request_caller
from queues.models import Grant, Queue

if TYPE_CHECKING:
    from django.forms.models import BaseInlineFormSet


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
