"""Acknowledging a partition's messages, and every other removal: receipts checked, the
in-flight ones pinned while their delete runs, the store written (fenced), then memory
settled; a message's visibility changed.

An ack is three steps (:meth:`Acks.ack`): under the lock, check the receipts and pin the
messages (no redelivery while the delete runs); without it, delete them from the store
(journaled for the archive if the queue archives); under the lock again, forget them in the
cursor and prune emptied blocks. A failed delete unpins them. The service takes these steps
itself when one call acks on several partitions (``queues.service``).

On a topic a message is shared by the subscriptions: one subscription's ack of a message the
others still hold writes only its marker (``<topic>/<p>/_acks/<subscription>/<block>.<index>``,
see ``queues.engine.keys``); the last one's deletes it with every marker and count. That
decision and its writes happen under the lock, so two subscriptions acking one message cannot
both leave it to the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from queues.engine import archive_journal
from queues.engine.cursor import Cursor
from queues.engine.ids import MessageId, parse_message_id
from queues.engine.ports import AcksState, Prunes, Routes
from queues.engine.redelivery import RedeliveryEntry
from queues.errors import PartitionUnavailable, ReceiptMismatch
from queues.kv.base import Fenced, KVError


class Acks:
    """Acks and removals on one partition (see the module's text).

    ``p``: the partition's state; ``order``: its cursors' delivery order (forgetting what was
    removed frees a group's next message); ``pruner``: deletes emptied blocks; ``clock``: the
    manager's monotonic clock (visibility deadlines).
    """

    def __init__(self, p: AcksState, order: Routes, pruner: Prunes, clock: Callable[[], float]):
        self.p = p
        self.order = order
        self.pruner = pruner
        self.clock = clock

    def check_receipts(
        self, items: Sequence[tuple[MessageId, str | None]], sub: str = "", *, unexpired: bool = False
    ) -> None:
        """Raise :class:`ReceiptMismatch` for the first item whose receipt is not current. With
        ``unexpired``, a receipt whose visibility timeout ran out is not current either, though
        nobody received the message since. Lock held."""
        self._current(items, [str(mid) for mid, _ in items], sub, unexpired)

    def _current(
        self, items: Sequence[tuple[MessageId, str | None]], keys: Sequence[str], sub: str, unexpired: bool
    ) -> list[RedeliveryEntry | None]:
        """:meth:`check_receipts`, given each item's ID as text (``keys``); each item's entry in
        the redelivery index (None: not in flight)."""
        c = self.p.cursor(sub)
        get = c.redelivery.by_id.get
        now = self.clock()
        entries = []
        for (_, receipt), key in zip(items, keys):
            entry = get(key)
            if receipt is not None:
                if entry is None:
                    raise ReceiptMismatch(key, "not in flight (never delivered, or already acknowledged)")
                if entry.receipt != receipt:
                    raise ReceiptMismatch(key, "the receipt is from an earlier delivery")
                if unexpired and entry.deadline <= now:
                    raise ReceiptMismatch(key, "the receipt expired: its visibility timeout ran out")
            entries.append(entry)
        return entries

    def pin_for_ack(self, items: Sequence[MessageId], sub: str = "") -> dict[str, float]:
        """Hold the in-flight ones back from redelivery while their delete runs. Lock held.

        Returns their deadlines, for :meth:`unpin` if the delete fails.
        """
        return self.p.cursor(sub).redelivery.pin_many([str(mid) for mid in items])

    def unpin(self, pinned: dict[str, float], sub: str = "") -> None:
        """Give back the deadlines taken by :meth:`pin_for_ack`. Lock held."""
        p = self.p
        c = p.cursor(sub)
        for key, deadline in pinned.items():
            if key in c.redelivery:
                c.redelivery.change_deadline(key, deadline)

    def delete_acked(self, items: Sequence[MessageId], sub: str = "") -> int:
        """The store half of an ack: journaled for the archive (if the queue archives), then
        deleted. Returns how many were still held (a queue: stored). See :meth:`delete`."""
        return self.delete(items, journal=True, sub=sub)

    def delete(
        self, items: Sequence[MessageId], *, journal: bool, sub: str = "", keys: Sequence[str] | None = None
    ) -> int:
        """Delete messages ``sub`` holds. ``journal``: it is an ack, which the archive journal
        records; removals that are no ack (retention, a move to the dead-letter queue) are not
        archived.

        A queue's runs without the lock. A subscription's decides, under the lock, whether
        another subscription still holds each message: then only its marker is written, else
        the message goes (with the others' markers). The lock is held across those writes, so
        two subscriptions acking one message cannot both leave it to the other; a failure
        closes the manager, which the node reopens from the store. ``keys``: the IDs as text,
        when the caller has them already.
        """
        p = self.p
        c = p.cursor(sub)
        if not c.shared:
            return self._delete_by_subscription(c, items, journal)
        if keys is None:
            keys = [str(mid) for mid in items]
        receives = c.receives
        counts = [p.receives_key(c, mid) for mid, key in zip(items, keys) if key in receives] if receives else []
        try:
            if journal and p.archive != "none":
                entries = archive_journal.on_ack(p.store, p.cache, p.queue, p.index, p.archive, items, p.wall())
                p.store.put_many(entries, fence=p.fence)
            # Fenced like every write: a stale owner's delete would leave the new owner holding a
            # live message that is gone (in flight for ever, its group blocked).
            removed = p.store.delete_many(list(keys), fence=p.fence)
            if counts:
                p.store.delete_many(counts, fence=p.fence)
            return removed
        except Fenced as exc:
            raise p.lost(exc) from exc
        except KVError as exc:
            raise PartitionUnavailable(f"{p.queue}/{p.index}: store delete failed: {exc}") from exc

    def _delete_by_subscription(self, c: Cursor, items: Sequence[MessageId], journal: bool) -> int:
        p = self.p
        with p.lock:
            p.check_serving()
            held = [mid for mid in items if c.holds(p.blocks, mid.block, mid.index)]
            last: list[MessageId] = []
            shared: list[MessageId] = []
            for mid in held:
                others = any(o is not c and o.holds(p.blocks, mid.block, mid.index) for o in p.readers)
                (shared if others else last).append(mid)
            try:
                if journal and last and p.archive != "none":
                    entries = archive_journal.on_ack(p.store, p.cache, p.queue, p.index, p.archive, last, p.wall())
                    p.store.put_many(entries, fence=p.fence)
                if shared:
                    p.store.put_many([(p.ack_key(c, mid), b"1") for mid in shared], fence=p.fence)
                if last:
                    self.delete_stored([str(mid) for mid in last])
                counts = [p.receives_key(c, mid) for mid in held if str(mid) in c.receives]
                if counts:
                    p.store.delete_many(counts, fence=p.fence)
            except Fenced as exc:
                raise p.lost(exc) from exc
            except KVError as exc:
                p.close()  # memory and store may disagree now: reopen from the store
                raise PartitionUnavailable(f"{p.queue}/{p.index}: store write failed: {exc}") from exc
            for mid in held:
                c.live.get(mid.block, set()).discard(mid.index)
            p.drop_stored([str(mid) for mid in last])
            return len(held)

    def delete_stored(self, mids: Sequence[str]) -> None:
        """Delete messages from the store with every subscription's marker and count. Lock held."""
        p = self.p
        doomed = list(mids)
        if p.is_topic:
            for mid in mids:
                parsed = parse_message_id(mid)
                if parsed is not None:
                    for o in p.readers:
                        doomed.append(p.ack_key(o, parsed))
                        doomed.append(p.receives_key(o, parsed))
        p.store.delete_many(doomed, fence=p.fence)

    def remove_everywhere(self, mids: Sequence[str]) -> None:
        """Delete messages that no cursor needs, and forget them everywhere. Lock held."""
        p = self.p
        try:
            self.delete_stored(mids)
        except Fenced as exc:
            raise p.lost(exc) from exc
        for c in p.readers:
            self.order.forget(c, mids)
        p.drop_stored(mids)

    def settle_acked(
        self,
        items: Sequence[MessageId],
        removed: int,
        sub: str = "",
        *,
        ack: bool = True,
        keys: Sequence[str] | None = None,
    ) -> None:
        """The memory half of an ack, after the delete. Lock held. ``ack=False``: a removal
        that is no ack (a move to the dead-letter queue), left out of ``mq_messages_acked``.
        ``keys``: the IDs as text, when the caller has them already."""
        p = self.p
        c = p.cursor(sub)
        mids = [str(mid) for mid in items] if keys is None else keys
        where = [(mid.block, mid.index) for mid in items]  # parsed already: not again per use
        woke = self.order.forget(c, mids, where)
        if c.shared:
            p.drop_stored(mids, where)
        c.acked_total += removed
        if ack:
            p.counters.acked(p.queue, sub, removed)
        self.pruner.prune()
        if woke:
            p.on_change()  # a group's next message may go: wake the long polls

    def ack(self, items: Sequence[tuple[MessageId, str | None]], sub: str = "", *, unexpired: bool = False) -> int:
        """Check receipts (``unexpired``: :meth:`check_receipts`), delete, settle: a whole ack
        on this partition alone (journaled for the archive: :meth:`delete_acked`). Returns how
        many were still held."""
        return self._ack(items, journal=True, sub=sub, unexpired=unexpired)

    def remove_dead_lettered(self, items: Sequence[MessageId], sub: str = "") -> int:
        """Remove messages that were moved to the dead-letter queue: like an ack without
        receipts, but not journaled (a dead letter is not acknowledged, so not archived)."""
        return self._ack([(mid, None) for mid in items], journal=False, sub=sub)

    def _ack(
        self, items: Sequence[tuple[MessageId, str | None]], *, journal: bool, sub: str, unexpired: bool = False
    ) -> int:
        p = self.p
        mids = [mid for mid, _ in items]
        keys = [str(mid) for mid in mids]  # (each ID as text once, for every step)
        with p.lock:
            p.check_serving()
            entries = self._current(items, keys, sub, unexpired)
            pinned = p.cursor(sub).redelivery.pin_many(keys, entries)
        try:
            removed = self.delete(mids, journal=journal, sub=sub, keys=keys)
        except PartitionUnavailable:
            with p.lock:
                self.unpin(pinned, sub)
            raise
        with p.lock:
            self.settle_acked(mids, removed, sub, ack=journal, keys=keys)
        return removed

    def change_visibility_locked(self, mid: MessageId, receipt: str | None, timeout: float, sub: str = "") -> int:
        """Move the message's visibility deadline to ``timeout`` seconds from now (0: deliverable
        at once); returns its receive count. Called with ``lock`` held.

        Raises :class:`ReceiptMismatch` when the message is not in flight: never delivered,
        acknowledged, or visible again (its visibility timeout ran out, though nobody received
        it since: it is anyone's to receive, so no receipt may hide it again), or when
        ``receipt`` is an earlier delivery's."""
        p = self.p
        c = p.cursor(sub)
        key = str(mid)
        entry = c.redelivery.get(key)
        if entry is None or not p.is_live(c, key):
            raise ReceiptMismatch(key, "not in flight (never delivered, or already acknowledged)")
        if receipt is not None and entry.receipt != receipt:
            raise ReceiptMismatch(key, "the receipt is from an earlier delivery")
        if entry.deadline == float("inf"):
            raise ReceiptMismatch(key, "it is being acknowledged or dead-lettered")
        now = self.clock()
        if entry.deadline <= now:
            raise ReceiptMismatch(key, "not in flight (visible again: its visibility timeout ran out)")
        c.redelivery.change_deadline(key, now + timeout)
        if timeout == 0:
            p.on_change()
        return c.receives.get(key, 1)
