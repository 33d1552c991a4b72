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

from queues.engine import keys
from queues.engine.blocks import BlockState
from queues.engine.cursor import Cursor
from queues.engine.format import read_count
from queues.engine.ids import StoredMessage
from queues.engine.ports import Prunes, Removes, Routes, TakeoverState
from queues.engine.tree import AppendTree, Block, BlockReader, newest_head, parse_head_record
from queues.errors import LeaseLost
from queues.kv.base import Fence

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
    """Opens one partition from the store, and scans the blocks found there.

    It fills the partition's memory (its fence, tree, blocks and cursors) under its lock,
    routing each message found to the cursors (``order``: :meth:`Ordering.route_new
    <queues.engine.ordering.Ordering.route_new>`); ``remover`` deletes what every subscription
    had acknowledged before the owner died, ``pruner`` the blocks a scan found empty. ``p``: the
    partition's state, as :class:`TakeoverState <queues.engine.ports.TakeoverState>`; ``clock``:
    the manager's monotonic clock, for the open's timings and the fence's confirmation.
    """

    def __init__(self, p: TakeoverState, order: Routes, pruner: Prunes, remover: Removes, clock: Callable[[], float]):
        self.p = p
        self.order = order
        self.pruner = pruner
        self.remover = remover
        self.clock = clock
        #: ``clock()`` when the open began.
        self.started = 0.0

    def read_block(self, block_id: str) -> Block | None:
        p = self.p
        key = keys.block_key(p.queue, p.index, block_id)
        raw = p.store.get(key)
        return Block.from_bytes(raw, key) if raw is not None else None

    def open_head(self) -> None:
        """Fence out earlier owners and load the head: enqueues may start. O(log N) reads."""
        p = self.p
        self.started = self.clock()
        with p.lock:
            self._raise_fence()
            p.confirmed(self.started)
            # The head as the row and the store hold it now: read after the fence, so that no
            # earlier owner can move either since. The store's head record was written with the
            # blocks under the fence; the row may be behind it (a database restored from a
            # backup, or rebuilt from the queue descriptions): the newer wins (newest_head).
            row_head = p.row.read_head()
            head_key = keys.head_key(p.queue, p.index)
            record = parse_head_record(p.store.get(head_key), head_key)
            read = _memo(self.read_block)
            head_id = newest_head(row_head, record, read)
            if head_id != row_head:
                log.warning(
                    "%s/%s: the row's head %s is not the newest: loading %s, the store's (restored database?)",
                    p.queue,
                    p.index,
                    row_head,
                    head_id,
                )
                p.row.set_head(head_id or "")  # for the admin, a purge
            p.tree = AppendTree.load(head_id, read, p.block_size)
            # (the old head stays sealed: see Writer, which starts in a fresh block)
            if p.tree.head is not None:
                # A generator: no read yet, but from now on local blocks wait behind it.
                p.unscanned = p.tree.iter_from_oldest(self.read_block, upto=p.tree.head.ordinal)
            p.enqueue_ready = True
        p.opened_in = {"enqueue_ready_s": self.clock() - self.started, "head_reads": p.tree.reads}

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
        p = self.p
        for _ in range(FENCE_ATTEMPTS):
            held = p.store.raise_fence(p.fence.key, p.lease.epoch)
            if held < p.lease.epoch:
                return
            log.warning(
                "%s/%s: the fence is at epoch %s, ours is %s (restored database?): moving to %s",
                p.queue,
                p.index,
                held,
                p.lease.epoch,
                held + 1,
            )
            p.row.move_epoch(held + 1)
            p.fence = Fence(p.fence.key, p.lease.epoch)
        raise LeaseLost(f"{p.queue}/{p.index}: a newer epoch fenced us at open")

    def open_oldest(self) -> None:
        """Reach the oldest live block (O(log N) more reads) and the saved receive counts (and a
        topic's ack markers): dequeues may start. Enqueues run meanwhile (they take the lock
        between steps)."""
        p = self.p
        with p.lock:
            for c in p.readers:
                self._load_receives(c)
        with p.lock:
            if p.unscanned is not None and not p.scanned_order:
                self.scan()
            p.dequeue_ready = True
        p.opened_in.update(dequeue_ready_s=self.clock() - self.started, oldest_reads=p.tree.reads)
        log.info("opened %s/%s epoch %s: %s", p.queue, p.index, p.lease.epoch, p.opened_in)

    def _load_receives(self, c: Cursor) -> None:
        """A cursor's saved receive counts and, for a subscription, its ack markers (their
        names say it all: ``<block id>.<index>``)."""
        p = self.p
        bucket = keys.receives_bucket(p.queue, p.index, c.name)
        names = p.store.scan(bucket)
        for name, raw in zip(names, p.store.get_many([f"{bucket}/{n}" for n in names])):
            pos = keys.parse_position(name)
            if raw is not None and pos is not None:
                c.receives[keys.message_key(p.queue, p.index, *pos)] = read_count(raw, f"{bucket}/{name}")
        if not c.shared:
            for name in p.store.scan(keys.acks_bucket(p.queue, p.index, c.name)):
                pos = keys.parse_position(name)
                if pos is not None:
                    c.acked.add(keys.message_key(p.queue, p.index, *pos))

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
            self.p.close()
            raise

    def _scan_once(self) -> bool:
        p = self.p
        while p.unscanned is not None:
            block = next(p.unscanned, None)
            if block is None:
                p.unscanned = None
                for c in p.readers:
                    c.acked.clear()  # every marker has met its message by now
                    for group in list(c.groups):
                        self.order.unblock_group(c, group)  # local heads waited for the unscanned blocks
                self.pruner.prune()  # and so were this manager's own emptied blocks
                break
            bucket = keys.block_bucket(p.queue, p.index, block.id)
            live = sorted(int(n) for n in p.store.scan(bucket) if n.isdigit())
            ids = [f"{bucket}/{i}" for i in live]
            records = p.store.get_many(ids) if ids else []
            state = BlockState(block, set(), sealed=True, scanned=True)
            p.blocks[block.id] = state
            p.scanned_order.append(state)
            done: list[str] = []
            route = self.order.route_new
            for i, mid, raw in zip(live, ids, records):
                if raw is None:
                    continue  # acknowledged between the scan and the read
                message = StoredMessage.from_bytes(raw, mid)
                state.live.add(i)
                if message.archived:
                    state.archived.add(i)
                state.newest = max(state.newest, message.enqueued_at)
                p.seq_counter = max(p.seq_counter, message.sequence & 0xFFFFFFFF)
                if route(mid, block, i, message, scanned=True):
                    if not message.archived:  # a stub's body is read from the archive
                        p.cache.put(mid, message)
                elif p.readers and all(mid in c.acked for c in p.readers if message.subscription in (None, c.name)):
                    done.append(mid)  # acked by every subscription; the owner died before the delete
            if done:
                self.remover.remove_everywhere(done)
            if state.live:
                return True
            self.pruner.prune()
        return False
