"""Appending to a partition: block allocation, the head pointer and the message writes.

The writer holds the enqueue ID (the head block and its next free index). A message goes into
a block only after the block is stored and the head pointer names it, both under the fence of
the owner's epoch, so a new owner finds every block that holds a confirmed message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from queues.engine import archive_journal, keys
from queues.engine.blocks import BlockState
from queues.engine.ids import StoredMessage
from queues.engine.ports import Routes, WriterState
from queues.engine.tree import BLOCK_SEAL_S, Block, head_record, next_block_size
from queues.errors import LeaseLost, PartitionUnavailable
from queues.kv.base import Fenced, KVError, ReplicationError

log = logging.getLogger(__name__)


class Writer:
    """Stores messages in one partition (:meth:`enqueue`) and makes them deliverable.

    Allocates blocks in the partition's tree and adds them to its blocks (local, in allocation
    order), writes them and the head pointer (the store's head record, then the row), then the
    messages; once written, each goes to the cursors (``order``: :meth:`Ordering.route_new
    <queues.engine.ordering.Ordering.route_new>`). The enqueue position (the head block's next
    index) is the state's ``next_index``. ``p``: the partition's state, as :class:`WriterState
    <queues.engine.ports.WriterState>`; ``clock``: the manager's monotonic clock (a grown head is
    sealed :data:`BLOCK_SEAL_S` after its allocation; the fence's confirmation).
    """

    def __init__(self, p: WriterState, order: Routes, clock: Callable[[], float]):
        self.p = p
        self.order = order
        self.clock = clock
        #: new messages may go into the head block. Not at first: the head found at open was
        #: an earlier owner's, which may have used any of its positions and can write no more
        #: (fenced), so this owner's messages go into a fresh block.
        self.head_writable = False
        #: ``clock()`` when this writer allocated the head block (while head_writable).
        self.head_since = 0.0

    def enqueue(self, messages: Sequence[StoredMessage]) -> list[str]:
        """Store ``messages`` in order; their IDs once stored. All or nothing for the caller.

        Positions are reserved under the lock, the messages written without it (so enqueues
        and dequeues on one partition overlap their store round trips), and made deliverable
        under the lock once written. A new block is written, and the head pointer moved,
        while the lock is held: no message may go into a block before the pointer names it.
        """
        p = self.p
        with p.lock:
            p.check_serving()
            if not p.enqueue_ready:
                raise PartitionUnavailable(f"{p.queue}/{p.index} is still loading")
            new_blocks: list[Block] = []
            #: (block, first index, how many): the messages' positions, a run per block
            runs: list[tuple[Block, int, int]] = []
            checkpoint = p.tree.checkpoint()
            head = p.tree.head
            next_index = p.next_index
            writable = self.head_writable
            now = self.clock()
            since = self.head_since
            if writable and head is not None and head.size > p.block_size:
                writable = now - since <= BLOCK_SEAL_S  # else sealed: see BLOCK_SEAL_S
            left = len(messages)
            while left:
                if head is None or not writable or next_index >= head.size:
                    previous = head.size if head is not None else None
                    filled_in = now - since if writable and head is not None else None
                    head = p.tree.allocate(next_block_size(p.block_size, p.block_growth, previous, filled_in))
                    new_blocks.append(head)
                    next_index = 0
                    writable = True
                    since = now
                n = min(left, head.size - next_index)
                runs.append((head, next_index, n))
                next_index += n
                left -= n
            if new_blocks:
                writes = [(keys.block_key(p.queue, p.index, b.id), b.to_bytes()) for b in new_blocks]
                # The head record last (the file store renames in order), in the same fenced write:
                # the store leads to the block whatever happens to the row.
                writes.append((keys.head_key(p.queue, p.index), head_record(p.lease.epoch, new_blocks[-1].id)))
                outages: tuple[type[Exception], ...] = (KVError, *p.row.outages)
                try:
                    p.store.put_many(writes, fence=p.fence)
                    # Durable pointer before any message goes into the new block: a new owner
                    # must find every block that holds a confirmed message.
                    p.row.set_head(new_blocks[-1].id)
                except (Fenced, LeaseLost) as exc:
                    raise p.lost(exc) from exc
                except outages as exc:
                    # The store or the database is down or did not answer (an outage): the new
                    # blocks are forgotten, so no later block points at one that may not be
                    # stored, and the partition goes on serving once the stores are back. A
                    # block written whose pointer was not (or whose pointer was written but
                    # not confirmed) names the old head as its previous: a new owner reading
                    # either pointer finds every confirmed message. Nothing went into them.
                    p.tree.rollback(checkpoint)
                    if isinstance(exc, KVError):
                        raise PartitionUnavailable(f"{p.queue}/{p.index}: store write failed: {exc}") from exc
                    raise
                except Exception:
                    # Anything else: the tree in memory may be ahead of the store, and a later
                    # block must never point at one that was not stored. Close; the node
                    # reopens from the store.
                    p.close()
                    raise
                self._adopt_blocks(new_blocks)
            self.head_writable, p.next_index = True, next_index
            if new_blocks:
                self.head_since = now
            states = [(p.blocks[b.id], n) for b, _, n in runs]
            for state, n in states:
                state.pending += n
            base = p.lease.epoch << 32
            messages = [msg.with_sequence(base | (p.seq_counter + k + 1)) for k, msg in enumerate(messages)]
            p.seq_counter += len(messages)
        ids = [mid for b, start, n in runs for mid in keys.message_keys(p.queue, p.index, b.id, start, n)]
        items = [(mid, msg.to_bytes()) for mid, msg in zip(ids, messages)]
        if p.archive == "all":  # the journal entries go in the same (atomic) write
            items += archive_journal.entries(p.queue, p.index, items)
        started = self.clock()
        try:
            p.store.put_many(items, fence=p.fence)
        except BaseException as exc:
            if not isinstance(exc, (Fenced, KVError)):
                with p.lock:
                    for state, n in states:
                        state.pending -= n
                raise
            if isinstance(exc, ReplicationError):
                # Written on the primary only: take it back, so that nothing unconfirmed is
                # ever delivered (by us, or by an owner that scans this block later).
                try:
                    p.store.delete_many([key for key, _ in items])
                except KVError:
                    log.error("%s/%s: could not take back unreplicated messages", p.queue, p.index)
            with p.lock:
                for state, n in states:
                    state.pending -= n  # the positions are burnt
                if isinstance(exc, Fenced):
                    raise p.lost(exc) from exc
            raise PartitionUnavailable(f"{p.queue}/{p.index}: store write failed: {exc}") from exc
        with p.lock:
            p.confirmed(started)
            if p.closed:
                # Closed while we wrote (a failure elsewhere): the next owner, under a newer
                # epoch, finds the messages if they were stored; do not confirm them here.
                for state, n in states:
                    state.pending -= n
                raise PartitionUnavailable(f"{p.queue}/{p.index} closed during the write; retry")
            p.cache.put_many(zip(ids, messages))
            done = 0
            for (_, start, n), (state, _) in zip(runs, states):
                state.pending -= n
                state.live.update(range(start, start + n))
                state.newest = max(state.newest, *(m.enqueued_at for m in messages[done : done + n]))
                done += n
            self.order.route_many(ids, runs, messages)
            p.enqueued_total += len(ids)
        p.counters.enqueued(p.queue, len(ids))
        p.on_change()
        return ids

    def _adopt_blocks(self, new_blocks: list[Block]) -> None:
        """The blocks just stored join the partition's, after its own. Lock held."""
        p = self.p
        if p.local_order:
            p.local_order[-1].sealed = True  # the previous head
        for b in new_blocks:
            state = BlockState(b, set(), sealed=b is not new_blocks[-1], scanned=False)
            p.blocks[b.id] = state
            p.local_order.append(state)
