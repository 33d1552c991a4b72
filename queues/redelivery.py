"""The redelivery index: messages delivered and not yet acknowledged.

The seed keeps two trees over the same entries, one ordered by message ID and one by
visibility deadline. Here: a dict by ID (O(1) lookup for acks), and two binary heaps of
``(deadline, seq, id)`` items by deadline: ``future`` (deadlines not yet reached when last
looked) and ``due`` (reached: the messages to redeliver, earliest first).

The heaps forget lazily. An ack, or a new deadline, only marks the entry's old item stale (the
entry no longer points at it, by identity); a stale item is dropped when it comes to the top,
and a heap is rebuilt without its stale items once they are more than half of it (so the
memory stays within twice the entries; the rebuild is O(n) under the partition's lock, paid by
the one call that tips it: about 0.3 µs an item). A sorted list removed each acknowledged message at
once, at about 2 µs a message (py-spy: 5% of a batch cycle's node CPU); a heap push is a
C call, and a removal a dict pop.

An entry stays after its deadline passes, until it is delivered again (with a new receipt
and deadline) or acknowledged; so a receive count and the last receipt survive the expiry.

An ack *pins* its entries while their delete runs (:meth:`RedeliveryIndex.pin`): the deadline
reads infinite (never redelivered, no change of visibility) but the entry keeps its item
(``listed``) until it is removed, or unpinned when the delete failed. Moving it to the end and
back would cost two heap operations per acknowledged message for an entry that is nearly
always removed a moment later.

Changes run under the partition's lock. :meth:`~RedeliveryIndex.in_flight_count` and
:meth:`~RedeliveryIndex.next_deadline` change nothing, so the node's housekeeping may read
them without the lock (a figure read while a request changes the index is an estimate).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush

#: (deadline it sits under, sequence number: unique, so the ID is never compared, message ID)
Item = tuple[float, int, str]

#: A heap is rebuilt without its stale items when they are more than half of it, and more than this.
COMPACT_AT = 1024


@dataclass(slots=True)
class RedeliveryEntry:
    """A delivered message's entry: in flight until its deadline, kept after it until the
    message is delivered again or acknowledged."""

    #: monotonic time at which the message becomes deliverable again.
    deadline: float
    #: the receipt of the latest delivery; an ack or visibility change must carry it.
    receipt: str
    #: deliveries so far, this one included.
    receive_count: int
    #: the deadline under which the entry sits in a heap: ``deadline``, except while pinned
    #: (``deadline`` is then infinite).
    listed: float = 0.0
    #: its item (any other item of its ID is stale), and whether that item is in ``due``.
    item: Item | None = field(default=None, repr=False)
    due: bool = False


class RedeliveryIndex:
    def __init__(self) -> None:
        self.by_id: dict[str, RedeliveryEntry] = {}
        self.future: list[Item] = []
        self.due: list[Item] = []
        #: every entry listed at or before this is in ``due`` (``future`` holds the later ones).
        self.looked = float("-inf")
        self._due_live = 0  # entries whose item is in ``due``
        self._future_stale = 0
        self._due_stale = 0
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self.by_id)

    def __contains__(self, msg_id: str) -> bool:
        return msg_id in self.by_id

    def get(self, msg_id: str) -> RedeliveryEntry | None:
        return self.by_id.get(msg_id)

    # --- changes (the partition's lock held) ------------------------------------------------
    def add(self, msg_id: str, deadline: float, receipt: str, receive_count: int) -> None:
        """Record a delivery. O(log n)."""
        old = self.by_id.get(msg_id)
        if old is not None:
            self._unlist(old)
        entry = self.by_id[msg_id] = RedeliveryEntry(deadline, receipt, receive_count)
        self._list(entry, msg_id, deadline)

    def remove(self, msg_id: str) -> RedeliveryEntry | None:
        """Forget a message (acknowledged). O(1) amortized."""
        entry = self.by_id.pop(msg_id, None)
        if entry is not None:
            self._unlist(entry)
        return entry

    def remove_many(self, msg_ids: Iterable[str]) -> None:
        """Forget messages (an ack's): as :meth:`remove` of each, with the heaps' tops cleaned
        once at the end instead of once per message (the per-message calls were 3% of a batch
        ack's node CPU, py-spy)."""
        by_id = self.by_id
        due_left = future_left = 0
        for msg_id in msg_ids:
            entry = by_id.pop(msg_id, None)
            if entry is None:
                continue
            entry.item = None
            if entry.due:
                due_left += 1
            else:
                future_left += 1
        if due_left:
            self._due_live -= due_left
            self.due, self._due_stale = self._clean(self.due, self._due_stale + due_left)
        if future_left:
            self.future, self._future_stale = self._clean(self.future, self._future_stale + future_left)

    def _clean(self, heap: list[Item], stale: int) -> tuple[list[Item], int]:
        """``heap`` and its count of stale items after some of its items went stale: the
        stale ones at the top popped (an ack's are mostly there), or the heap rebuilt when
        they are too many."""
        stale -= self._pop_stale(heap)
        if stale > COMPACT_AT and 2 * stale > len(heap):
            return self._live(heap), 0
        return heap, stale

    def change_deadline(self, msg_id: str, deadline: float) -> None:
        """O(log n); unpins a pinned entry."""
        entry = self.by_id[msg_id]
        if deadline == entry.listed:
            entry.deadline = deadline  # unpinned back to where it sits: nothing moves
            return
        self._unlist(entry)
        entry.deadline = deadline
        self._list(entry, msg_id, deadline)

    def pin(self, msg_id: str) -> float | None:
        """Hold an entry back from redelivery (its deadline reads infinite) without moving it.
        O(1). Returns the deadline it had, for :meth:`change_deadline` to give back; None if
        there is no entry, or it is pinned already."""
        entry = self.by_id.get(msg_id)
        if entry is None or entry.deadline == float("inf"):
            # pinned already (a second ack of the same delivery, at once): only the first
            # one's unpin may give the deadline back, else it could give back infinity
            return None
        deadline = entry.deadline
        entry.deadline = float("inf")
        return deadline

    def expired(self, now: float, limit: int) -> list[str]:
        """Up to ``limit`` IDs whose deadline has passed, earliest first (pinned ones left
        out). O((limit + pinned ones among the expired) log n)."""
        self.advance(now)
        due = self.due
        out: list[str] = []
        taken: list[Item] = []
        while due and len(out) < limit and due[0][0] <= now:
            item = heappop(due)
            entry = self._owner(item)
            if entry is None:
                self._due_stale -= 1
                continue
            taken.append(item)
            if entry.deadline == item[0]:
                out.append(item[2])
        for item in taken:  # they stay listed until delivered again or acknowledged
            heappush(due, item)
        return out

    def _owner(self, item: Item) -> RedeliveryEntry | None:
        """The entry ``item`` stands for, or None if the item is stale."""
        entry = self.by_id.get(item[2])
        return entry if entry is not None and entry.item is item else None

    def _list(self, entry: RedeliveryEntry, msg_id: str, deadline: float) -> None:
        item = (deadline, next(self._seq), msg_id)
        entry.item, entry.listed = item, deadline
        if deadline <= self.looked:
            heappush(self.due, item)
            entry.due = True
            self._due_live += 1
        else:
            heappush(self.future, item)
            entry.due = False

    def _unlist(self, entry: RedeliveryEntry) -> None:
        """Mark the entry's item stale (see the module's docstring). Each heap's top is kept
        live: acks come mostly in delivery order, so their items are mostly at the top, and
        are dropped there at once (a C pop each) instead of piling up in front of the live
        ones that :meth:`next_deadline` looks for."""
        entry.item = None
        if entry.due:
            self._due_live -= 1
            self.due, self._due_stale = self._clean(self.due, self._due_stale + 1)
        else:
            self.future, self._future_stale = self._clean(self.future, self._future_stale + 1)

    def _pop_stale(self, heap: list[Item]) -> int:
        """Drop the stale items at the top of ``heap``; how many."""
        by_id, dropped = self.by_id, 0
        while heap:
            top = heap[0]
            entry = by_id.get(top[2])
            if entry is not None and entry.item is top:  # live (``_owner``, inlined: one per ack)
                break
            heappop(heap)
            dropped += 1
        return dropped

    def _live(self, heap: list[Item]) -> list[Item]:
        """The heap without its stale items: a new list (a reader without the lock keeps the old)."""
        live = [it for it in heap if self._owner(it) is not None]
        heapify(live)
        return live

    def advance(self, now: float) -> None:
        """Move the items whose deadline has come by ``now`` from ``future`` to ``due`` (each
        item moves once). Dequeues do it; so do a partition's figures (``stats``), so that
        :meth:`in_flight_count` read without the lock walks at most what came due since."""
        if now <= self.looked:
            return
        future, due = self.future, self.due
        while future and future[0][0] <= now:
            item = heappop(future)
            entry = self._owner(item)
            if entry is None:
                self._future_stale -= 1
                continue
            heappush(due, item)
            entry.due = True
            self._due_live += 1
        self.looked = now

    # --- readings (no change: safe without the lock, as estimates) ----------------------------
    def in_flight_count(self, now: float) -> int:
        """Entries still hidden at ``now`` (listed after it). A pinned entry counts by the
        deadline it had: for the moment its ack's delete takes. A ``now`` before the last
        look counts as that look (a dequeue may have looked a moment after the caller read
        its clock). O(1 + items of ``future`` that came due since the last look)."""
        now = max(now, self.looked)
        come_due = 0
        by_id, future = self.by_id, self.future
        stack = [0]
        try:
            while stack:  # the heap's items at or before now: a subtree above now is skipped whole
                i = stack.pop()
                if i < len(future) and future[i][0] <= now:
                    if self._owner(future[i]) is not None:
                        come_due += 1
                    stack += (2 * i + 1, 2 * i + 2)
        except IndexError:  # changed under us (read without the lock): an estimate
            pass
        return max(0, len(by_id) - self._due_live - come_due)

    def next_deadline(self) -> float | None:
        """The earliest deadline of an entry not pinned. O((1 + pinned or stale items before
        it) log n): each heap's top is live (:meth:`_unlist`), and pinned ones are the acks
        in progress. Minus infinity when the heaps changed under a reader without the lock:
        look again at once."""
        for heap in (self.due, self.future):  # every item of due is before every one of future
            try:
                frontier = [(heap[0], 0)] if heap else []
                while frontier:  # best first through the heap, without taking anything out
                    item, i = heappop(frontier)
                    entry = self._owner(item)
                    if entry is not None and entry.deadline == item[0]:
                        return item[0]
                    for child in (2 * i + 1, 2 * i + 2):
                        if child < len(heap):
                            heappush(frontier, (heap[child], child))
            except IndexError:  # changed under us (read without the lock): look again at once
                return float("-inf")
        return None

    def _check(self) -> None:
        listed = [it for heap in (self.future, self.due) for it in heap]
        live = [it for it in listed if self._owner(it) is not None]
        assert len(live) == len(self.by_id)
        assert len(listed) - len(live) == self._future_stale + self._due_stale
        assert self._due_live == sum(e.due for e in self.by_id.values())
        for msg_id, entry in self.by_id.items():
            assert entry.item is not None and entry.item[2] == msg_id
            assert entry.listed == entry.item[0]
            assert entry.deadline in (entry.listed, float("inf"))
            assert (entry.item in self.due) == entry.due
            assert entry.due == (entry.listed <= self.looked)
