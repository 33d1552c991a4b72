"""Retention on a topic, and the archive stubs it leaves for slow subscriptions.

A queue's expired messages are simply removed (``PartitionManager.expire``). A topic's are
shared by its subscriptions: those no subscription holds any more are removed; on a topic that
archives (mode ``all`` or ``acked``) those a slow subscription still holds are kept, by
writing each to the archive table (committed first) and then replacing its stored record by a
*stub* (times, group, sequence; no body: ``StoredMessage.stub``). The stub keeps the message's
place in the tree, so group order, pruning and a takeover work as for any message; a delivery
reads the body back from the archive (:func:`bodies_from_archive`), and the last
subscription's ack removes the stub like a message.

These functions work on a :class:`~queues.partition.PartitionManager`, as part of it: they
use its private helpers. :func:`expire` and :func:`bodies_from_archive` take its lock
themselves (it must not be held on entry); :func:`held` and :func:`is_stub` expect it held.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import metrics
from .errors import PartitionUnavailable
from .keys import block_and_index
from .kv import Fenced, KVError
from .messages import StoredMessage

if TYPE_CHECKING:
    from .partition import Delivery, PartitionManager

log = logging.getLogger(__name__)

#: messages a retention pass moves to the archive (or removes) per step on a topic: one
#: batched read, one archive insert and one store write, the lock held only for the last.
EXPIRE_BATCH = 1000


def held(m: PartitionManager, mid: str) -> bool:
    """Some subscription still holds ``mid``. Lock held."""
    return any(m._is_live(c, mid) for c in m._all)


def is_stub(m: PartitionManager, mid: str) -> bool:
    """``mid``'s stored record is a stub: its body is in the archive only. Lock held."""
    block_id, idx = block_and_index(mid)
    state = m.blocks.get(block_id)
    return state is not None and idx in state.archived


def expire(m: PartitionManager, doomed: list[str]) -> int:
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
            m._check_serving()
            wanted = [d for d in doomed if m._stored(d) and not is_stub(m, d) and held(m, d)]
        if wanted:
            records = m._records(wanted)
            try:
                sink([(mid, rec.to_bytes()) for mid, rec in records.items() if not rec.archived])
            except Exception as exc:
                raise PartitionUnavailable(
                    f"{m.queue}/{m.index}: archive write failed, retention deferred: {exc}"
                ) from exc
    with m.lock:
        m._check_serving()
        gone: list[str] = []
        stubs: list[str] = []
        for mid in doomed:
            if not m._stored(mid):
                continue  # acknowledged meanwhile: gone already
            if not keep or not held(m, mid):
                gone.append(mid)
            elif mid in records and not is_stub(m, mid):
                stubs.append(mid)
        try:
            # (a record that is a stub already was written by a run whose store write failed)
            writes = [(mid, records[mid].stub().to_bytes()) for mid in stubs if not records[mid].archived]
            if writes:
                m.store.put_many(writes, fence=m.fence)
            if gone:
                m._remove_everywhere(gone)
        except Fenced as exc:
            raise m._lost(exc) from exc
        except KVError as exc:
            # Memory still says "not a stub" for any stub written: the next run finds it in
            # the store and marks it; a delivery meanwhile reads it from the archive.
            raise PartitionUnavailable(f"{m.queue}/{m.index}: store write failed: {exc}") from exc
        for mid in stubs:
            block_id, idx = block_and_index(mid)
            m.blocks[block_id].archived.add(idx)
            m.cache.discard(mid)
        m.archived_total += len(stubs)
        m.expired_total += len(gone)
        metrics.EXPIRED.labels(m.queue).inc(len(gone))
        m._prune()
    return len(gone)


def bodies_from_archive(m: PartitionManager, stubs: list[Delivery]) -> None:
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
                m._remove_everywhere([mid for mid in lost if m._stored(mid)])
            except KVError as exc:
                m.closed = True  # reopened from the store, which still has the stubs
                raise PartitionUnavailable(f"{m.queue}/{m.index}: store delete failed: {exc}") from exc
            m.archive_missing_total += len(lost)
