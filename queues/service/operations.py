"""Operators' actions on a queue's messages and leases: purge, redrive, expire, release.

Each is one function with the same contract whoever calls it (the REST API, the admin, a Celery
task): typed arguments, a typed result, the service's exceptions.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime

from django.db.models import F

from queues.access import Caller, audit, require
from queues.cluster.acks import ack_here
from queues.cluster.dedup import get_dedup
from queues.cluster.long_polls import message_id as _message_id
from queues.cluster.purge import purge_partition
from queues.cluster.router import MAX_HOPS
from queues.engine.config import QueueConfig
from queues.engine.ids import StoredMessage
from queues.engine.partition import Delivery, PartitionManager, wait_out_trust
from queues.engine.ports import Lease
from queues.models import Partition, Queue
from queues.public import LIMITS, QUEUE_NAME
from queues.service.errors import Conflict, InvalidRequest, PartitionUnavailable, QueueNotFound, RemoteError
from queues.service.messages import enqueue
from queues.service.peers import get_peers
from queues.service.runtime import get_runtime
from queues.service.targets import authorize
from queues.service.types import ExpireResult, MessageDraft, RedriveResult

log = logging.getLogger(__name__)

#: How long redrive hides the dead letters it is moving (they are acked or given back before
#: it answers; this only matters if the node dies meanwhile).
REDRIVE_VISIBILITY = 60.0


def purge(queue: str, *, caller: Caller, forget_dedup: bool = False) -> int:
    """Remove every message of ``queue``, in flight ones too (``manage``); returns how many
    were removed. With ``forget_dedup`` its remembered dedup_ids go too (SQS's PurgeQueue: a
    message sent again after it is stored); without, a retried dedup_id still answers the
    purged message's ID for the rest of its window.

    Done here whoever owns the partitions (see ``queues.cluster.purge``: each row's epoch moves on
    in its own transaction, then the store's fence, then the old tree is deleted); the owners
    are then told to drop their managers, which they would do anyway at their next renewal.
    It answers ``partition.FENCE_TRUST`` after the fences moved: from then on no manager of
    the old epochs delivers what it removed, told or not (it reads its fence first).
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
            # Deleted meanwhile (its fences moved before its rows went), after this purge
            # moved some: the answer waits out the managers' trust all the same.
            wait_out_trust(time.monotonic())
            raise QueueNotFound(queue)
        removed += count
    fenced_at = time.monotonic()
    rt.purged(cfg.name)
    for address in sorted(owners):
        try:
            get_peers().close_purged(address, cfg.name)
        except Exception as exc:  # noqa: BLE001 - it stops at its next renewal anyway
            log.warning("purge of %s: telling %s failed: %s", cfg.name, address, exc)
    # Not answered before no manager of the old epochs, told or not, delivers without reading
    # its fence (a node whose call failed, one that was still opening the partition).
    wait_out_trust(fenced_at)
    if forget_dedup:
        get_dedup().forget(cfg.name)
    Queue.objects.filter(pk=queue_id).update(purged_total=F("purged_total") + removed)
    audit.record(caller, "purge", cfg.name, removed=removed)
    log.info("purged %s: %d messages", cfg.name, removed)
    return removed


def close_purged(queue: str, *, caller: Caller) -> None:
    """Another node purged ``queue``: drop this node's managers of it now (``manage``: a
    node's own call comes as ``access.SYSTEM``)."""
    get_runtime().purged(authorize(queue, "manage", caller=caller)[0].name)


def redrive(queue: str, max_messages: int = 100, *, caller: Caller, hops: int = 0) -> RedriveResult:
    """Move up to ``max_messages`` dead letters of ``queue`` back to where they came from
    (``history.source``: a queue, or ``topic/subscription``), each with its group, as new
    messages; each source's share is stored there, then acknowledged here, before the next
    source's. ``manage`` on ``queue``, ``produce`` on each source.

    The dead letters are taken in rounds (a grouped one's successor is deliverable only once it
    is acked); every source a round names is checked (it exists, the caller may produce to it)
    before anything of that round is copied. Dead letters that name no source (enqueued here by
    a client) are skipped: they stay hidden while the call runs, so a round never takes them
    twice, and are given back when it ends, their receive counts as they were. This node's
    partitions first, then (``hops`` 0) each other owner's, asked for ``caller``.

    Raises QueueNotFound / SubscriptionNotFound / ``access.Forbidden`` for ``queue`` or for a
    source (nothing of that round copied; earlier rounds stay moved, acknowledged here, so a
    retry does not copy them twice), and what :func:`enqueue` raises for a source (that source's
    share and the rest of the round are given back).
    """
    cfg, _ = authorize(queue, "manage", caller=caller)
    moved: dict[str, int] = {}
    skipped = 0
    held: list[tuple[PartitionManager[Lease], list[Delivery]]] = []  # skipped: given back at the end
    try:
        while sum(moved.values()) + skipped < max_messages:
            taken = _take_local(cfg, min(100, max_messages - sum(moved.values()) - skipped))
            if not taken:
                break
            by_source: dict[str, list[tuple[PartitionManager[Lease], Delivery]]] = {}
            for m, ds in taken:
                skip = []
                for d in ds:
                    assert d.message is not None
                    source = (d.message.history or {}).get("source")
                    if isinstance(source, str) and _SOURCE_RE.fullmatch(source):
                        by_source.setdefault(source, []).append((m, d))
                    else:
                        skip.append(d)
                if skip:
                    held.append((m, skip))
                    skipped += len(skip)
            todo = list(by_source.items())
            try:
                for source, _ in todo:
                    _check_source(source, caller)
                while todo:
                    source, pairs = todo[0]
                    _move(source, pairs, caller)
                    todo.pop(0)
                    moved[source] = moved.get(source, 0) + len(pairs)
            finally:
                for _, pairs in todo:  # not moved: back at once, counts as they were
                    _give_back(pairs)
    finally:
        for m, ds in held:
            m.give_back(ds)
    result = RedriveResult(sum(moved.values()), skipped, moved)
    if hops == 0 and result.moved + result.skipped < max_messages:
        result = _redrive_elsewhere(cfg, max_messages, result, caller)
    audit.record(caller, "redrive", cfg.name, moved=result.moved, skipped=result.skipped)
    return result


#: A dead letter's ``history.source``: a queue, or a topic's subscription.
_SOURCE_RE = re.compile(rf"{QUEUE_NAME}(/{QUEUE_NAME})?")


def _take_local(cfg: QueueConfig, max_messages: int) -> list[tuple[PartitionManager[Lease], list[Delivery]]]:
    """Up to ``max_messages`` dead letters from this node's partitions, hidden for
    ``REDRIVE_VISIBILITY``, with the manager each came from (to give them back to)."""
    out: list[tuple[PartitionManager[Lease], list[Delivery]]] = []
    count = 0
    for m in get_runtime().local_managers(cfg.name):
        try:
            got = m.dequeue(max_messages - count, REDRIVE_VISIBILITY)
            if got:
                got = m.load_bodies(got, "")
        except PartitionUnavailable:
            continue
        if got:
            out.append((m, got))
            count += len(got)
        if count >= max_messages:
            break
    return out


def _check_source(source: str, caller: Caller) -> None:
    """Refuse a source that does not exist now, or that ``caller`` may not produce to."""
    topic, _, sub = source.partition("/")
    cfg, _ = authorize(topic, "produce", caller=caller)
    if sub:
        if cfg.kind != "topic":
            raise QueueNotFound(topic)
        cfg.subscription(sub)  # SubscriptionNotFound
    elif cfg.kind == "topic":
        raise QueueNotFound(source)  # a queue's dead letter whose name is a topic's now


def _move(source: str, pairs: list[tuple[PartitionManager[Lease], Delivery]], caller: Caller) -> None:
    """Store one source's dead letters there (in their order), then acknowledge them here."""
    topic, _, sub = source.partition("/")
    drafts = [_back_to_source(d.message, sub or None) for _, d in pairs if d.message is not None]
    # A new call from here (hops 0): this may be a redrive forwarded by another node.
    enqueue(topic, drafts, caller=caller)
    # Without receipts: moved is moved, whoever holds them now; one purged meanwhile counts as
    # not found rather than refusing the others.
    ack_here(get_runtime(), pairs[0][0].queue, [(_message_id(d.id), None) for _, d in pairs])


def _give_back(pairs: list[tuple[PartitionManager[Lease], Delivery]]) -> None:
    by_manager: dict[int, tuple[PartitionManager[Lease], list[Delivery]]] = {}
    for m, d in pairs:
        by_manager.setdefault(id(m), (m, []))[1].append(d)
    for m, ds in by_manager.values():
        m.give_back(ds)


def _redrive_elsewhere(cfg: QueueConfig, max_messages: int, result: RedriveResult, caller: Caller) -> RedriveResult:
    """The rest at the other owners of ``queue``'s partitions, one after the other."""
    moved, skipped, sources = result.moved, result.skipped, dict(result.sources)
    for address in get_runtime().router.other_nodes(cfg.id, cfg.name):
        if moved + skipped >= max_messages:
            break
        try:
            got = get_peers().redrive(address, cfg.name, max_messages - moved - skipped, 0, caller)
        except RemoteError:
            raise  # its refusal (a source not found, forbidden) is the caller's answer
        except Exception as exc:  # noqa: BLE001 - unreachable: its dead letters wait for the next call
            log.warning("redrive of %s at %s: %s", cfg.name, address, exc)
            continue
        moved += got.moved
        skipped += got.skipped
        for source, n in got.sources.items():
            sources[source] = sources.get(source, 0) + n
    return RedriveResult(moved, skipped, sources)


def _back_to_source(m: StoredMessage, subscription: str | None = None) -> MessageDraft:
    """A dead letter as a new message for the queue (or only the subscription) it came from,
    in its group again."""
    return MessageDraft(
        m.body,
        group=(m.history or {}).get("group"),
        attributes=m.attributes,
        size=m.size,
        estimates=m.estimates,
        subscription=subscription,
        fairness_key=m.fairness_key,
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
