from django.contrib import admin
from django.contrib.auth.views import redirect_to_login
from django.http import HttpResponseBase
from django.urls import include, path, reverse
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.exceptions import NotAuthenticated

from config.root import root
from consoles.views import favicon
from queues.api.observability import metrics_view

# No ReDoc page: drf-spectacular's ReDoc template loads Google's fonts, a third-party request
# from the console's origin; Swagger UI (from drf-spectacular-sidecar) needs none.


class DocsView(SpectacularSwaggerView):
    """A docs page asked for without a login: send the browser to the console's login and back
    (the schema itself answers 401 like every API call)."""

    # DRF's dispatch finalizes any HttpResponseBase a handler returns; its stubs say Response.
    def handle_exception(self, exc: Exception) -> HttpResponseBase:  # type: ignore[override]
        if isinstance(exc, NotAuthenticated):
            return redirect_to_login(self.request.get_full_path(), reverse("admin:login"))
        return super().handle_exception(exc)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("queues.api.urls")),
    path("api/v1/", include("workers.urls")),
    path("api/v1/", include("archive.urls")),
    path("", include("sqs.urls")),
    path("", root, name="root"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", DocsView.as_view(url_name="schema"), name="docs"),
    path("metrics", metrics_view, name="metrics"),
    path("favicon.ico", favicon, name="favicon"),
]

handler404 = "queues.http.errors.json_404"
handler500 = "queues.http.errors.json_500"
