"""The body cache: recently enqueued messages, kept by the node so a prompt dequeue needs no
store read.

One cache serves every partition manager of a node (``NodeRuntime.cache``), bounded in bytes
and evicting the oldest first. Stored messages are immutable, so an entry is never stale while
its message is stored; the manager discards it when the message goes (ack, expiry, dead
letter) or becomes an archive stub. A miss is never wrong, only slower: the manager reads the
store.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from .messages import StoredMessage

#: bytes counted per entry beyond its body (key, record, dict slot), roughly.
OVERHEAD = 96


class BodyCache:
    """Recently enqueued bodies, by message ID. Bounded in bytes (``budget``; 0: off)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0
        self._items: OrderedDict[str, StoredMessage] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, msg_id: str, message: StoredMessage) -> None:
        if self.budget <= 0:
            return
        cost = len(message.body) + OVERHEAD
        with self._lock:
            self._items[msg_id] = message
            self.used += cost
            while self.used > self.budget and self._items:
                _, old = self._items.popitem(last=False)
                self.used -= len(old.body) + OVERHEAD

    def get(self, msg_id: str) -> StoredMessage | None:
        # No lock: a dict read is atomic, and a racing eviction only turns a hit into a miss.
        return self._items.get(msg_id)

    def discard(self, msg_id: str) -> None:
        with self._lock:
            old = self._items.pop(msg_id, None)
            if old is not None:
                self.used -= len(old.body) + OVERHEAD
