"""What the partition engine needs from the runtime that hosts it.

The engine (``queues.engine.partition`` and the modules it is built from) holds a partition in the
memory of its owner and writes the key-value store. What makes it the owner, and what it reports
to, belong to the cluster runtime (``queues.cluster.node``, ``queues.cluster.leases``, ``queues.metrics``), which
passes them in as these protocols: the engine imports nothing of the runtime, nor Django. Beside
them, ready-made ones: a row bound from plain functions (:class:`BoundRow`), and counters that
count nothing (:data:`NO_COUNTERS`). And who hears of a partition's work (:class:`Announcer`), set from
outside in :data:`ANNOUNCE`. ``queues.engine.ports`` re-exports all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


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


class Counters(Protocol):
    """Counts of the messages a partition stores, delivers and removes: the process's
    Prometheus counters in a node (``queues.metrics.MESSAGES``). ``sub``: the subscription
    (a queue's is "")."""

    def enqueued(self, queue: str, n: int) -> None: ...

    def delivered(self, queue: str, sub: str, n: int) -> None: ...

    def redelivered(self, queue: str, sub: str) -> None: ...

    def acked(self, queue: str, sub: str, n: int) -> None: ...

    def expired(self, queue: str, n: int) -> None: ...


L = TypeVar("L")


@dataclass(frozen=True)
class BoundRow(Generic[L]):
    """A :class:`~queues.engine.ports.LeaseRow` made of functions that take the lease and the owner's node ID
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


class NoCounters:
    """:class:`~queues.engine.ports.Counters` that count nothing (a manager outside a node: tests, benchmarks)."""

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


class Announcer(Protocol):
    """Who hears what a partition does (a node's tracing, ``queues.tracing``): each event is a
    context around the work it names, entered before and left after it (an error inside
    passes through it)."""

    def storing(self, queue: str, index: int, count: int) -> AbstractContextManager[object]:
        """A store write of ``count`` messages to partition ``index`` of ``queue``."""
        ...


class Announce:
    """Where this process's partitions announce their work: ``to`` (None: nowhere, the default;
    a partition then pays one attribute read a store write)."""

    __slots__ = ("to",)

    def __init__(self) -> None:
        self.to: Announcer | None = None


#: This process's (a node's tracing sets ``ANNOUNCE.to`` while it makes spans).
ANNOUNCE = Announce()
