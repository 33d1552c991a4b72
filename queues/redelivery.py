"""The redelivery index: messages delivered and not yet acknowledged.

The seed keeps two trees over the same entries, one ordered by message ID and one by
visibility deadline. Here: a dict by ID (O(1) lookup for acks) and a sorted list by
``(deadline, id)`` (O(log n) insert/remove, expired ones at the front).

An entry stays after its deadline passes, until it is delivered again (with a new receipt
and deadline) or acknowledged; so a receive count and the last receipt survive the expiry.
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
            self.by_deadline.remove((old.deadline, msg_id))
        self.by_id[msg_id] = RedeliveryEntry(deadline, receipt, receive_count)
        self.by_deadline.add((deadline, msg_id))

    def remove(self, msg_id: str) -> RedeliveryEntry | None:
        """Forget a message (acknowledged). O(log n)."""
        entry = self.by_id.pop(msg_id, None)
        if entry is not None:
            self.by_deadline.remove((entry.deadline, msg_id))
        return entry

    def change_deadline(self, msg_id: str, deadline: float) -> None:
        entry = self.by_id[msg_id]
        self.by_deadline.remove((entry.deadline, msg_id))
        entry.deadline = deadline
        self.by_deadline.add((deadline, msg_id))

    def expired(self, now: float, limit: int) -> list[str]:
        """Up to ``limit`` IDs whose deadline has passed, earliest first. O(limit)."""
        out: list[str] = []
        for deadline, msg_id in self.by_deadline:
            if deadline > now or len(out) >= limit:
                break
            out.append(msg_id)
        return out

    def in_flight_count(self, now: float) -> int:
        """Entries still hidden at ``now``. O(log n)."""
        return len(self.by_deadline) - self.by_deadline.bisect_left((now, ""))

    def next_deadline(self) -> float | None:
        return self.by_deadline[0][0] if self.by_deadline else None

    def _check(self) -> None:
        assert len(self.by_id) == len(self.by_deadline)
        for deadline, msg_id in self.by_deadline:
            assert self.by_id[msg_id].deadline == deadline
