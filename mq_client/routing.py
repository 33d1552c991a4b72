"""The owner cache: which node owns each partition of a queue, as last learned.

The client sends acks, visibility changes and a single group's enqueues straight to the owner of
the message's partition. Owners come from ``GET /queues/{name}/partitions`` and are kept for
``ttl`` seconds; when some partition had no owner, or the lookup failed, they are asked again
after :data:`OWNERS_RETRY` seconds instead. Any node forwards a call to the owner, so a stale or
empty entry costs a hop, never a wrong answer.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

from mq_client.types import PartitionOwner

__all__ = ["OWNERS_RETRY", "OwnerCache", "Owners"]

#: Seconds after which owners are asked again when some partition had none, or the lookup failed.
OWNERS_RETRY = 1.0


@dataclass
class Owners:
    """The owner addresses (``host:port``) of a queue's partitions, by index, and when they were
    learned (``time.monotonic()``, moved back when they should be asked again soon)."""

    addresses: dict[int, str | None]
    fetched: float


class OwnerCache:
    """The owners of each queue, thread-safe. ``ttl <= 0`` keeps nothing (owner routing off)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.entries: dict[str, Owners] = {}
        self._lock = threading.Lock()
        _LIVE.add(self)

    def after_fork(self) -> None:
        """In a child process: a new lock (another thread may have held the parent's)."""
        self._lock = threading.Lock()

    def fresh(self, queue: str) -> dict[int, str | None] | None:
        """The owners of ``queue`` learned less than ``ttl`` seconds ago, else None."""
        with self._lock:
            cached = self.entries.get(queue)
        if cached is not None and time.monotonic() - cached.fetched < self.ttl:
            return cached.addresses
        return None

    def store(self, queue: str, parts: Iterable[PartitionOwner]) -> dict[int, str | None]:
        """Keep the owners just learned; asked again soon if a partition has none (just created,
        a takeover)."""
        addresses = {p.index: p.address for p in parts}
        fetched = time.monotonic()
        if any(a is None for a in addresses.values()):
            fetched -= max(0.0, self.ttl - OWNERS_RETRY)
        with self._lock:
            self.entries[queue] = Owners(addresses, fetched)
        return addresses

    def lookup_failed(self, queue: str) -> None:
        """Know no owners of ``queue`` for :data:`OWNERS_RETRY` seconds: not asked at every call
        while the lookup fails."""
        with self._lock:
            self.entries[queue] = Owners({}, time.monotonic() - max(0.0, self.ttl - OWNERS_RETRY))

    def forget(self, queue: str | None = None) -> None:
        """Drop the owners of ``queue`` (all queues when None)."""
        with self._lock:
            if queue is None:
                self.entries.clear()
            else:
                self.entries.pop(queue, None)


_LIVE: weakref.WeakSet[OwnerCache] = weakref.WeakSet()


def _renew_in_child() -> None:
    for cache in list(_LIVE):
        cache.after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_renew_in_child)
