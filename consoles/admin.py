"""Read-only lists of the dashboards job's runs and learned estimates, on the console's site.

The dashboards page itself and the index's link to it belong to the site
(:class:`consoles.admin_site.ConsoleSite`).
"""

from __future__ import annotations

from django.contrib import admin

from consoles.models import DashboardRun, EstimateFit
from queues.admin.reads import ByGrant


class ReadOnly(admin.ModelAdmin):
    """What the job wrote is its record: shown, never edited by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # the job forgets its old runs itself (DASHBOARDS_HISTORY_DAYS)


@admin.register(DashboardRun)
class DashboardRunAdmin(ReadOnly):
    list_display = [
        "id",
        "started_at",
        "status",
        "trigger",
        "master",
        "source",
        "attempts_read",
        "queues",
        "fits",
        "read_seconds",
        "transform_seconds",
        "write_seconds",
    ]
    list_filter = ["status", "trigger"]


@admin.register(EstimateFit)
class EstimateFitAdmin(ByGrant, ReadOnly):
    grant_name = "queue"  # the estimates of the queues the user may read (by name)
    list_display = [
        "created_at",
        "queue",
        "stage",
        "estimate",
        "previous",
        "applied",
        "n",
        "intercept",
        "slope",
        "r2",
        "rmse",
        "median_size",
    ]
    list_filter = ["stage", "applied"]
    search_fields = ["queue"]
