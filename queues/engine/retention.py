"""Removing what a partition no longer keeps: messages past retention, and emptied blocks.

Retention (:meth:`Retention.expire`) removes a block's messages once its newest is older than
the queue's retention, from every subscription; on a topic it works through
``queues.engine.topic_retention``, which keeps what slow subscriptions still hold in the archive.
Pruning (:meth:`Retention.prune`) deletes fully acknowledged blocks from the front of the
allocation order, after every ack and removal.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from queues.engine import keys, topic_retention
from queues.engine.blocks import BlockState
from queues.engine.ids import parse_message_id
from queues.kv.base import Fenced, KVError

if TYPE_CHECKING:
    from queues.engine.partition import PartitionManager
    from queues.engine.ports import Lease


class Retention:
    """Expires and prunes one manager's partition: its blocks, in allocation order (those
    scanned at open, then the manager's own), and the messages of its cursors."""

    def __init__(self, manager: PartitionManager[Lease]):
        self.m = manager

    def expire(self, cutoff: float) -> int:
        """Remove messages of blocks whose newest message is older than ``cutoff`` (retention),
        from every subscription; on a topic that archives, move the ones a subscription still
        holds to the archive instead (see ``queues.engine.topic_retention``).

        Works a block at a time from the oldest, so a message outlives its retention by at
        most the time its block took to fill (a grown block: at most BLOCK_SEAL_S). Returns how
        many were removed.
        """
        m = self.m
        with m.lock:
            m.check_serving()
            doomed: list[str] = []
            for state in [*m.scanned_order, *m.local_order]:
                if state.newest >= cutoff or state.pending:
                    break
                bucket = keys.block_bucket(m.queue, m.index, state.block.id)
                doomed.extend(f"{bucket}/{i}" for i in sorted(state.live))
        if not doomed:
            return 0
        if m.is_topic:
            batch = topic_retention.EXPIRE_BATCH
            return sum(topic_retention.expire(m, doomed[k : k + batch]) for k in range(0, len(doomed), batch))
        parsed = [p for p in (parse_message_id(d) for d in doomed) if p is not None]
        removed = m.delete(parsed, journal=False)
        with m.lock:
            for c in m.readers:
                m.forget(c, doomed)
            m.drop_stored(doomed)
            m.expired_total += removed
            m.counters.expired(m.queue, removed)
            self.prune()
        return removed

    def prune(self) -> None:
        """Delete fully acknowledged blocks from the front of the allocation order. Lock held.

        Only a prefix of the allocation order is ever pruned (see ``queues.engine.tree``): a block goes
        when it and every older block are sealed and empty, and never while it is the head.
        On a topic a block is empty when no subscription holds any of its messages.
        """
        m = self.m
        head_id = m.tree.head.id if m.tree.head is not None else None
        doomed: list[BlockState] = []

        def take(order: deque[BlockState]) -> bool:
            for state in order:
                if state.live or state.pending or not state.sealed or state.block.id == head_id:
                    return False
                doomed.append(state)
            return True

        if take(m.scanned_order) and m.unscanned is None:
            take(m.local_order)
        if not doomed:
            return
        try:
            m.store.delete_many([keys.block_key(m.queue, m.index, s.block.id) for s in doomed], fence=m.fence)
        except Fenced as exc:
            raise m.lost(exc) from exc
        except KVError:
            return  # try again at the next ack
        for s in doomed:
            order = m.scanned_order if s.scanned else m.local_order
            order.popleft()
            del m.blocks[s.block.id]
            m.tree.forget(s.block.id)
