"""One leased partition's state: the memory its owner serves it from, and the small rules that
keep that memory true.

The state holds the append tree and the state of each live block (:class:`BlockState`: the
positions still stored, stubs among them, in allocation order: those scanned at open, then the
owner's own), the enqueue position (the head block's next index), one
:class:`~queues.engine.cursor.Cursor` per reader (``""`` for a queue, one per subscription for
a topic), the fence of the lease's epoch, the lock, the counters, and the store and the node's
body cache it writes and reads through. It does nothing of its own beyond the checks every
collaborator shares (:meth:`PartitionState.check_serving`, :meth:`PartitionState.lost`, ...):
the writer, the takeover, delivery, acks, retention and the figures (``queues.engine.*``) change
it, each through the narrow protocol of ``queues.engine.ports`` that names what it may touch.
``queues.engine.partition.PartitionManager`` is this state with those collaborators attached.

Lock: ``lock`` guards all of it and is held across the store writes that decide what a reader
sees (new blocks and the head pointer, a subscription's ack, retention's stubs), so memory
never runs ahead of the store. Methods that say "Lock held" expect the caller to hold it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from queues.engine import keys
from queues.engine.blocks import BlockState
from queues.engine.body_cache import BodyCache
from queues.engine.cursor import Cursor, SubscriptionSpec
from queues.engine.host import NO_COUNTERS, Counters, Lease, LeaseRow
from queues.engine.ids import StoredMessage
from queues.engine.keys import Positioned, block_and_index
from queues.engine.tree import AppendTree, Block
from queues.errors import NotServedHere, PartitionUnavailable
from queues.kv.base import Fence, KeyValueStore, KVError

log = logging.getLogger(__name__)

#: the lease a manager is built for: the node's (``queues.cluster.leases.Lease``), which the node reads
#: back from its managers.
LeaseT = TypeVar("LeaseT", bound=Lease, covariant=True)


class PartitionState(Generic[LeaseT]):
    """The memory of one leased partition (see the module's text). Built for a lease just
    claimed: empty, not ready for enqueues or dequeues until the takeover opens it."""

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
        self.lease = lease
        self.queue = lease.queue
        self.index = lease.index
        self.block_size = block_size
        #: a busy partition's blocks grow up to this many times ``block_size`` (tree.next_block_size).
        self.block_growth = block_growth
        self.store = store
        self.node_id = node_id
        self.cache = cache
        #: the lease's row: the durable head pointer and epoch.
        self.row = row
        #: called when messages may have become deliverable (wakes the long polls).
        self.on_change = on_change
        #: called once, when the partition is closed (:meth:`close`), after it stopped serving:
        #: the node reports it (``queues.cluster.ownership``). Whoever closes it, the node or a
        #: collaborator after a failure, closes it through :meth:`close`.
        self.on_close = on_close
        self.counters = counters
        self.fence = Fence(keys.fence_key(self.queue, self.index), lease.epoch)
        #: ``monotonic()`` before the store last confirmed ``fence`` (see :data:`FENCE_TRUST`);
        #: never, before the open raised it.
        self.fence_confirmed_at = float("-inf")
        self.lock = threading.Lock()
        self.tree = AppendTree(block_size)
        #: the head block's next free index: with the head, the enqueue ID (the writer's).
        self.next_index = 0
        #: live blocks whose positions are known, by id; their ``live`` sets are the positions
        #: still stored (held by at least one cursor, or by none yet on a topic).
        self.blocks: dict[str, BlockState] = {}
        #: The same blocks in allocation order: first those scanned (found in the store at open,
        #: every one older than any this manager allocates), then this manager's own.
        self.scanned_order: deque[BlockState] = deque()
        self.local_order: deque[BlockState] = deque()
        #: the blocks found at open and not scanned yet, oldest first (None: all scanned).
        self.unscanned: Iterator[Block] | None = None
        #: a topic's subscriptions (fixed for the manager's life: a change reopens it).
        self.subscriptions: tuple[SubscriptionSpec, ...] | None = (
            tuple(subscriptions) if subscriptions is not None else None
        )
        if self.subscriptions is None:
            self.cursors = {"": Cursor("", shared=True)}
        else:
            self.cursors = {
                s.name: Cursor(s.name, shared=False, starts_at=s.starts_at, max_receives=s.max_receives)
                for s in self.subscriptions
            }
        #: every cursor, in one list.
        self.readers = list(self.cursors.values())
        self.enqueue_ready = False
        self.dequeue_ready = False
        #: stopped serving (:meth:`close`): a plain attribute, read on every call. Closed by the
        #: node (lease lost or given up, queue deleted or purged) or after a store failure that
        #: left memory and store apart; a closed partition is never reopened.
        self.closed = False
        self.enqueued_total = 0
        self.dead_lettered_total = 0
        self.expired_total = 0
        #: seconds and block reads of the last open, for the failover figures.
        self.opened_in: dict[str, float] = {}
        #: the last sequence number given (its low 32 bits; the epoch is the high ones).
        self.seq_counter = 0
        #: the queue's archive mode ("none", "all", "acked"): which journal entries we write.
        self.archive = "none"
        #: writes ``(message id, record)`` pairs to the archive table, returning once they are
        #: committed (``archive.archiver.store_records``); None: retention cannot keep stubs.
        self.archive_sink = archive_sink
        #: ``{message id: record}`` of those archived (``archive.archiver.lookup``).
        self.archive_source = archive_source
        #: messages retention moved to the archive, kept as stubs for slow subscriptions
        #: (``queues.engine.topic_retention``).
        self.archived_total = 0
        #: stubs whose archive row was gone, so never delivered
        #: (see ``TopicRetention.bodies_from_archive``).
        self.archive_missing_total = 0
        #: the wall clock (delays, ages); a test may set another.
        self.wall = time.time

    # --- readers ------------------------------------------------------------------------------
    @property
    def is_topic(self) -> bool:
        return self.subscriptions is not None

    def cursor(self, sub: str = "") -> Cursor:
        """The cursor of ``sub`` (a queue's: ""). Raises NotServedHere for a subscription of a
        queue, PartitionUnavailable for one this topic's manager was not built with (yet)."""
        c = self.cursors.get(sub)
        if c is None:
            if not self.is_topic:
                raise NotServedHere(f"{self.queue} is a queue, it has no subscription {sub!r}")
            raise PartitionUnavailable(
                f"{self.queue}/{self.index}: subscription {sub!r} is not loaded on this node yet; retry"
            )
        return c

    @property
    def acked_total(self) -> int:
        return sum(c.acked_total for c in self.readers)

    @property
    def redelivered_total(self) -> int:
        return sum(c.redelivered_total for c in self.readers)

    def in_flight_count(self, now: float) -> int:
        """Messages in flight at ``now``, every cursor's."""
        return sum(c.redelivery.in_flight_count(now) for c in self.readers)

    # --- guards -------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop serving: every call is refused from now on (:attr:`closed`). By the node (lease
        lost or given up, queue deleted or purged) or by a collaborator after a failure; the
        first close calls :attr:`on_close`. Called with the lock held (the node takes it too)."""
        if not self.closed:
            self.closed = True
            self.on_close()

    def check_serving(self) -> None:
        """Raise PartitionUnavailable unless the partition serves: open, and its lease valid."""
        if self.closed:
            raise PartitionUnavailable(f"{self.queue}/{self.index} is closed on this node")
        if not self.lease.valid():
            raise PartitionUnavailable(f"{self.queue}/{self.index}: lease expired on this node")

    def confirmed(self, started: float) -> None:
        """The store confirmed the fence by a read or fenced write begun at ``started``."""
        if started > self.fence_confirmed_at:
            self.fence_confirmed_at = started

    def lost(self, exc: Exception) -> PartitionUnavailable:
        """Close after a fenced write or a moved fence (another owner now); the error to raise."""
        log.warning("%s/%s: giving up ownership: %s", self.queue, self.index, exc)
        self.close()
        return PartitionUnavailable(f"{self.queue}/{self.index} changed owner; retry")

    # --- what is stored and held --------------------------------------------------------------
    def is_live(self, c: Cursor, mid: str) -> bool:
        """``c``'s reader still holds ``mid`` (not acknowledged by it). Lock held."""
        block_id, idx = block_and_index(mid)
        return c.holds(self.blocks, block_id, idx)

    def stored(self, mid: str) -> bool:
        """``mid`` is still stored. Lock held."""
        block_id, idx = block_and_index(mid)
        state = self.blocks.get(block_id)
        return state is not None and idx in state.live

    def held(self, mid: str) -> bool:
        """Some cursor still holds ``mid``. Lock held."""
        return any(self.is_live(c, mid) for c in self.readers)

    def is_stub(self, mid: str) -> bool:
        """``mid``'s stored record is a stub: its body is in the archive only. Lock held."""
        block_id, idx = block_and_index(mid)
        state = self.blocks.get(block_id)
        return state is not None and idx in state.archived

    def waits_for_scan(self, mid: str) -> bool:
        """``mid`` is in a block of this manager's while blocks found at open are unscanned:
        an older message of its group may be in one of them. Lock held."""
        state = self.blocks.get(mid.rsplit("/", 2)[1])
        return self.unscanned is not None and state is not None and not state.scanned

    def drop_stored(self, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> None:
        """Memory of messages no longer stored (block live sets, cache). Lock held. ``where``:
        each one's ``(block id, index)``, when the caller has them already."""
        self.cache.discard_many(mids)
        for block_id, idx in where if where is not None else map(block_and_index, mids):
            state = self.blocks.get(block_id)
            if state is not None:
                state.live.discard(idx)
                state.archived.discard(idx)

    def mark_stubs(self, mids: Sequence[str]) -> None:
        """``mids``' stored records were replaced by stubs (their bodies are in the archive
        only): no longer kept in the cache. Lock held."""
        for mid in mids:
            block_id, idx = block_and_index(mid)
            self.blocks[block_id].archived.add(idx)
            self.cache.discard(mid)

    def records(self, mids: Sequence[str]) -> dict[str, StoredMessage]:
        """The stored records of ``mids`` (cache, else one batched read; stubs too); gone ones
        left out. Raises PartitionUnavailable when the store cannot be read."""
        out: dict[str, StoredMessage] = {}
        missing = []
        for mid in mids:
            cached = self.cache.get(mid)
            if cached is not None:
                out[mid] = cached
            else:
                missing.append(mid)
        if missing:
            try:
                raws = self.store.get_many(missing)
            except KVError as exc:
                raise PartitionUnavailable(f"{self.queue}/{self.index}: store read failed: {exc}") from exc
            for mid, raw in zip(missing, raws):
                if raw is not None:
                    out[mid] = StoredMessage.from_bytes(raw, mid)
        return out

    # --- keys of a cursor's own records -------------------------------------------------------
    def receives_key(self, c: Cursor, mid: Positioned) -> str:
        """Where ``c``'s receive count of ``mid`` is kept (``queues.engine.keys``)."""
        return keys.receives_key(self.queue, self.index, mid, c.name)

    def ack_key(self, c: Cursor, mid: Positioned) -> str:
        """Where ``c``'s ack marker of ``mid`` is kept (``queues.engine.keys``)."""
        return keys.ack_key(self.queue, self.index, c.name, mid)
