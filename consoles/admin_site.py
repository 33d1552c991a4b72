"""The console: the project's own admin site.

It is the default site (``config.apps.MQAdminConfig``), so the models every app registers with
``@admin.register`` appear on it, and it adds the dashboards page at ``/admin/dashboards/``
(``admin:dashboards``): in the ``admin`` namespace, behind the admin's login and staff check,
with the admin's look. Its index links to the dashboards (``templates/consoles/admin_index.html``).
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from . import views


class ConsoleSite(admin.AdminSite):
    site_header = "mq console"
    site_title = "mq console"
    index_title = "Queues, partitions, nodes and workers"
    index_template = "consoles/admin_index.html"
    site_url = None  # no "view site" link: the node serves an API, nothing at "/"

    def get_urls(self):
        return [path("dashboards/", self.admin_view(self.dashboards), name="dashboards"), *super().get_urls()]

    def dashboards(self, request):
        """The dashboards page (:func:`consoles.views.dashboards`), in this site's frame."""
        return views.dashboards(request, self)
