"""Retention on a topic, and the archive stubs it leaves for slow subscriptions.

A queue's expired messages are simply removed (``queues.engine.retention``). A topic's are
shared by its subscriptions: those no subscription holds any more are removed; on a topic that
archives (mode ``all`` or ``acked``) those a slow subscription still holds are kept, by
writing each to the archive table (committed first) and then replacing its stored record by a
*stub* (times, group, sequence; no body: ``StoredMessage.stub``). The stub keeps the message's
place in the tree, so group order, pruning and a takeover work as for any message; a delivery
reads the body back from the archive (:func:`bodies_from_archive`), and the last
subscription's ack removes the stub like a message.

These functions work on a partition manager through :class:`TopicPartition`, the part of its
public interface they need. They take its lock themselves (it must not be held on entry).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from queues.engine.ids import StoredMessage
from queues.errors import PartitionUnavailable
from queues.kv.base import Fence, Fenced, KeyValueStore, KVError

if TYPE_CHECKING:
    from queues.engine.cursor import Delivery
    from queues.engine.ports import Counters

log = logging.getLogger(__name__)

#: messages a retention pass moves to the archive (or removes) per step on a topic: one
#: batched read, one archive insert and one store write, the lock held only for the last.
EXPIRE_BATCH = 1000


class TopicPartition(Protocol):
    """What topic retention uses of a partition manager (``queues.engine.partition``). Methods named
    "Lock held" expect its ``lock`` held."""

    queue: str
    index: int
    lock: threading.Lock
    store: KeyValueStore
    fence: Fence
    counters: Counters
    #: the topic's archive mode ("none", "all", "acked").
    archive: str
    archive_sink: Callable[[list[tuple[str, bytes]]], object] | None
    archive_source: Callable[[list[str]], dict[str, StoredMessage]] | None
    closed: bool
    expired_total: int
    archived_total: int
    archive_missing_total: int

    def check_serving(self) -> None:
        """Raise PartitionUnavailable unless the manager serves (open, lease valid). Lock held."""
        ...

    def stored(self, mid: str) -> bool:
        """``mid`` is still stored. Lock held."""
        ...

    def held(self, mid: str) -> bool:
        """Some subscription still holds ``mid``. Lock held."""
        ...

    def is_stub(self, mid: str) -> bool:
        """``mid``'s stored record is a stub: its body is in the archive only. Lock held."""
        ...

    def records(self, mids: Sequence[str]) -> dict[str, StoredMessage]:
        """The stored records of ``mids`` (stubs too); gone ones left out."""
        ...

    def mark_stubs(self, mids: Sequence[str]) -> None:
        """``mids``' records are stubs now. Lock held."""
        ...

    def remove_everywhere(self, mids: Sequence[str]) -> None:
        """Delete messages no subscription needs, and forget them everywhere. Lock held."""
        ...

    def lost(self, exc: Exception) -> PartitionUnavailable:
        """Close after a fenced write (another owner now); the error to raise. Lock held."""
        ...

    def prune(self) -> None:
        """Delete the emptied blocks at the front. Lock held."""
        ...


def expire(m: TopicPartition, doomed: list[str]) -> int:
    """Retention on a topic's messages ``doomed`` (at most :data:`EXPIRE_BATCH`, all of
    blocks past the cutoff): those no subscription holds are removed; with
    archiving on, those one still holds are written to the archive table (committed
    first), then their records become stubs; without it they are removed too.

    A stub is written under the lock, after checking that the message is still stored:
    the last subscription's ack deletes under the same lock, so a stub never brings back
    a message that was acknowledged meanwhile. Returns how many were removed."""
    sink = m.archive_sink
    keep = m.archive != "none" and sink is not None
    records: dict[str, StoredMessage] = {}  # the held ones, read and archived
    if keep and sink is not None:
        with m.lock:
            m.check_serving()
            wanted = [d for d in doomed if m.stored(d) and not m.is_stub(d) and m.held(d)]
        if wanted:
            records = m.records(wanted)
            try:
                sink([(mid, rec.to_bytes()) for mid, rec in records.items() if not rec.archived])
            except Exception as exc:
                raise PartitionUnavailable(
                    f"{m.queue}/{m.index}: archive write failed, retention deferred: {exc}"
                ) from exc
    with m.lock:
        m.check_serving()
        gone: list[str] = []
        stubs: list[str] = []
        for mid in doomed:
            if not m.stored(mid):
                continue  # acknowledged meanwhile: gone already
            if not keep or not m.held(mid):
                gone.append(mid)
            elif mid in records and not m.is_stub(mid):
                stubs.append(mid)
        try:
            # (a record that is a stub already was written by a run whose store write failed)
            writes = [(mid, records[mid].stub().to_bytes()) for mid in stubs if not records[mid].archived]
            if writes:
                m.store.put_many(writes, fence=m.fence)
            if gone:
                m.remove_everywhere(gone)
        except Fenced as exc:
            raise m.lost(exc) from exc
        except KVError as exc:
            # Memory still says "not a stub" for any stub written: the next run finds it in
            # the store and marks it; a delivery meanwhile reads it from the archive.
            raise PartitionUnavailable(f"{m.queue}/{m.index}: store write failed: {exc}") from exc
        m.mark_stubs(stubs)
        m.archived_total += len(stubs)
        m.expired_total += len(gone)
        m.counters.expired(m.queue, len(gone))
        m.prune()
    return len(gone)


def bodies_from_archive(m: TopicPartition, stubs: list[Delivery]) -> None:
    """Replace stubs by their archived records (raises PartitionUnavailable when the archive
    cannot be read). A stub whose row is not in the archive (deleted by hand, a database
    restored from an older backup) can never be delivered: it is removed, counted in
    ``archive_missing_total`` and logged as an error."""
    try:
        if m.archive_source is None:
            raise KVError("this node has no archive to read from")
        found = m.archive_source([d.id for d in stubs])
    except Exception as exc:
        raise PartitionUnavailable(f"{m.queue}/{m.index}: archive read failed: {exc}") from exc
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
            m.queue,
            m.index,
            len(lost),
            lost[:10],
        )
        with m.lock:
            try:
                m.remove_everywhere([mid for mid in lost if m.stored(mid)])
            except KVError as exc:
                m.closed = True  # reopened from the store, which still has the stubs
                raise PartitionUnavailable(f"{m.queue}/{m.index}: store delete failed: {exc}") from exc
            m.archive_missing_total += len(lost)
