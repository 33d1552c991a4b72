"""The redelivery index: messages delivered and not yet acknowledged.

The seed keeps two trees over the same entries, one ordered by message ID and one by
visibility deadline. Here: a dict by ID (O(1) lookup for acks), and two orders of
``(deadline, seq, id)`` items by deadline (:class:`Deadlines`: a sorted run with a binary heap
beside it): ``future`` (deadlines not yet reached when last looked) and ``due`` (reached: the
messages to redeliver, earliest first).

The orders forget lazily. An ack, or a new deadline, only marks the entry's old item stale (the
entry no longer points at it, by identity); a stale item is dropped when it comes to the front,
and an order is rebuilt without its stale items once they are more than half of it (so the
memory stays within twice the entries; the rebuild is O(n) under the partition's lock, paid by
the one call that tips it). Removing each acknowledged message from a sorted list at once
costs a visible share of a batch cycle (``docs/explanation/performance.md``); here a push is a deque
append (or a heap push), and a removal a dict pop.

An entry stays after its deadline passes, until it is delivered again (with a new receipt
and deadline) or acknowledged; so a receive count and the last receipt survive the expiry.

An ack *pins* its entries while their delete runs (:meth:`RedeliveryIndex.pin_many`): the deadline
reads infinite (never redelivered, no change of visibility) but the entry keeps its item
(``listed``) until it is removed, or unpinned when the delete failed. Moving it to the end and
back would cost two pushes per acknowledged message for an entry that is nearly
always removed a moment later.

Changes run under the partition's lock. :meth:`~RedeliveryIndex.in_flight_count` and
:meth:`~RedeliveryIndex.next_deadline` change nothing, so the node's housekeeping may read
them without the lock (a figure read while a request changes the index is an estimate).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from heapq import heappop

from queues.engine.deadlines import Deadlines, Item

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
        self.future = Deadlines()
        self.due = Deadlines()
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

    def add_new(self, msg_ids: list[str], deadline: float, receipts: list[str], receive_counts: list[int]) -> None:
        """Record first deliveries of one dequeue, under one ``deadline``: as :meth:`add` of
        each, for IDs none of which is in the index (the caller checked). Their items come in
        order (one deadline, rising sequence numbers), so past the last look they go onto
        ``future``'s run at once when it ends no later."""
        if deadline <= self.looked:
            for msg_id, receipt, count in zip(msg_ids, receipts, receive_counts):
                self.add(msg_id, deadline, receipt, count)
            return
        by_id, seq = self.by_id, self._seq
        items = []
        for msg_id, receipt, count in zip(msg_ids, receipts, receive_counts):
            item = (deadline, next(seq), msg_id)
            by_id[msg_id] = RedeliveryEntry(deadline, receipt, count, deadline, item)
            items.append(item)
        self.future.extend(items)

    def remove(self, msg_id: str) -> RedeliveryEntry | None:
        """Forget a message (acknowledged). O(1) amortized."""
        entry = self.by_id.pop(msg_id, None)
        if entry is not None:
            self._unlist(entry)
        return entry

    def remove_many(self, msg_ids: Iterable[str]) -> None:
        """Forget messages (an ack's): as :meth:`remove` of each, with the orders' fronts cleaned
        once at the end instead of once per message."""
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

    def _clean(self, order: Deadlines, stale: int) -> tuple[Deadlines, int]:
        """``order`` and its count of stale items after some of its items went stale: the
        stale ones in front dropped (an ack's are mostly there), or ``order`` rebuilt when
        they are too many."""
        stale -= self._pop_stale(order)
        if stale > COMPACT_AT and 2 * stale > len(order):
            return self._live(order), 0
        return order, stale

    def change_deadline(self, msg_id: str, deadline: float) -> None:
        """O(log n); unpins a pinned entry."""
        entry = self.by_id[msg_id]
        if deadline == entry.listed:
            entry.deadline = deadline  # unpinned back to where it sits: nothing moves
            return
        self._unlist(entry)
        entry.deadline = deadline
        self._list(entry, msg_id, deadline)

    def pin_many(
        self, msg_ids: Sequence[str], entries: Iterable[RedeliveryEntry | None] | None = None
    ) -> dict[str, float]:
        """Hold entries back from redelivery (their deadlines read infinite) without moving
        them. O(1) each. ``entries``: theirs, None where there is none, when the caller looked
        them up already. Returns the deadlines they had, by ID, of those pinned now, for
        :meth:`change_deadline` to give back. One pinned already (a second ack of the same
        delivery, at once) is left out: only the first one's unpin may give the deadline back,
        else it could give back infinity."""
        pinned = {}
        inf = float("inf")
        for msg_id, entry in zip(msg_ids, map(self.by_id.get, msg_ids) if entries is None else entries):
            if entry is not None and entry.deadline != inf:
                pinned[msg_id] = entry.deadline
                entry.deadline = inf
        return pinned

    def expired(self, now: float, limit: int) -> list[str]:
        """Up to ``limit`` IDs whose deadline has passed, earliest first (pinned ones left
        out). O((limit + pinned ones among the expired) log n)."""
        self.advance(now)
        due = self.due
        out: list[str] = []
        taken: list[Item] = []
        while len(out) < limit and (first := due.first()) is not None and first[0] <= now:
            item = due.pop()
            entry = self._owner(item)
            if entry is None:
                self._due_stale -= 1
                continue
            taken.append(item)
            if entry.deadline == item[0]:
                out.append(item[2])
        for item in reversed(taken):  # they stay listed until delivered again or acknowledged
            due.push_front(item)
        return out

    def _owner(self, item: Item) -> RedeliveryEntry | None:
        """The entry ``item`` stands for, or None if the item is stale."""
        entry = self.by_id.get(item[2])
        return entry if entry is not None and entry.item is item else None

    def _list(self, entry: RedeliveryEntry, msg_id: str, deadline: float) -> None:
        item = (deadline, next(self._seq), msg_id)
        entry.item, entry.listed = item, deadline
        if deadline <= self.looked:
            self.due.push(item)
            entry.due = True
            self._due_live += 1
        else:
            self.future.push(item)
            entry.due = False

    def _unlist(self, entry: RedeliveryEntry) -> None:
        """Mark the entry's item stale (see the module's docstring). Each order's first item is
        kept live: acks come mostly in delivery order, so their items are mostly in front, and
        are dropped there at once (a C pop each) instead of piling up before the live ones
        that :meth:`next_deadline` looks for."""
        entry.item = None
        if entry.due:
            self._due_live -= 1
            self.due, self._due_stale = self._clean(self.due, self._due_stale + 1)
        else:
            self.future, self._future_stale = self._clean(self.future, self._future_stale + 1)

    def _pop_stale(self, order: Deadlines) -> int:
        """Drop the stale items in front of ``order``; how many."""
        by_id, dropped = self.by_id, 0
        run, heap = order.run, order.heap
        while True:
            # (Deadlines.first and .pop, inlined: this runs once per acknowledged message)
            in_heap = bool(heap) and (not run or heap[0] < run[0])
            if in_heap:
                top = heap[0]
            elif run:
                top = run[0]
            else:
                return dropped
            entry = by_id.get(top[2])
            if entry is not None and entry.item is top:  # live (``_owner``, inlined)
                return dropped
            if in_heap:
                heappop(heap)
            else:
                run.popleft()
            dropped += 1

    def _live(self, order: Deadlines) -> Deadlines:
        """``order`` without its stale items: a new one (a reader without the lock keeps the old)."""
        return order.kept(lambda it: self._owner(it) is not None)

    def advance(self, now: float) -> None:
        """Move the items whose deadline has come by ``now`` from ``future`` to ``due`` (each
        item moves once). Dequeues do it; so do a partition's figures (``stats``), so that
        :meth:`in_flight_count` read without the lock walks at most what came due since."""
        if now <= self.looked:
            return
        future, due = self.future, self.due
        while (first := future.first()) is not None and first[0] <= now:
            item = future.pop()
            entry = self._owner(item)
            if entry is None:
                self._future_stale -= 1
                continue
            due.push(item)
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
        try:
            for item in self.future.until(now):
                if self._owner(item) is not None:
                    come_due += 1
        except (IndexError, RuntimeError):  # changed under us (read without the lock): an estimate
            pass
        return max(0, len(self.by_id) - self._due_live - come_due)

    def next_deadline(self) -> float | None:
        """The earliest deadline of an entry not pinned. O((1 + pinned or stale items before
        it) log n): each order's first item is live (:meth:`_unlist`), and pinned ones are the
        acks in progress. Minus infinity when the orders changed under a reader without the
        lock: look again at once."""

        def unpinned(item: Item) -> bool:
            entry = self._owner(item)
            return entry is not None and entry.deadline == item[0]

        for order in (self.due, self.future):  # every item of due is before every one of future
            try:
                found = order.first_such(unpinned)
            except (IndexError, RuntimeError):  # changed under us (without the lock): look again at once
                return float("-inf")
            if found is not None:
                return found[0]
        return None

    def _check(self) -> None:
        self.future._check()
        self.due._check()
        listed = [it for order in (self.future, self.due) for it in order]
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
