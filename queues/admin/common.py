"""What the console's model admins share: their typed bases, how a refusal and an age are shown."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.utils import timezone

from queues import service
from queues.models import AuditEntry, Grant, Node, Partition, Queue, Subscription

if TYPE_CHECKING:
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
