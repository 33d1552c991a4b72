"""The partition engine's ports: what it needs from the runtime that hosts it, and what each of
its collaborators may touch of a partition's state.

What makes a node the owner of a partition, and what the partition reports to (the lease, the
lease's row, the counters, who hears of its work), belong to the cluster runtime, which passes them in as the protocols
of ``queues.engine.host``, re-exported here (:class:`Lease`, :class:`LeaseRow`,
:class:`Counters`, :class:`BoundRow`, :data:`NO_COUNTERS`, :class:`Announcer` and :data:`ANNOUNCE`): the engine imports nothing of the
runtime, nor Django.

Inside the engine, the partition's state (``queues.engine.state``) is one object, and each
collaborator (the writer, the takeover, delivery, acks, retention, the figures) sees it only as
the protocol below named for it, and its fellow collaborators only as the one or two methods it
calls of them. The manager (``queues.engine.partition``) wires them together; no collaborator
imports another.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

__all__ = [
    "ANNOUNCE",
    "NO_COUNTERS",
    "AcksState",
    "Announce",
    "Announcer",
    "BoundRow",
    "Counters",
    "DeliveryState",
    "ExpiresTopic",
    "FiguresState",
    "Lease",
    "LeaseRow",
    "NoCounters",
    "OrderingState",
    "PrunerState",
    "Prunes",
    "ReadsArchive",
    "Removes",
    "RetentionState",
    "Routes",
    "Scans",
    "TakeoverState",
    "TopicRetentionState",
    "WriterState",
]

from queues.engine.blocks import BlockState
from queues.engine.body_cache import BodyCache
from queues.engine.cursor import Cursor, Delivery
from queues.engine.host import (
    ANNOUNCE,
    NO_COUNTERS,
    Announce,
    Announcer,
    BoundRow,
    Counters,
    Lease,
    LeaseRow,
    NoCounters,
)
from queues.engine.ids import MessageId, StoredMessage
from queues.engine.keys import Positioned
from queues.engine.tree import AppendTree, Block
from queues.errors import PartitionUnavailable
from queues.kv.base import Fence, KeyValueStore

# --- the partition's state, as each collaborator sees it ------------------------------------
# ``queues.engine.state.PartitionState`` holds one leased partition's memory; each collaborator
# of ``queues.engine.partition.PartitionManager`` is given it as the protocol named for it below,
# which lists all it may touch: a property it only reads, a plain attribute it also sets.
# Methods that say "Lock held" (``queues.engine.state``) expect the state's ``lock`` held.


class Named(Protocol):
    """The partition's queue and index (keys, message IDs, errors): every collaborator's."""

    @property
    def queue(self) -> str: ...
    @property
    def index(self) -> int: ...


class Locked(Named, Protocol):
    """The lock, and the check every call makes under it (PartitionUnavailable: closed, or
    the lease ran out)."""

    @property
    def lock(self) -> threading.Lock: ...
    def check_serving(self) -> None: ...


class Writes(Named, Protocol):
    """The store, written under the fence of the lease's epoch; a write refused by the fence
    means another owner: ``lost`` closes the partition and gives the error to raise."""

    @property
    def store(self) -> KeyValueStore: ...
    @property
    def fence(self) -> Fence: ...
    def lost(self, exc: Exception) -> PartitionUnavailable: ...


class Holding(Protocol):
    """The cursors (every reader's), and the live blocks whose positions they hold, by id."""

    @property
    def readers(self) -> list[Cursor]: ...
    @property
    def blocks(self) -> dict[str, BlockState]: ...


class Announces(Protocol):
    """The counters the node publishes, and the call that wakes its long polls."""

    @property
    def counters(self) -> Counters: ...
    @property
    def on_change(self) -> Callable[[], None]: ...


class OrderingState(Holding, Protocol):
    """What :class:`~queues.engine.ordering.Ordering` touches: the cursors and the blocks."""

    @property
    def wall(self) -> Callable[[], float]: ...
    def is_live(self, c: Cursor, mid: str) -> bool: ...
    def waits_for_scan(self, mid: str) -> bool: ...


class WriterState(Locked, Writes, Announces, Protocol):
    """What :class:`~queues.engine.writer.Writer` touches."""

    @property
    def lease(self) -> Lease: ...
    @property
    def row(self) -> LeaseRow: ...
    @property
    def enqueue_ready(self) -> bool: ...
    @property
    def cache(self) -> BodyCache: ...
    @property
    def archive(self) -> str: ...
    @property
    def block_size(self) -> int: ...
    @property
    def block_growth(self) -> int: ...
    @property
    def tree(self) -> AppendTree: ...
    @property
    def blocks(self) -> dict[str, BlockState]: ...
    @property
    def local_order(self) -> deque[BlockState]: ...

    @property
    def closed(self) -> bool: ...

    next_index: int
    seq_counter: int
    enqueued_total: int

    def close(self) -> None: ...
    def confirmed(self, started: float) -> None: ...


class TakeoverState(Named, Holding, Protocol):
    """What :class:`~queues.engine.takeover.Takeover` touches: it fills an empty state."""

    @property
    def lease(self) -> Lease: ...
    @property
    def row(self) -> LeaseRow: ...
    @property
    def lock(self) -> threading.Lock: ...
    @property
    def store(self) -> KeyValueStore: ...
    @property
    def cache(self) -> BodyCache: ...
    @property
    def block_size(self) -> int: ...
    @property
    def scanned_order(self) -> deque[BlockState]: ...

    enqueue_ready: bool
    dequeue_ready: bool
    fence: Fence
    tree: AppendTree
    unscanned: Iterator[Block] | None
    seq_counter: int
    opened_in: dict[str, float]

    def close(self) -> None: ...
    def confirmed(self, started: float) -> None: ...


class DeliveryState(Locked, Writes, Holding, Announces, Protocol):
    """What :class:`~queues.engine.delivery.Deliverer` touches."""

    @property
    def closed(self) -> bool: ...
    @property
    def fence_confirmed_at(self) -> float: ...
    @property
    def dequeue_ready(self) -> bool: ...
    @property
    def unscanned(self) -> Iterator[Block] | None: ...
    @property
    def cursors(self) -> dict[str, Cursor]: ...
    def confirmed(self, started: float) -> None: ...
    def cursor(self, sub: str = "") -> Cursor: ...
    def is_live(self, c: Cursor, mid: str) -> bool: ...
    def waits_for_scan(self, mid: str) -> bool: ...
    def receives_key(self, c: Cursor, mid: Positioned) -> str: ...
    def records(self, mids: Sequence[str]) -> dict[str, StoredMessage]: ...
    def drop_stored(self, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> None: ...


class AcksState(Locked, Writes, Holding, Announces, Protocol):
    """What :class:`~queues.engine.acks.Acks` touches."""

    @property
    def cache(self) -> BodyCache: ...
    @property
    def archive(self) -> str: ...
    @property
    def wall(self) -> Callable[[], float]: ...
    @property
    def is_topic(self) -> bool: ...

    def close(self) -> None: ...
    def cursor(self, sub: str = "") -> Cursor: ...
    def is_live(self, c: Cursor, mid: str) -> bool: ...
    def receives_key(self, c: Cursor, mid: Positioned) -> str: ...
    def ack_key(self, c: Cursor, mid: Positioned) -> str: ...
    def drop_stored(self, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> None: ...


class PrunerState(Writes, Protocol):
    """What :class:`~queues.engine.retention.Pruner` touches."""

    @property
    def tree(self) -> AppendTree: ...
    @property
    def blocks(self) -> dict[str, BlockState]: ...
    @property
    def scanned_order(self) -> deque[BlockState]: ...
    @property
    def local_order(self) -> deque[BlockState]: ...
    @property
    def unscanned(self) -> Iterator[Block] | None: ...


class RetentionState(Locked, Protocol):
    """What :class:`~queues.engine.retention.Retention` touches."""

    @property
    def is_topic(self) -> bool: ...
    @property
    def scanned_order(self) -> deque[BlockState]: ...
    @property
    def local_order(self) -> deque[BlockState]: ...
    @property
    def readers(self) -> list[Cursor]: ...
    @property
    def counters(self) -> Counters: ...

    expired_total: int

    def drop_stored(self, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> None: ...


class TopicRetentionState(Locked, Writes, Protocol):
    """What :class:`~queues.engine.topic_retention.TopicRetention` touches."""

    @property
    def counters(self) -> Counters: ...
    @property
    def archive(self) -> str: ...
    @property
    def archive_sink(self) -> Callable[[list[tuple[str, bytes]]], object] | None: ...
    @property
    def archive_source(self) -> Callable[[list[str]], dict[str, StoredMessage]] | None: ...

    expired_total: int
    archived_total: int
    archive_missing_total: int

    def close(self) -> None: ...
    def stored(self, mid: str) -> bool: ...
    def held(self, mid: str) -> bool: ...
    def is_stub(self, mid: str) -> bool: ...
    def records(self, mids: Sequence[str]) -> dict[str, StoredMessage]: ...
    def mark_stubs(self, mids: Sequence[str]) -> None: ...


class FiguresState(Named, Holding, Protocol):
    """What :class:`~queues.engine.figures.Figures` reads (it changes nothing)."""

    @property
    def lease(self) -> Lease: ...
    @property
    def lock(self) -> threading.Lock: ...
    @property
    def closed(self) -> bool: ...
    @property
    def dequeue_ready(self) -> bool: ...
    @property
    def tree(self) -> AppendTree: ...
    @property
    def next_index(self) -> int: ...
    @property
    def scanned_order(self) -> deque[BlockState]: ...
    @property
    def local_order(self) -> deque[BlockState]: ...
    @property
    def unscanned(self) -> Iterator[Block] | None: ...
    @property
    def cursors(self) -> dict[str, Cursor]: ...
    @property
    def is_topic(self) -> bool: ...
    @property
    def cache(self) -> BodyCache: ...
    @property
    def wall(self) -> Callable[[], float]: ...
    @property
    def opened_in(self) -> dict[str, float]: ...
    @property
    def enqueued_total(self) -> int: ...
    @property
    def acked_total(self) -> int: ...
    @property
    def redelivered_total(self) -> int: ...
    def in_flight_count(self, now: float) -> int: ...


# --- one collaborator, as another calls it ----------------------------------------------------


class Routes(Protocol):
    """Where a message's turn comes in each cursor (:class:`~queues.engine.ordering.Ordering`). Lock held."""

    def route_new(self, mid: str, block: Block, i: int, message: StoredMessage, *, scanned: bool) -> bool: ...
    def route_many(
        self, mids: Sequence[str], runs: Sequence[tuple[Block, int, int]], messages: Sequence[StoredMessage]
    ) -> None: ...
    def unblock_group(self, c: Cursor, group: str) -> bool: ...
    def unblock_due(self, c: Cursor) -> None: ...
    def forget(self, c: Cursor, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> bool: ...


class Scans(Protocol):
    """Reads the next block found at open (:class:`~queues.engine.takeover.Takeover`). Lock held."""

    def scan(self) -> bool: ...


class Prunes(Protocol):
    """Deletes the emptied blocks at the front (:class:`~queues.engine.retention.Pruner`). Lock held."""

    def prune(self) -> None: ...


class Removes(Protocol):
    """Removes messages from the store and memory (:class:`~queues.engine.acks.Acks`)."""

    def delete(self, items: Sequence[MessageId], *, journal: bool, sub: str = "") -> int: ...
    def remove_everywhere(self, mids: Sequence[str]) -> None: ...


class ExpiresTopic(Protocol):
    """Retention on a topic's messages (:class:`~queues.engine.topic_retention.TopicRetention`)."""

    def expire(self, doomed: list[str]) -> int: ...


class ReadsArchive(Protocol):
    """Reads stubs' bodies back from the archive (:class:`~queues.engine.topic_retention.TopicRetention`)."""

    def bodies_from_archive(self, stubs: list[Delivery]) -> None: ...
