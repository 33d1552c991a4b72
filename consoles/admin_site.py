"""The console: the project's own admin site.

It is the default site (``config.apps.MQAdminConfig``), so the models every app registers with
``@admin.register`` appear on it. It adds the overview at ``/admin/overview/``
(``admin:overview``, with its figures at ``/admin/overview.json``), each topic's page at
``/admin/topics/<name>/`` (``admin:topic``) and the dashboards page at
``/admin/dashboards/`` (``admin:dashboards``): in the ``admin`` namespace, behind the admin's
login and staff check, with the admin's look. Its index links to both, the overview first
(``templates/consoles/admin_index.html``).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.http import HttpResponse
from django.urls import path

from consoles import login_guard, overview, topics, views


class ConsoleSite(admin.AdminSite):
    site_header = "mq console"
    site_title = "mq console"
    index_title = "Queues, partitions, nodes and workers"
    index_template = "consoles/admin_index.html"
    site_url = None  # no "view site" link: the node serves an API, nothing at "/"

    def get_urls(self):
        return [
            path("overview/", self.admin_view(self.overview), name="overview"),
            path("overview.json", self.admin_view(overview.overview_json), name="overview_json"),
            path("topics/<str:name>/", self.admin_view(self.topic), name="topic"),
            path("dashboards/", self.admin_view(self.dashboards), name="dashboards"),
            *super().get_urls(),
        ]

    def login(self, request, extra_context=None):
        """The admin's login, refused (429) after too many failures (:mod:`consoles.login_guard`)."""
        if request.method == "POST" and login_guard.refused(request):
            return HttpResponse(
                "Too many failed logins: try again later.\n",
                status=429,
                content_type="text/plain; charset=utf-8",
                headers={"Retry-After": str(settings.ADMIN_LOGIN_WINDOW)},
            )
        response = super().login(request, extra_context)
        if request.method == "POST" and response.status_code == 200 and not request.user.is_authenticated:
            login_guard.failed(request)  # the form came back: wrong password, or not staff
        return response

    def overview(self, request):
        """The overview page (:mod:`consoles.overview`), in this site's frame."""
        return overview.overview(request, self)

    def topic(self, request, name):
        """A topic's page (:mod:`consoles.topics`), in this site's frame."""
        return topics.topic(request, name, self)

    def dashboards(self, request):
        """The dashboards page (:func:`consoles.views.dashboards`), in this site's frame."""
        return views.dashboards(request, self)
