"""Delivering a partition's messages to a reader: first deliveries, redeliveries once the
visibility runs out, a group's batch, dead letters set aside, bodies loaded, and deliveries
given back.

A dequeue hands out, in this order, messages whose visibility ran out (again, or set aside
for the dead-letter queue once past ``max_receives``), group heads whose turn came (with the
group's next ones in a batch, SQS FIFO), then the oldest undelivered; when the ones it knows
are used up it scans a block found at open. Receive counts of redeliveries are written to the
store (fenced), so a new owner goes on counting; a first delivery writes nothing. Before
delivering, the fence is read unless the store confirmed it within :data:`FENCE_TRUST`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from queues.engine.cursor import Cursor, Delivery
from queues.engine.ids import new_receipt, new_receipts, parse_message_id
from queues.engine.keys import block_and_index
from queues.engine.ports import DeliveryState, ReadsArchive, Routes, Scans
from queues.errors import PartitionUnavailable
from queues.kv.base import Fenced, KVError

log = logging.getLogger(__name__)

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


class Deliverer:
    """Delivers one partition's messages (see the module's text).

    ``p``: the partition's state; ``order``: its cursors' delivery order (group turns, delays,
    forgetting); ``scanner``: the takeover, which scans the next block found at open;
    ``archive``: reads a stub's body back from the archive (a topic's retention); ``clock``:
    the manager's monotonic clock (visibility deadlines, the fence's trust).
    """

    def __init__(
        self, p: DeliveryState, order: Routes, scanner: Scans, archive: ReadsArchive, clock: Callable[[], float]
    ):
        self.p = p
        self.order = order
        self.scanner = scanner
        self.archive = archive
        self.clock = clock

    def check_fence(self) -> None:
        """Before delivering: unless the store confirmed the epoch within :data:`FENCE_TRUST`,
        read the fence; moved on (a purge, a delete, a takeover), the manager closes and
        delivers nothing. One read per partition per FENCE_TRUST at most, none while enqueues
        (fenced writes) keep confirming it."""
        p = self.p
        started = self.clock()
        if started - p.fence_confirmed_at <= FENCE_TRUST or p.closed:
            return  # (closed: refused by check_serving, no read)
        try:
            current = p.store.read_fence(p.fence.key)
        except KVError as exc:
            raise PartitionUnavailable(f"{p.queue}/{p.index}: store read failed: {exc}") from exc
        if current != p.fence.epoch:
            with p.lock:
                raise p.lost(Fenced(f"fence at {current}, epoch {p.fence.epoch} here"))
        p.confirmed(started)

    def dequeue(self, max_messages: int, visibility: float, sub: str = "") -> list[Delivery]:
        """Up to ``max_messages`` deliveries to ``sub`` (a queue: ""): expired ones first, then
        group heads whose turn came, then the oldest undelivered. Messages past
        ``max_receives`` are set aside for the dead-letter queue instead (see :meth:`take_dead`)."""
        p = self.p
        out: list[Delivery] = []
        counts: list[tuple[str, int]] = []
        self.check_fence()
        with p.lock:
            p.check_serving()
            c = p.cursor(sub)
            if not p.dequeue_ready:
                return out
            now = self.clock()
            deadline = now + visibility
            # A batch's message whose visibility ran out goes back to its group, not into
            # ``out``: then another pass lists more, skipping those seen (one delivered again
            # with a visibility of 0 is listed again).
            seen: set[str] = set()
            returned = True
            while returned and len(out) < max_messages:
                returned = False
                for mid in c.redelivery.expired(now, max_messages - len(out) + len(seen)):
                    if mid not in seen:
                        seen.add(mid)
                        returned = self._redeliver(c, mid, deadline, out, counts) or returned
            self.order.unblock_due(c)
            scans = 0
            try:
                while len(out) < max_messages:
                    if c.unblocked:
                        mid = c.unblocked.pop()
                        if c.group_batch:
                            for batched in self._deliver_batch(c, mid, deadline, max_messages - len(out)):
                                out.append(batched)
                                if batched.receive_count > 1:
                                    counts.append((batched.id, batched.receive_count))
                            continue
                    elif c.scanned_ready:
                        mid = c.scanned_ready.popleft()
                    elif p.unscanned is not None and scans < 8:
                        scans += 1
                        self.scanner.scan()
                        continue
                    elif c.ready:
                        # Nothing else waits (delivering these changes none of the above):
                        # a run of the oldest undelivered, as one batch.
                        run = c.ready.take(max_messages - len(out))
                        try:
                            self._deliver_run(c, run, deadline, out, counts)
                        except BaseException:
                            # None of the run is in flight (the index takes it whole, last):
                            # back in front, not lost until the next owner.
                            for mid in reversed(run):
                                c.ready.appendleft(mid, c.fairness_of.get(mid))
                            raise
                        continue
                    else:
                        break
                    if p.is_live(c, mid) and mid not in c.redelivery and mid not in c.not_due:
                        delivery = self._deliver_first(c, mid, deadline)
                        if delivery is not None:
                            out.append(delivery)
                            if delivery.receive_count > 1:
                                counts.append((mid, delivery.receive_count))
            except KVError as exc:
                # The manager is closed (see Takeover.scan): what it took is handed out by
                # the next owner, not here.
                raise PartitionUnavailable(f"{p.queue}/{p.index}: store read failed: {exc}") from exc
            for mid, count in counts:
                c.receives[mid] = count
        if counts:
            self._save_receives(c, counts)
        if out:
            p.counters.delivered(p.queue, sub, len(out))
        return out

    def _deliver_run(
        self, c: Cursor, mids: list[str], deadline: float, out: list[Delivery], counts: list[tuple[str, int]]
    ) -> None:
        """First deliveries of ``mids`` (taken from ``c.ready``, oldest first) into ``out``, as
        :meth:`_deliver_first` of each still held and neither in flight nor delayed: one batch
        of receipts, one insert into the redelivery index. Lock held."""
        redelivery, receives, not_due = c.redelivery, c.receives, c.not_due
        in_flight = redelivery.by_id
        if c.shared:
            blocks = self.p.blocks
            live = set()  # (in a queue's blocks)
            for mid in mids:
                _, block_id, idx = mid.rsplit("/", 2)
                state = blocks.get(block_id)
                if state is not None and int(idx) in state.live:
                    live.add(mid)
        else:
            live = {mid for mid in mids if self.p.is_live(c, mid)}
        firsts: list[str] = []
        firsts_counts: list[int] = []
        limit = c.max_receives
        for mid in mids:
            if mid not in live or mid in in_flight or mid in not_due:
                continue
            live.discard(mid)  # (an ID listed twice goes once)
            count = receives.get(mid, 0) + 1
            if limit is not None and count > limit:
                self._deliver_first(c, mid, deadline)  # set aside for the dead-letter queue
                continue
            firsts.append(mid)
            firsts_counts.append(count)
            if count > 1:
                counts.append((mid, count))
        if firsts:
            receipts = new_receipts(len(firsts))
            redelivery.add_new(firsts, deadline, receipts, firsts_counts)
            out.extend(map(Delivery, firsts, receipts, firsts_counts))

    def _redeliver(
        self, c: Cursor, mid: str, deadline: float, out: list[Delivery], counts: list[tuple[str, int]]
    ) -> bool:
        """Deliver again a message whose visibility ran out (into ``out``), set it aside for the
        dead-letter queue, or, in a batch of its group, give it back to its group (True). Lock
        held."""
        p = self.p
        if not p.is_live(c, mid):
            c.redelivery.remove(mid)
            return False
        entry = c.redelivery.get(mid)
        assert entry is not None  # expired() lists only entries of the index
        if c.max_receives is not None and entry.receive_count >= c.max_receives:
            c.redelivery.change_deadline(mid, float("inf"))  # pinned until moved
            c.dead.append((mid, entry.receive_count))
            return False
        group = c.group_of.get(mid)
        batch = c.group_out.get(group) if group is not None else None
        if group is not None and batch is not None and mid in batch:
            # Back in its place in the group, with the deliveries it had: the group's turn
            # comes again once the batch's others are settled too, and it goes in order.
            c.redelivery.remove(mid)
            c.receives[mid] = entry.receive_count
            c.redelivered_total += 1
            p.counters.redelivered(p.queue, c.name)
            batch.discard(mid)
            if not batch:
                del c.group_out[group]
                self.order.unblock_group(c, group)
            return True
        receipt = new_receipt()
        count = entry.receive_count + 1
        c.redelivery.add(mid, deadline, receipt, count)
        c.redelivered_total += 1
        p.counters.redelivered(p.queue, c.name)
        counts.append((mid, count))
        out.append(Delivery(mid, receipt, count))
        return False

    def _deliver_batch(self, c: Cursor, head: str, deadline: float, room: int) -> list[Delivery]:
        """The group's head whose turn came, then the group's next messages in order, up to
        ``room``: one batch, which holds the group until each of them is settled (see
        :attr:`Cursor.group_batch <queues.engine.cursor.Cursor.group_batch>`). Lock held.

        It stops at a message that cannot go yet (delayed, in flight, or possibly preceded by
        one in a block not scanned yet), and after one past ``max_receives``, which is set aside
        for the dead-letter queue instead and holds the group like the others until it is
        moved."""
        p = self.p
        group = c.group_of.get(head)
        if group is None or c.group_busy.get(group) != head:
            return []
        if not p.is_live(c, head) or head in c.redelivery or head in c.not_due:
            return []
        del c.group_busy[group]
        pending = c.groups[group]
        block_id, idx = block_and_index(head)
        start = pending.bisect_left(((p.blocks[block_id].block.ordinal, idx), head))
        batch = c.group_out.setdefault(group, set())
        out: list[Delivery] = []
        for _, mid in pending.islice(start):
            if len(out) >= room:
                break
            if mid in c.redelivery or mid in c.not_due or (mid != head and p.waits_for_scan(mid)):
                break
            if not p.is_live(c, mid):
                continue
            batch.add(mid)
            delivery = self._deliver_first(c, mid, deadline)
            if delivery is None:
                break  # set aside: the next ones wait until it is moved, as after a head
            out.append(delivery)
        return out

    def _save_receives(self, c: Cursor, counts: list[tuple[str, int]]) -> None:
        """Persist receive counts of redeliveries. A count lost here makes it at most the
        deliveries in flight at a crash too low; first deliveries are never written."""
        p = self.p
        items = []
        for mid, count in counts:
            parsed = parse_message_id(mid)
            if parsed is not None:
                items.append((p.receives_key(c, parsed), str(count).encode()))
        try:
            p.store.put_many(items, fence=p.fence)
        except KVError as exc:
            log.warning("%s/%s: receive counts not saved: %s", p.queue, p.index, exc)

    def take_dead(self, sub: str = "") -> list[tuple[str, int]]:
        """Messages set aside for the dead-letter queue (they stay pinned until acked)."""
        p = self.p
        with p.lock:
            c = p.cursor(sub)
            dead, c.dead = c.dead, []
        return dead

    def give_back_dead(self, mids: Sequence[str], sub: str = "") -> None:
        """Give back messages set aside by :meth:`take_dead` whose move failed: their
        visibility runs out now, and the next dequeue sets them aside again."""
        p = self.p
        with p.lock:
            c = p.cursor(sub)
            now = self.clock()
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

    def load_bodies(self, deliveries: list[Delivery], sub: str | None = None) -> list[Delivery]:
        """Attach the stored messages (cache, else one batched read; a stub's from the archive);
        drop vanished ones.

        ``sub``: the cursor the deliveries were made for (a queue's is ""). Given, deliveries
        whose body cannot be read now are given back to it (:meth:`give_back`) rather than left
        hidden until their visibility runs out: a store failure gives back all of them and
        raises, an archive failure only the stubs, and the others are delivered. Without it
        (moving dead letters), any failure raises.
        """
        p = self.p
        try:
            records = p.records([d.id for d in deliveries])
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
                self.archive.bodies_from_archive(stubs)
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
            with p.lock:
                for c in p.readers:
                    self.order.forget(c, vanished)
                p.drop_stored(vanished)
        return [d for d in deliveries if d.message is not None]

    def give_back(self, deliveries: Sequence[Delivery], sub: str = "") -> None:
        """Undo deliveries that never reached the client: each is deliverable again at once, in
        its place, with the receive count it had (so a failure of ours never brings a message
        closer to the dead-letter queue). One acknowledged or redelivered since is left alone."""
        p = self.p
        with p.lock:
            c = p.cursors.get(sub)
            if c is None:
                return
            freed: list[str] = []
            for d in reversed(deliveries):  # each goes to the front: keep their order
                entry = c.redelivery.get(d.id)
                if entry is None or entry.receipt != d.receipt:
                    continue
                c.redelivery.remove(d.id)
                if d.receive_count > 1:
                    c.receives[d.id] = d.receive_count - 1
                else:
                    c.receives.pop(d.id, None)
                if not p.is_live(c, d.id):
                    continue
                group = c.group_of.get(d.id)
                if group is not None:
                    batch = c.group_out.get(group)
                    if batch is not None and d.id in batch:  # back in its place in the group
                        batch.discard(d.id)
                        if not batch:
                            del c.group_out[group]
                            freed.append(group)
                    elif c.group_busy.get(group) == d.id:  # still the group's turn
                        block_id, idx = block_and_index(d.id)
                        state = p.blocks.get(block_id)
                        c.unblocked.push((state.block.ordinal if state is not None else -1, idx), d.id)
                    continue
                state = p.blocks.get(block_and_index(d.id)[0])
                lanes = c.scanned_ready if state is not None and state.scanned else c.ready
                lanes.appendleft(d.id, c.fairness_of.get(d.id))
            for group in freed:
                self.order.unblock_group(c, group)
        p.on_change()
