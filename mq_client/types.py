"""The API's answers as frozen dataclasses, and the messages a producer sends.

Each answer type has ``from_json``, which keeps the fields it knows (a newer server may answer
more) and turns the API's ISO 8601 times into aware datetimes (UTC).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from mq_client.ids import message_partition, message_queue

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "AckResult",
    "Estimates",
    "Health",
    "History",
    "Message",
    "MessageItem",
    "NewMessage",
    "PartitionOwner",
    "PartitionStats",
    "Queue",
    "RedriveResult",
    "Stats",
    "VisibilityResult",
    "message_json",
]

_D = TypeVar("_D", bound="DataclassInstance")


def _time(value: Any) -> datetime | None:
    """An ISO 8601 time of the API as an aware datetime (UTC), or None."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, tz=UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _known(cls: type[_D], data: Mapping[str, Any], **override: Any) -> _D:
    """``cls(**data)`` with the fields ``cls`` knows (newer servers may answer more)."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in data.items() if k in names}
    values.update(override)
    return cls(**values)


@dataclass(frozen=True)
class Estimates:
    """How long a message should take in each stage of a worker, in seconds."""

    #: seconds to pre-process (the message's own estimate, else the queue's ``preprocess_estimate``)
    preprocess: float | None = None
    #: seconds to process (the message's own estimate, else the queue's ``process_estimate``)
    process: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Estimates:
        data = data or {}
        return cls(preprocess=data.get("preprocess"), process=data.get("process"))

    def to_json(self) -> dict[str, float]:
        return {k: v for k, v in (("preprocess", self.preprocess), ("process", self.process)) if v is not None}


@dataclass(frozen=True)
class History:
    """Where a dead letter came from (set on messages of a dead-letter queue)."""

    #: the queue the message was first enqueued to
    source: str | None = None
    #: its message ID in that queue
    id: str | None = None
    #: how often it had been delivered there when it was set aside
    receive_count: int | None = None
    #: its message group there, if any
    group: str | None = None
    #: when it was first enqueued
    enqueued_at: datetime | None = None
    #: when it was moved to the dead-letter queue
    dead_lettered_at: datetime | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> History | None:
        if not data:
            return None
        return _known(
            cls, data, enqueued_at=_time(data.get("enqueued_at")), dead_lettered_at=_time(data.get("dead_lettered_at"))
        )


@dataclass(frozen=True)
class Message:
    """A delivered message: hidden from other consumers until its visibility deadline."""

    #: the message ID, ``<queue>/<partition>/<block>/<index>``
    id: str
    #: this delivery's receipt: carry it to :meth:`Client.ack` and :meth:`Client.change_visibility`
    receipt: str
    #: the message body (UTF-8 text)
    body: str
    #: how many times the message was delivered, this delivery included (1 on the first)
    receive_count: int = 1
    #: when the message was enqueued (aware, UTC)
    enqueued_at: datetime | None = None
    #: its sequence number: increases within a partition (and so within a group), across owners
    sequence: int | None = None
    #: its message group, or None
    group: str | None = None
    #: its attributes (string, number or boolean values)
    attributes: Mapping[str, Any] = field(default_factory=dict)
    #: the size the producer declared (``size`` at enqueue), or None
    size: int | None = None
    #: the time estimates for a worker's pre-process and process stages
    estimates: Estimates = field(default_factory=Estimates)
    #: on a dead-letter queue: where the message came from; else None
    history: History | None = None
    #: its fairness key (a tenant's: see :attr:`NewMessage.fairness_key`), or None
    fairness_key: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Message:
        return cls(
            id=data["id"],
            receipt=data["receipt"],
            body=data["body"],
            receive_count=data.get("receive_count", 1),
            enqueued_at=_time(data.get("enqueued_at")),
            sequence=data.get("sequence"),
            group=data.get("group"),
            attributes=dict(data.get("attributes") or {}),
            size=data.get("size"),
            estimates=Estimates.from_json(data.get("estimates")),
            history=History.from_json(data.get("history")),
            fairness_key=data.get("fairness_key"),
        )

    @property
    def queue(self) -> str:
        """The queue the message is in (from its ID)."""
        return message_queue(self.id)

    @property
    def partition(self) -> int:
        """The partition the message is in (from its ID)."""
        return message_partition(self.id)


@dataclass(frozen=True)
class NewMessage:
    """A message to enqueue. :meth:`Client.enqueue_many` also takes plain strings (a body) and dicts."""

    #: the body: UTF-8 text up to the queue's ``max_message_size`` (encode other data as JSON)
    body: str
    #: message group: messages of a group are delivered in order, one at a time (strict queues need one)
    group: str | None = None
    #: deduplication ID: a second enqueue with it within the queue's dedup window returns the first ID
    dedup_id: str | None = None
    #: seconds (<= 900) before the first delivery; the queue's ``delay`` when None
    delay: float | None = None
    #: not delivered before this time: epoch seconds, an ISO 8601 string or a datetime (not with ``delay``)
    not_before: float | str | datetime | None = None
    #: up to 16 attributes: names of 1..64 characters, string, number or boolean values
    attributes: Mapping[str, Any] | None = None
    #: the size of the work the message stands for, for the producer's own accounting
    size: int | None = None
    #: time estimates in seconds: an :class:`Estimates` or ``{"preprocess": s, "process": s}``
    estimates: Estimates | Mapping[str, float] | None = None
    #: a tenant's key (1..128 characters): in each partition the messages of each key take turns
    #: with the other keys', so a tenant that floods the queue holds the others back by one
    #: message a turn; it orders nothing (``group`` does)
    fairness_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"body": self.body}
        for name in ("group", "fairness_key", "dedup_id", "delay", "size"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.not_before is not None:
            out["not_before"] = _not_before(self.not_before)
        if self.attributes is not None:
            out["attributes"] = dict(self.attributes)
        if self.estimates is not None:
            out["estimates"] = (
                self.estimates.to_json() if isinstance(self.estimates, Estimates) else dict(self.estimates)
            )
        return out


#: What the enqueue calls take for a message: its body, a :class:`NewMessage` or the API's dict.
MessageItem = str | NewMessage | Mapping[str, Any]


def _not_before(value: float | str | datetime) -> float | str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.astimezone()  # a naive datetime is local time, as datetime.timestamp() says
        return value.isoformat()
    return value


def message_json(item: MessageItem) -> dict[str, Any]:
    """A message to enqueue as the API's JSON object."""
    if isinstance(item, str):
        return {"body": item}
    if isinstance(item, NewMessage):
        return item.to_json()
    if isinstance(item, Mapping):
        out = dict(item)
        if isinstance(out.get("not_before"), datetime):
            out["not_before"] = _not_before(out["not_before"])
        if isinstance(out.get("estimates"), Estimates):
            out["estimates"] = out["estimates"].to_json()
        return out
    raise TypeError(f"a message is a str (its body), a NewMessage or a dict, not {type(item).__name__}")


@dataclass(frozen=True)
class Queue:
    """A queue's settings."""

    #: the queue's name: letters, digits, '_' and '-', at most 80
    name: str
    #: how many partitions it has (they can only grow)
    partitions: int = 4
    #: positions per block of the append tree
    block_size: int = 256
    #: seconds a node's lease on a partition lasts
    lease_period: float = 10
    #: default seconds a delivered message stays hidden
    visibility_timeout: float = 30
    #: the largest body accepted, in bytes of UTF-8
    max_message_size: int = 256 * 1024
    #: seconds a message is kept before the retention rule removes it
    retention: float = 4 * 24 * 3600
    #: every message needs a group, and acks need receipts
    strict: bool = False
    #: a dequeue takes as many of a group's next messages as it has room for, in order, and the
    #: group is held until each is acknowledged or visible again (SQS FIFO); else one at a time
    group_batch: bool = False
    #: name of the queue that receives messages delivered ``max_receives`` times, or None
    dead_letter_queue: str | None = None
    #: deliveries after which a message goes to ``dead_letter_queue``, or None
    max_receives: int | None = None
    #: seconds a ``dedup_id`` is remembered
    dedup_window: float = 300
    #: default seconds before a new message is first delivered
    delay: float = 0
    #: default pre-process estimate of its messages, seconds, or None
    preprocess_estimate: float | None = None
    #: default process estimate of its messages, seconds, or None
    process_estimate: float | None = None
    #: what is copied to the archive table: "none", "all" (every message) or "acked"
    archive: str = "none"
    #: when it was created
    created_at: datetime | None = None
    #: when its settings last changed
    updated_at: datetime | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Queue:
        return _known(cls, data, created_at=_time(data.get("created_at")), updated_at=_time(data.get("updated_at")))


@dataclass(frozen=True)
class PartitionStats:
    """One partition in :class:`Stats`: exact figures from its owner when ``live``, else the
    figures its last owner saved."""

    #: the partition's index, 0..partitions-1
    index: int
    #: the owner node's address (``host:port``), or None when nobody holds the lease
    owner: str | None = None
    #: the lease's epoch (increments at every change of owner)
    epoch: int = 0
    #: figures come from the owner's memory (the answering node owns it), not from the database
    live: bool = False
    #: visible messages waiting
    depth: int = 0
    #: messages delivered and not yet acknowledged
    in_flight: int = 0
    #: of ``depth``, messages whose delay has not passed yet (0 from older servers)
    delayed: int = 0
    #: ``depth`` is exact (False: an estimate, e.g. blocks not read yet after a takeover)
    depth_exact: bool = False
    #: seconds since the oldest message was enqueued, or None when empty
    oldest_age: float | None = None
    #: ID of the append tree's newest block
    head_block: str | None = None
    #: next free position (the enqueue ID), as a message ID
    enqueue_id: str | None = None
    #: next deliverable position (the dequeue ID), as a message ID
    dequeue_id: str | None = None
    #: height of the append tree
    tree_height: int | None = None
    #: blocks not yet pruned
    live_blocks: int | None = None
    #: messages enqueued in total
    enqueued: int | None = None
    #: messages acknowledged in total
    acked: int | None = None
    #: messages delivered again in total
    redelivered: int | None = None
    #: the owner node's ID, or None when nobody holds the lease (None too from older servers)
    owner_id: str | None = None
    #: the owner node's address (``host:port``), as ``owner`` (None from older servers)
    owner_address: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartitionStats:
        return _known(cls, data)


@dataclass(frozen=True)
class Stats:
    """A queue's figures, summed over its partitions."""

    #: the queue's name
    queue: str
    #: visible messages waiting, all partitions
    depth: int = 0
    #: messages delivered and not yet acknowledged, all partitions
    in_flight: int = 0
    #: of ``depth``, messages whose delay has not passed yet, all partitions (0 from older servers)
    delayed: int = 0
    #: seconds since the oldest message was enqueued, or None when empty
    oldest_age: float | None = None
    #: per partition, by index
    partitions: tuple[PartitionStats, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Stats:
        return _known(cls, data, partitions=tuple(PartitionStats.from_json(p) for p in data.get("partitions", ())))


@dataclass(frozen=True)
class PartitionOwner:
    """Who serves a partition (``GET /queues/{name}/partitions``)."""

    #: the partition's index
    index: int
    #: the owner node's ID, or None when nobody holds the lease
    owner: str | None = None
    #: the owner's ``host:port``, or None
    address: str | None = None
    #: the lease's epoch
    epoch: int = 0
    #: the owner is over its load and sends enqueues elsewhere
    cooling: bool = False
    #: the owner node's ID, as ``owner`` (None from older servers)
    owner_id: str | None = None
    #: the owner node's ``host:port``, as ``address`` (None from older servers)
    owner_address: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartitionOwner:
        return _known(cls, data)


@dataclass(frozen=True)
class AckResult:
    """What an ack removed."""

    #: messages removed by the call
    acked: int = 0
    #: IDs no longer stored (acknowledged before, expired, or dead-lettered)
    not_found: int = 0

    def __add__(self, other: AckResult) -> AckResult:
        return AckResult(self.acked + other.acked, self.not_found + other.not_found)


@dataclass(frozen=True)
class VisibilityResult:
    """A message's new visibility."""

    #: the message ID
    id: str
    #: seconds from the call until it is delivered again (0: visible at once)
    visibility_timeout: float


@dataclass(frozen=True)
class RedriveResult:
    """What a redrive moved from a dead-letter queue."""

    #: messages moved back to the queue (or topic subscription) they came from
    moved: int = 0
    #: messages left in place (no source named in their history)
    skipped: int = 0
    #: ``moved`` by source: a queue's name, or ``topic/subscription``
    sources: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Health:
    """A node's liveness answer. Only a staff user's token (or a node) is told the rest."""

    #: ``"ok"``
    status: str
    #: the node's ID (staff only, else None)
    node: str | None = None
    #: the node's ``host:port`` (staff only, else None)
    address: str | None = None
    #: partitions it holds now, all queues (staff only, else 0)
    partitions: int = 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Health:
        return _known(cls, data or {})
