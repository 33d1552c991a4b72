"""Opening a partition after its lease was taken, and scanning the blocks found there.

Opening (:meth:`Takeover.open_head`, then :meth:`Takeover.open_oldest`): raise the fence
(moving the epoch past it when it is ahead: a restored database), read the head (the newer of
the row's pointer and the store's head record, which every new block is written with) and the
previous pointers (O(log N) blocks): enqueues may start, into a fresh block. Then descend to the
oldest live block and scan it: dequeues may start. The other blocks found at open are
*unscanned* until the dequeue position reaches them; each is then read by a *scan*
(:meth:`Takeover.scan`: its messages, in one batched read), one at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from queues.engine import keys
from queues.engine.blocks import BlockState
from queues.engine.cursor import Cursor
from queues.engine.format import read_count
from queues.engine.ids import StoredMessage
from queues.engine.tree import AppendTree, Block, BlockReader, newest_head, parse_head_record
from queues.errors import LeaseLost
from queues.kv.base import Fence

if TYPE_CHECKING:
    from queues.engine.partition import PartitionManager
    from queues.engine.ports import Lease

log = logging.getLogger(__name__)

#: times an opening owner moves its epoch past a fence ahead of it before it gives up (each
#: try meets a fence raised again meanwhile, which only a row restored under it can cause).
FENCE_ATTEMPTS = 5


def _memo(read: BlockReader) -> BlockReader:
    """``read``, each block read once (choosing the head, then loading the tree from it)."""
    seen: dict[str, Block | None] = {}

    def memo(block_id: str) -> Block | None:
        if block_id not in seen:
            seen[block_id] = read(block_id)
        return seen[block_id]

    return memo


class Takeover:
    """Opens one manager's partition from the store, and scans the blocks found there.

    It fills the manager's memory (its fence, tree, blocks and cursors) under the manager's
    lock, routing each message found through :meth:`PartitionManager.route_new`. ``clock``:
    the manager's monotonic clock, for the open's timings and the fence's confirmation.
    """

    def __init__(self, manager: PartitionManager[Lease], clock: Callable[[], float]):
        self.m = manager
        self.clock = clock
        #: ``clock()`` when the open began.
        self.started = 0.0

    def read_block(self, block_id: str) -> Block | None:
        m = self.m
        key = keys.block_key(m.queue, m.index, block_id)
        raw = m.store.get(key)
        return Block.from_bytes(raw, key) if raw is not None else None

    def open_head(self) -> None:
        """Fence out earlier owners and load the head: enqueues may start. O(log N) reads."""
        m = self.m
        self.started = self.clock()
        with m.lock:
            self._raise_fence()
            m.confirmed(self.started)
            # The head as the row and the store hold it now: read after the fence, so that no
            # earlier owner can move either since. The store's head record was written with the
            # blocks under the fence; the row may be behind it (a database restored from a
            # backup, or rebuilt from the queue descriptions): the newer wins (newest_head).
            row_head = m.row.read_head()
            head_key = keys.head_key(m.queue, m.index)
            record = parse_head_record(m.store.get(head_key), head_key)
            read = _memo(self.read_block)
            head_id = newest_head(row_head, record, read)
            if head_id != row_head:
                log.warning(
                    "%s/%s: the row's head %s is not the newest: loading %s, the store's (restored database?)",
                    m.queue,
                    m.index,
                    row_head,
                    head_id,
                )
                m.row.set_head(head_id or "")  # for the admin, a purge
            m.tree = AppendTree.load(head_id, read, m.block_size)
            # (the old head stays sealed: see Writer, which starts in a fresh block)
            if m.tree.head is not None:
                # A generator: no read yet, but from now on local blocks wait behind it.
                m.unscanned = m.tree.iter_from_oldest(self.read_block, upto=m.tree.head.ordinal)
            m.enqueue_ready = True
        m.opened_in = {"enqueue_ready_s": self.clock() - self.started, "head_reads": m.tree.reads}

    def _raise_fence(self) -> None:
        """Raise the fence to our epoch, or move our epoch past the fence. Lock held.

        A fence at or ahead of our epoch means the row forgot epochs the store remembers: a
        database restored from a backup, a store left by an earlier deployment of the same
        queue names, an owner whose row change was rolled back. Whoever was given such an epoch
        may still be writing, so we share none of them: we move our row past the fence
        (compare-and-set on the epoch we hold) and raise the fence to the new epoch, which we
        then hold alone, in one claim pass however far ahead the fence is. Raises LeaseLost if
        the row is no longer ours.
        """
        m = self.m
        for _ in range(FENCE_ATTEMPTS):
            held = m.store.raise_fence(m.fence.key, m.lease.epoch)
            if held < m.lease.epoch:
                return
            log.warning(
                "%s/%s: the fence is at epoch %s, ours is %s (restored database?): moving to %s",
                m.queue,
                m.index,
                held,
                m.lease.epoch,
                held + 1,
            )
            m.row.move_epoch(held + 1)
            m.fence = Fence(m.fence.key, m.lease.epoch)
        raise LeaseLost(f"{m.queue}/{m.index}: a newer epoch fenced us at open")

    def open_oldest(self) -> None:
        """Reach the oldest live block (O(log N) more reads) and the saved receive counts (and a
        topic's ack markers): dequeues may start. Enqueues run meanwhile (they take the lock
        between steps)."""
        m = self.m
        with m.lock:
            for c in m.readers:
                self._load_receives(c)
        with m.lock:
            if m.unscanned is not None and not m.scanned_order:
                self.scan()
            m.dequeue_ready = True
        m.opened_in.update(dequeue_ready_s=self.clock() - self.started, oldest_reads=m.tree.reads)
        log.info("opened %s/%s epoch %s: %s", m.queue, m.index, m.lease.epoch, m.opened_in)

    def _load_receives(self, c: Cursor) -> None:
        """A cursor's saved receive counts and, for a subscription, its ack markers (their
        names say it all: ``<block id>.<index>``)."""
        m = self.m
        bucket = keys.receives_bucket(m.queue, m.index, c.name)
        names = m.store.scan(bucket)
        for name, raw in zip(names, m.store.get_many([f"{bucket}/{n}" for n in names])):
            pos = keys.parse_position(name)
            if raw is not None and pos is not None:
                c.receives[keys.message_key(m.queue, m.index, *pos)] = read_count(raw, f"{bucket}/{name}")
        if not c.shared:
            for name in m.store.scan(keys.acks_bucket(m.queue, m.index, c.name)):
                pos = keys.parse_position(name)
                if pos is not None:
                    c.acked.add(keys.message_key(m.queue, m.index, *pos))

    def scan(self) -> bool:
        """Scan the next unscanned block and route its messages. Lock held. One store scan and
        one batched read; True if the block held live messages.

        The records are read (not only the keys) because a message's group and delay decide
        where it goes; the bodies land in the cache for the delivery that follows. Any failure
        closes the manager: the block iterator cannot resume after an error, and a block
        skipped here would be pruned later and lost. The node reopens the partition from the
        store under a new epoch.
        """
        try:
            return self._scan_once()
        except Exception:
            self.m.close()
            raise

    def _scan_once(self) -> bool:
        m = self.m
        while m.unscanned is not None:
            block = next(m.unscanned, None)
            if block is None:
                m.unscanned = None
                for c in m.readers:
                    c.acked.clear()  # every marker has met its message by now
                    for group in list(c.groups):
                        m.unblock_group(c, group)  # local heads waited for the unscanned blocks
                m.retention.prune()  # and so were this manager's own emptied blocks
                break
            bucket = keys.block_bucket(m.queue, m.index, block.id)
            live = sorted(int(n) for n in m.store.scan(bucket) if n.isdigit())
            ids = [f"{bucket}/{i}" for i in live]
            records = m.store.get_many(ids) if ids else []
            state = BlockState(block, set(), sealed=True, scanned=True)
            m.blocks[block.id] = state
            m.scanned_order.append(state)
            done: list[str] = []
            for i, mid, raw in zip(live, ids, records):
                if raw is None:
                    continue  # acknowledged between the scan and the read
                message = StoredMessage.from_bytes(raw, mid)
                state.live.add(i)
                if message.archived:
                    state.archived.add(i)
                state.newest = max(state.newest, message.enqueued_at)
                m.seq_counter = max(m.seq_counter, message.sequence & 0xFFFFFFFF)
                if m.route_new(mid, block, i, message, scanned=True):
                    if not message.archived:  # a stub's body is read from the archive
                        m.cache.put(mid, message)
                elif m.readers and all(mid in c.acked for c in m.readers if message.subscription in (None, c.name)):
                    done.append(mid)  # acked by every subscription; the owner died before the delete
            if done:
                m.remove_everywhere(done)
            if state.live:
                return True
            m.retention.prune()
        return False
