"""Stand-ins shared by the unit tests of the partition manager (no database)."""

from __future__ import annotations

from queues.leases import LeaseLost


class Row:
    """The Partition row: the head pointer, written only under the current epoch."""

    def __init__(self):
        self.head: str | None = None
        self.epoch = 0

    def set_head(self, lease, node_id, head):
        if lease.epoch != self.epoch:
            raise LeaseLost("stale epoch")
        self.head = head

    def read_head(self, lease):
        return self.head
