"""The partition manager: one leased partition, held in memory by its owner node.

It keeps the enqueue ID (the head block and its next free index), the dequeue position (the
messages not yet delivered, oldest first) and the redelivery index, and it is the only writer
of its partition in the key-value store while its lease lasts. Every write carries the fence
of its epoch, so a paused owner that wakes after a takeover writes nothing.

Readers: a queue's partition has one *cursor* (its delivery state: dequeue position,
redelivery index, group order, delays, receive counts, dead letters). A topic's partition has
one per subscription, over the same blocks: a message is stored once and removed when no
cursor holds it any more. A subscription's acks of messages others still hold are kept as
markers (``<topic>/<p>/_acks/<subscription>/<block>.<index>``, see ``queues.engine.keys``), so a new
owner knows them.
A subscription's cursor starts at the messages enqueued from its ``starts_at`` on (None: all).

Retention on a topic that archives (mode ``all`` or ``acked``) keeps what slow subscriptions
still hold: the owner makes sure each such message is in the archive table, then replaces its
stored record by a *stub* (times, group, sequence; no body). The stub keeps the position in the
tree, so group order, pruning and a takeover work as for any message; a delivery reads the
body back from the archive (the consensus seed's delivery agent reading from a backing store).
The last subscription's ack removes the stub like a message.

Locking: one lock per partition guards its memory and is held across its store writes, so a
message becomes deliverable only after it is stored. Callers that lock several partitions
take them in index order.

How it is built: the manager is the partition's state (``queues.engine.state.PartitionState``:
its memory and the checks every part shares) with its collaborators attached, one module each,
each seeing the state only as its protocol in ``queues.engine.ports``:
``queues.engine.writer`` (enqueue: block allocation and appends), ``queues.engine.takeover``
(opening after a takeover, scanning the blocks found), ``queues.engine.ordering`` (where each
message's turn comes in each cursor), ``queues.engine.delivery`` (dequeue, redelivery, dead
letters set aside, bodies, give-backs), ``queues.engine.acks`` (receipts, deletes, settling,
visibility), ``queues.engine.retention`` (expiry and pruning; a topic's through
``queues.engine.topic_retention``) and ``queues.engine.figures`` (stats, block listings, wait
hints). This module wires them and keeps the public methods, each a delegation; it is the only
engine module that imports them all, and none of them imports it. What the manager needs of the
node that hosts it (the lease, the lease's row, the counters) comes in as the protocols of
``queues.engine.host``; what it raises is in ``queues.errors`` (re-exported here).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from queues.engine.acks import Acks
from queues.engine.blocks import BlockState
from queues.engine.body_cache import BodyCache
from queues.engine.cursor import Cursor, Delivery, FairLanes, SubscriptionSpec
from queues.engine.delivery import FENCE_TRUST, Deliverer, wait_out_trust
from queues.engine.figures import (
    BLOCK_LISTING_MAX,
    MESSAGE_STATES,
    BlockListing,
    BlockMessage,
    Figures,
    PartitionStats,
)
from queues.engine.host import ANNOUNCE, NO_COUNTERS, Counters, LeaseRow
from queues.engine.ids import MessageId, StoredMessage
from queues.engine.ordering import Ordering
from queues.engine.redelivery import RedeliveryIndex
from queues.engine.retention import Pruner, Retention
from queues.engine.state import LeaseT, PartitionState
from queues.engine.takeover import Takeover
from queues.engine.topic_retention import TopicRetention
from queues.engine.tree import BLOCK_SEAL_S, Block
from queues.engine.writer import Writer
from queues.errors import NotServedHere, PartitionUnavailable, ReceiptMismatch
from queues.kv.base import KeyValueStore

log = logging.getLogger(__name__)

monotonic = time.monotonic


def _monotonic() -> float:
    """:data:`monotonic`, looked up at each call: the collaborators' clock, so that a clock
    set on this module (tests, the failover benchmark) is theirs too."""
    return monotonic()


__all__ = [
    "BLOCK_LISTING_MAX",
    "BLOCK_SEAL_S",
    "FENCE_TRUST",
    "MESSAGE_STATES",
    "BlockListing",
    "BlockMessage",
    "BlockState",
    "BodyCache",
    "Delivery",
    "NotServedHere",
    "PartitionManager",
    "PartitionStats",
    "PartitionUnavailable",
    "ReceiptMismatch",
    "SubscriptionSpec",
    "wait_out_trust",
]


class PartitionManager(PartitionState[LeaseT]):
    """One leased partition of a queue or topic, served from the memory of its owner node.

    It is its state (:class:`~queues.engine.state.PartitionState`: the append tree, the state of
    each live block, the enqueue position, one :class:`~queues.engine.cursor.Cursor` per reader,
    ``""`` for a queue and one per subscription for a topic, the fence, the lock, the counters),
    whose attributes callers read directly, plus the collaborators that change it (see the
    module's text). It writes the partition's keys (``queues.engine.keys``) with the fence of its
    lease's epoch, and bodies go through the node's :class:`~queues.engine.body_cache.BodyCache`.

    Lock: ``lock`` guards all of that memory and is held across the store writes that decide
    what a reader sees (new blocks and the head pointer, a subscription's ack, retention's
    stubs), so memory never runs ahead of the store. Message writes and a queue's deletes run
    outside it. Methods named ``*_locked``, and those whose docstring says "Lock held", expect
    the caller to hold it (``queues.service`` does, across several partitions, in index order).

    Callers: the node runtime (``queues.cluster.node.NodeRuntime``) creates, opens, renews and closes
    managers and publishes their :meth:`stats`; the service layer (``queues.service``) and the
    API call enqueue, dequeue, ack, visibility, expire and dead-letter moves on them.

    Collaborators: :attr:`writer`, :attr:`takeover`, :attr:`ordering`, :attr:`delivery`,
    :attr:`acks`, :attr:`pruner`, :attr:`retention`, :attr:`topic_retention` and :attr:`figures`;
    the methods below delegate to them, so callers need not know which does what.

    Life: built for a lease just claimed; :meth:`open_head` raises the fence and loads the head
    (enqueues may start); :meth:`open_oldest` loads the saved receive counts and scans the oldest
    block (dequeues may start); it then serves until ``closed`` is set, by the node (lease lost or
    given up, queue deleted or purged) or by the manager itself after a store failure that left
    memory and store apart (the node then reopens the partition under a new epoch). A closed
    manager refuses every call with :class:`PartitionUnavailable` and is never reopened.
    """

    def __init__(
        self,
        lease: LeaseT,
        *,
        block_size: int,
        block_growth: int = 1,
        store: KeyValueStore,
        node_id: str,
        cache: BodyCache,
        row: LeaseRow,
        on_change: Callable[[], None] = lambda: None,
        on_close: Callable[[], None] = lambda: None,
        counters: Counters = NO_COUNTERS,
        subscriptions: Sequence[SubscriptionSpec] | None = None,
        archive_sink: Callable[[list[tuple[str, bytes]]], object] | None = None,
        archive_source: Callable[[list[str]], dict[str, StoredMessage]] | None = None,
    ):
        super().__init__(
            lease,
            block_size=block_size,
            block_growth=block_growth,
            store=store,
            node_id=node_id,
            cache=cache,
            row=row,
            on_change=on_change,
            on_close=on_close,
            counters=counters,
            subscriptions=subscriptions,
            archive_sink=archive_sink,
            archive_source=archive_source,
        )
        # The collaborators, each given the state as the protocol it may touch
        # (``queues.engine.ports``) and the others it calls; none imports another.
        self.ordering = Ordering(self)
        self.pruner = Pruner(self)
        self.acks = Acks(self, self.ordering, self.pruner, _monotonic)
        self.topic_retention = TopicRetention(self, self.acks, self.pruner)
        self.retention = Retention(self, self.acks, self.ordering, self.pruner, self.topic_retention)
        self.takeover = Takeover(self, self.ordering, self.pruner, self.acks, _monotonic)
        self.writer = Writer(self, self.ordering, _monotonic)
        self.delivery = Deliverer(self, self.ordering, self.takeover, self.topic_retention, _monotonic)
        self.figures = Figures(self, _monotonic)

    # --- the queue's cursor, for callers that know no subscriptions ---------------------------
    @property
    def redelivery(self) -> RedeliveryIndex:
        return self.cursor().redelivery

    @property
    def ready(self) -> FairLanes:
        return self.cursor().ready

    @property
    def scanned_ready(self) -> FairLanes:
        return self.cursor().scanned_ready

    @property
    def max_receives(self) -> int | None:
        c = self.cursors.get("")
        return c.max_receives if c is not None else None

    @max_receives.setter
    def max_receives(self, value: int | None) -> None:
        c = self.cursors.get("")
        if c is not None:  # a subscription's rule comes with its spec
            c.max_receives = value

    @property
    def group_batch(self) -> bool:
        """Groups are delivered in batches (SQS FIFO: see :attr:`Cursor.group_batch
        <queues.engine.cursor.Cursor.group_batch>`), not one message at a time."""
        return any(c.group_batch for c in self.readers)

    @group_batch.setter
    def group_batch(self, value: bool) -> None:
        for c in self.readers:
            c.group_batch = value

    # --- opening: Takeover ---------------------------------------------------------------------
    def open(self) -> None:
        """Both phases of a takeover, for callers that need not serve in between."""
        self.open_head()
        self.open_oldest()

    def open_head(self) -> None:
        """Fence out earlier owners and load the head: enqueues may start. O(log N) reads."""
        self.takeover.open_head()

    def open_oldest(self) -> None:
        """Reach the oldest live block and the saved receive counts: dequeues may start."""
        self.takeover.open_oldest()

    # --- delivery order: Ordering -------------------------------------------------------------
    def route_new(self, mid: str, block: Block, i: int, message: StoredMessage, *, scanned: bool) -> bool:
        """Give a stored message to every cursor that should read it (see :class:`Ordering
        <queues.engine.ordering.Ordering>`). Lock held. True if any took it."""
        return self.ordering.route_new(mid, block, i, message, scanned=scanned)

    def unblock_group(self, c: Cursor, group: str) -> bool:
        """Let the group's head be delivered if the group has nothing out. Lock held."""
        return self.ordering.unblock_group(c, group)

    def forget(self, c: Cursor, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> bool:
        """Drop removed messages from a cursor. Lock held. True if a group's next message
        became deliverable."""
        return self.ordering.forget(c, mids, where)

    # --- delivery: Deliverer -------------------------------------------------------------------
    def dequeue(self, max_messages: int, visibility: float, sub: str = "") -> list[Delivery]:
        """Up to ``max_messages`` deliveries to ``sub`` (a queue: ""): expired ones first, then
        group heads whose turn came, then the oldest undelivered. Messages past
        ``max_receives`` are set aside for the dead-letter queue instead (see :meth:`take_dead`
        and :meth:`Deliverer.dequeue <queues.engine.delivery.Deliverer.dequeue>`)."""
        return self.delivery.dequeue(max_messages, visibility, sub)

    def take_dead(self, sub: str = "") -> list[tuple[str, int]]:
        """Messages set aside for the dead-letter queue (they stay pinned until acked)."""
        return self.delivery.take_dead(sub)

    def give_back_dead(self, mids: Sequence[str], sub: str = "") -> None:
        """Give back messages set aside by :meth:`take_dead` whose move failed: their
        visibility runs out now, and the next dequeue sets them aside again."""
        self.delivery.give_back_dead(mids, sub)

    def load_bodies(self, deliveries: list[Delivery], sub: str | None = None) -> list[Delivery]:
        """Attach the stored messages (cache, else one batched read; a stub's from the archive);
        drop vanished ones. ``sub`` given, those whose body cannot be read now are given back
        (see :meth:`Deliverer.load_bodies <queues.engine.delivery.Deliverer.load_bodies>`)."""
        return self.delivery.load_bodies(deliveries, sub)

    def give_back(self, deliveries: Sequence[Delivery], sub: str = "") -> None:
        """Undo deliveries that never reached the client: each is deliverable again at once, in
        its place, with the receive count it had."""
        self.delivery.give_back(deliveries, sub)

    # --- enqueue: Writer ----------------------------------------------------------------------
    def enqueue(self, messages: Sequence[StoredMessage]) -> list[str]:
        """Store ``messages`` in order; their IDs once stored. All or nothing for the caller
        (see :meth:`Writer.enqueue <queues.engine.writer.Writer.enqueue>`)."""
        to = ANNOUNCE.to  # who hears of it: a node's tracing, or nobody
        if to is None:
            return self.writer.enqueue(messages)
        with to.storing(self.queue, self.index, len(messages)):
            ids = self.writer.enqueue(messages)
        return ids

    # --- acks and removals: Acks --------------------------------------------------------------
    def ack(self, items: Sequence[tuple[MessageId, str | None]], sub: str = "", *, unexpired: bool = False) -> int:
        """Check receipts (``unexpired``: :meth:`check_receipts`), delete, settle: a whole ack
        on this partition alone (journaled for the archive). Returns how many were still held."""
        return self.acks.ack(items, sub, unexpired=unexpired)

    def remove_dead_lettered(self, items: Sequence[MessageId], sub: str = "") -> int:
        """Remove messages that were moved to the dead-letter queue: like an ack without
        receipts, but not journaled (a dead letter is not acknowledged, so not archived)."""
        return self.acks.remove_dead_lettered(items, sub)

    def check_receipts(
        self, items: Sequence[tuple[MessageId, str | None]], sub: str = "", *, unexpired: bool = False
    ) -> None:
        """Raise :class:`ReceiptMismatch` for the first item whose receipt is not current
        (``unexpired``: nor one whose visibility timeout ran out). Lock held."""
        self.acks.check_receipts(items, sub, unexpired=unexpired)

    def pin_for_ack(self, items: Sequence[MessageId], sub: str = "") -> dict[str, float]:
        """Hold the in-flight ones back from redelivery while their delete runs; their
        deadlines, for :meth:`unpin`. Lock held."""
        return self.acks.pin_for_ack(items, sub)

    def unpin(self, pinned: dict[str, float], sub: str = "") -> None:
        """Give back the deadlines taken by :meth:`pin_for_ack`. Lock held."""
        self.acks.unpin(pinned, sub)

    def delete_acked(self, items: Sequence[MessageId], sub: str = "") -> int:
        """The store half of an ack (journaled); how many were still held. Lock not held."""
        return self.acks.delete_acked(items, sub)

    def delete(self, items: Sequence[MessageId], *, journal: bool, sub: str = "") -> int:
        """Delete messages ``sub`` holds (see :meth:`Acks.delete <queues.engine.acks.Acks.delete>`)."""
        return self.acks.delete(items, journal=journal, sub=sub)

    def settle_acked(self, items: Sequence[MessageId], removed: int, sub: str = "", *, ack: bool = True) -> None:
        """The memory half of an ack, after the delete. Lock held."""
        self.acks.settle_acked(items, removed, sub, ack=ack)

    def remove_everywhere(self, mids: Sequence[str]) -> None:
        """Delete messages that no cursor needs, and forget them everywhere. Lock held."""
        self.acks.remove_everywhere(mids)

    def change_visibility_locked(self, mid: MessageId, receipt: str | None, timeout: float, sub: str = "") -> int:
        """Move the message's visibility deadline to ``timeout`` seconds from now (0: deliverable
        at once); returns its receive count. Lock held."""
        return self.acks.change_visibility_locked(mid, receipt, timeout, sub)

    # --- retention: Retention -----------------------------------------------------------------
    def expire(self, cutoff: float) -> int:
        """Remove messages of blocks whose newest message is older than ``cutoff`` (see
        :meth:`Retention.expire <queues.engine.retention.Retention.expire>`); how many were removed."""
        return self.retention.expire(cutoff)

    def prune(self) -> None:
        """Delete fully acknowledged blocks from the front of the allocation order. Lock held."""
        self.pruner.prune()

    # --- figures: Figures ------------------------------------------------------------------------
    def stats(self) -> PartitionStats:
        """The partition's figures, for the node to publish (see :class:`PartitionStats`). Takes the lock."""
        return self.figures.stats()

    def block_messages(self, block_id: str, limit: int = BLOCK_LISTING_MAX) -> BlockListing | None:
        """What each position of live block ``block_id`` holds, per reader, for the console (see
        :meth:`Figures.block_messages <queues.engine.figures.Figures.block_messages>`)."""
        return self.figures.block_messages(block_id, limit)

    def keyed(self, sub: str = "") -> bool:
        """Some message waiting for ``sub`` has a fairness key (a hint, read without the lock)."""
        return self.figures.keyed(sub)

    def waiting_since(self, sub: str = "") -> tuple[float | None, float | None]:
        """``(oldest, due)``: the wall time the oldest deliverable message has waited since, and
        the monotonic time the next one in flight comes due (None: none). A hint, read without the lock."""
        return self.figures.waiting_since(sub)

    def next_wakeup(self, sub: str | None = None) -> float | None:
        """Monotonic time at which a message in flight or delayed becomes deliverable."""
        return self.figures.next_wakeup(sub)
