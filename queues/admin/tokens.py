"""The REST API's tokens in the console, in place of the admin DRF registers for them.

DRF's own admin lists every key in full to anyone who may view tokens, and lets anyone who may
add one make it for any user. This one issues and revokes through the service
(``service.issue_token`` / ``revoke_token``: for oneself; a superuser for another user who is not
a superuser; recorded in the audit trail), shows the new key once, in the message after it is
made, and from then on only its first characters: in the list, on its page, in the confirmation
of a delete and in the admin's own log, which name a token by its holder and that prefix. A user
who is not a superuser sees (and revokes) its own token only: another user's is not listed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from rest_framework.authtoken import admin as drf_token_admin  # registers DRF's admin: replaced below
from rest_framework.authtoken.models import TokenProxy

from queues import service
from queues.access import ANONYMOUS, Caller, Forbidden
from queues.admin.reads import request_caller

if TYPE_CHECKING:
    # django-stubs' forms take their model as a type argument; Django's cannot be subscripted
    _TokenForm = forms.ModelForm[TokenProxy]
else:
    _TokenForm = forms.ModelForm


def _token_label(token: TokenProxy) -> str:
    return f"token {service.credentials.token_prefix(token.key)} of {token.user}"


# Token's __str__ is its key, and the admin names an object by str() in its titles, its messages,
# its delete confirmation and its log (LogEntry.object_repr, shown in "Recent actions"): the proxy
# the admin works on is named by its holder and its prefix instead. (Token itself is untouched.)
TokenProxy.__str__ = _token_label  # type: ignore[method-assign, assignment]  # on purpose: see above


class TokenForm(_TokenForm):
    """A new token, checked by the service's rule as the admin's user makes it."""

    #: who issues it: set per request (``TokenAdmin.get_form``).
    caller: Caller = ANONYMOUS

    class Meta:
        model = TokenProxy
        fields = ["user"]

    def clean(self) -> dict[str, Any] | None:
        data = super().clean()
        assert data is not None  # ModelForm.clean answers cleaned_data
        user = data.get("user")
        if user is not None:
            try:
                service.check_issuer(self.caller, user, "issue an API token")
            except Forbidden as exc:
                raise ValidationError(str(exc)) from exc
        return data


class TokenAdmin(drf_token_admin.TokenAdmin):
    """Tokens by their holder (DRF's admin maps a row's id to its user: a key never appears in a
    URL); the list and the page show the key's first characters only."""

    form = TokenForm
    list_display = ("prefix", "user", "created")
    fields = ("user",)

    @admin.display(description="key")
    def prefix(self, obj: TokenProxy) -> str:
        return service.credentials.token_prefix(obj.key)

    def get_fields(self, request: HttpRequest, obj: TokenProxy | None = None) -> tuple[str, ...]:
        return ("user",) if obj is None else ("prefix", "user", "created")

    def get_readonly_fields(self, request: HttpRequest, obj: TokenProxy | None = None) -> tuple[str, ...]:
        return () if obj is None else ("prefix", "user", "created")

    def get_form(
        self, request: HttpRequest, obj: TokenProxy | None = None, change: bool = False, **kwargs: Any
    ) -> type[forms.ModelForm[TokenProxy]]:
        form = super().get_form(request, obj, change, **kwargs)
        if obj is None and not request.user.is_superuser and "user" in form.base_fields:
            # anyone else issues a token for themselves only (the service refuses the rest)
            # (the user foreign key's field: a ModelChoiceField, which the stubs' Field is not)
            form.base_fields["user"].queryset = form.base_fields["user"].queryset.filter(pk=request.user.pk)  # type: ignore[attr-defined]
        return type(form.__name__, (form,), {"caller": Caller.of(request.user)})

    def get_queryset(self, request: HttpRequest) -> QuerySet[TokenProxy]:
        """A user's own token; every user's to a superuser."""
        rows = super().get_queryset(request)
        caller = request_caller(request)
        return rows if caller.unrestricted else rows.filter(user_id=caller.user_id)

    def has_change_permission(self, request: HttpRequest, obj: TokenProxy | None = None) -> bool:
        return False  # a token is issued or revoked, never edited

    def save_model(self, request: HttpRequest, obj: TokenProxy, form: TokenForm, change: bool) -> None:
        token = service.issue_token(obj.user, caller=Caller.of(request.user))
        obj.key, obj.created, obj._state.adding = token.key, token.created, False
        messages.warning(
            request,
            f"API token for {token.user}: {token.key} (shown only now: copy it to the client's configuration).",
        )

    def delete_model(self, request: HttpRequest, obj: TokenProxy) -> None:
        try:
            service.revoke_token(obj.user, caller=Caller.of(request.user))
        except Forbidden as exc:
            self.message_user(request, f"{obj}: not revoked: {exc}", level=messages.ERROR)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[TokenProxy]) -> None:
        for token in queryset.select_related("user"):
            self.delete_model(request, token)


if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)
admin.site.register(TokenProxy, TokenAdmin)
