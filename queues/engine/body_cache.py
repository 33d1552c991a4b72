"""The body cache: recently enqueued messages, kept by the node so a prompt dequeue needs no
store read.

One cache serves every partition manager of a node (``NodeRuntime.cache``), bounded in bytes
and evicting the oldest first. Stored messages are immutable, so an entry is never stale while
its message is stored; the manager discards it when the message goes (ack, expiry, dead
letter) or becomes an archive stub. A miss is never wrong, only slower: the manager reads the
store.

Each entry is charged what it holds in memory (:func:`held_bytes`): the body, the attributes,
estimates and history, the group, the ID and the record itself. Charging the body alone let a
1-character body with 16 attributes of 1 KB cost 97 bytes while it held about 18 KB, so the
budget admitted gigabytes (issue 14).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable

from queues.engine.ids import StoredMessage

#: bytes per entry beyond its strings and dicts: the record (112 with its slots), its floats
#: and ints (~80), the ordered dict's slot and links (~100), the charge kept beside it (~40).
#: Measured with tracemalloc on CPython 3.11 (tests/unit/test_body_cache.py checks the sum).
OVERHEAD = 330


def _deep(value: object) -> int:
    """Bytes a JSON-like value holds: strings, numbers, and the dicts and lists around them.
    An ASCII string (most keys and values) is sized by its length, as :func:`held_bytes` sizes
    a body: one call less per string."""
    if isinstance(value, dict):
        total = sys.getsizeof(value)
        for k, v in value.items():
            total += _ASCII + len(k) if type(k) is str and k.isascii() else _deep(k)
            total += _ASCII + len(v) if type(v) is str and v.isascii() else _deep(v)
        return total
    if isinstance(value, list):
        return sys.getsizeof(value) + sum(_deep(v) for v in value)
    return sys.getsizeof(value)


#: ``sys.getsizeof`` of an ASCII str is this plus its length (CPython's compact ASCII layout).
_ASCII = sys.getsizeof("")


def held_bytes(msg_id: str, message: StoredMessage) -> int:
    """What an entry holds in memory, in bytes (``sys.getsizeof`` counts a str's real size,
    up to 4 bytes a character). Attributes are at most 16, so this is a few microseconds.

    An ASCII ID and body (every ID, most bodies) are sized by their length, without
    ``sys.getsizeof`` (a method lookup each, on every cached message of an enqueue)."""
    body = message.body
    cost = OVERHEAD + (_ASCII + len(msg_id) if msg_id.isascii() else sys.getsizeof(msg_id))
    cost += _ASCII + len(body) if body.isascii() else sys.getsizeof(body)
    if message.group is not None:
        cost += sys.getsizeof(message.group)
    if message.attributes or message.estimates or message.history:
        for extra in (message.attributes, message.estimates, message.history):
            if extra:
                cost += _deep(extra)
    return cost


class BodyCache:
    """Recently enqueued messages, by message ID. Bounded in bytes held (``budget``; 0: off)."""

    def __init__(self, budget: int):
        self.budget = budget
        #: bytes charged for what is held now (never above ``budget`` after a put).
        self.used = 0
        self._items: OrderedDict[str, tuple[StoredMessage, int]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, msg_id: str, message: StoredMessage) -> None:
        self.put_many(((msg_id, message),))

    def put_many(self, entries: Iterable[tuple[str, StoredMessage]]) -> None:
        """Keep these messages (one lock for a whole enqueue), evicting the oldest past the
        budget; one that could not fit alone is not kept."""
        if self.budget <= 0:
            return
        costed = [(msg_id, message, held_bytes(msg_id, message)) for msg_id, message in entries]
        items, budget = self._items, self.budget
        with self._lock:
            for msg_id, message, cost in costed:
                if cost > budget:
                    continue  # it would evict everything and still not fit
                if msg_id in items:  # (rarely: a new ID mostly, and a miss is cheaper than a pop)
                    self.used -= items.pop(msg_id)[1]
                items[msg_id] = (message, cost)
                self.used += cost
            while self.used > budget and items:
                _, (_, charged) = items.popitem(last=False)
                self.used -= charged

    def get(self, msg_id: str) -> StoredMessage | None:
        # No lock: a dict read is atomic, and a racing eviction only turns a hit into a miss.
        hit = self._items.get(msg_id)
        return hit[0] if hit is not None else None

    def discard(self, msg_id: str) -> None:
        self.discard_many((msg_id,))

    def discard_many(self, msg_ids: Iterable[str]) -> None:
        """Forget these messages (one lock for a whole ack)."""
        pop = self._items.pop
        with self._lock:
            for msg_id in msg_ids:
                old = pop(msg_id, None)
                if old is not None:
                    self.used -= old[1]
