"""Access keys in the admin: create one for a user (its secret shown once), list them with
their last use, revoke."""

from django.contrib import admin, messages
from django.utils import timezone

from queues.admin_reads import ByGrant, request_caller

from .models import AccessKey, QueueSettings


@admin.register(AccessKey)
class AccessKeyAdmin(admin.ModelAdmin):
    list_display = ("access_key_id", "user", "description", "created_at", "last_used_at", "active")
    list_filter = ("revoked_at",)
    search_fields = ("access_key_id", "user__username", "description")
    fields = ("user", "description", "access_key_id", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("access_key_id", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    @admin.display(boolean=True)
    def active(self, obj: AccessKey) -> bool:
        return obj.active

    def get_queryset(self, request):
        """A user's own keys; every user's to a superuser."""
        rows = super().get_queryset(request)
        caller = request_caller(request)
        return rows if caller.unrestricted else rows.filter(user_id=caller.user_id)

    def get_readonly_fields(self, request, obj=None):
        if obj is not None:  # a key's owner never changes
            return ("user", *self.readonly_fields)
        return self.readonly_fields

    def save_model(self, request, obj, form, change):
        if change:
            obj.save(update_fields=["description"])
            return
        key = AccessKey.issue(obj.user, obj.description)
        obj.pk, obj.access_key_id, obj.secret, obj.created_at = key.pk, key.access_key_id, key.secret, key.created_at
        messages.warning(
            request,
            f"Access key {key.access_key_id} for {key.user}: secret {key.secret} "
            "(shown only now: copy it to the client's configuration).",
        )

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request, queryset):
        n = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"{n} key(s) revoked.")


@admin.register(QueueSettings)
class QueueSettingsAdmin(ByGrant, admin.ModelAdmin):
    grant_queue = "queue"  # the settings of the queues the user may read
    list_display = ("queue", "receive_wait", "content_based_dedup", "tags", "modified_at")
    readonly_fields = ("queue",)
