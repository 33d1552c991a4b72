"""Stand-ins for the tests and the benchmarks: the partition manager without a database, and a
delivered message without a client.

:class:`PartitionRow` (the Partition row's head pointer, fenced by epoch) and :func:`next_owner`
(a takeover: the next epoch's lease and manager) import the core when called, which needs Django
set up; :class:`FakeMessage`, the shape of ``mq_client.Message`` for in-memory clients, and
:class:`Ticks`, a clock the test moves, need nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from queues.cluster.leases import Lease
    from queues.engine.partition import PartitionManager
    from queues.kv import KeyValueStore


class Ticks:
    """A monotonic clock the test moves (``clock.now += 1``): seconds, from 1,000."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class FakeMessage:
    """A delivered message as ``mq_client.Message`` has it, for in-memory clients."""

    id: str
    receipt: str
    body: str
    group: str | None = None
    attributes: dict = field(default_factory=dict)
    size: int | None = None
    estimates: Any = None
    receive_count: int = 1


class PartitionRow:
    """The Partition row without the database: the head pointer and the epoch, written only
    under the current epoch (as ``queues.cluster.leases.set_head`` / ``read_head`` / ``move_epoch`` do it)."""

    def __init__(self) -> None:
        self.head: str | None = None
        self.epoch = 0

    def set_head(self, lease: Lease, node_id: str, head: str) -> None:
        from queues.cluster.leases import LeaseLost  # the core needs Django set up

        if lease.epoch != self.epoch:
            raise LeaseLost(f"epoch {lease.epoch} is stale (row has {self.epoch})")
        self.head = head
        lease.head_block = head

    def read_head(self, lease: Lease) -> str | None:
        return self.head

    def move_epoch(self, lease: Lease, node_id: str, epoch: int) -> None:
        from queues.cluster.leases import LeaseLost

        if lease.epoch != self.epoch:
            raise LeaseLost(f"epoch {lease.epoch} is stale (row has {self.epoch})")
        self.epoch = lease.epoch = epoch


def next_owner(
    store: KeyValueStore,
    row: PartitionRow,
    *,
    block_size: int,
    cache_bytes: int = 0,
    queue: str = "q",
    node_id: str = "node",
    manager: type[PartitionManager] | None = None,
    **options: Any,
) -> PartitionManager:
    """A takeover: the row's next epoch, its lease and a ``manager`` (PartitionManager by
    default) on partition 0 of ``queue``, not opened yet. ``options`` go to the manager."""
    from queues.cluster.leases import ROW_OUTAGES, Lease
    from queues.engine.partition import BodyCache, PartitionManager
    from queues.engine.ports import BoundRow

    row.epoch += 1
    lease = Lease(1, queue, 0, row.epoch, "n", 10.0, float("inf"), row.head or "")
    return (manager or PartitionManager)(
        lease,
        block_size=block_size,
        store=store,
        node_id=node_id,
        cache=BodyCache(cache_bytes),
        row=BoundRow(lease, node_id, row.read_head, row.set_head, row.move_epoch, outages=ROW_OUTAGES),
        **options,
    )
