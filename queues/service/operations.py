"""Operators' actions on a queue's messages and leases: purge, redrive, expire, release.

Each is one function with the same contract whoever calls it (the REST API, the admin, a Celery
task): typed arguments, a typed result, the service's exceptions.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.db.models import F

from .. import audit
from ..access import Caller, require
from ..dedup import get_dedup
from ..messages import StoredMessage
from ..models import LIMITS, QUEUE_NAME_RE, Partition, Queue
from ..partition import Delivery
from ..purge import purge_partition
from ..router import MAX_HOPS
from .errors import Conflict, InvalidRequest, PartitionUnavailable, QueueNotFound
from .messages import _ack_local, _dequeue_local, _message_id, enqueue
from .peers import get_peers
from .runtime import get_runtime
from .targets import authorize
from .types import ExpireResult, MessageDraft, RedriveResult

log = logging.getLogger(__name__)

#: How long redrive hides the dead letters it is moving (they are acked or given back first).
REDRIVE_VISIBILITY = 60.0


def purge(queue: str, *, caller: Caller) -> int:
    """Remove every message of ``queue``, in flight ones too (``manage``); returns how many
    were removed.

    Done here whoever owns the partitions (see ``queues.purge``: each row's epoch moves on
    in its own transaction, then the store's fence, then the old tree is deleted); the owners
    are then told to drop their managers, which they would do anyway at their next renewal.
    Acks of purged messages answer ``not_found``. What was enqueued before the purge started
    is removed; a partition added meanwhile is not purged.

    Raises QueueNotFound (also when the queue is deleted while it runs: its messages went with
    it), ``access.Forbidden``.
    """
    cfg, _ = authorize(queue, "manage", caller=caller)
    rt = get_runtime()
    # The queue as the database holds it now: this node's description may be a moment old
    # (deleted since, or created again under the name).
    queue_id = Queue.objects.filter(name=cfg.name).values_list("pk", flat=True).first()
    if queue_id is None:
        raise QueueNotFound(queue)
    rows = list(Partition.objects.filter(queue_id=queue_id).select_related("owner").order_by("index"))
    owners = {
        p.owner.address for p in rows if p.owner is not None and p.owner.stopped_at is None and p.owner_id != rt.node_id
    }
    removed = 0
    for p in rows:
        count = purge_partition(p.pk, rt.store)
        if count is None:
            raise QueueNotFound(queue)  # deleted meanwhile
        removed += count
    rt.purged(cfg.name)
    for address in sorted(owners):
        try:
            get_peers().close_purged(address, cfg.name)
        except Exception as exc:  # noqa: BLE001 - it stops at its next renewal anyway
            log.warning("purge of %s: telling %s failed: %s", cfg.name, address, exc)
    Queue.objects.filter(pk=queue_id).update(purged_total=F("purged_total") + removed)
    audit.record(caller, "purge", cfg.name, removed=removed)
    log.info("purged %s: %d messages", cfg.name, removed)
    return removed


def close_purged(queue: str, *, caller: Caller) -> None:
    """Another node purged ``queue``: drop this node's managers of it now (``manage``: a
    node's own call comes as ``access.SYSTEM``)."""
    get_runtime().purged(authorize(queue, "manage", caller=caller)[0].name)


def redrive(queue: str, max_messages: int = 100, *, caller: Caller, hops: int = 0) -> RedriveResult:
    """Move up to ``max_messages`` dead letters of ``queue`` back to the queues they came from
    (``history.source``), each with its group, as new messages; then acknowledge them here.
    ``manage`` on ``queue``, and ``produce`` on each source (checked by :func:`enqueue`).

    Raises QueueNotFound, ``access.Forbidden``, and what :func:`enqueue` raises for a source
    (what was moved before stays moved; the rest comes back after ``REDRIVE_VISIBILITY``).
    """
    cfg, _ = authorize(queue, "manage", caller=caller)
    moved = skipped = 0
    while moved + skipped < max_messages:
        got = _dequeue_local(cfg, "", min(100, max_messages - moved - skipped), REDRIVE_VISIBILITY, 0)
        if not got:
            break
        by_source: dict[str, list[Delivery]] = {}
        back: list[Delivery] = []
        for d in got:
            assert d.message is not None
            source = (d.message.history or {}).get("source")
            if source is None or not QUEUE_NAME_RE.fullmatch(source):
                skipped += 1
                continue
            by_source.setdefault(source, []).append(d)
        for source, ds in by_source.items():
            drafts = [_back_to_source(d.message) for d in ds if d.message is not None]
            enqueue(source, drafts, caller=caller, hops=hops)
            back.extend(ds)
            moved += len(ds)
        if back:
            # Without receipts: moved is moved, whoever holds them now; one purged meanwhile
            # counts as not found rather than refusing the others.
            _ack_local(cfg.name, [(_message_id(d.id), None) for d in back])
    audit.record(caller, "redrive", cfg.name, moved=moved, skipped=skipped)
    return RedriveResult(moved, skipped)


def _back_to_source(m: StoredMessage) -> MessageDraft:
    """A dead letter as a new message for the queue it came from, in its group again."""
    return MessageDraft(
        m.body,
        group=(m.history or {}).get("group"),
        attributes=m.attributes,
        size=m.size,
        estimates=m.estimates,
    )


def expire(queue: str, older_than: float | None = None, *, caller: Caller) -> ExpireResult:
    """Apply the retention rule on the partitions this node owns: remove messages older than
    the queue's retention (or ``older_than`` seconds). On a topic that archives, what a
    subscription still holds moves to the archive instead (``archived``). Counted on the queue.

    A partition whose pass fails is reported in ``deferred`` and the others go on; the pass is
    counted from the managers' totals, since one that fails half-way did part of its work.
    ``manage`` (the API lets only staff and nodes call it; a node's own call comes as
    ``access.SYSTEM``). Raises QueueNotFound, ``access.Forbidden``, InvalidRequest
    (``older_than`` out of range).
    """
    cfg, _ = authorize(queue, "manage", caller=caller)
    high = LIMITS["retention"][1]
    if older_than is None:
        older_than = cfg.retention
    elif not 0 <= older_than <= high:
        raise InvalidRequest(f"older_than must be between 0 and {high}, got {older_than}", "out_of_range")
    cutoff = datetime.now(UTC).timestamp() - older_than
    expired = archived = 0
    deferred: dict[int, str] = {}
    for m in get_runtime().local_managers(cfg.name):
        before = (m.expired_total, m.archived_total)
        try:
            m.expire(cutoff)
        except PartitionUnavailable as exc:
            deferred[m.index] = str(exc)
        expired += m.expired_total - before[0]
        archived += m.archived_total - before[1]
    if expired:
        Queue.objects.filter(pk=cfg.id).update(expired_total=F("expired_total") + expired)
    return ExpireResult(expired, archived, deferred)


def expire_everywhere(queue: Queue, *, caller: Caller) -> int:
    """Ask every node that owns a partition of ``queue`` to apply the retention rule there
    (the Celery beat task). Only an owner can remove its partition's messages (it holds them
    in its append tree); a partition without a live owner is done by the node that takes it
    over, at the next run. Returns how many messages were removed; failures are logged.
    ``manage`` (the beat task is ``access.SYSTEM``); the nodes are asked as nodes. Checked on
    the row: a Celery worker has no node runtime and must not start one."""
    require(caller, "manage", queue.pk, queue.name, queue.created_by_id)
    addresses = set(
        Partition.objects.filter(queue=queue, owner__isnull=False, owner__stopped_at=None).values_list(
            "owner__address", flat=True
        )
    )
    expired = 0
    for address in sorted(addresses):
        try:
            result = get_peers().expire(address, queue.name)
        except Exception as exc:  # noqa: BLE001 - the next run tries again
            log.warning("retention on %s at %s: %s", queue.name, address, exc)
            continue
        expired += result.expired
        if result.deferred:
            log.warning("retention on %s at %s deferred for partitions %s", queue.name, address, result.deferred)
    return expired


def release_partition(queue: str, index: int, *, caller: Caller, hops: int = 0) -> str:
    """The owner gives the partition's lease up (an operator's action) and leaves it to
    another node for one lease period; asked of the owner wherever it is. Returns the address
    of the node that released it.

    ``manage``; asked of the owner for ``caller``. Raises QueueNotFound, ``access.Forbidden``,
    InvalidRequest (``no_such_partition``), Conflict (``not_owned``: no live node holds it),
    RemoteError.
    """
    cfg, _ = authorize(queue, "manage", caller=caller)
    if not 0 <= index < cfg.partitions:
        raise InvalidRequest(f"{queue} has partitions 0..{cfg.partitions - 1}, not {index}", "no_such_partition")
    rt = get_runtime()
    if rt.release_partition(cfg.name, index):
        audit.record(caller, "release", f"{cfg.name}/{index}", node=rt.address)
        return rt.address
    address = rt.router.owner_of(cfg.id, cfg.name, index) if hops < MAX_HOPS else None
    if address is None:
        raise Conflict(f"no live node holds {queue}/{index} now", "not_owned")
    return get_peers().release_partition(address, cfg.name, index, hops, caller)


def forget_expired_dedup() -> int:
    """Forget the dedup_ids past their queue's window (the database's rows; Redis expires its
    own keys); returns how many. Run by the retention task: the rows were never deleted."""
    return get_dedup().expire()
