"""The router: which node serves a partition.

A node serves the partitions it leases. A call it cannot serve here (an ack for a partition
another node owns, an enqueue when it owns no partition of the queue or is cooling, a dequeue
that finds nothing here) goes to the owner, found on the partition rows (read at most twice a
second). The service decides where a call goes; the API carries it (``queues.api.peers``):
forwarded calls are signed with the cluster secret (``queues.cluster.peerauth``; not the client's token)
and carry the user they act for and a hop count, and a call that has made ``MAX_HOPS`` hops is
answered where it is, so nothing loops. Only a signed call's hop count counts: a client's is 0.
"""

from __future__ import annotations

import threading
import time

from queues.models import Partition

MAX_HOPS = 2
_TTL = 0.5


def hops_of(value: str | None) -> int:
    try:
        return max(0, min(int(value or 0), MAX_HOPS))
    except ValueError:
        return MAX_HOPS  # a garbled count is treated as spent: never forward it again


class Router:
    def __init__(self, node_id: str):
        self.node_id = node_id
        #: by queue row id, not name: a queue created again under a name is another queue.
        self._owners: dict[int, tuple[float, dict[int, tuple[str, str, int]]]] = {}
        self._lock = threading.Lock()

    def owners(self, queue_id: int, queue: str) -> dict[int, tuple[str, str, int]]:
        """``index -> (node id, address, depth)`` for partitions with a live owner."""
        now = time.monotonic()
        hit = self._owners.get(queue_id)
        if hit is not None and now - hit[0] < _TTL:
            return hit[1]
        rows = Partition.objects.filter(queue_id=queue_id, owner__isnull=False, owner__stopped_at=None)
        owners: dict[int, tuple[str, str, int]] = {}
        for p in rows.select_related("owner"):
            if p.owner is not None:  # always, by the filter; said for the type checker
                owners[p.index] = (p.owner.id, p.owner.address, p.depth)
        with self._lock:
            self._owners[queue_id] = (now, owners)
        return owners

    def forget(self, queue_id: int) -> None:
        """Read the queue's owners afresh at the next look (partitions were just claimed)."""
        with self._lock:
            self._owners.pop(queue_id, None)

    def other_nodes(self, queue_id: int, queue: str) -> list[str]:
        """Addresses of other nodes owning partitions of the queue, the deepest first."""
        depth: dict[str, int] = {}
        for node_id, address, d in self.owners(queue_id, queue).values():
            if node_id != self.node_id:
                depth[address] = depth.get(address, 0) + d
        return sorted(depth, key=lambda a: -depth[a])

    def owner_of(self, queue_id: int, queue: str, index: int) -> str | None:
        hit = self.owners(queue_id, queue).get(index)
        if hit is None or hit[0] == self.node_id:
            return None
        return hit[1]
