"""The partition engine's ports: what it needs from the runtime that hosts it, and what each of
its collaborators may touch of a partition's state.

The engine (``queues.engine.partition`` and the modules it is built from) holds a partition in the
memory of its owner and writes the key-value store. What makes it the owner, and what it reports
to, belong to the cluster runtime (``queues.cluster.node``, ``queues.cluster.leases``, ``queues.metrics``), which
passes them in as the first protocols here: the engine imports nothing of the runtime, nor Django.

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
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from queues.engine.blocks import BlockState
from queues.engine.body_cache import BodyCache
from queues.engine.cursor import Cursor, Delivery
from queues.engine.ids import MessageId, StoredMessage
from queues.engine.keys import Positioned
from queues.engine.tree import AppendTree, Block
from queues.errors import PartitionUnavailable
from queues.kv.base import Fence, KeyValueStore


class Lease(Protocol):
    """The owner's lease on one partition (``queues.cluster.leases.Lease`` in a node)."""

    queue: str
    index: int
    #: the epoch every store write is fenced with; moved on by :meth:`LeaseRow.move_epoch`.
    epoch: int

    def valid(self) -> bool:
        """The owner may still act on the lease (its period, by the owner's clock, not over)."""
        ...


class LeaseRow(Protocol):
    """The partition's row, as the owner under one lease changes it.

    Each change is made only while the row still holds the lease's epoch; else it raises
    :class:`~queues.errors.LeaseLost` and changes nothing.
    """

    @property
    def outages(self) -> tuple[type[Exception], ...]:
        """What the calls raise when the row's database is down or did not answer: an outage,
        after which the partition serves on once the database is back (not a lost lease)."""
        ...

    def read_head(self) -> str | None:
        """The partition's head pointer as the row holds it now (None: no block yet)."""
        ...

    def set_head(self, head_block: str) -> None:
        """Point the partition at its newest block."""
        ...

    def move_epoch(self, epoch: int) -> None:
        """Move the row, and the lease, on to ``epoch``."""
        ...


L = TypeVar("L")


@dataclass(frozen=True)
class BoundRow(Generic[L]):
    """A :class:`LeaseRow` made of functions that take the lease and the owner's node ID
    (``queues.cluster.leases.read_head``, ``set_head`` and ``move_epoch`` in a node), bound to one
    lease and node."""

    lease: L
    node_id: str
    read: Callable[[L], str | None]
    write_head: Callable[[L, str, str], None]
    write_epoch: Callable[[L, str, int], None]
    outages: tuple[type[Exception], ...] = ()

    def read_head(self) -> str | None:
        return self.read(self.lease)

    def set_head(self, head_block: str) -> None:
        self.write_head(self.lease, self.node_id, head_block)

    def move_epoch(self, epoch: int) -> None:
        self.write_epoch(self.lease, self.node_id, epoch)


class Counters(Protocol):
    """Counts of the messages a partition stores, delivers and removes: the process's
    Prometheus counters in a node (``queues.metrics.MESSAGES``). ``sub``: the subscription
    (a queue's is "")."""

    def enqueued(self, queue: str, n: int) -> None: ...

    def delivered(self, queue: str, sub: str, n: int) -> None: ...

    def redelivered(self, queue: str, sub: str) -> None: ...

    def acked(self, queue: str, sub: str, n: int) -> None: ...

    def expired(self, queue: str, n: int) -> None: ...


class NoCounters:
    """:class:`Counters` that count nothing (a manager outside a node: tests, benchmarks)."""

    def enqueued(self, queue: str, n: int) -> None:
        pass

    def delivered(self, queue: str, sub: str, n: int) -> None:
        pass

    def redelivered(self, queue: str, sub: str) -> None:
        pass

    def acked(self, queue: str, sub: str, n: int) -> None:
        pass

    def expired(self, queue: str, n: int) -> None:
        pass


NO_COUNTERS = NoCounters()


# --- the partition's state, as each collaborator sees it ------------------------------------
# ``queues.engine.state.PartitionState`` holds one leased partition's memory; each collaborator
# of ``queues.engine.partition.PartitionManager`` is given it as one of the protocols below,
# which name all it may touch (read-only ones as properties). Methods that say "Lock held"
# expect the state's ``lock`` held.


class OrderingState(Protocol):
    """What :class:`~queues.engine.ordering.Ordering` touches: the cursors and the blocks."""

    @property
    def readers(self) -> list[Cursor]: ...
    @property
    def blocks(self) -> dict[str, BlockState]: ...
    @property
    def wall(self) -> Callable[[], float]: ...
    def is_live(self, c: Cursor, mid: str) -> bool: ...
    def waits_for_scan(self, mid: str) -> bool: ...


class Routes(Protocol):
    """Where a message's turn comes in each cursor (:class:`~queues.engine.ordering.Ordering`)."""

    def route_new(self, mid: str, block: Block, i: int, message: StoredMessage, *, scanned: bool) -> bool: ...
    def unblock_group(self, c: Cursor, group: str, *, front: bool = False) -> bool: ...
    def unblock_due(self, c: Cursor) -> None: ...
    def forget(self, c: Cursor, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> bool: ...


class DeliveryState(Protocol):
    """What :class:`~queues.engine.delivery.Deliverer` touches."""

    @property
    def queue(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def lock(self) -> threading.Lock: ...
    @property
    def closed(self) -> bool: ...
    @property
    def store(self) -> KeyValueStore: ...
    @property
    def fence(self) -> Fence: ...
    @property
    def fence_confirmed_at(self) -> float: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def on_change(self) -> Callable[[], None]: ...
    @property
    def dequeue_ready(self) -> bool: ...
    @property
    def unscanned(self) -> Iterator[Block] | None: ...
    @property
    def cursors(self) -> dict[str, Cursor]: ...
    @property
    def readers(self) -> list[Cursor]: ...
    @property
    def blocks(self) -> dict[str, BlockState]: ...
    def check_serving(self) -> None: ...
    def lost(self, exc: Exception) -> PartitionUnavailable: ...
    def confirmed(self, started: float) -> None: ...
    def cursor(self, sub: str = "") -> Cursor: ...
    def is_live(self, c: Cursor, mid: str) -> bool: ...
    def waits_for_scan(self, mid: str) -> bool: ...
    def receives_key(self, c: Cursor, mid: Positioned) -> str: ...
    def records(self, mids: Sequence[str]) -> dict[str, StoredMessage]: ...
    def drop_stored(self, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> None: ...


class Scans(Protocol):
    """Reads the next block found at open (:class:`~queues.engine.takeover.Takeover`)."""

    def scan(self) -> bool: ...


class ReadsArchive(Protocol):
    """Reads stubs' bodies back from the archive (:class:`~queues.engine.topic_retention.TopicRetention`)."""

    def bodies_from_archive(self, stubs: list[Delivery]) -> None: ...


class AcksState(Protocol):
    """What :class:`~queues.engine.acks.Acks` touches."""

    @property
    def queue(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def lock(self) -> threading.Lock: ...

    closed: bool

    @property
    def store(self) -> KeyValueStore: ...
    @property
    def fence(self) -> Fence: ...
    @property
    def cache(self) -> BodyCache: ...
    @property
    def archive(self) -> str: ...
    @property
    def wall(self) -> Callable[[], float]: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def on_change(self) -> Callable[[], None]: ...
    @property
    def readers(self) -> list[Cursor]: ...
    @property
    def blocks(self) -> dict[str, BlockState]: ...
    @property
    def is_topic(self) -> bool: ...
    def check_serving(self) -> None: ...
    def lost(self, exc: Exception) -> PartitionUnavailable: ...
    def cursor(self, sub: str = "") -> Cursor: ...
    def is_live(self, c: Cursor, mid: str) -> bool: ...
    def receives_key(self, c: Cursor, mid: Positioned) -> str: ...
    def ack_key(self, c: Cursor, mid: Positioned) -> str: ...
    def drop_stored(self, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> None: ...


class Prunes(Protocol):
    """Deletes the emptied blocks at the front of the allocation order (:class:`~queues.engine.retention.Pruner`)."""

    def prune(self) -> None: ...


class Removes(Protocol):
    """Removes messages from the store and from memory (:class:`~queues.engine.acks.Acks`)."""

    def delete(self, items: Sequence[MessageId], *, journal: bool, sub: str = "") -> int: ...
    def remove_everywhere(self, mids: Sequence[str]) -> None: ...


class FiguresState(Protocol):
    """What :class:`~queues.engine.figures.Figures` reads (it changes nothing)."""

    @property
    def queue(self) -> str: ...
    @property
    def index(self) -> int: ...
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
    def blocks(self) -> dict[str, BlockState]: ...
    @property
    def scanned_order(self) -> deque[BlockState]: ...
    @property
    def local_order(self) -> deque[BlockState]: ...
    @property
    def unscanned(self) -> Iterator[Block] | None: ...
    @property
    def cursors(self) -> dict[str, Cursor]: ...
    @property
    def readers(self) -> list[Cursor]: ...
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
