"""What a call names: a queue (``"orders"``), a topic (``"news"``, published to by name) or a
topic's subscription (``"news/mail"``, read through)."""

from __future__ import annotations

from ..models import QUEUE_NAME_RE
from ..node import QueueConfig
from .errors import InvalidRequest, QueueNotFound, SubscriptionNotFound
from .runtime import get_runtime


def checked_name(name: str) -> str:
    """A name no queue can have (NUL, '/', too long...) is unknown, not a database error."""
    if not QUEUE_NAME_RE.fullmatch(name):
        raise QueueNotFound(name)
    return name


def queue_config(name: str) -> QueueConfig:
    """The queue's (or topic's) settings as this node knows them. Raises QueueNotFound."""
    return get_runtime().queue(checked_name(name))


def resolve(target: str, *, reading: bool = True) -> tuple[QueueConfig, str]:
    """``(config, subscription)`` of a call's target; subscription "" for a queue.

    Raises QueueNotFound, SubscriptionNotFound, and InvalidRequest (``is_a_topic``) when
    ``reading`` names a topic itself: a topic is read only through a subscription.
    """
    queue, slash, sub = target.partition("/")
    cfg = queue_config(queue)
    if slash:
        if cfg.kind != "topic":
            raise QueueNotFound(target)
        if cfg.subscription(sub) is None:
            raise SubscriptionNotFound(target)
    elif reading and cfg.kind == "topic":
        raise InvalidRequest(
            f"{queue} is a topic: read it through a subscription (/api/v1/topics/{queue}/subscriptions/<name>/...)",
            "is_a_topic",
        )
    return cfg, sub
