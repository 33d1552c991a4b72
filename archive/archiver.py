"""The archiver: copies each queue's journal (``queues.service.journal``) to the archive table.

For each queue, under the queue's :class:`~archive.models.ArchiverLock`, for each partition:
read a batch of the journal's entries and markers (``service.journal.read_journal``), insert
the rows (a message already archived is left as it is; a marker sets ``acked_at``), commit,
and only then drop exactly the journal names read (``drop_journal``). So an entry is never
lost; at worst it is copied twice, which the unique ``message_id`` absorbs.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict, overload

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from archive.models import ArchivedMessage, ArchiverLock
from queues import service
from queues.errors import Fault, StoredFormatTooNew, Unavailable
from queues.public import StoredMessage, parse_message_id, read_ack_time
from queues.service.journal import JournalBatch, JournalQueue, drop_journal, journal_holds, journal_queues, read_journal

log = logging.getLogger(__name__)

#: journal names handled per round (one scan, one batched read, one insert, one delete).
BATCH = int(os.environ.get("ARCHIVE_BATCH", "1000"))
#: rounds per partition and run, so a run ends even while producers keep writing.
MAX_ROUNDS = int(os.environ.get("ARCHIVE_MAX_ROUNDS", "100"))
#: how long a claimed queue stays ours without renewal.
LOCK_SECONDS = float(os.environ.get("ARCHIVE_LOCK_SECONDS", "60"))


class PartitionCounts(TypedDict):
    """What one pass over a partition's journal did."""

    archived: int  # rows inserted
    acked: int  # rows marked acknowledged
    removed: int  # journal names deleted


class QueueReport(TypedDict, total=False):
    """What one pass did to a queue: its partitions' counts added up, or why it stopped."""

    archived: int
    acked: int
    removed: int
    busy: bool  # another archiver holds the queue: nothing done
    lock_lost: bool  # another archiver took it meanwhile: the counts are what was done before
    error: bool  # the pass failed (logged)


class LockLost(Unavailable):
    """Another archiver took the queue (our lease ran out): stop working on it."""


def new_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# --- the per-queue lock -----------------------------------------------------------------------
def claim(queue: str, holder: str, seconds: float = LOCK_SECONDS) -> bool:
    """Take (or renew) the queue's archiver lock: True if it is now ours."""
    now = timezone.now()
    try:
        ArchiverLock.objects.get_or_create(queue=queue, defaults={"holder": "", "expires_at": now})
    except IntegrityError:
        pass  # created by another archiver at the same moment
    taken = (
        ArchiverLock.objects.filter(queue=queue)
        .filter(Q(expires_at__lt=now) | Q(holder=holder) | Q(holder=""))
        .update(holder=holder, expires_at=now + timedelta(seconds=seconds))
    )
    return taken == 1


def renew(queue: str, holder: str, seconds: float = LOCK_SECONDS) -> None:
    if not ArchiverLock.objects.filter(queue=queue, holder=holder).update(
        expires_at=timezone.now() + timedelta(seconds=seconds)
    ):
        raise LockLost(f"archiver lock of {queue!r} taken by another archiver")


def release(queue: str, holder: str) -> None:
    ArchiverLock.objects.filter(queue=queue, holder=holder).update(holder="", expires_at=timezone.now())


# --- rows -------------------------------------------------------------------------------------
def _ts(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC)


@overload
def _clean(value: str) -> str: ...
@overload
def _clean(value: dict[str, Any] | None) -> dict[str, Any] | None: ...
@overload
def _clean(value: object) -> object: ...
def _clean(value: object) -> object:
    """``value`` without NUL characters (PostgreSQL text and jsonb refuse them)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def row_for(mid: str, raw: bytes, incarnation: int | None) -> ArchivedMessage:
    """The row of message ``mid`` (its stored bytes ``raw``) of the queue row ``incarnation``."""
    m = StoredMessage.from_bytes(raw, mid)
    parsed = parse_message_id(mid)
    if parsed is None:
        raise ValueError(f"{mid!r} is no message ID")
    body, attributes, estimates, history = (
        _clean(m.body),
        _clean(m.attributes),
        _clean(m.estimates),
        _clean(m.history),
    )
    # the columns hold no fairness key nor subscription: a message with one is kept whole in ``raw``
    exact = (body, attributes, estimates, history) == (m.body, m.attributes, m.estimates, m.history) and (
        m.fairness_key is None and m.subscription is None
    )
    return ArchivedMessage(
        message_id=mid,
        queue=parsed.queue,
        incarnation=incarnation,
        partition=parsed.partition,
        group=m.group,
        body=body,
        attributes=attributes,
        size=m.size,
        estimates=estimates,
        history=history,
        sequence=m.sequence,
        not_before=_ts(m.not_before),
        enqueued_at=datetime.fromtimestamp(m.enqueued_at, tz=UTC),
        raw=None if exact else raw,
    )


def message_of(row: ArchivedMessage) -> StoredMessage:
    """The stored record of an archived row (exact: from ``raw`` when the columns are not)."""
    if row.raw is not None:
        return StoredMessage.from_bytes(bytes(row.raw), row.message_id)
    return StoredMessage(
        row.body,
        row.enqueued_at.timestamp(),
        row.group,
        row.sequence,
        row.not_before.timestamp() if row.not_before else None,
        row.attributes,
        row.size,
        row.estimates,
        row.history,
    )


def _queue_of(mid: str) -> str:
    parsed = parse_message_id(mid)
    if parsed is None:
        raise ValueError(f"{mid!r} is no message ID")
    return parsed.queue


def store_records(items: Iterable[tuple[str, bytes]]) -> int:
    """Write ``(message id, StoredMessage bytes)`` to the table now, committed when this
    returns (called outside any transaction); rows already there are left as they are. For a
    topic's owner whose retention moves messages a subscription still holds out of the
    key-value store (the journal may not have reached the table yet). The rows belong to the
    queue now of their name (the topic being served). Returns how many rows are new."""
    named = [(mid, _queue_of(mid), raw) for mid, raw in items]
    current = service.current_queue_ids(queue for _, queue, _ in named)
    rows = [row_for(mid, raw, current.get(queue)) for mid, queue, raw in named]
    with transaction.atomic():
        return _insert(rows)


def _insert(rows: list[ArchivedMessage]) -> int:
    """Insert ``rows``, leaving those already archived as they are; how many are new."""
    if not rows:
        return 0
    before = ArchivedMessage.objects.filter(message_id__in=[r.message_id for r in rows]).count()
    ArchivedMessage.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
    return len(rows) - before


def lookup(message_ids: Iterable[str]) -> dict[str, StoredMessage]:
    """``{message id: StoredMessage}`` for those of ``message_ids`` that are archived (for an
    owner serving a subscription whose message has left the key-value store)."""
    ids = list(dict.fromkeys(str(m) for m in message_ids))
    out: dict[str, StoredMessage] = {}
    for start in range(0, len(ids), 1000):
        for row in ArchivedMessage.objects.filter(message_id__in=ids[start : start + 1000]):
            out[row.message_id] = message_of(row)
    return out


# --- one partition ----------------------------------------------------------------------------
def _read_batch(found: JournalBatch, incarnation: int) -> tuple[list[ArchivedMessage], dict[str, datetime | None]]:
    """The rows and ack times of a journal batch; what is unreadable is logged and dropped,
    except a record of a newer stored format: ``StoredFormatTooNew``, nothing dropped."""
    rows: list[ArchivedMessage] = []
    acked_at: dict[str, datetime | None] = {}
    for mid, raw in found.entries:
        try:
            rows.append(row_for(mid, raw, incarnation))
        except StoredFormatTooNew:
            raise
        except Exception:  # noqa: BLE001 - never archivable: logged and dropped
            log.error("archive: unreadable journal entry for %s dropped", mid)
    for mid, raw in found.acks:
        try:
            acked_at[mid] = _ts(read_ack_time(raw, mid))
        except (Fault, ValueError):  # (ValueError: a time out of datetime's range)
            log.error("archive: unreadable ack marker for %s dropped", mid)
    return rows, acked_at


def archive_partition(
    store: service.KeyValueStore | None,
    queue: str,
    partition: int,
    *,
    incarnation: int,
    holder: str | None = None,
    batch: int = BATCH,
    max_rounds: int = MAX_ROUNDS,
) -> PartitionCounts:
    """Copy one partition's journal of the queue row ``incarnation`` to the table, its rows
    tied to that row (``store``: the store to read, default this process's); counts of rows
    inserted, acks marked, journal names removed. Renews the queue's lock between rounds when
    ``holder`` is given."""
    counts: PartitionCounts = {"archived": 0, "acked": 0, "removed": 0}
    for _ in range(max_rounds):
        if holder is not None:
            renew(queue, holder)
        found = read_journal(queue, partition, incarnation=incarnation, batch=batch, store=store)
        if found is None:
            break
        try:
            rows, acked_at = _read_batch(found, incarnation)
        except StoredFormatTooNew:
            # A record of a newer release (logged with its key): the batch stays in the
            # journal, whole, for an archiver that reads it; the other partitions go on.
            break
        with transaction.atomic():
            counts["archived"] += _insert(rows)
            if acked_at:
                marked = list(ArchivedMessage.objects.filter(message_id__in=list(acked_at), acked_at__isnull=True))
                for row in marked:
                    row.acked_at = acked_at[row.message_id]
                ArchivedMessage.objects.bulk_update(marked, ["acked_at"], batch_size=500)
                counts["acked"] += len(marked)
        # Committed: now the journal names read may go (and nothing else: new ones stay).
        drop_journal(queue, partition, found.names, incarnation=incarnation, store=store)
        counts["removed"] += len(found.names)
        if not found.more:
            break
    return counts


# --- queues -----------------------------------------------------------------------------------
def archive_queue(store: service.KeyValueStore | None, q: JournalQueue, holder: str, **kw: int) -> QueueReport:
    """Every partition of ``q`` under its lock; ``{"busy": True}`` if another archiver has it.
    ``store``: the store to read (default: this process's)."""
    if not claim(q.name, holder):
        return {"busy": True}
    total: QueueReport = {"archived": 0, "acked": 0, "removed": 0}
    try:
        for p in range(q.partitions):
            counts = archive_partition(store, q.name, p, holder=holder, incarnation=q.incarnation, **kw)
            total["archived"] += counts["archived"]
            total["acked"] += counts["acked"]
            total["removed"] += counts["removed"]
    except LockLost as exc:
        log.warning("archive: %s", exc)
        return {**total, "lock_lost": True}
    finally:
        release(q.name, holder)
    return total


def run(
    queue: str | None = None, *, store: service.KeyValueStore | None = None, holder: str | None = None, **kw: int
) -> dict[str, QueueReport]:
    """One archiver pass over every queue (or one): counts per queue that had work or was busy.

    Queues with archiving off are visited too, but only if their journal holds something (the
    mode was switched off with entries left): a scan per partition, no lock otherwise.
    """
    holder = holder or new_holder()
    report: dict[str, QueueReport] = {}
    for q in journal_queues(queue):
        if q.archive == "none" and not journal_holds(q, store=store):
            continue
        counts: QueueReport
        try:
            counts = archive_queue(store, q, holder, **kw)
        except Exception:
            log.exception("archiving %s", q.name)
            counts = {"error": True}
        if counts.get("busy") or counts.get("error") or any(counts.values()):
            report[q.name] = counts
    if report:
        log.info("archiver: %s", report)
    return report
