"""A queue's description as the engine and every entrance read it: its settings, and a topic's
subscriptions. The node's catalog (``queues.cluster.catalog``) makes them from the rows."""

from __future__ import annotations

from dataclasses import dataclass

from queues.engine.cursor import SubscriptionSpec


@dataclass(frozen=True)
class QueueConfig:
    id: int
    name: str
    partitions: int
    block_size: int
    lease_period: int
    visibility_timeout: int
    max_message_size: int
    retention: int
    strict: bool = False
    delay: int = 0
    dead_letter_queue: str | None = None
    max_receives: int | None = None
    dedup_window: int = 300
    preprocess_estimate: float = 0.0
    process_estimate: float = 0.0
    #: what the archiver copies: "none", "all" (at enqueue) or "acked" (at ack).
    archive: str = "none"
    kind: str = "queue"
    #: a topic's subscriptions, by name (None for a queue).
    subscriptions: tuple[SubscriptionSpec, ...] | None = None
    #: the user who created it (it may manage it: ``queues.access``), so the hot path needs no query.
    created_by: int | None = None
    #: a dequeue takes a group's next messages in one batch (SQS FIFO), not one at a time
    #: (``queues.engine.cursor.Cursor.group_batch``).
    group_batch: bool = False

    def subscription(self, name: str) -> SubscriptionSpec | None:
        return next((s for s in self.subscriptions or () if s.name == name), None)
