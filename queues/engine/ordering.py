"""Where each stored message's turn comes, in each cursor: routing new and scanned messages,
group turns, delays, and forgetting what was removed.

A cursor (``queues.engine.cursor``) delivers, in this order, group heads whose turn came
(``unblocked``), then messages found by a scan (``scanned_ready``), then the owner's own
(``ready``). A message of a group waits in its group, by position, until every earlier one of
the group is settled; a delayed one waits until its ``not_before`` (wall time) passes. A
message this owner enqueued waits while blocks found at open are unscanned, since one of them
may hold an older message of its group (:meth:`PartitionState.waits_for_scan
<queues.engine.state.PartitionState.waits_for_scan>`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from sortedcontainers import SortedList

from queues.engine.cursor import Cursor
from queues.engine.ids import StoredMessage
from queues.engine.keys import block_and_index
from queues.engine.ports import OrderingState
from queues.engine.tree import Block


class Ordering:
    """Keeps the delivery order of one partition's cursors (see the module's text). Every
    method expects the partition's lock held."""

    def __init__(self, p: OrderingState):
        self.p = p

    def route_new(self, mid: str, block: Block, i: int, message: StoredMessage, *, scanned: bool) -> bool:
        """Give a stored message to every cursor that should read it. Lock held. True if any took it."""
        p = self.p
        taken = False
        for c in p.readers:
            if not c.shared:
                if mid in c.acked or (c.starts_at is not None and message.enqueued_at < c.starts_at):
                    continue
                if message.subscription is not None and message.subscription != c.name:
                    continue  # a redriven dead letter: only its subscription reads it again
                c.live.setdefault(block.id, set()).add(i)
            self._route(c, mid, (block.ordinal, i), message, scanned=scanned)
            taken = True
        return taken

    def route_many(
        self, mids: Sequence[str], runs: Sequence[tuple[Block, int, int]], messages: Sequence[StoredMessage]
    ) -> None:
        """:meth:`route_new` of each message just enqueued (not scanned), in order: ``runs``
        their positions, ``(block, first index, how many)`` a run per block. A queue's
        messages with no group, delay or fairness key join its ready lane as one run. Lock
        held."""
        readers = self.p.readers
        c = readers[0] if len(readers) == 1 and readers[0].shared else None
        plain: list[str] = []  # (only on a queue: c set)
        k = 0
        for block, start, n in runs:
            for i in range(start, start + n):
                mid, message = mids[k], messages[k]
                k += 1
                if c is not None:
                    if message.group is None and message.not_before is None and message.fairness_key is None:
                        plain.append(mid)
                        continue
                    if plain:
                        c.ready.extend(plain)
                        plain = []
                self.route_new(mid, block, i, message, scanned=False)
        if c is not None and plain:
            c.ready.extend(plain)

    def _route(self, c: Cursor, mid: str, pos: tuple[int, int], message: StoredMessage, *, scanned: bool) -> None:
        """Put a stored, undelivered message where its turn will come in ``c``. Lock held."""
        if message.not_before is not None and message.not_before > self.p.wall():
            heapq.heappush(c.delayed, (message.not_before, mid))
            c.not_due.add(mid)
        if message.group is not None:
            c.group_of[mid] = message.group
            c.groups.setdefault(message.group, SortedList()).add((pos, mid))
            self.unblock_group(c, message.group)
            return
        key = message.fairness_key
        if key is not None:
            c.fairness_of[mid] = key
        if mid in c.not_due:
            return
        (c.scanned_ready if scanned else c.ready).append(mid, key)

    def unblock_group(self, c: Cursor, group: str) -> bool:
        """Let the group's head be delivered if the group has nothing out. Lock held. True if
        it did. Heads whose turn came go oldest first (:class:`~queues.engine.cursor.GroupHeads`).

        The head is the group's oldest live message. A message this manager enqueued waits
        while blocks found at open are still unscanned: one of them may hold an older message
        of the same group.
        """
        p = self.p
        if group in c.group_busy or group in c.group_out:
            return False
        pending = c.groups.get(group)
        if not pending:
            c.groups.pop(group, None)
            return False
        position, head = pending[0]
        if head in c.not_due or p.waits_for_scan(head):
            return False
        c.group_busy[group] = head
        c.unblocked.push(position, head)
        return True

    def unblock_due(self, c: Cursor) -> None:
        """Messages whose delay (not_before) has passed become deliverable. Lock held."""
        p = self.p
        now = p.wall()
        while c.delayed and c.delayed[0][0] <= now:
            _, mid = heapq.heappop(c.delayed)
            if mid not in c.not_due:
                continue
            c.not_due.discard(mid)
            group = c.group_of.get(mid)
            if group is not None:
                self.unblock_group(c, group)
            elif p.is_live(c, mid):
                c.ready.append(mid, c.fairness_of.get(mid))

    def forget(self, c: Cursor, mids: Sequence[str], where: Sequence[tuple[str, int]] | None = None) -> bool:
        """Drop acknowledged (or dead-lettered, or expired) messages from a cursor. Lock held.
        ``where``: each one's ``(block id, index)``, when the caller has them already. True if
        a group's next message became deliverable."""
        p = self.p
        freed: set[str] = set()
        c.redelivery.remove_many(mids)
        # What most cursors keep nothing of (receive counts past the first, fairness keys,
        # delays), each emptied at once; a queue's cursor without groups stops there.
        for kept in (c.receives, c.fairness_of):
            if kept:
                for key in mids:
                    kept.pop(key, None)
        if c.not_due:
            c.not_due.difference_update(mids)
        if c.shared and not c.group_of:
            return False
        for key, (block_id, idx) in zip(mids, where if where is not None else map(block_and_index, mids)):
            if not c.shared:
                live = c.live.get(block_id)
                if live is not None:
                    live.discard(idx)
                    if not live:
                        del c.live[block_id]
            group = c.group_of.pop(key, None)
            if group is not None:
                pending = c.groups.get(group)
                state = p.blocks.get(block_id)
                if pending is not None and state is not None:
                    pending.discard(((state.block.ordinal, idx), key))
                if c.group_busy.get(group) == key:
                    del c.group_busy[group]
                batch = c.group_out.get(group)
                if batch is not None:
                    batch.discard(key)
                    if not batch:
                        del c.group_out[group]
                freed.add(group)
        woke = False
        for group in freed:
            woke = self.unblock_group(c, group) or woke
        return woke
