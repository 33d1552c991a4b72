"""The dashboards in the admin: the page at ``/admin/dashboards/`` (``admin:dashboards``), a
link to it on the admin index, and read-only lists of the job's runs and learned estimates.

The page is added to the default admin site's URLs (wrapping ``get_urls``) rather than to the
project's URLconf, so that it lives in the ``admin`` namespace, behind the admin's login and
staff check, with the admin's own look.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from . import views
from .models import DashboardRun, EstimateFit

_admin_urls = admin.site.get_urls


def _urls_with_dashboards():
    return [path("dashboards/", admin.site.admin_view(views.dashboards), name="dashboards")] + _admin_urls()


admin.site.get_urls = _urls_with_dashboards
admin.site.index_template = "consoles/admin_index.html"


class ReadOnly(admin.ModelAdmin):
    """What the job wrote is its record: shown, never edited by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


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
class EstimateFitAdmin(ReadOnly):
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
