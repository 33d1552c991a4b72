"""Access keys and the queues' SQS settings in the admin, written through ``sqs.service`` as the
admin's user: a key is issued for oneself (a superuser: for another user who is not a
superuser), its secret shown once in a message, never listed; a queue's settings need
``manage`` on the queue, as SetQueueAttributes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from queues import service
from queues.access import ANONYMOUS, Caller, Forbidden
from queues.admin.common import _age
from queues.admin.reads import ByGrant, request_caller
from sqs import service as sqs_service
from sqs.keys import changes_in_force_at_exit
from sqs.models import AccessKey, QueueSettings

if TYPE_CHECKING:
    # django-stubs' admin and form classes take their models as type arguments; Django's own
    # cannot be subscripted at run time, so the classes below derive from these names.
    _AccessKeyForm = forms.ModelForm[AccessKey]
    _QueueSettingsForm = forms.ModelForm[QueueSettings]
    _AccessKeyAdmin = admin.ModelAdmin[AccessKey]
    _QueueSettingsAdmin = admin.ModelAdmin[QueueSettings]
else:
    _AccessKeyForm = _QueueSettingsForm = forms.ModelForm
    _AccessKeyAdmin = _QueueSettingsAdmin = admin.ModelAdmin


def _refusal(exc: service.ServiceError) -> str:
    if isinstance(exc, service.QueueNotFound):
        return f"you may not see {exc.args[0]!r}: it needs a grant on it"
    return exc.detail


class AccessKeyForm(_AccessKeyForm):
    """A new key, checked by the service's rule as the admin's user makes it, so the form says
    why one is refused."""

    #: who issues it: set per request (``AccessKeyAdmin.get_form``).
    caller: Caller = ANONYMOUS

    class Meta:
        model = AccessKey
        fields = ["user", "description"]

    def clean(self) -> dict[str, Any] | None:
        data = super().clean()
        assert data is not None  # ModelForm.clean answers cleaned_data
        if self.instance.pk is None and data.get("user") is not None:
            try:
                service.check_issuer(self.caller, data["user"], "issue an access key")
            except Forbidden as exc:
                raise ValidationError(str(exc)) from exc
        return data


@admin.register(AccessKey)
class AccessKeyAdmin(_AccessKeyAdmin):
    form = AccessKeyForm
    list_display = ("access_key_id", "user", "description", "last_used", "active")
    list_filter = ("revoked_at",)
    search_fields = ("access_key_id", "user__username", "description")
    fields = ("user", "description", "access_key_id", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("access_key_id", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    @admin.display(description="last used", ordering="last_used_at")
    def last_used(self, obj: AccessKey) -> str:
        return _age(obj.last_used_at) + " ago" if obj.last_used_at else "never"

    @admin.display(boolean=True)
    def active(self, obj: AccessKey) -> bool:
        return obj.active

    def get_queryset(self, request: HttpRequest) -> QuerySet[AccessKey]:
        """A user's own keys; every user's to a superuser."""
        rows = super().get_queryset(request)
        caller = request_caller(request)
        # (a caller without a user: user_id=None, which Django reads as IS NULL; the stubs take no None)
        return rows if caller.unrestricted else rows.filter(user_id=caller.user_id)  # type: ignore[misc]

    def get_readonly_fields(self, request: HttpRequest, obj: AccessKey | None = None) -> tuple[str, ...]:
        if obj is not None:  # a key's owner never changes
            return ("user", *self.readonly_fields)
        return self.readonly_fields

    def get_form(
        self, request: HttpRequest, obj: AccessKey | None = None, change: bool = False, **kwargs: Any
    ) -> type[forms.ModelForm[AccessKey]]:
        form = super().get_form(request, obj, change, **kwargs)
        if obj is None and not request.user.is_superuser and "user" in form.base_fields:
            # anyone else issues keys for themselves only (the service refuses the rest)
            # (the user foreign key's field: a ModelChoiceField, which the stubs' Field is not)
            form.base_fields["user"].queryset = form.base_fields["user"].queryset.filter(pk=request.user.pk)  # type: ignore[attr-defined]
        return type(form.__name__, (form,), {"caller": Caller.of(request.user)})

    def has_delete_permission(self, request: HttpRequest, obj: AccessKey | None = None) -> bool:
        return False  # revoked, never deleted: the row keeps who held it and when it was last used

    def save_model(self, request: HttpRequest, obj: AccessKey, form: AccessKeyForm, change: bool) -> None:
        caller = Caller.of(request.user)
        if change:
            try:
                sqs_service.describe_access_key(
                    AccessKey.objects.select_related("user").get(pk=obj.pk), obj.description, caller=caller
                )
            except service.Refused as exc:
                self.message_user(request, f"{obj}: not changed: {_refusal(exc)}", level=messages.ERROR)
            return
        key = sqs_service.issue_access_key(obj.user, obj.description, caller=caller)
        obj.pk, obj.access_key_id, obj.secret, obj.created_at = key.pk, key.access_key_id, key.secret, key.created_at
        obj._state.adding = False
        messages.warning(
            request,
            f"Access key {key.access_key_id} for {key.user}: secret {key.secret} "
            "(shown only now: copy it to the client's configuration).",
        )

    @admin.action(description="Revoke the selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[AccessKey]) -> None:
        caller = Caller.of(request.user)
        n = 0
        with changes_in_force_at_exit():  # (one wait for the processes' leases, not one a key)
            for key in queryset.select_related("user"):
                try:
                    n += sqs_service.revoke_access_key(key, caller=caller)
                except Forbidden as exc:
                    self.message_user(request, f"{key}: not revoked: {exc}", level=messages.ERROR)
        self.message_user(request, f"{n} key(s) revoked.")


class QueueSettingsForm(_QueueSettingsForm):
    """A queue's SQS settings, checked by the service as the admin's user changes them (``manage``
    on the queue, values as the SQS API takes them), so the form says why a change is refused."""

    #: who changes them: set per request (``QueueSettingsAdmin.get_form``).
    caller: Caller = ANONYMOUS

    class Meta:
        model = QueueSettings
        fields = ["queue", "receive_wait", "content_based_dedup", "tags", "opaque"]

    def changed_settings(self) -> dict[str, Any]:
        """The settings the form changes (a JSON field posted as it was shown is no change)."""
        return {
            f: self.cleaned_data[f]
            for f in self.changed_data
            if f in sqs_service.SETTINGS and self.cleaned_data[f] != self.initial.get(f)
        }

    def clean(self) -> dict[str, Any] | None:
        data = super().clean()
        assert data is not None  # ModelForm.clean answers cleaned_data
        q = data.get("queue") or getattr(self.instance, "queue", None)
        if q is None or self.errors:
            return data
        try:
            sqs_service.check_queue_settings(q, caller=self.caller, **self.changed_settings())
        except service.Refused as exc:
            raise ValidationError(f"{q.name}: {_refusal(exc)}") from exc
        return data


@admin.register(QueueSettings)
class QueueSettingsAdmin(ByGrant, _QueueSettingsAdmin):
    """A queue's SQS settings (a row for each queue created or changed over the SQS API):
    changed through ``sqs.service.update_queue_settings``, which needs ``manage`` on the queue."""

    form = QueueSettingsForm
    grant_queue = "queue"  # the settings of the queues the user may read
    choice_action = "manage"  # a new row's queue: one the user may change
    list_display = ("queue", "receive_wait", "content_based_dedup", "tags", "modified_at")

    def get_readonly_fields(self, request: HttpRequest, obj: QueueSettings | None = None) -> tuple[str, ...]:
        return ("queue",) if obj is not None else ()

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # a new row's queue: one the user may manage that has no settings row yet (the others'
        # rows are changed from the list)
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)
        if db_field.name == "queue":
            field.queryset = field.queryset.filter(sqs__isnull=True)
        return field

    def get_form(
        self, request: HttpRequest, obj: QueueSettings | None = None, change: bool = False, **kwargs: Any
    ) -> type[forms.ModelForm[QueueSettings]]:
        form = super().get_form(request, obj, change, **kwargs)
        return type(form.__name__, (form,), {"caller": Caller.of(request.user)})

    def has_delete_permission(self, request: HttpRequest, obj: QueueSettings | None = None) -> bool:
        return False  # the row goes with its queue; the settings are changed, not removed

    def save_model(self, request: HttpRequest, obj: QueueSettings, form: QueueSettingsForm, change: bool) -> None:
        q = obj.queue
        try:
            s = sqs_service.update_queue_settings(
                q, caller=Caller.of(request.user), replace=("tags", "opaque"), **form.changed_settings()
            )
        except service.Refused as exc:
            # refused after the form's check (a grant revoked meanwhile): nothing was saved
            self.message_user(request, f"{q.name}: SQS settings not changed: {_refusal(exc)}", level=messages.ERROR)
            return
        obj.modified_at, obj._state.adding = s.modified_at, False
