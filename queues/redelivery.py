"""The redelivery index: messages delivered and not yet acknowledged.

The seed keeps two trees over the same entries, one ordered by message ID and one by
visibility deadline. Here: a dict by ID (O(1) lookup for acks) and a sorted list by
``(deadline, id)`` (O(log n) insert/remove, expired ones at the front).

An entry stays after its deadline passes, until it is delivered again (with a new receipt
and deadline) or acknowledged; so a receive count and the last receipt survive the expiry.

An ack *pins* its entries while their delete runs (:meth:`RedeliveryIndex.pin`): the deadline
reads infinite (never redelivered, no change of visibility) but the entry keeps its place in
the sorted list (``listed``) until it is removed, or unpinned when the delete failed. Moving
it to the end and back cost two sorted-list operations per acknowledged message for an entry
that is nearly always removed a moment later (cProfile: a tenth of a batch ack's Python time).
"""

from __future__ import annotations

from dataclasses import dataclass

from sortedcontainers import SortedList


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
    #: the deadline under which the entry sits in ``by_deadline``: ``deadline``, except while
    #: pinned (``deadline`` is then infinite).
    listed: float = 0.0


class RedeliveryIndex:
    def __init__(self) -> None:
        self.by_id: dict[str, RedeliveryEntry] = {}
        self.by_deadline: SortedList = SortedList()

    def __len__(self) -> int:
        return len(self.by_id)

    def __contains__(self, msg_id: str) -> bool:
        return msg_id in self.by_id

    def get(self, msg_id: str) -> RedeliveryEntry | None:
        return self.by_id.get(msg_id)

    def add(self, msg_id: str, deadline: float, receipt: str, receive_count: int) -> None:
        """Record a delivery. O(log n)."""
        old = self.by_id.get(msg_id)
        if old is not None:
            self.by_deadline.remove((old.listed, msg_id))
        self.by_id[msg_id] = RedeliveryEntry(deadline, receipt, receive_count, deadline)
        self.by_deadline.add((deadline, msg_id))

    def remove(self, msg_id: str) -> RedeliveryEntry | None:
        """Forget a message (acknowledged). O(log n)."""
        entry = self.by_id.pop(msg_id, None)
        if entry is not None:
            self.by_deadline.remove((entry.listed, msg_id))
        return entry

    def change_deadline(self, msg_id: str, deadline: float) -> None:
        """O(log n); unpins a pinned entry."""
        entry = self.by_id[msg_id]
        if deadline == entry.listed:
            entry.deadline = deadline  # unpinned back to where it sits: nothing moves
            return
        self.by_deadline.remove((entry.listed, msg_id))
        entry.deadline = entry.listed = deadline
        self.by_deadline.add((deadline, msg_id))

    def pin(self, msg_id: str) -> float | None:
        """Hold an entry back from redelivery (its deadline reads infinite) without moving it.
        O(1). Returns the deadline it had, for :meth:`change_deadline` to give back; None if
        there is no entry."""
        entry = self.by_id.get(msg_id)
        if entry is None:
            return None
        deadline = entry.deadline
        entry.deadline = float("inf")
        return deadline

    def expired(self, now: float, limit: int) -> list[str]:
        """Up to ``limit`` IDs whose deadline has passed, earliest first (pinned ones left
        out). O(limit + pinned ones among the expired)."""
        out: list[str] = []
        by_id = self.by_id
        for deadline, msg_id in self.by_deadline:
            if deadline > now or len(out) >= limit:
                break
            if by_id[msg_id].deadline == deadline:
                out.append(msg_id)
        return out

    def in_flight_count(self, now: float) -> int:
        """Entries still hidden at ``now``. O(log n). (A pinned entry counts by the deadline it
        had: for the moment its ack's delete takes.)"""
        return len(self.by_deadline) - self.by_deadline.bisect_left((now, ""))

    def next_deadline(self) -> float | None:
        """The earliest deadline of an entry not pinned. O(1 + pinned ones before it)."""
        for deadline, msg_id in self.by_deadline:
            if self.by_id[msg_id].deadline == deadline:
                return deadline
        return None

    def _check(self) -> None:
        assert len(self.by_id) == len(self.by_deadline)
        for deadline, msg_id in self.by_deadline:
            entry = self.by_id[msg_id]
            assert entry.listed == deadline
            assert entry.deadline in (deadline, float("inf"))
