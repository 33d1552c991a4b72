"""The values the service layer takes and returns (frozen where a caller may keep them).

Each entrance (the REST API, the fast path, the admin, Celery tasks, the archive) builds these
from its own input and shapes its own output from them; nothing here knows about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    attributes: dict | None = None
    size: int | None = None
    #: ``{"preprocess": s, "process": s}`` (else the queue's estimates).
    estimates: dict | None = None
    #: a dead letter's history; only nodes set it (the dead-letter move, forwarded).
    history: dict | None = None


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
    #: dead letters that name no source that exists now: given back at once, counts unchanged.
    skipped: int


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
