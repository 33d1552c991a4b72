"""Cursors: a reader's delivery state over a partition's blocks, and the subscription specs
they are made from.

A queue's partition has one cursor (named ``""``); a topic's has one per subscription, over
the same stored messages (see ``queues.engine.partition``). A cursor knows which messages its reader
still *holds* (not acked yet, in flight included), which are ready for delivery and in what
order, which are in flight (its redelivery index), and the groups, delays, receive counts and
dead letters of its reader. It is plain memory: the partition manager changes it under its
lock and persists what must survive a takeover (receive counts, a subscription's ack markers).
"""

from __future__ import annotations

import heapq
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from sortedcontainers import SortedList

from queues.engine.blocks import BlockState
from queues.engine.ids import StoredMessage
from queues.engine.redelivery import RedeliveryIndex


@dataclass(frozen=True)
class SubscriptionSpec:
    """What an owner needs of a topic's subscription (``queues.models.Subscription``)."""

    name: str
    #: wall-clock seconds; messages enqueued before are not delivered to it (None: all).
    starts_at: float | None = None
    max_receives: int | None = None
    #: its own visibility timeout (None: the topic's) and dead-letter queue; the service reads
    #: these, the owner ignores them.
    visibility_timeout: int | None = None
    dead_letter_queue: str | None = None


@dataclass(slots=True)
class Delivery:
    """One message handed to a cursor's reader: its ID, the receipt an ack must show, and the
    deliveries so far (this one included)."""

    id: str
    receipt: str
    receive_count: int
    #: filled in after the lock is released (bodies are immutable).
    message: StoredMessage | None = None
    #: the body came from the archive table (retention moved it out of the store).
    from_archive: bool = False


class Cursor:
    """One reader's delivery state over the partition's blocks (see the module's text)."""

    def __init__(self, name: str, *, shared: bool, starts_at: float | None = None, max_receives: int | None = None):
        self.name = name
        #: a queue's only cursor: the messages it holds are the blocks' own live sets.
        self.shared = shared
        #: a subscription's held positions (not acknowledged by it yet), by block id.
        self.live: dict[str, set[int]] = {}
        self.starts_at = starts_at
        #: message IDs this subscription acknowledged before the open (its markers).
        self.acked: set[str] = set()
        #: undelivered messages of this manager's own blocks, oldest first within each
        #: fairness key, the keys taking turns (:class:`FairLanes`).
        self.ready = FairLanes()
        #: undelivered messages a scan found (in blocks older than any of ``ready``'s): first.
        self.scanned_ready = FairLanes()
        #: the fairness key of each undelivered or in-flight ungrouped message that has one.
        self.fairness_of: dict[str, str] = {}
        #: the messages in flight (and those whose visibility ran out, until redelivered).
        self.redelivery = RedeliveryIndex()
        #: a group's undelivered and in-flight messages, by position: its head goes first.
        self.groups: dict[str, SortedList] = {}
        self.group_of: dict[str, str] = {}
        #: the group's message that is unblocked (its turn came) or in flight (one at a time).
        self.group_busy: dict[str, str] = {}
        #: deliver a group's messages in batches (SQS FIFO): a dequeue that delivers a group's
        #: head goes on with the group's next messages, in order, while it has room; the group
        #: is held until every one of them is settled (acked, or its visibility ran out).
        self.group_batch = False
        #: a batch's messages still in flight, by group (see :attr:`group_batch`).
        self.group_out: dict[str, set[str]] = {}
        #: group heads whose turn has come, oldest first.
        self.unblocked = GroupHeads()
        #: (not_before, id) of messages whose delay has not passed.
        self.delayed: list[tuple[float, str]] = []
        self.not_due: set[str] = set()
        #: receive counts of redelivered messages, kept in the store so they survive a takeover.
        self.receives: dict[str, int] = {}
        #: deliveries after which a message is dead-lettered instead (None: never).
        self.max_receives = max_receives
        #: messages waiting to be moved to the dead-letter queue, with their receive counts.
        self.dead: list[tuple[str, int]] = []
        self.acked_total = 0
        self.redelivered_total = 0

    def holds(self, blocks: dict[str, BlockState], block_id: str, idx: int) -> bool:
        """The reader has not acknowledged this stored message yet. ``blocks``: the manager's
        block states by id (a queue's cursor holds what its blocks hold)."""
        if self.shared:
            state = blocks.get(block_id)
            return state is not None and idx in state.live
        live = self.live.get(block_id)
        return live is not None and idx in live

    def held_count(self) -> int:
        """Messages a subscription holds, in flight included (a queue's cursor: see its blocks)."""
        return sum(len(s) for s in self.live.values())


class GroupHeads:
    """Group heads whose turn came, by position (block ordinal, index): the group whose waiting
    message was sent earliest goes first, as SQS hands out FIFO groups ("messages that belong
    to the same message group are always processed one by one, in a strict order relative to
    the message group"; the oldest group first, FIFO delivery logic). O(log n) a push or pop.

    A head may be pushed twice (given back while listed) or go stale (removed meanwhile): the
    dequeue checks each head it pops against the group's turn."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, int], str]] = []

    def push(self, position: tuple[int, int], mid: str) -> None:
        heapq.heappush(self._heap, (position, mid))

    def pop(self) -> str:
        """The oldest head. Raises IndexError when there is none."""
        return heapq.heappop(self._heap)[1]

    def __getitem__(self, i: int) -> str:
        """``[0]``: the oldest head, without taking it (IndexError when there is none)."""
        if i != 0:
            raise IndexError(i)
        return self._heap[0][1]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)


#: Fairness keys a lane order tracks apart; past them, new keys share :data:`OVERFLOW_LANES`
#: lanes by a hash of the key (a flood of distinct keys costs memory for its messages only).
MAX_FAIR_KEYS = 1024
OVERFLOW_LANES = 64
#: Turns in a row new lanes take before a lane that had turns already gets one (see FairLanes).
MAX_NEW_STREAK = 16


class FairLanes:
    """Undelivered messages in one lane per fairness key (None: the keyless'), the lanes taking
    turns a message at a time, each lane oldest first: a key that floods the partition holds
    the others' messages back by one message each turn, not by its whole backlog (SQS fair
    queues: "a noisy group cannot hold the others' messages back"). With one key (or none),
    a plain FIFO. O(1) an append or pop; what :meth:`appendleft` gives back goes first.

    A lane that had nothing waiting and gets a message is *new*: new lanes take their first
    turn before the lanes that had turns already (FQ-CoDel's new and old flow lists, RFC 8290
    section 4.1), so that a quiet key's message does not wait behind each backlogged key's
    next one. Old lanes still get one turn in every :data:`MAX_NEW_STREAK` + 1 while any
    waits, so a stream of ever-new keys cannot hold them back for good.

    An ID may be listed twice or go stale (removed meanwhile): the dequeue checks each one it
    pops."""

    __slots__ = ("_lanes", "_n", "_new", "_old", "_streak")

    def __init__(self) -> None:
        self._lanes: dict[str | None, deque[str]] = {}
        #: the keys whose lanes have not had a turn since they got messages, the first first
        self._new: deque[str | None] = deque()
        #: the other keys with messages, the next turn's first
        self._old: deque[str | None] = deque()
        #: turns in a row taken by new lanes while old ones waited
        self._streak = 0
        self._n = 0

    def _lane(self, key: str | None, *, front: bool) -> deque[str]:
        lane = self._lanes.get(key)
        if lane is None:
            if key is not None and len(self._lanes) >= MAX_FAIR_KEYS:
                key = f"\x00{zlib.crc32(key.encode()) % OVERFLOW_LANES}"
                lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = deque()
                if front:
                    self._new.appendleft(key)
                else:
                    self._new.append(key)
                return lane
        if front and not (self._new and self._new[0] == key):
            if key in self._new:
                self._new.remove(key)
            else:
                self._old.remove(key)
            self._new.appendleft(key)
        return lane

    def append(self, mid: str, key: str | None = None) -> None:
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lane(key, front=False)
        lane.append(mid)
        self._n += 1

    def extend(self, mids: list[str]) -> None:
        """:meth:`append` of each of ``mids``, keyless."""
        if not mids:
            return
        lane = self._lanes.get(None)
        if lane is None:
            lane = self._lane(None, front=False)
        lane.extend(mids)
        self._n += len(mids)

    def appendleft(self, mid: str, key: str | None = None) -> None:
        """Give back ``mid``: it goes first (its lane's turn is next)."""
        self._lane(key, front=True).appendleft(mid)
        self._n += 1

    def _next_is_new(self) -> bool:
        return bool(self._new) and (not self._old or self._streak < MAX_NEW_STREAK)

    def popleft(self) -> str:
        """The next turn's message. Raises IndexError when there is none."""
        if self._next_is_new():
            new = self._new
            key = new.popleft()
            lane = self._lanes[key]
            mid = lane.popleft()
            self._streak = self._streak + 1 if self._old else 0
            if lane:
                self._old.append(key)
            else:
                del self._lanes[key]
        else:
            old = self._old
            key = old[0]
            lane = self._lanes[key]
            mid = lane.popleft()
            self._streak = 0
            if not lane:
                old.popleft()
                del self._lanes[key]
            elif len(old) > 1:
                old.rotate(-1)
        self._n -= 1
        return mid

    def take(self, n: int) -> list[str]:
        """Up to ``n`` messages, in the order :meth:`popleft` would give them. With one lane (no
        fairness key, or one), a run taken from it at once; else a :meth:`popleft` each."""
        if len(self._lanes) != 1:
            out: list[str] = []
            while self._lanes and len(out) < n:
                out.append(self.popleft())
            return out
        if n <= 0:
            return []
        ((key, lane),) = self._lanes.items()
        k = min(n, len(lane))
        out = [lane.popleft() for _ in range(k)]
        # As k pops of the one lane: its key goes to the old lanes after its first turn, and
        # leaves them with its last message.
        if self._new:
            self._new.popleft()
            if lane:
                self._old.append(key)
        if not lane:
            if self._old:
                self._old.popleft()
            del self._lanes[key]
        self._streak = 0
        self._n -= k
        return out

    def __getitem__(self, i: int) -> str:
        """``[0]``: the next turn's message, without taking it (IndexError when there is none)."""
        if i != 0:
            raise IndexError(i)
        return self._lanes[(self._new if self._next_is_new() else self._old)[0]][0]

    def __iter__(self) -> Iterator[str]:
        for key in (*self._new, *self._old):
            yield from self._lanes[key]

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return bool(self._lanes)

    @property
    def keyed(self) -> bool:
        """Some waiting message has a fairness key (a lane other than the keyless one)."""
        return len(self._lanes) > (1 if None in self._lanes else 0)
