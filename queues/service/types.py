"""The values the service layer takes and returns (frozen where a caller may keep them).

Each entrance (the REST API, the fast path, the admin, Celery tasks, the archive) builds these
from its own input and shapes its own output from them; nothing here knows about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, Required, TypedDict

# A queue's description and a delivered message, as the engine makes them: every entrance reads
# them from here, not from the runtime.
from queues.engine.config import QueueConfig
from queues.engine.partition import Delivery

if TYPE_CHECKING:
    from queues.models import Queue

__all__ = [
    "AckResult",
    "Delivery",
    "ExpireResult",
    "MessageDraft",
    "NewQueueFields",
    "NewSubscriptionFields",
    "PartitionOwner",
    "PartitionStats",
    "QueueConfig",
    "QueueFields",
    "QueueStats",
    "RedriveResult",
    "ReleaseResult",
    "SubscriptionFields",
    "SubscriptionPartitionStats",
    "SubscriptionStats",
]


class QueueFields(TypedDict, total=False):
    """The settings of a queue (or topic) its manager sets: what ``update_queue`` changes, and
    with :class:`NewQueueFields` what ``create_queue`` takes. A setting left out keeps its value
    (a new queue's: the model's default). Each is bounded by ``queues.models.LIMITS``, checked
    by the model's ``full_clean`` (django's ValidationError)."""

    #: how many partitions the messages are spread over; it may grow, never shrink.
    partitions: int
    #: positions per append-tree block (a busy partition's blocks grow past it).
    block_size: int
    #: seconds a partition's lease lasts (owned rows take a new one at their next renewal).
    lease_period: int
    #: seconds a delivered message stays hidden before it is delivered again.
    visibility_timeout: int
    #: the most bytes of a message's body (UTF-8).
    max_message_size: int
    #: seconds a message is kept unacknowledged.
    retention: int
    #: every message needs a group, and acks need receipts.
    strict: bool
    #: a dequeue takes as many of a group's next messages as it has room for (SQS FIFO's rule).
    group_batch: bool
    #: where a message goes after ``max_receives`` deliveries (the caller needs ``produce`` on
    #: it); None: nowhere.
    dead_letter_queue: Queue | None
    #: deliveries before a message is dead-lettered; None: never.
    max_receives: int | None
    #: seconds a ``dedup_id`` is remembered.
    dedup_window: int
    #: seconds every message waits before its first delivery.
    delay: int
    #: default seconds of pre-processing per message (for messages that bring no estimate).
    preprocess_estimate: float
    #: default seconds of processing per message.
    process_estimate: float
    #: what the archiver copies (``Queue.Archive``: ``none``, ``all``, ``acked``).
    archive: str


class NewQueueFields(QueueFields, total=False):
    """A new queue's (or topic's) name and kind, with its settings (``create_queue``)."""

    #: letters, digits, ``_`` and ``-``, at most 80; no other queue or topic has it.
    name: Required[str]
    #: ``Queue.Kind``: ``queue`` (the default) or ``topic``.
    kind: str
    #: the user recorded as its creator, who may manage it; default: the caller's.
    created_by_id: int | None


class SubscriptionFields(TypedDict, total=False):
    """The settings of a subscription its topic's manager may change (``update_subscription``;
    the names in ``descriptions.SUBSCRIPTION_SETTINGS``). A setting left out keeps its value."""

    #: seconds a delivered message stays hidden; None: the topic's.
    visibility_timeout: int | None
    #: where a message goes after ``max_receives`` deliveries to this reader (a queue, not a
    #: topic; the caller needs ``produce`` on it); None: nowhere.
    dead_letter_queue: Queue | None
    #: deliveries to this reader before a message is dead-lettered; None: never.
    max_receives: int | None


class NewSubscriptionFields(SubscriptionFields, total=False):
    """A new subscription's name and start, with its settings (``create_subscription``)."""

    #: letters, digits, ``_`` and ``-``, at most 80; unique among the topic's subscriptions.
    name: Required[str]
    #: ``Subscription.Start``: ``newest`` (the default: what is published from now on) or
    #: ``oldest`` (every message the topic still holds too).
    start: str


@dataclass(slots=True)
class MessageDraft:
    """A checked message to enqueue, before it has an ID."""

    body: str
    #: the strict-order parameter (message group); None: any partition.
    group: str | None = None
    #: the producer's deduplication ID: a repeat within the queue's window gets the first ID.
    dedup_id: str | None = None
    #: wall-clock seconds before which it is not delivered (None: at once).
    not_before: float | None = None
    attributes: dict[str, Any] | None = None
    size: int | None = None
    #: ``{"preprocess": s, "process": s}`` (else the queue's estimates).
    estimates: dict[str, Any] | None = None
    #: a dead letter's history; only nodes set it (the dead-letter move, forwarded).
    history: dict[str, Any] | None = None
    #: on a topic: the one subscription that reads it (a redriven dead letter of that
    #: subscription); None: every subscription. Only nodes set it (redrive, forwarded).
    subscription: str | None = None
    #: its fairness key: a partition's ungrouped messages of each key take turns with the
    #: other keys' (SQS fair queues); no order, and no partition, follows from it.
    fairness_key: str | None = None


@dataclass(frozen=True, slots=True)
class AckResult:
    #: messages removed by this call.
    acked: int
    #: IDs that were no longer stored (acknowledged before, or never existed).
    not_found: int


@dataclass(frozen=True, slots=True)
class RedriveResult:
    #: dead letters enqueued again into their source and removed from the dead-letter queue.
    moved: int
    #: dead letters that name no source (``history.source``, e.g. enqueued into the dead-letter
    #: queue by a client): given back when the call ends, their receive counts unchanged.
    skipped: int
    #: ``moved`` by source (a queue, or ``topic/subscription``).
    sources: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExpireResult:
    #: messages removed by the retention rule.
    expired: int
    #: messages a topic's retention moved to the archive (slow subscriptions still hold them).
    archived: int
    #: partitions whose pass failed (store down, lease lost), with why; retried at the next pass.
    deferred: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    #: the node that gave the lease up.
    node: str


#: What the OpenAPI schema says of a field kept for older clients (``queues.api.schema``
#: reads the ``Annotated`` metadata of these types).
DEPRECATED = {"deprecated": True}
#: A partition's owner, the same two fields wherever an answer shows one.
OWNER_ID = {"description": "the owner node's ID; null when no node holds the lease"}
OWNER_ADDRESS = {"description": "the owner node's host:port; null when no node holds the lease"}


class PartitionOwner(TypedDict):
    """Who serves one partition now (clients may call the owner directly)."""

    index: int
    owner_id: Annotated[str | None, OWNER_ID]
    owner_address: Annotated[str | None, OWNER_ADDRESS]
    #: the owner's ID, as ``owner_id``; kept for older clients.
    owner: Annotated[str | None, DEPRECATED | {"description": "deprecated: read owner_id"}]
    address: str | None
    epoch: int
    cooling: bool


class PartitionStats(TypedDict):
    """One partition of a queue's stats: live from its owner here, else as last published."""

    index: int
    owner_id: Annotated[str | None, OWNER_ID]
    owner_address: Annotated[str | None, OWNER_ADDRESS]
    #: the owner's *address*, as ``owner_address``; kept for older clients.
    owner: Annotated[str | None, DEPRECATED | {"description": "deprecated: read owner_address"}]
    epoch: int
    #: served by this node now (figures exact), or the owner's last published ones.
    live: bool
    depth: int
    in_flight: int
    #: of ``depth``, the messages whose delay has not passed yet.
    delayed: int
    depth_exact: bool
    oldest_age: float | None
    head_block: str
    enqueue_id: str
    dequeue_id: str
    tree_height: int
    live_blocks: int
    enqueued: int
    acked: int
    redelivered: int


class SubscriptionPartitionStats(TypedDict):
    index: int
    live: bool
    held: int
    in_flight: int
    acked: int
    redelivered: int
    archived: int
    dequeue_id: str
    oldest_age: float | None
    depth: int


class SubscriptionStats(TypedDict):
    """What a subscription holds; ``queue``, ``depth``, ``in_flight`` and ``oldest_age`` read as a
    queue's do."""

    queue: str
    topic: str
    subscription: str
    held: int
    depth: int
    in_flight: int
    acked: int
    archived: int
    oldest_age: float | None
    partitions: list[SubscriptionPartitionStats]


class QueueStats(TypedDict):
    queue: str
    depth: int
    in_flight: int
    #: of ``depth``, the messages whose delay has not passed yet.
    delayed: int
    oldest_age: float | None
    partitions: list[PartitionStats]
    #: a topic's, by subscription name.
    subscriptions: NotRequired[dict[str, SubscriptionStats]]
