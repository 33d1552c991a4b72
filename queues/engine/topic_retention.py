"""Retention on a topic, and the archive stubs it leaves for slow subscriptions.

A queue's expired messages are simply removed (``queues.engine.retention``). A topic's are
shared by its subscriptions: those no subscription holds any more are removed; on a topic that
archives (mode ``all`` or ``acked``) those a slow subscription still holds are kept, by
writing each to the archive table (committed first) and then replacing its stored record by a
*stub* (times, group, sequence; no body: ``StoredMessage.stub``). The stub keeps the message's
place in the tree, so group order, pruning and a takeover work as for any message; a delivery
reads the body back from the archive (:func:`bodies_from_archive`), and the last
subscription's ack removes the stub like a message.

:class:`TopicRetention` works on the partition's state through :class:`TopicRetentionState
<queues.engine.ports.TopicRetentionState>`, the part of it it needs. Its methods take the lock
themselves (it must not be held on entry).
"""

from __future__ import annotations

import logging

from queues.engine.cursor import Delivery
from queues.engine.ids import StoredMessage
from queues.engine.ports import Prunes, Removes, TopicRetentionState
from queues.errors import PartitionUnavailable
from queues.kv.base import Fenced, KVError

log = logging.getLogger(__name__)

#: messages a retention pass moves to the archive (or removes) per step on a topic: one
#: batched read, one archive insert and one store write, the lock held only for the last.
EXPIRE_BATCH = 1000


class TopicRetention:
    """Retention on one topic partition, and reading its stubs' bodies back (see the module's
    text). ``p``: the partition's state; ``remover``: deletes what no subscription holds and
    forgets it everywhere; ``pruner``: deletes the emptied blocks."""

    def __init__(self, p: TopicRetentionState, remover: Removes, pruner: Prunes):
        self.p = p
        self.remover = remover
        self.pruner = pruner

    def expire(self, doomed: list[str]) -> int:
        """Retention on the topic's messages ``doomed`` (all of blocks past the cutoff), in
        steps of :data:`EXPIRE_BATCH`; how many were removed."""
        return sum(self._expire_batch(doomed[k : k + EXPIRE_BATCH]) for k in range(0, len(doomed), EXPIRE_BATCH))

    def _expire_batch(self, doomed: list[str]) -> int:
        """Retention on a topic's messages ``doomed`` (at most :data:`EXPIRE_BATCH`, all of
        blocks past the cutoff): those no subscription holds are removed; with
        archiving on, those one still holds are written to the archive table (committed
        first), then their records become stubs; without it they are removed too.

        A stub is written under the lock, after checking that the message is still stored:
        the last subscription's ack deletes under the same lock, so a stub never brings back
        a message that was acknowledged meanwhile. Returns how many were removed."""
        p = self.p
        sink = p.archive_sink
        keep = p.archive != "none" and sink is not None
        records: dict[str, StoredMessage] = {}  # the held ones, read and archived
        if keep and sink is not None:
            with p.lock:
                p.check_serving()
                wanted = [d for d in doomed if p.stored(d) and not p.is_stub(d) and p.held(d)]
            if wanted:
                records = p.records(wanted)
                try:
                    sink([(mid, rec.to_bytes()) for mid, rec in records.items() if not rec.archived])
                except Exception as exc:
                    raise PartitionUnavailable(
                        f"{p.queue}/{p.index}: archive write failed, retention deferred: {exc}"
                    ) from exc
        with p.lock:
            p.check_serving()
            gone: list[str] = []
            stubs: list[str] = []
            for mid in doomed:
                if not p.stored(mid):
                    continue  # acknowledged meanwhile: gone already
                if not keep or not p.held(mid):
                    gone.append(mid)
                elif mid in records and not p.is_stub(mid):
                    stubs.append(mid)
            try:
                # (a record that is a stub already was written by a run whose store write failed)
                writes = [(mid, records[mid].stub().to_bytes()) for mid in stubs if not records[mid].archived]
                if writes:
                    p.store.put_many(writes, fence=p.fence)
                if gone:
                    self.remover.remove_everywhere(gone)
            except Fenced as exc:
                raise p.lost(exc) from exc
            except KVError as exc:
                # Memory still says "not a stub" for any stub written: the next run finds it in
                # the store and marks it; a delivery meanwhile reads it from the archive.
                raise PartitionUnavailable(f"{p.queue}/{p.index}: store write failed: {exc}") from exc
            p.mark_stubs(stubs)
            p.archived_total += len(stubs)
            p.expired_total += len(gone)
            p.counters.expired(p.queue, len(gone))
            self.pruner.prune()
        return len(gone)

    def bodies_from_archive(self, stubs: list[Delivery]) -> None:
        """Replace stubs by their archived records (raises PartitionUnavailable when the archive
        cannot be read). A stub whose row is not in the archive (deleted by hand, a database
        restored from an older backup) can never be delivered: it is removed, counted in
        ``archive_missing_total`` and logged as an error."""
        p = self.p
        try:
            if p.archive_source is None:
                raise KVError("this node has no archive to read from")
            found = p.archive_source([d.id for d in stubs])
        except Exception as exc:
            raise PartitionUnavailable(f"{p.queue}/{p.index}: archive read failed: {exc}") from exc
        lost = []
        for d in stubs:
            record = found.get(d.id)
            if record is None:
                d.message = None
                lost.append(d.id)
            else:
                d.message, d.from_archive = record, True
        if lost:
            log.error(
                "%s/%s: %d archived messages are missing from the archive table and are dropped: %s",
                p.queue,
                p.index,
                len(lost),
                lost[:10],
            )
            with p.lock:
                try:
                    self.remover.remove_everywhere([mid for mid in lost if p.stored(mid)])
                except KVError as exc:
                    p.close()  # reopened from the store, which still has the stubs
                    raise PartitionUnavailable(f"{p.queue}/{p.index}: store delete failed: {exc}") from exc
                p.archive_missing_total += len(lost)
