from django.urls import path

from archive import api

urlpatterns = [
    path("archive", api.ArchiveListView.as_view(), name="archive-list"),
    path("archive/replay", api.ReplayView.as_view(), name="archive-replay"),
]
