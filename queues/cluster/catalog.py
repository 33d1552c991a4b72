"""The queue catalog: every queue's description (:class:`~queues.engine.config.QueueConfig`),
read from the queue and subscription rows in two queries, as the housekeeping pass and a
request that meets a queue it has not seen yet read them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from queues.engine.config import QueueConfig
from queues.engine.cursor import SubscriptionSpec
from queues.models import QUEUE_SETTINGS, Queue, Subscription

#: What a description (:func:`config_from_row`) is made of: a queue row's columns, and a
#: subscription row's. A housekeeping pass reads them as values: model instances with their
#: prefetches cost several times as much, every second, in every process (``bench/housekeeping.py``).
QUEUE_COLUMNS = (
    "id",
    "name",
    "kind",
    "created_by_id",
    *("dead_letter_queue__name" if f == "dead_letter_queue" else f for f in QUEUE_SETTINGS),
)
SUBSCRIPTION_COLUMNS = (
    "topic_id",
    "name",
    "starts_at",
    "max_receives",
    "dead_letter_queue_id",
    "visibility_timeout",
    "dead_letter_queue__name",
)


def load(name: str | None = None) -> dict[str, QueueConfig]:
    """The descriptions of every queue (or of the one named ``name``), by name: two queries."""
    rows = Queue.objects.all() if name is None else Queue.objects.filter(name=name)
    queues = list(rows.values(*QUEUE_COLUMNS))
    topics = [q["id"] for q in queues if q["kind"] == Queue.Kind.TOPIC]
    subscriptions: dict[int, list[dict[str, Any]]] = {}
    if topics:
        for s in Subscription.objects.filter(topic_id__in=topics).values(*SUBSCRIPTION_COLUMNS):
            subscriptions.setdefault(s["topic_id"], []).append(s)
    return {q["name"]: config_from_row(q, subscriptions.get(q["id"], ())) for q in queues}


def config_from_row(row: dict[str, Any], subscriptions: Iterable[dict[str, Any]] = ()) -> QueueConfig:
    """A description of a queue row's values (:data:`QUEUE_COLUMNS`) and, for a topic, its
    subscription rows' (:data:`SUBSCRIPTION_COLUMNS`)."""
    dlq = row["dead_letter_queue__name"]
    subs = None
    if row["kind"] == Queue.Kind.TOPIC:
        subs = tuple(
            SubscriptionSpec(
                s["name"],
                s["starts_at"].timestamp() if s["starts_at"] else None,
                s["max_receives"] if s["dead_letter_queue_id"] else None,
                s["visibility_timeout"],
                s["dead_letter_queue__name"],
            )
            for s in sorted(subscriptions, key=lambda s: s["name"])
        )
    return QueueConfig(
        row["id"],
        row["name"],
        row["partitions"],
        row["block_size"],
        row["lease_period"],
        row["visibility_timeout"],
        row["max_message_size"],
        row["retention"],
        row["strict"],
        row["delay"],
        dlq,
        row["max_receives"] if dlq else None,
        row["dedup_window"],
        row["preprocess_estimate"],
        row["process_estimate"],
        row["archive"],
        row["kind"],
        subs,
        row["created_by_id"],
        row["group_batch"],
    )
