"""A partition's figures, read from its state: the counts the node publishes
(:class:`PartitionStats`), one block's positions for the console (:class:`BlockListing`), and
the hints the node's sibling processes and long polls wait on (:meth:`Figures.waiting_since`,
:meth:`Figures.next_wakeup`). Nothing here changes the state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from queues.engine import keys
from queues.engine.keys import block_and_index
from queues.engine.ports import FiguresState


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
    opened_in: dict[str, float]
    #: a topic's figures per subscription (``{name: {...}}``): held (not acked yet, in flight
    #: included), in_flight, archived (held, only in the archive), acked, redelivered,
    #: dequeue_id and oldest_enqueued_at (epoch seconds, of the oldest held; None: none held).
    cursors: dict[str, dict[str, Any]]


#: A message's states in :meth:`PartitionManager.block_messages`, for each reader: ``ready`` (to
#: be delivered: its turn, its group's or its visibility's came), ``in_flight`` (delivered, not
#: acknowledged, hidden until its visibility timeout), ``delayed`` (its delay has not passed),
#: ``dead_letter`` (received too often: on its way to the dead-letter queue), ``gone`` (not held
#: by the reader: acknowledged, expired, moved, or a position never written).
MESSAGE_STATES = ("ready", "in_flight", "delayed", "dead_letter", "gone")
#: The most positions one block listing names (a block holds up to ``tree.MAX_BLOCK_SIZE``).
BLOCK_LISTING_MAX = 1000


class BlockMessage(TypedDict):
    id: str
    index: int
    #: reader (``""``: a queue's) -> one of :data:`MESSAGE_STATES`
    states: dict[str, str]
    #: reader -> deliveries so far (readers that delivered it)
    receive_counts: NotRequired[dict[str, int]]
    #: reader -> seconds until an in-flight message is visible again
    visible_in: NotRequired[dict[str, float]]
    #: its stored record is a stub: its body is in the archive (a topic's retention)
    archived: NotRequired[bool]


class BlockListing(TypedDict):
    block: str
    ordinal: int
    height: int
    size: int
    #: positions written so far (the head block's next index; ``size`` for the others)
    used: int
    #: positions some reader still holds
    live: int
    created_age: float
    head: bool
    messages: list[BlockMessage]
    #: positions written beyond those listed
    more: int
    #: the owner holds no such live block, and has blocks found at its open still to read:
    #: it may be one of them (``queues.service.blocks``)
    unscanned: NotRequired[bool]


class Figures:
    """Reads one partition's figures (see the module's text). ``p``: the partition's state;
    ``clock``: the manager's monotonic clock."""

    def __init__(self, p: FiguresState, clock: Callable[[], float]):
        self.p = p
        self.clock = clock

    def stats(self) -> PartitionStats:
        p = self.p
        with p.lock:
            now = self.clock()
            for c in p.readers:
                c.redelivery.advance(now)  # (the count read without the lock walks only what came due since)
            live = sum(len(s.live) for s in p.blocks.values())
            ordered = [*p.scanned_order, *p.local_order]
            in_flight = p.in_flight_count(now)
            head = p.tree.head
            oldest = next((s.block.created_at for s in ordered if s.live), None)
            first = ""
            cursors = {}
            if p.is_topic:
                for c in p.readers:
                    cursors[c.name] = {
                        "held": c.held_count(),
                        "in_flight": c.redelivery.in_flight_count(now),
                        "archived": sum(
                            len(live & p.blocks[b].archived)
                            for b, live in c.live.items()
                            if b in p.blocks and p.blocks[b].archived
                        ),
                        "acked": c.acked_total,
                        "redelivered": c.redelivered_total,
                        "dequeue_id": (c.scanned_ready or c.ready or [""])[0],
                        "oldest_enqueued_at": min(
                            (p.blocks[b].block.created_at for b, live in c.live.items() if live and b in p.blocks),
                            default=None,
                        ),
                    }
            else:
                c = p.cursors[""]
                first = (c.scanned_ready or c.ready or [""])[0]
            return PartitionStats(
                queue=p.queue,
                index=p.index,
                epoch=p.lease.epoch,
                head_block=head.id if head else "",
                enqueue_id=keys.message_key(p.queue, p.index, head.id, p.next_index) if head else "",
                dequeue_id=first,
                visible=max(live - in_flight, 0),
                in_flight=in_flight,
                delayed=len(set().union(*(c.not_due for c in p.readers))),
                depth_exact=p.unscanned is None,
                live_blocks=len(p.blocks),
                tree_height=max((h for _, h in p.tree.roots), default=-1) + 1,
                oldest_enqueued_at=oldest,
                enqueued_total=p.enqueued_total,
                acked_total=p.acked_total,
                redelivered_total=p.redelivered_total,
                opened_in=p.opened_in,
                cursors=cursors,
            )

    def block_messages(self, block_id: str, limit: int = BLOCK_LISTING_MAX) -> BlockListing | None:
        """What each position of live block ``block_id`` holds, for the console: its message
        ID and its state (:data:`MESSAGE_STATES`) for each reader (``""``: a queue's; a
        topic's subscriptions by name), the first ``limit`` positions. None when this manager
        holds no such live block: none of its messages is held (acknowledged, expired or
        purged), or it was found at the open and is not scanned yet (:attr:`unscanned`). Takes
        the lock; O(positions listed)."""
        p = self.p
        with p.lock:
            state = p.blocks.get(block_id)
            if state is None:
                return None
            block = state.block
            head = p.tree.head
            used = p.next_index if head is not None and head.id == block_id else block.size
            now, wall = self.clock(), p.wall()
            messages: list[BlockMessage] = []
            dead = {c.name: {mid for mid, _ in c.dead} for c in p.readers if c.dead}
            for i in range(min(used, max(limit, 0))):
                mid = keys.message_key(p.queue, p.index, block_id, i)
                states: dict[str, str] = {}
                receives: dict[str, int] = {}
                visible_in: dict[str, float] = {}
                for c in p.readers:
                    if not c.holds(p.blocks, block_id, i):
                        states[c.name] = "gone"
                        continue
                    entry = c.redelivery.get(mid)
                    if mid in dead.get(c.name, ()):
                        states[c.name] = "dead_letter"
                    elif entry is not None and entry.deadline > now:
                        states[c.name] = "in_flight"
                        if entry.deadline != float("inf"):  # (inf: an ack in progress)
                            visible_in[c.name] = round(entry.deadline - now, 3)
                    elif mid in c.not_due:
                        states[c.name] = "delayed"
                    else:
                        states[c.name] = "ready"
                    count = entry.receive_count if entry is not None else c.receives.get(mid, 0)
                    if count:
                        receives[c.name] = count
                item: BlockMessage = {"id": mid, "index": i, "states": states}
                if receives:
                    item["receive_counts"] = receives
                if visible_in:
                    item["visible_in"] = visible_in
                if i in state.archived:
                    item["archived"] = True
                messages.append(item)
            return {
                "block": block_id,
                "ordinal": block.ordinal,
                "height": block.height,
                "size": block.size,
                "used": used,
                "live": len(state.live),
                "created_age": round(max(wall - block.created_at, 0.0), 3),
                "head": head is not None and head.id == block_id,
                "messages": messages,
                "more": max(used - len(messages), 0),
            }

    def keyed(self, sub: str = "") -> bool:
        """Some message waiting for ``sub`` has a fairness key. A hint, read without the lock."""
        c = self.p.cursors.get(sub)
        return c is not None and (c.ready.keyed or c.scanned_ready.keyed)

    def waiting_since(self, sub: str = "") -> tuple[float | None, float | None]:
        """``(oldest, due)``: the wall time the oldest message this manager could deliver to
        ``sub`` now has waited since (None: none), and the monotonic time its next message in
        flight comes due (None: none; past: due now).

        Read without the lock, for the node's sibling processes (``queues.cluster.siblings``):
        a hint that may be a moment old, or name a message that turns out not deliverable (a
        delayed one, one acknowledged meanwhile); a reader that acts on it finds out."""
        p = self.p
        c = p.cursors.get(sub)
        if c is None or p.closed or not p.dequeue_ready:
            return None, None
        oldest: float | None = p.wall() if p.unscanned is not None else None
        for waiting in (c.unblocked, c.scanned_ready, c.ready):
            try:
                mid = waiting[0]
            except (IndexError, KeyError):  # empty, or emptied under us (FairLanes)
                continue
            message = p.cache.get(mid)
            if message is not None:
                since = message.enqueued_at
            else:
                state = p.blocks.get(block_and_index(mid)[0])
                since = state.block.created_at if state is not None else p.wall()
            oldest = since if oldest is None else min(oldest, since)
        now = self.clock()
        due = c.redelivery.next_deadline()
        if due == float("-inf"):  # changed under us: due now, as far as a hint goes
            due = now
        try:
            delayed = c.delayed[0][0]  # the next delayed message's turn (wall time)
        except IndexError:
            pass
        else:
            turn = now + (delayed - p.wall())
            due = turn if due is None else min(due, turn)
        return oldest, due

    def next_wakeup(self, sub: str | None = None) -> float | None:
        """Monotonic time at which a message the cursor knows of becomes deliverable: an
        in-flight one's visibility timeout runs out, or a delayed one's delay passes (None:
        neither). A long poll sleeps until then at the latest."""
        p = self.p
        cursors = p.readers if sub is None else [p.cursors[sub]] if sub in p.cursors else []
        deadlines = [d for d in (c.redelivery.next_deadline() for c in cursors) if d is not None]
        for c in cursors:  # (read without the lock: a delay taken meanwhile is an early look)
            try:
                turn = c.delayed[0][0]
            except IndexError:
                continue
            deadlines.append(self.clock() + (turn - p.wall()))
        return min(deadlines, default=None)
