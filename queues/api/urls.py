from django.urls import path

from . import views

urlpatterns = [
    path("healthz", views.HealthView.as_view(), name="healthz"),
    path("queues", views.QueueListView.as_view(), name="queue-list"),
    path("queues/<str:name>", views.QueueDetailView.as_view(), name="queue-detail"),
    path("queues/<str:name>/enqueue", views.EnqueueView.as_view(), name="queue-enqueue"),
    path("queues/<str:name>/dequeue", views.DequeueView.as_view(), name="queue-dequeue"),
    path("queues/<str:name>/ack", views.AckView.as_view(), name="queue-ack"),
    path("queues/<str:name>/visibility", views.VisibilityView.as_view(), name="queue-visibility"),
    path("queues/<str:name>/stats", views.StatsView.as_view(), name="queue-stats"),
    path("queues/<str:name>/redrive", views.RedriveView.as_view(), name="queue-redrive"),
    path("queues/<str:name>/expire", views.ExpireView.as_view(), name="queue-expire"),
    path("queues/<str:name>/partitions", views.PartitionsView.as_view(), name="queue-partitions"),
    path("queues/<str:name>/partitions/<int:index>/release", views.ReleasePartitionView.as_view(),
         name="partition-release"),
    path("queues/<str:name>/purge", views.PurgeView.as_view(), name="queue-purge"),
]
