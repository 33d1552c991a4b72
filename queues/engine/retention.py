"""Removing what a partition no longer keeps: messages past retention, and emptied blocks.

Retention (:meth:`Retention.expire`) removes a block's messages once its newest is older than
the queue's retention, from every subscription; on a topic it works through
``queues.engine.topic_retention``, which keeps what slow subscriptions still hold in the archive.
Pruning (:meth:`Pruner.prune`) deletes fully acknowledged blocks from the front of the
allocation order, after every ack and removal.
"""

from __future__ import annotations

from collections import deque

from queues.engine import keys
from queues.engine.blocks import BlockState
from queues.engine.ids import parse_message_id
from queues.engine.ports import ExpiresTopic, PrunerState, Prunes, Removes, RetentionState, Routes
from queues.kv.base import Fenced, KVError


class Pruner:
    """Deletes one partition's emptied blocks: in allocation order (those scanned at open,
    then the owner's own), from the front. ``p``: the partition's state, as :class:`PrunerState
    <queues.engine.ports.PrunerState>`."""

    def __init__(self, p: PrunerState):
        self.p = p

    def prune(self) -> None:
        """Delete fully acknowledged blocks from the front of the allocation order. Lock held.

        Only a prefix of the allocation order is ever pruned (see ``queues.engine.tree``): a block goes
        when it and every older block are sealed and empty, and never while it is the head.
        On a topic a block is empty when no subscription holds any of its messages.
        """
        p = self.p
        head_id = p.tree.head.id if p.tree.head is not None else None
        doomed: list[BlockState] = []

        def take(order: deque[BlockState]) -> bool:
            for state in order:
                if state.live or state.pending or not state.sealed or state.block.id == head_id:
                    return False
                doomed.append(state)
            return True

        if take(p.scanned_order) and p.unscanned is None:
            take(p.local_order)
        if not doomed:
            return
        try:
            p.store.delete_many([keys.block_key(p.queue, p.index, s.block.id) for s in doomed], fence=p.fence)
        except Fenced as exc:
            raise p.lost(exc) from exc
        except KVError:
            return  # try again at the next ack
        for s in doomed:
            order = p.scanned_order if s.scanned else p.local_order
            order.popleft()
            del p.blocks[s.block.id]
            p.tree.forget(s.block.id)


class Retention:
    """Expires one partition's messages past retention, from every cursor. ``p``: the
    partition's state, as :class:`RetentionState <queues.engine.ports.RetentionState>`;
    ``remover``: deletes from the store (a queue's); ``order``: forgets them in each cursor;
    ``pruner``: deletes the emptied blocks; ``topic``: a topic's retention."""

    def __init__(self, p: RetentionState, remover: Removes, order: Routes, pruner: Prunes, topic: ExpiresTopic):
        self.p = p
        self.remover = remover
        self.order = order
        self.pruner = pruner
        self.topic = topic

    def expire(self, cutoff: float) -> int:
        """Remove messages of blocks whose newest message is older than ``cutoff`` (retention),
        from every subscription; on a topic that archives, move the ones a subscription still
        holds to the archive instead (see ``queues.engine.topic_retention``).

        Works a block at a time from the oldest, so a message outlives its retention by at
        most the time its block took to fill (a grown block: at most BLOCK_SEAL_S). Returns how
        many were removed.
        """
        p = self.p
        with p.lock:
            p.check_serving()
            doomed: list[str] = []
            for state in [*p.scanned_order, *p.local_order]:
                if state.newest >= cutoff or state.pending:
                    break
                bucket = keys.block_bucket(p.queue, p.index, state.block.id)
                doomed.extend(f"{bucket}/{i}" for i in sorted(state.live))
        if not doomed:
            return 0
        if p.is_topic:
            return self.topic.expire(doomed)
        parsed = [mid for mid in (parse_message_id(d) for d in doomed) if mid is not None]
        removed = self.remover.delete(parsed, journal=False)
        with p.lock:
            for c in p.readers:
                self.order.forget(c, doomed)
            p.drop_stored(doomed)
            p.expired_total += removed
            p.counters.expired(p.queue, removed)
            self.pruner.prune()
        return removed
