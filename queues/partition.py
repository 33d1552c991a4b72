"""The partition manager: one leased partition, held in memory by its owner node.

It keeps the enqueue ID (the head block and its next free index), the dequeue position (the
messages not yet delivered, oldest first) and the redelivery index, and it is the only writer
of its partition in the key-value store while its lease lasts. Every write carries the fence
of its epoch, so a paused owner that wakes after a takeover writes nothing.

Opening after a takeover (:meth:`PartitionManager.open`): raise the fence (moving the epoch
past it when it is ahead: a restored database), read the head (the newer of the row's pointer
and the store's head record, which every new block is written with) and the previous pointers
(O(log N) blocks): enqueues may start, into a fresh block. Then descend
to the oldest live block and scan it: dequeues may start. The other blocks found at open are
*unscanned* until the dequeue position reaches them; each is then read by a *scan* (its
messages, in one batched read), one at a time.

Readers: a queue's partition has one *cursor* (its delivery state: dequeue position,
redelivery index, group order, delays, receive counts, dead letters). A topic's partition has
one per subscription, over the same blocks: a message is stored once and removed when no
cursor holds it any more. A subscription's acks of messages others still hold are kept as
markers (``<topic>/<p>/_acks/<subscription>/<block>.<index>``, see ``queues.keys``), so a new
owner knows them.
A subscription's cursor starts at the messages enqueued from its ``starts_at`` on (None: all).

Retention on a topic that archives (mode ``all`` or ``acked``) keeps what slow subscriptions
still hold: the owner makes sure each such message is in the archive table, then replaces its
stored record by a *stub* (times, group, sequence; no body). The stub keeps the position in the
tree, so group order, pruning and a takeover work as for any message; a delivery reads the
body back from the archive (the consensus seed's delivery agent reading from a backing store).
The last subscription's ack removes the stub like a message. That part of the manager lives
in ``queues.topic_retention``.

Locking: one lock per partition guards its memory and is held across its store writes, so a
message becomes deliverable only after it is stored. Callers that lock several partitions
take them in index order.

Built from: ``queues.cursor`` (a reader's delivery state), ``queues.body_cache`` (the node's
recent bodies), ``queues.keys`` (where everything is stored), ``queues.topic_retention`` and
``queues.errors`` (what it raises, re-exported here).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from django.db import InterfaceError, OperationalError
from sortedcontainers import SortedList

from . import archive_journal, keys, leases, metrics, topic_retention
from .body_cache import BodyCache
from .cursor import Cursor, SubscriptionSpec
from .errors import NotServedHere, PartitionUnavailable, ReceiptMismatch
from .keys import block_and_index
from .kv import Fence, Fenced, KeyValueStore, KVError, ReplicationError
from .messages import MessageId, StoredMessage, new_receipt, parse_message_id
from .redelivery import RedeliveryIndex
from .tree import (
    BLOCK_SEAL_S,
    AppendTree,
    Block,
    BlockReader,
    head_record,
    newest_head,
    next_block_size,
    parse_head_record,
)

log = logging.getLogger(__name__)

monotonic = time.monotonic

#: times an opening owner moves its epoch past a fence ahead of it before it gives up (each
#: try meets a fence raised again meanwhile, which only a row restored under it can cause).
FENCE_ATTEMPTS = 5

#: Seconds a manager delivers on the word of the store's last confirmation that its epoch is
#: still the partition's (its fence read, or a fenced write that went through): past that, a
#: dequeue reads the fence first. Fences alone stop only writes, and a first delivery writes
#: nothing (the ID from memory, the body from the node's cache), so a manager that was not told
#: of a purge or a delete (its owner field already cleared by a purge, the call to it failed,
#: it was still opening) went on delivering what they removed until its next pass. A purge or
#: delete moves the fences, then answers no sooner than this after (:func:`wait_out_trust`):
#: a dequeue made after the answer finds the confirmation too old, reads the moved fence and
#: delivers nothing of the old epoch (or incarnation), on whichever node it lands.
FENCE_TRUST = 0.2


def wait_out_trust(fenced_at: float) -> None:
    """Return once :data:`FENCE_TRUST` has passed since ``fenced_at`` (``time.monotonic()``
    taken after a purge or delete moved fences): from then on no manager of an older epoch
    delivers without reading its fence first."""
    left = fenced_at + FENCE_TRUST - time.monotonic()
    if left > 0:
        time.sleep(left)


__all__ = [
    "BodyCache",
    "Delivery",
    "NotServedHere",
    "PartitionManager",
    "PartitionStats",
    "PartitionUnavailable",
    "ReceiptMismatch",
    "SubscriptionSpec",
]


def _memo(read: BlockReader) -> BlockReader:
    """``read``, each block read once (choosing the head, then loading the tree from it)."""
    seen: dict[str, Block | None] = {}

    def memo(block_id: str) -> Block | None:
        if block_id not in seen:
            seen[block_id] = read(block_id)
        return seen[block_id]

    return memo


@dataclass(slots=True)
class Delivery:
    id: str
    receipt: str
    receive_count: int
    #: filled in after the lock is released (bodies are immutable).
    message: StoredMessage | None = None
    #: the body came from the archive table (retention moved it out of the store).
    from_archive: bool = False


class BlockState:
    """Which positions of a block still hold unacknowledged messages."""

    __slots__ = ("archived", "block", "live", "newest", "pending", "scanned", "sealed")

    def __init__(self, block: Block, live: set[int], *, sealed: bool, scanned: bool):
        self.block = block
        self.live = live
        #: positions reserved by enqueues whose store write has not finished.
        self.pending = 0
        #: enqueue time of the newest message in the block (for retention).
        self.newest = block.created_at
        #: no position will be written any more (not the head, or the head of a dead owner).
        self.sealed = sealed
        #: read by a scan (found in the store at open), rather than written by this manager.
        self.scanned = scanned
        #: live positions whose stored record is a stub: the message is in the archive.
        self.archived: set[int] = set()


@dataclass
class PartitionStats:
    queue: str
    index: int
    epoch: int
    head_block: str
    enqueue_id: str
    dequeue_id: str
    visible: int
    in_flight: int
    #: stored, but their delay (not_before) has not passed.
    delayed: int
    depth_exact: bool
    live_blocks: int
    tree_height: int
    oldest_enqueued_at: float | None
    enqueued_total: int
    acked_total: int
    redelivered_total: int
    opened_in: dict
    #: a topic's figures per subscription (``{name: {...}}``): held (not acked yet, in flight
    #: included), in_flight, archived (held, only in the archive), acked, redelivered,
    #: dequeue_id and oldest_enqueued_at (epoch seconds, of the oldest held; None: none held).
    cursors: dict


class PartitionManager:
    """One leased partition of a queue or topic, served from the memory of its owner node.

    Holds the partition's append tree and the state of each of its blocks (:class:`BlockState`:
    the positions still stored, stubs among them), the enqueue ID (head block, next index), and
    one :class:`~queues.cursor.Cursor` per reader: ``""`` for a queue, one per subscription for
    a topic. It writes the partition's keys (``queues.keys``) with the fence of its lease's
    epoch, and bodies go through the node's :class:`~queues.body_cache.BodyCache`.

    Lock: ``lock`` guards all of that memory and is held across the store writes that decide
    what a reader sees (new blocks and the head pointer, a subscription's ack, retention's
    stubs), so memory never runs ahead of the store. Message writes and a queue's deletes run
    outside it. Methods named ``*_locked``, and those whose docstring says "Lock held", expect
    the caller to hold it (``queues.service`` does, across several partitions, in index order).

    Callers: the node runtime (``queues.node.NodeRuntime``) creates, opens, renews and closes
    managers and publishes their :meth:`stats`; the service layer (``queues.service``) and the
    API call enqueue, dequeue, ack, visibility, expire and dead-letter moves on them.

    Life: built for a lease just claimed; :meth:`open_head` raises the fence and loads the head
    (enqueues may start); :meth:`open_oldest` loads the saved receive counts and scans the oldest
    block (dequeues may start); it then serves until ``closed`` is set, by the node (lease lost or
    given up, queue deleted or purged) or by the manager itself after a store failure that left
    memory and store apart (the node then reopens the partition under a new epoch). A closed
    manager refuses every call with :class:`PartitionUnavailable` and is never reopened.
    """

    def __init__(
        self,
        lease: leases.Lease,
        *,
        block_size: int,
        block_growth: int = 1,
        store: KeyValueStore,
        node_id: str,
        cache: BodyCache,
        on_change: Callable[[], None] = lambda: None,
        set_head: Callable[[leases.Lease, str, str], None] = leases.set_head,
        read_head: Callable[[leases.Lease], str | None] = leases.read_head,
        move_epoch: Callable[[leases.Lease, str, int], None] = leases.move_epoch,
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
        self.on_change = on_change
        self._set_head = set_head
        self._read_head = read_head
        self._move_epoch = move_epoch
        self.fence = Fence(keys.fence_key(self.queue, self.index), lease.epoch)
        #: ``monotonic()`` before the store last confirmed ``fence`` (see :data:`FENCE_TRUST`);
        #: never, before the open raised it.
        self.fence_confirmed_at = float("-inf")
        self.lock = threading.Lock()
        self.tree = AppendTree(block_size)
        #: live blocks whose positions are known, by id; their ``live`` sets are the positions
        #: still stored (held by at least one cursor, or by none yet on a topic).
        self.blocks: dict[str, BlockState] = {}
        # The same blocks in allocation order: first those scanned (found in the store at open,
        # every one older than any this manager allocates), then this manager's own.
        self.scanned_order: deque[BlockState] = deque()
        self.local_order: deque[BlockState] = deque()
        self.next_index = 0
        self.head_writable = False
        #: ``monotonic()`` when this manager allocated the head block (while head_writable).
        self.head_since = 0.0
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
        self._all = list(self.cursors.values())
        self.enqueue_ready = False
        self.dequeue_ready = False
        self.closed = False
        self.enqueued_total = 0
        self.dead_lettered_total = 0
        self.expired_total = 0
        #: seconds and block reads of the last open, for the failover figures.
        self.opened_in: dict = {}
        self.seq_counter = 0
        #: the queue's archive mode ("none", "all", "acked"): which journal entries we write.
        self.archive = "none"
        #: writes ``(message id, record)`` pairs to the archive table, returning once they are
        #: committed (``archive.archiver.store_records``); None: retention cannot keep stubs.
        self.archive_sink = archive_sink
        #: ``{message id: record}`` of those archived (``archive.archiver.lookup``).
        self.archive_source = archive_source
        #: messages retention moved to the archive, kept as stubs for slow subscriptions
        #: (``queues.topic_retention``).
        self.archived_total = 0
        #: stubs whose archive row was gone, so never delivered
        #: (see ``topic_retention.bodies_from_archive``).
        self.archive_missing_total = 0
        self.wall = time.time

    # --- the queue's cursor, for callers that know no subscriptions ---------------------------
    @property
    def is_topic(self) -> bool:
        return self.subscriptions is not None

    def cursor(self, sub: str = "") -> Cursor:
        c = self.cursors.get(sub)
        if c is None:
            if not self.is_topic:
                raise NotServedHere(f"{self.queue} is a queue, it has no subscription {sub!r}")
            raise PartitionUnavailable(
                f"{self.queue}/{self.index}: subscription {sub!r} is not loaded on this node yet; retry"
            )
        return c

    @property
    def redelivery(self) -> RedeliveryIndex:
        return self.cursor().redelivery

    @property
    def ready(self) -> deque[str]:
        return self.cursor().ready

    @property
    def scanned_ready(self) -> deque[str]:
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
    def acked_total(self) -> int:
        return sum(c.acked_total for c in self._all)

    @property
    def redelivered_total(self) -> int:
        return sum(c.redelivered_total for c in self._all)

    def in_flight_count(self, now: float) -> int:
        """Messages in flight at ``now``, every cursor's."""
        return sum(c.redelivery.in_flight_count(now) for c in self._all)

    # --- keys of a cursor's own records -------------------------------------------------------
    def _receives_key(self, c: Cursor, mid: MessageId) -> str:
        return keys.receives_key(self.queue, self.index, mid, c.name)

    def _ack_key(self, c: Cursor, mid: MessageId) -> str:
        return keys.ack_key(self.queue, self.index, c.name, mid)

    # --- opening ------------------------------------------------------------------------------
    def _read_block(self, block_id: str) -> Block | None:
        raw = self.store.get(keys.block_key(self.queue, self.index, block_id))
        return Block.from_bytes(raw) if raw is not None else None

    def open(self) -> None:
        """Both phases of a takeover, for callers that need not serve in between."""
        self.open_head()
        self.open_oldest()

    def open_head(self) -> None:
        """Fence out earlier owners and load the head: enqueues may start. O(log N) reads."""
        self._t0 = monotonic()
        with self.lock:
            self._raise_fence()
            self._confirmed(self._t0)
            # The head as the row and the store hold it now: read after the fence, so that no
            # earlier owner can move either since. The store's head record was written with the
            # blocks under the fence; the row may be behind it (a database restored from a
            # backup, or rebuilt from the queue descriptions): the newer wins (newest_head).
            row_head = self._read_head(self.lease)
            record = parse_head_record(self.store.get(keys.head_key(self.queue, self.index)))
            read = _memo(self._read_block)
            head_id = newest_head(row_head, record, read)
            if head_id != row_head:
                log.warning(
                    "%s/%s: the row's head %s is not the newest: loading %s, the store's (restored database?)",
                    self.queue,
                    self.index,
                    row_head,
                    head_id,
                )
                self._set_head(self.lease, self.node_id, head_id or "")  # for the admin, a purge
            self.tree = AppendTree.load(head_id, read, self.block_size)
            # The old head is sealed: an earlier owner may have used any of its positions, and
            # it can write no more (fenced), so new messages go into a fresh block.
            self.head_writable = False
            if self.tree.head is not None:
                # A generator: no read yet, but from now on local blocks wait behind it.
                self.unscanned = self.tree.iter_from_oldest(self._read_block, upto=self.tree.head.ordinal)
            self.enqueue_ready = True
        self.opened_in = {"enqueue_ready_s": monotonic() - self._t0, "head_reads": self.tree.reads}

    def _raise_fence(self) -> None:
        """Raise the fence to our epoch, or move our epoch past the fence. Lock held.

        A fence at or ahead of our epoch means the row forgot epochs the store remembers: a
        database restored from a backup, a store left by an earlier deployment of the same
        queue names, an owner whose row change was rolled back. Whoever was given such an epoch
        may still be writing, so we share none of them: we move our row past the fence
        (compare-and-set on the epoch we hold) and raise the fence to the new epoch, which we
        then hold alone. One claim pass however far ahead the fence is (it used to cost a
        lease period per epoch behind). Raises LeaseLost if the row is no longer ours.
        """
        for _ in range(FENCE_ATTEMPTS):
            held = self.store.raise_fence(self.fence.key, self.lease.epoch)
            if held < self.lease.epoch:
                return
            log.warning(
                "%s/%s: the fence is at epoch %s, ours is %s (restored database?): moving to %s",
                self.queue,
                self.index,
                held,
                self.lease.epoch,
                held + 1,
            )
            self._move_epoch(self.lease, self.node_id, held + 1)
            self.fence = Fence(self.fence.key, self.lease.epoch)
        raise leases.LeaseLost(f"{self.queue}/{self.index}: a newer epoch fenced us at open")

    def open_oldest(self) -> None:
        """Reach the oldest live block (O(log N) more reads) and the saved receive counts (and a
        topic's ack markers): dequeues may start. Enqueues run meanwhile (they take the lock
        between steps)."""
        with self.lock:
            for c in self._all:
                self._load_receives(c)
        with self.lock:
            if self.unscanned is not None and not self.scanned_order:
                self._scan()
            self.dequeue_ready = True
        self.opened_in.update(dequeue_ready_s=monotonic() - self._t0, oldest_reads=self.tree.reads)
        log.info("opened %s/%s epoch %s: %s", self.queue, self.index, self.lease.epoch, self.opened_in)

    def _load_receives(self, c: Cursor) -> None:
        """A cursor's saved receive counts and, for a subscription, its ack markers (their
        names say it all: ``<block id>.<index>``)."""
        bucket = keys.receives_bucket(self.queue, self.index, c.name)
        names = self.store.scan(bucket)
        for name, raw in zip(names, self.store.get_many([f"{bucket}/{n}" for n in names])):
            pos = keys.parse_position(name)
            if raw is not None and pos is not None:
                c.receives[keys.message_key(self.queue, self.index, *pos)] = int(raw)
        if not c.shared:
            for name in self.store.scan(keys.acks_bucket(self.queue, self.index, c.name)):
                pos = keys.parse_position(name)
                if pos is not None:
                    c.acked.add(keys.message_key(self.queue, self.index, *pos))

    def _scan(self) -> bool:
        """Scan the next unscanned block and route its messages. One store scan and one batched
        read.

        The records are read (not only the keys) because a message's group and delay decide
        where it goes; the bodies land in the cache for the delivery that follows. Any failure
        closes the manager: the block iterator cannot resume after an error, and a block
        skipped here would be pruned later and lost. The node reopens the partition from the
        store under a new epoch.
        """
        try:
            return self._scan_once()
        except Exception:
            self.closed = True
            raise

    def _scan_once(self) -> bool:
        while self.unscanned is not None:
            block = next(self.unscanned, None)
            if block is None:
                self.unscanned = None
                for c in self._all:
                    c.acked.clear()  # every marker has met its message by now
                    for group in list(c.groups):
                        self._unblock_group(c, group)  # local heads waited for the unscanned blocks
                self._prune()  # and so were this manager's own emptied blocks
                break
            bucket = keys.block_bucket(self.queue, self.index, block.id)
            live = sorted(int(n) for n in self.store.scan(bucket) if n.isdigit())
            ids = [f"{bucket}/{i}" for i in live]
            records = self.store.get_many(ids) if ids else []
            state = BlockState(block, set(), sealed=True, scanned=True)
            self.blocks[block.id] = state
            self.scanned_order.append(state)
            done: list[str] = []
            for i, mid, raw in zip(live, ids, records):
                if raw is None:
                    continue  # acknowledged between the scan and the read
                message = StoredMessage.from_bytes(raw)
                state.live.add(i)
                if message.archived:
                    state.archived.add(i)
                state.newest = max(state.newest, message.enqueued_at)
                self.seq_counter = max(self.seq_counter, message.sequence & 0xFFFFFFFF)
                if self._route_new(mid, block, i, message, scanned=True):
                    if not message.archived:  # a stub's body is read from the archive
                        self.cache.put(mid, message)
                elif self._all and all(mid in c.acked for c in self._all if message.subscription in (None, c.name)):
                    done.append(mid)  # acked by every subscription; the owner died before the delete
            if done:
                self._remove_everywhere(done)
            if state.live:
                return True
            self._prune()
        return False

    def _route_new(self, mid: str, block: Block, i: int, message: StoredMessage, *, scanned: bool) -> bool:
        """Give a stored message to every cursor that should read it. Lock held. True if any took it."""
        taken = False
        for c in self._all:
            if not c.shared:
                if mid in c.acked or (c.starts_at is not None and message.enqueued_at < c.starts_at):
                    continue
                if message.subscription is not None and message.subscription != c.name:
                    continue  # a redriven dead letter: only its subscription reads it again
                c.live.setdefault(block.id, set()).add(i)
            self._route(c, mid, (block.ordinal, i), message, scanned=scanned)
            taken = True
        return taken

    def _route(self, c: Cursor, mid: str, pos: tuple[int, int], message: StoredMessage, *, scanned: bool) -> None:
        """Put a stored, undelivered message where its turn will come in ``c``. Lock held."""
        if message.not_before is not None and message.not_before > self.wall():
            heapq.heappush(c.delayed, (message.not_before, mid))
            c.not_due.add(mid)
        if message.group is not None:
            c.group_of[mid] = message.group
            c.groups.setdefault(message.group, SortedList()).add((pos, mid))
            self._unblock_group(c, message.group)
            return
        if mid in c.not_due:
            return
        (c.scanned_ready if scanned else c.ready).append(mid)

    def _unblock_group(self, c: Cursor, group: str) -> None:
        """Let the group's head be delivered if the group has nothing out. Lock held.

        The head is the group's oldest live message. A message this manager enqueued waits
        while blocks found at open are still unscanned: one of them may hold an older message
        of the same group.
        """
        if group in c.group_busy:
            return
        pending = c.groups.get(group)
        if not pending:
            c.groups.pop(group, None)
            return
        (ordinal, _), head = pending[0]
        if head in c.not_due:
            return
        state = self.blocks.get(head.rsplit("/", 2)[1])
        if self.unscanned is not None and state is not None and not state.scanned:
            return
        c.group_busy[group] = head
        c.unblocked.append(head)

    def _unblock_due(self, c: Cursor) -> None:
        """Messages whose delay (not_before) has passed become deliverable. Lock held."""
        now = self.wall()
        while c.delayed and c.delayed[0][0] <= now:
            _, mid = heapq.heappop(c.delayed)
            if mid not in c.not_due:
                continue
            c.not_due.discard(mid)
            group = c.group_of.get(mid)
            if group is not None:
                self._unblock_group(c, group)
            elif self._is_live(c, mid):
                c.ready.append(mid)

    # --- guards -------------------------------------------------------------------------------
    def _check_serving(self) -> None:
        if self.closed:
            raise PartitionUnavailable(f"{self.queue}/{self.index} is closed on this node")
        if not self.lease.valid():
            raise PartitionUnavailable(f"{self.queue}/{self.index}: lease expired on this node")

    def _confirmed(self, started: float) -> None:
        """The store confirmed the fence by a read or fenced write begun at ``started``."""
        if started > self.fence_confirmed_at:
            self.fence_confirmed_at = started

    def _check_fence(self) -> None:
        """Before delivering: unless the store confirmed the epoch within :data:`FENCE_TRUST`,
        read the fence; moved on (a purge, a delete, a takeover), the manager closes and
        delivers nothing. One read per partition per FENCE_TRUST at most, none while enqueues
        (fenced writes) keep confirming it."""
        started = monotonic()
        if started - self.fence_confirmed_at <= FENCE_TRUST or self.closed:
            return  # (closed: refused by _check_serving, no read)
        try:
            current = self.store.read_fence(self.fence.key)
        except KVError as exc:
            raise PartitionUnavailable(f"{self.queue}/{self.index}: store read failed: {exc}") from exc
        if current != self.fence.epoch:
            with self.lock:
                raise self._lost(Fenced(f"fence at {current}, epoch {self.fence.epoch} here"))
        self._confirmed(started)

    def _lost(self, exc: Exception) -> PartitionUnavailable:
        log.warning("%s/%s: giving up ownership: %s", self.queue, self.index, exc)
        self.closed = True
        return PartitionUnavailable(f"{self.queue}/{self.index} changed owner; retry")

    # --- enqueue ------------------------------------------------------------------------------
    def enqueue(self, messages: Sequence[StoredMessage]) -> list[str]:
        """Store ``messages`` in order; their IDs once stored. All or nothing for the caller.

        Positions are reserved under the lock, the messages written without it (so enqueues
        and dequeues on one partition overlap their store round trips), and made deliverable
        under the lock once written. A new block is written, and the head pointer moved,
        while the lock is held: no message may go into a block before the pointer names it.
        """
        with self.lock:
            self._check_serving()
            if not self.enqueue_ready:
                raise PartitionUnavailable(f"{self.queue}/{self.index} is still loading")
            new_blocks: list[Block] = []
            positions: list[tuple[Block, int]] = []
            checkpoint = self.tree.checkpoint()
            head = self.tree.head
            next_index = self.next_index
            writable = self.head_writable
            now = monotonic()
            since = self.head_since
            if writable and head is not None and head.size > self.block_size:
                writable = now - since <= BLOCK_SEAL_S  # else sealed: see BLOCK_SEAL_S
            for _ in messages:
                if head is None or not writable or next_index >= head.size:
                    previous = head.size if head is not None else None
                    filled_in = now - since if writable and head is not None else None
                    head = self.tree.allocate(next_block_size(self.block_size, self.block_growth, previous, filled_in))
                    new_blocks.append(head)
                    next_index = 0
                    writable = True
                    since = now
                positions.append((head, next_index))
                next_index += 1
            if new_blocks:
                writes = [(keys.block_key(self.queue, self.index, b.id), b.to_bytes()) for b in new_blocks]
                # The head record last (the file store renames in order), in the same fenced write:
                # the store leads to the block whatever happens to the row.
                writes.append((keys.head_key(self.queue, self.index), head_record(self.lease.epoch, new_blocks[-1].id)))
                try:
                    self.store.put_many(writes, fence=self.fence)
                    # Durable pointer before any message goes into the new block: a new owner
                    # must find every block that holds a confirmed message.
                    self._set_head(self.lease, self.node_id, new_blocks[-1].id)
                except (Fenced, leases.LeaseLost) as exc:
                    raise self._lost(exc) from exc
                except (KVError, OperationalError, InterfaceError) as exc:
                    # The store or the database is down or did not answer (an outage): the new
                    # blocks are forgotten, so no later block points at one that may not be
                    # stored, and the partition goes on serving once the stores are back. A
                    # block written whose pointer was not (or whose pointer was written but
                    # not confirmed) names the old head as its previous: a new owner reading
                    # either pointer finds every confirmed message. Nothing went into them.
                    self.tree.rollback(checkpoint)
                    if isinstance(exc, KVError):
                        raise PartitionUnavailable(f"{self.queue}/{self.index}: store write failed: {exc}") from exc
                    raise
                except Exception:
                    # Anything else: the tree in memory may be ahead of the store, and a later
                    # block must never point at one that was not stored. Close; the node
                    # reopens from the store.
                    self.closed = True
                    raise
                self._adopt_blocks(new_blocks)
            self.head_writable, self.next_index = True, next_index
            if new_blocks:
                self.head_since = now
            states = [self.blocks[b.id] for b, _ in positions]
            for state in states:
                state.pending += 1
            base = self.lease.epoch << 32
            messages = [m.with_sequence(base | (self.seq_counter + k + 1)) for k, m in enumerate(messages)]
            self.seq_counter += len(messages)
        ids = [keys.message_key(self.queue, self.index, b.id, i) for b, i in positions]
        items = [(mid, m.to_bytes()) for mid, m in zip(ids, messages)]
        if self.archive == "all":  # the journal entries go in the same (atomic) write
            items += archive_journal.entries(self.queue, self.index, items)
        started = monotonic()
        try:
            self.store.put_many(items, fence=self.fence)
        except BaseException as exc:
            if not isinstance(exc, (Fenced, KVError)):
                with self.lock:
                    for state in states:
                        state.pending -= 1
                raise
            if isinstance(exc, ReplicationError):
                # Written on the primary only: take it back, so that nothing unconfirmed is
                # ever delivered (by us, or by an owner that scans this block later).
                try:
                    self.store.delete_many([key for key, _ in items])
                except KVError:
                    log.error("%s/%s: could not take back unreplicated messages", self.queue, self.index)
            with self.lock:
                for state in states:
                    state.pending -= 1  # the positions are burnt
                if isinstance(exc, Fenced):
                    raise self._lost(exc) from exc
            raise PartitionUnavailable(f"{self.queue}/{self.index}: store write failed: {exc}") from exc
        with self.lock:
            self._confirmed(started)
            if self.closed:
                # Closed while we wrote (a failure elsewhere): the next owner, under a newer
                # epoch, finds the messages if they were stored; do not confirm them here.
                for state in states:
                    state.pending -= 1
                raise PartitionUnavailable(f"{self.queue}/{self.index} closed during the write; retry")
            self.cache.put_many(zip(ids, messages))
            for (block, i), state, mid, message in zip(positions, states, ids, messages):
                state.pending -= 1
                state.live.add(i)
                state.newest = max(state.newest, message.enqueued_at)
                self._route_new(mid, block, i, message, scanned=False)
            self.enqueued_total += len(ids)
        metrics.child(metrics.ENQUEUED, self.queue).inc(len(ids))
        self.on_change()
        return ids

    def _adopt_blocks(self, new_blocks: list[Block]) -> None:
        if not new_blocks:
            return
        if self.local_order:
            self.local_order[-1].sealed = True  # the previous head
        for b in new_blocks:
            state = BlockState(b, set(), sealed=b is not new_blocks[-1], scanned=False)
            self.blocks[b.id] = state
            self.local_order.append(state)

    # --- dequeue ------------------------------------------------------------------------------
    def dequeue(self, max_messages: int, visibility: float, sub: str = "") -> list[Delivery]:
        """Up to ``max_messages`` deliveries to ``sub`` (a queue: ""): expired ones first, then
        group heads whose turn came, then the oldest undelivered. Messages past
        ``max_receives`` are set aside for the dead-letter queue instead (see :meth:`take_dead`)."""
        out: list[Delivery] = []
        counts: list[tuple[str, int]] = []
        self._check_fence()
        with self.lock:
            self._check_serving()
            c = self.cursor(sub)
            if not self.dequeue_ready:
                return out
            now = monotonic()
            deadline = now + visibility
            for mid in c.redelivery.expired(now, max_messages):
                if not self._is_live(c, mid):
                    c.redelivery.remove(mid)
                    continue
                entry = c.redelivery.get(mid)
                assert entry is not None  # due() lists only entries of the index
                if c.max_receives is not None and entry.receive_count >= c.max_receives:
                    c.redelivery.change_deadline(mid, float("inf"))  # pinned until moved
                    c.dead.append((mid, entry.receive_count))
                    continue
                receipt = new_receipt()
                count = entry.receive_count + 1
                c.redelivery.add(mid, deadline, receipt, count)
                c.redelivered_total += 1
                metrics.child(metrics.REDELIVERED, self.queue, sub).inc()
                counts.append((mid, count))
                out.append(Delivery(mid, receipt, count))
            self._unblock_due(c)
            scans = 0
            try:
                while len(out) < max_messages:
                    if c.unblocked:
                        mid = c.unblocked.popleft()
                    elif c.scanned_ready:
                        mid = c.scanned_ready.popleft()
                    elif self.unscanned is not None and scans < 8:
                        scans += 1
                        self._scan()
                        continue
                    elif c.ready:
                        mid = c.ready.popleft()
                    else:
                        break
                    if self._is_live(c, mid) and mid not in c.redelivery and mid not in c.not_due:
                        delivery = self._deliver_first(c, mid, deadline)
                        if delivery is not None:
                            out.append(delivery)
                            if delivery.receive_count > 1:
                                counts.append((mid, delivery.receive_count))
            except KVError as exc:
                # The manager is closed (see _scan): what it took is handed out by
                # the next owner, not here.
                raise PartitionUnavailable(f"{self.queue}/{self.index}: store read failed: {exc}") from exc
            for mid, count in counts:
                c.receives[mid] = count
        if counts:
            self._save_receives(c, counts)
        if out:
            metrics.child(metrics.DELIVERED, self.queue, sub).inc(len(out))
        return out

    def _save_receives(self, c: Cursor, counts: list[tuple[str, int]]) -> None:
        """Persist receive counts of redeliveries. A count lost here makes it at most the
        deliveries in flight at a crash too low; first deliveries are never written."""
        items = []
        for mid, count in counts:
            parsed = parse_message_id(mid)
            if parsed is not None:
                items.append((self._receives_key(c, parsed), str(count).encode()))
        try:
            self.store.put_many(items, fence=self.fence)
        except KVError as exc:
            log.warning("%s/%s: receive counts not saved: %s", self.queue, self.index, exc)

    def take_dead(self, sub: str = "") -> list[tuple[str, int]]:
        """Messages set aside for the dead-letter queue (they stay pinned until acked)."""
        with self.lock:
            c = self.cursor(sub)
            dead, c.dead = c.dead, []
        return dead

    def give_back_dead(self, mids: Sequence[str], sub: str = "") -> None:
        """Give back messages set aside by :meth:`take_dead` whose move failed: their
        visibility runs out now, and the next dequeue sets them aside again."""
        with self.lock:
            c = self.cursor(sub)
            now = monotonic()
            for mid in mids:
                if mid in c.redelivery:
                    c.redelivery.change_deadline(mid, now)

    def _deliver_first(self, c: Cursor, mid: str, deadline: float) -> Delivery | None:
        """First delivery by this owner; the count goes on from one saved before a takeover."""
        count = c.receives.get(mid, 0) + 1
        if c.max_receives is not None and count > c.max_receives:
            c.redelivery.add(mid, float("inf"), new_receipt(), count - 1)
            c.dead.append((mid, count - 1))
            return None
        receipt = new_receipt()
        c.redelivery.add(mid, deadline, receipt, count)
        return Delivery(mid, receipt, count)

    def _is_live(self, c: Cursor, mid: str) -> bool:
        block_id, idx = block_and_index(mid)
        return c.holds(self.blocks, block_id, idx)

    def load_bodies(self, deliveries: list[Delivery], sub: str | None = None) -> list[Delivery]:
        """Attach the stored messages (cache, else one batched read; a stub's from the archive);
        drop vanished ones.

        ``sub``: the cursor the deliveries were made for (a queue's is ""). Given, deliveries
        whose body cannot be read now are given back to it (:meth:`give_back`) rather than left
        hidden until their visibility runs out: a store failure gives back all of them and
        raises, an archive failure only the stubs, and the others are delivered. Without it
        (moving dead letters), any failure raises.
        """
        try:
            records = self._records([d.id for d in deliveries])
        except PartitionUnavailable:
            if sub is not None:
                self.give_back(deliveries, sub)
            raise
        vanished, stubs = [], []
        for d in deliveries:
            d.message = records.get(d.id)
            if d.message is None:
                vanished.append(d.id)
            elif d.message.archived:
                stubs.append(d)
        if stubs:
            try:
                topic_retention.bodies_from_archive(self, stubs)
            except PartitionUnavailable as exc:
                if sub is None:
                    raise
                log.warning("%s", exc)
                for d in stubs:
                    d.message = None
                self.give_back(stubs, sub)
        if vanished:
            # Removed behind our back (acknowledged at a previous owner before our scan saw it
            # gone, a purge): forget it rather than keep it in flight for ever.
            with self.lock:
                for c in self._all:
                    self._forget(c, vanished)
                self._drop_stored(vanished)
        return [d for d in deliveries if d.message is not None]

    def give_back(self, deliveries: Sequence[Delivery], sub: str = "") -> None:
        """Undo deliveries that never reached the client: each is deliverable again at once, in
        its place, with the receive count it had (so a failure of ours never brings a message
        closer to the dead-letter queue). One acknowledged or redelivered since is left alone."""
        with self.lock:
            c = self.cursors.get(sub)
            if c is None:
                return
            for d in reversed(deliveries):  # each goes to the front: keep their order
                entry = c.redelivery.get(d.id)
                if entry is None or entry.receipt != d.receipt:
                    continue
                c.redelivery.remove(d.id)
                if d.receive_count > 1:
                    c.receives[d.id] = d.receive_count - 1
                else:
                    c.receives.pop(d.id, None)
                if not self._is_live(c, d.id):
                    continue
                group = c.group_of.get(d.id)
                if group is not None:
                    if c.group_busy.get(group) == d.id:  # still the group's turn
                        c.unblocked.appendleft(d.id)
                    continue
                state = self.blocks.get(block_and_index(d.id)[0])
                (c.scanned_ready if state is not None and state.scanned else c.ready).appendleft(d.id)
        self.on_change()

    # --- ack and visibility -------------------------------------------------------------------
    def check_receipts(self, items: Sequence[tuple[MessageId, str | None]], sub: str = "") -> None:
        """Raise :class:`ReceiptMismatch` for the first item whose receipt is not current. Lock held."""
        c = self.cursor(sub)
        for mid, receipt in items:
            if receipt is None:
                continue
            entry = c.redelivery.get(str(mid))
            if entry is None:
                raise ReceiptMismatch(str(mid), "not in flight (never delivered, or already acknowledged)")
            if entry.receipt != receipt:
                raise ReceiptMismatch(str(mid), "the receipt is from an earlier delivery")

    def pin_for_ack(self, items: Sequence[MessageId], sub: str = "") -> dict[str, float]:
        """Hold the in-flight ones back from redelivery while their delete runs. Lock held.

        Returns their deadlines, for :meth:`unpin` if the delete fails.
        """
        redelivery = self.cursor(sub).redelivery
        pinned = {}
        for mid in items:
            key = str(mid)
            if key not in pinned:
                deadline = redelivery.pin(key)
                if deadline is not None:
                    pinned[key] = deadline
        return pinned

    def unpin(self, pinned: dict[str, float], sub: str = "") -> None:
        """Give back the deadlines taken by :meth:`pin_for_ack`. Lock held."""
        c = self.cursor(sub)
        for key, deadline in pinned.items():
            if key in c.redelivery:
                c.redelivery.change_deadline(key, deadline)

    def delete_acked(self, items: Sequence[MessageId], sub: str = "") -> int:
        """The store half of an ack: journaled for the archive (if the queue archives), then
        deleted. Returns how many were still held (a queue: stored). See :meth:`_delete`."""
        return self._delete(items, journal=True, sub=sub)

    def _delete(self, items: Sequence[MessageId], *, journal: bool, sub: str = "") -> int:
        """Delete messages ``sub`` holds. ``journal``: it is an ack, which the archive journal
        records; removals that are no ack (retention, a move to the dead-letter queue) are not
        archived.

        A queue's runs without the lock. A subscription's decides, under the lock, whether
        another subscription still holds each message: then only its marker is written, else
        the message goes (with the others' markers). The lock is held across those writes, so
        two subscriptions acking one message cannot both leave it to the other; a failure
        closes the manager, which the node reopens from the store.
        """
        c = self.cursor(sub)
        if not c.shared:
            return self._delete_by_subscription(c, items, journal)
        counts = [self._receives_key(c, m) for m in items if str(m) in c.receives]
        try:
            if journal and self.archive != "none":
                entries = archive_journal.on_ack(
                    self.store, self.cache, self.queue, self.index, self.archive, items, self.wall()
                )
                self.store.put_many(entries, fence=self.fence)
            # Fenced like every write: a stale owner's delete would leave the new owner holding a
            # live message that is gone (in flight for ever, its group blocked).
            removed = self.store.delete_many([str(m) for m in items], fence=self.fence)
            if counts:
                self.store.delete_many(counts, fence=self.fence)
            return removed
        except Fenced as exc:
            raise self._lost(exc) from exc
        except KVError as exc:
            raise PartitionUnavailable(f"{self.queue}/{self.index}: store delete failed: {exc}") from exc

    def _delete_by_subscription(self, c: Cursor, items: Sequence[MessageId], journal: bool) -> int:
        with self.lock:
            self._check_serving()
            held = [m for m in items if c.holds(self.blocks, m.block, m.index)]
            last: list[MessageId] = []
            shared: list[MessageId] = []
            for m in held:
                others = any(o is not c and o.holds(self.blocks, m.block, m.index) for o in self._all)
                (shared if others else last).append(m)
            try:
                if journal and last and self.archive != "none":
                    entries = archive_journal.on_ack(
                        self.store, self.cache, self.queue, self.index, self.archive, last, self.wall()
                    )
                    self.store.put_many(entries, fence=self.fence)
                if shared:
                    self.store.put_many([(self._ack_key(c, m), b"1") for m in shared], fence=self.fence)
                if last:
                    self._delete_stored([str(m) for m in last])
                counts = [self._receives_key(c, m) for m in held if str(m) in c.receives]
                if counts:
                    self.store.delete_many(counts, fence=self.fence)
            except Fenced as exc:
                raise self._lost(exc) from exc
            except KVError as exc:
                self.closed = True  # memory and store may disagree now: reopen from the store
                raise PartitionUnavailable(f"{self.queue}/{self.index}: store write failed: {exc}") from exc
            for m in held:
                c.live.get(m.block, set()).discard(m.index)
            self._drop_stored([str(m) for m in last])
            return len(held)

    def _delete_stored(self, mids: Sequence[str]) -> None:
        """Delete messages from the store with every subscription's marker and count. Lock held."""
        keys = list(mids)
        if self.is_topic:
            for mid in mids:
                parsed = parse_message_id(mid)
                if parsed is not None:
                    for o in self._all:
                        keys.append(self._ack_key(o, parsed))
                        keys.append(self._receives_key(o, parsed))
        self.store.delete_many(keys, fence=self.fence)

    def _drop_stored(self, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> None:
        """Memory of messages no longer stored (block live sets, cache). Lock held. ``where``:
        each one's ``(block id, index)``, when the caller has them already."""
        self.cache.discard_many(mids)
        for block_id, idx in where if where is not None else map(block_and_index, mids):
            state = self.blocks.get(block_id)
            if state is not None:
                state.live.discard(idx)
                state.archived.discard(idx)

    def _stored(self, mid: str) -> bool:
        block_id, idx = block_and_index(mid)
        state = self.blocks.get(block_id)
        return state is not None and idx in state.live

    def _remove_everywhere(self, mids: Sequence[str]) -> None:
        """Delete messages that no cursor needs, and forget them everywhere. Lock held."""
        try:
            self._delete_stored(mids)
        except Fenced as exc:
            raise self._lost(exc) from exc
        for c in self._all:
            self._forget(c, mids)
        self._drop_stored(mids)

    def settle_acked(self, items: Sequence[MessageId], removed: int, sub: str = "", *, ack: bool = True) -> None:
        """The memory half of an ack, after the delete. Lock held. ``ack=False``: a removal
        that is no ack (a move to the dead-letter queue), left out of ``mq_messages_acked``."""
        c = self.cursor(sub)
        mids = [str(m) for m in items]
        where = [(m.block, m.index) for m in items]  # parsed already: not again per use
        self._forget(c, mids, where)
        if c.shared:
            self._drop_stored(mids, where)
        c.acked_total += removed
        if ack:
            metrics.child(metrics.ACKED, self.queue, sub).inc(removed)
        self._prune()

    def _forget(self, c: Cursor, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> None:
        """Drop acknowledged (or dead-lettered, or expired) messages from a cursor. Lock held.
        ``where``: each one's ``(block id, index)``, when the caller has them already."""
        freed: set[str] = set()
        c.redelivery.remove_many(mids)
        for key, (block_id, idx) in zip(mids, where if where is not None else map(block_and_index, mids)):
            c.receives.pop(key, None)
            c.not_due.discard(key)
            if not c.shared:
                live = c.live.get(block_id)
                if live is not None:
                    live.discard(idx)
                    if not live:
                        del c.live[block_id]
            group = c.group_of.pop(key, None)
            if group is not None:
                pending = c.groups.get(group)
                state = self.blocks.get(block_id)
                if pending is not None and state is not None:
                    pending.discard(((state.block.ordinal, idx), key))
                if c.group_busy.get(group) == key:
                    del c.group_busy[group]
                freed.add(group)
        for group in freed:
            self._unblock_group(c, group)

    def expire(self, cutoff: float) -> int:
        """Remove messages of blocks whose newest message is older than ``cutoff`` (retention),
        from every subscription; on a topic that archives, move the ones a subscription still
        holds to the archive instead (see ``queues.topic_retention``).

        Works a block at a time from the oldest, so a message outlives its retention by at
        most the time its block took to fill (a grown block: at most BLOCK_SEAL_S). Returns how
        many were removed.
        """
        with self.lock:
            self._check_serving()
            doomed: list[str] = []
            for state in [*self.scanned_order, *self.local_order]:
                if state.newest >= cutoff or state.pending:
                    break
                bucket = keys.block_bucket(self.queue, self.index, state.block.id)
                doomed.extend(f"{bucket}/{i}" for i in sorted(state.live))
        if not doomed:
            return 0
        if self.is_topic:
            batch = topic_retention.EXPIRE_BATCH
            return sum(topic_retention.expire(self, doomed[k : k + batch]) for k in range(0, len(doomed), batch))
        parsed = [m for m in (parse_message_id(d) for d in doomed) if m is not None]
        removed = self._delete(parsed, journal=False)
        with self.lock:
            for c in self._all:
                self._forget(c, doomed)
            self._drop_stored(doomed)
            self.expired_total += removed
            metrics.EXPIRED.labels(self.queue).inc(removed)
            self._prune()
        return removed

    def _records(self, mids: Sequence[str]) -> dict[str, StoredMessage]:
        """The stored records of ``mids`` (cache, else one batched read; stubs too); gone ones
        left out."""
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
                    out[mid] = StoredMessage.from_bytes(raw)
        return out

    def ack(self, items: Sequence[tuple[MessageId, str | None]], sub: str = "") -> int:
        """Check receipts, delete, settle: a whole ack on this partition alone (journaled for
        the archive: :meth:`delete_acked`). Returns how many were still held."""
        return self._ack(items, journal=True, sub=sub)

    def remove_dead_lettered(self, items: Sequence[MessageId], sub: str = "") -> int:
        """Remove messages that were moved to the dead-letter queue: like an ack without
        receipts, but not journaled (a dead letter is not acknowledged, so not archived)."""
        return self._ack([(m, None) for m in items], journal=False, sub=sub)

    def _ack(self, items: Sequence[tuple[MessageId, str | None]], *, journal: bool, sub: str) -> int:
        mids = [mid for mid, _ in items]
        with self.lock:
            self._check_serving()
            self.check_receipts(items, sub)
            pinned = self.pin_for_ack(mids, sub)
        try:
            removed = self._delete(mids, journal=journal, sub=sub)
        except PartitionUnavailable:
            with self.lock:
                self.unpin(pinned, sub)
            raise
        with self.lock:
            self.settle_acked(mids, removed, sub, ack=journal)
        return removed

    def change_visibility_locked(self, mid: MessageId, receipt: str | None, timeout: float, sub: str = "") -> int:
        """Move the message's visibility deadline to ``timeout`` seconds from now (0: deliverable
        at once); returns its receive count. Called with ``lock`` held."""
        c = self.cursor(sub)
        key = str(mid)
        entry = c.redelivery.get(key)
        if entry is None or not self._is_live(c, key):
            raise ReceiptMismatch(key, "not in flight (never delivered, or already acknowledged)")
        if receipt is not None and entry.receipt != receipt:
            raise ReceiptMismatch(key, "the receipt is from an earlier delivery")
        if entry.deadline == float("inf"):
            raise ReceiptMismatch(key, "it is being acknowledged or dead-lettered")
        c.redelivery.change_deadline(key, monotonic() + timeout)
        if timeout == 0:
            self.on_change()
        return c.receives.get(key, 1)

    def _prune(self) -> None:
        """Delete fully acknowledged blocks from the front of the allocation order.

        Only a prefix of the allocation order is ever pruned (see ``queues.tree``): a block goes
        when it and every older block are sealed and empty, and never while it is the head.
        On a topic a block is empty when no subscription holds any of its messages.
        """
        head_id = self.tree.head.id if self.tree.head is not None else None
        doomed: list[BlockState] = []

        def take(order: deque[BlockState]) -> bool:
            for state in order:
                if state.live or state.pending or not state.sealed or state.block.id == head_id:
                    return False
                doomed.append(state)
            return True

        if take(self.scanned_order) and self.unscanned is None:
            take(self.local_order)
        if not doomed:
            return
        try:
            self.store.delete_many(
                [keys.block_key(self.queue, self.index, s.block.id) for s in doomed], fence=self.fence
            )
        except Fenced as exc:
            raise self._lost(exc) from exc
        except KVError:
            return  # try again at the next ack
        for s in doomed:
            order = self.scanned_order if s.scanned else self.local_order
            order.popleft()
            del self.blocks[s.block.id]
            self.tree.forget(s.block.id)

    # --- figures ------------------------------------------------------------------------------
    def stats(self) -> PartitionStats:
        with self.lock:
            now = monotonic()
            for c in self._all:
                c.redelivery.advance(now)  # (the count read without the lock walks only what came due since)
            live = sum(len(s.live) for s in self.blocks.values())
            ordered = [*self.scanned_order, *self.local_order]
            in_flight = self.in_flight_count(now)
            head = self.tree.head
            oldest = next((s.block.created_at for s in ordered if s.live), None)
            first = ""
            cursors = {}
            if self.is_topic:
                for c in self._all:
                    cursors[c.name] = {
                        "held": c.held_count(),
                        "in_flight": c.redelivery.in_flight_count(now),
                        "archived": sum(
                            len(live & self.blocks[b].archived)
                            for b, live in c.live.items()
                            if b in self.blocks and self.blocks[b].archived
                        ),
                        "acked": c.acked_total,
                        "redelivered": c.redelivered_total,
                        "dequeue_id": (c.scanned_ready or c.ready or [""])[0],
                        "oldest_enqueued_at": min(
                            (
                                self.blocks[b].block.created_at
                                for b, live in c.live.items()
                                if live and b in self.blocks
                            ),
                            default=None,
                        ),
                    }
            else:
                c = self.cursors[""]
                first = (c.scanned_ready or c.ready or [""])[0]
            return PartitionStats(
                queue=self.queue,
                index=self.index,
                epoch=self.lease.epoch,
                head_block=head.id if head else "",
                enqueue_id=keys.message_key(self.queue, self.index, head.id, self.next_index) if head else "",
                dequeue_id=first,
                visible=max(live - in_flight, 0),
                in_flight=in_flight,
                delayed=len(set().union(*(c.not_due for c in self._all))),
                depth_exact=self.unscanned is None,
                live_blocks=len(self.blocks),
                tree_height=max((h for _, h in self.tree.roots), default=-1) + 1,
                oldest_enqueued_at=oldest,
                enqueued_total=self.enqueued_total,
                acked_total=self.acked_total,
                redelivered_total=self.redelivered_total,
                opened_in=self.opened_in,
                cursors=cursors,
            )

    def next_wakeup(self, sub: str | None = None) -> float | None:
        """Monotonic time at which an in-flight message becomes deliverable again."""
        cursors = self._all if sub is None else [self.cursors[sub]] if sub in self.cursors else []
        deadlines = [d for d in (c.redelivery.next_deadline() for c in cursors) if d is not None]
        return min(deadlines, default=None)
