from django.urls import path

from workers import api

urlpatterns = [
    path("logs", api.LogsView.as_view(), name="logs"),
    path("consumers/heartbeat", api.HeartbeatView.as_view(), name="consumer-heartbeat"),
]
