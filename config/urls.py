from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from queues.api.observability import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("queues.api.urls")),
    path("api/v1/", include("workers.urls")),
    path("api/v1/", include("archive.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("metrics", metrics_view, name="metrics"),
]

handler404 = "queues.api.errors.json_404"
handler500 = "queues.api.errors.json_500"
