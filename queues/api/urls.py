from django.urls import path

from queues.api import observability, topics, views

urlpatterns = [
    path("healthz", views.HealthView.as_view(), name="healthz"),
    path("readyz", observability.ReadyView.as_view(), name="readyz"),
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
    path(
        "queues/<str:name>/partitions/<int:index>/release",
        views.ReleasePartitionView.as_view(),
        name="partition-release",
    ),
    path(
        "queues/<str:name>/partitions/<int:index>/blocks/<str:block>",
        views.BlockView.as_view(),
        name="partition-block",
    ),
    path("queues/<str:name>/purge", views.PurgeView.as_view(), name="queue-purge"),
    path("queues/<str:name>/refresh", topics.RefreshView.as_view(), name="topic-refresh"),
    path("topics", topics.TopicListView.as_view(), name="topic-list"),
    path("topics/<str:name>", topics.TopicDetailView.as_view(), name="topic-detail"),
    path("topics/<str:name>/publish", topics.PublishView.as_view(), name="topic-publish"),
    path("topics/<str:topic>/subscriptions", topics.SubscriptionListView.as_view(), name="subscription-list"),
    path(
        "topics/<str:topic>/subscriptions/<str:name>",
        topics.SubscriptionDetailView.as_view(),
        name="subscription-detail",
    ),
    path(
        "topics/<str:topic>/subscriptions/<str:name>/dequeue",
        topics.SubscriptionDequeueView.as_view(),
        name="subscription-dequeue",
    ),
    path(
        "topics/<str:topic>/subscriptions/<str:name>/ack", topics.SubscriptionAckView.as_view(), name="subscription-ack"
    ),
    path(
        "topics/<str:topic>/subscriptions/<str:name>/visibility",
        topics.SubscriptionVisibilityView.as_view(),
        name="subscription-visibility",
    ),
    path(
        "topics/<str:topic>/subscriptions/<str:name>/stats",
        topics.SubscriptionStatsView.as_view(),
        name="subscription-stats",
    ),
]
