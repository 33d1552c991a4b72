"""Read-only lists of the dashboards job's runs and learned estimates, on the console's site.

The dashboards page itself and the index's link to it belong to the site
(:class:`consoles.admin_site.ConsoleSite`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from consoles.models import DashboardRun, EstimateFit
from queues.admin.common import _age
from queues.admin.reads import ByGrant

if TYPE_CHECKING:
    # django-stubs' ModelAdmin takes its model as a type argument; Django's cannot be subscripted.
    _ModelAdmin = admin.ModelAdmin[Model]
else:
    _ModelAdmin = admin.ModelAdmin


class ReadOnly(_ModelAdmin):
    """What the job wrote is its record: shown, never edited by hand."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False  # the job forgets its old runs itself (DASHBOARDS_HISTORY_DAYS)


@admin.register(DashboardRun)
class DashboardRunAdmin(ReadOnly):
    # Where it ran and how long each step took are on its page.
    list_display = ["id", "started", "status", "trigger", "attempts_read", "queues", "fits", "seconds"]

    @admin.display(description="started", ordering="started_at")
    def started(self, obj: DashboardRun) -> str:
        return _age(obj.started_at) + " ago"

    @admin.display(description="seconds")
    def seconds(self, obj: DashboardRun) -> float | None:
        return None if obj.total_seconds is None else round(obj.total_seconds, 1)

    list_filter = ["status", "trigger"]


@admin.register(EstimateFit)
class EstimateFitAdmin(ByGrant, ReadOnly):
    grant_name = "queue"  # the estimates of the queues the user may read (by name)
    list_display = [
        "created",
        "queue",
        "stage",
        "estimate",
        "previous",
        "applied",
        "n",
        "r2",
    ]  # the fit's line (intercept, slope), its error and the median size are on its page
    list_filter = ["stage", "applied"]

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: EstimateFit) -> str:
        return _age(obj.created_at) + " ago"

    search_fields = ["queue"]
