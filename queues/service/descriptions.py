"""Queue and topic descriptions, their subscriptions, and the figures read from them.

Rows change in one transaction each (the queue's row locked with SELECT FOR UPDATE where a
change depends on its current value); the node runtime is told after the commit, so the
partition managers never see a description that was rolled back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Unpack

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from queues.access import Caller, Forbidden, audit, require, visible
from queues.cluster.dedup import get_dedup
from queues.engine import keys
from queues.engine.partition import wait_out_trust
from queues.models import Partition, Queue, Subscription, partitions_shrink_error
from queues.public import LIMITS
from queues.service.errors import Conflict, InvalidRequest, QueueNotFound, SubscriptionNotFound
from queues.service.peers import get_peers
from queues.service.reads import permitted_queues
from queues.service.runtime import current_runtime, get_runtime
from queues.service.targets import authorize, checked_name
from queues.service.types import (
    NewQueueFields,
    NewSubscriptionFields,
    PartitionOwner,
    PartitionStats,
    QueueFields,
    QueueStats,
    SubscriptionFields,
    SubscriptionPartitionStats,
    SubscriptionStats,
)

log = logging.getLogger(__name__)


# --- queues and topics --------------------------------------------------------------------------
def _require(caller: Caller, action: str, q: Queue, target: str = "") -> None:
    require(caller, action, q.pk, q.name, q.created_by_id, target=target or q.name)


def get_queue(name: str, kind: str = Queue.Kind.QUEUE, *, caller: Caller) -> Queue:
    """The row of queue (or topic, by ``kind``) ``name``, if ``caller`` may read it. Raises
    QueueNotFound (no such queue, or one the caller may not read)."""
    q = Queue.objects.filter(name=checked_name(name), kind=kind).first()
    if q is None:
        raise QueueNotFound(name)
    _require(caller, "read", q)
    return q


def list_queues(kind: str = Queue.Kind.QUEUE, *, caller: Caller) -> list[Queue]:
    """The queues (or topics) ``caller`` may read, by name (a topic's subscriptions prefetched)."""
    rows = Queue.objects.filter(kind=kind)
    if kind == Queue.Kind.TOPIC:
        rows = rows.prefetch_related("subscriptions")
    return list(rows) if caller.unrestricted else visible(caller, rows)


def readable_names(caller: Caller) -> set[str] | None:
    """Names of the queues and topics ``caller`` may read (None: every one, even those gone),
    to filter what is kept by queue name (the attempt log, the archive)."""
    if caller.unrestricted:
        return None
    return {q.name for q in visible(caller, Queue.objects.only("pk", "name", "created_by_id"))}


def readable_queue_ids(caller: Caller) -> set[int] | None:
    """Row ids of the queues and topics ``caller`` may read (None: every one, and those of the
    queues deleted since), to filter the history kept by a queue's incarnation (the archive,
    the attempt log). A queue deleted and created again under its name is a new row: whoever
    may read the new one reads none of the old one's history; only an unrestricted caller
    (a superuser, the service itself) reads the history of a deleted queue."""
    if caller.unrestricted:
        return None
    return set(permitted_queues(caller).values_list("pk", flat=True))


def current_queue_ids(names: Iterable[str]) -> dict[str, int]:
    """``{name: row id}`` of the queues and topics named (those that exist now): the
    incarnation a record written by name (a worker's report, a redelivery) belongs to."""
    wanted = set(names)
    if not wanted:
        return {}
    return dict(Queue.objects.filter(name__in=wanted).values_list("name", "pk"))


def create_queue(*, caller: Caller, **fields: Unpack[NewQueueFields]) -> Queue:
    """A new queue (or topic, ``kind="topic"``) and its partition rows, in one transaction;
    this node claims its share of the partitions at once (``fields``: its name, kind and
    settings, :class:`~queues.service.types.NewQueueFields`). Any authenticated caller may
    create one; it is recorded as the creator (``created_by_id`` unless given), who may manage
    it. Raises
    ``access.Forbidden`` (an anonymous caller), django's ValidationError, Conflict
    (``already_exists``: the name is taken, also by a concurrent create; ``concurrent_change``: e.g. its
    dead-letter queue was deleted meanwhile)."""
    if caller.user_id is None and not caller.system:
        raise Forbidden(caller, "create", str(fields.get("name", "")))
    if fields.get("created_by_id") is None:
        fields["created_by_id"] = caller.user_id
    _require_dead_letter_queue(caller, fields.get("dead_letter_queue"))
    name = fields.get("name")
    try:
        with transaction.atomic():
            q = Queue(**fields)
            q.full_clean()
            q.save()
            Partition.objects.bulk_create(
                [
                    Partition(queue=q, index=i, lease_period=q.lease_period, epoch=_first_epoch(q, i))
                    for i in range(q.partitions)
                ]
            )
            audit.record(caller, "create", q.name, kind=q.kind, partitions=q.partitions)
    except ValidationError as exc:
        if "name" in getattr(exc, "error_dict", {}) and Queue.objects.filter(name=name).exists():
            raise Conflict(f"a queue or topic named {name!r} exists", "already_exists") from exc
        raise
    except IntegrityError as exc:
        if Queue.objects.filter(name=name).exists():
            raise Conflict(f"a queue or topic named {name!r} exists", "already_exists") from exc
        raise Conflict(f"{name}: a queue it names was changed meanwhile; retry ({exc})", "concurrent_change") from exc
    get_runtime().queue_created(q)
    _others_claim(q)
    return q


def _first_epoch(q: Queue, index: int) -> int:
    """A new partition's epoch: past any fence its keys already hold, so that the first claim
    can raise it. A row id is unique in one database, but one created again (a restore, a test
    database) beside a store that kept its keys reuses ids, and a deleted queue leaves its
    fences behind (``delete_queue``): an epoch is never used twice under the same keys."""
    return get_runtime().store.within(keys.incarnation(q.pk)).read_fence(keys.fence_key(q.name, index))


def update_queue(q: Queue, *, caller: Caller, **fields: Unpack[QueueFields]) -> Queue:
    """Change the settings ``fields`` names (:class:`~queues.service.types.QueueFields`) under
    the row's lock (``manage``); partitions may only grow (existing
    ones hold messages): new partition rows are created in the same transaction. Raises
    QueueNotFound (also when deleted meanwhile) / ``access.Forbidden``, InvalidRequest
    (``partitions_shrink``), Conflict (``partitions_changed``: grown meanwhile past the number
    asked for; ``concurrent_change``: e.g. the dead-letter queue it names was deleted
    meanwhile), django's ValidationError."""
    _require(caller, "manage", q)
    _require_dead_letter_queue(caller, fields.get("dead_letter_queue"))
    seen = q.partitions  # what the caller saw
    try:
        with transaction.atomic():
            locked = Queue.objects.select_for_update().filter(pk=q.pk).first()
            if locked is None:
                raise QueueNotFound(q.name)
            q = locked
            old_partitions = q.partitions
            for k, v in fields.items():
                setattr(q, k, v)
            q.full_clean()
            shrink = partitions_shrink_error(old_partitions, q.partitions)
            if shrink:
                if q.partitions >= seen:
                    raise Conflict(
                        f"{q.name} has {old_partitions} partitions now (grown meanwhile), more than {q.partitions}",
                        "partitions_changed",
                    )
                raise InvalidRequest(shrink, "partitions_shrink")
            q.save()
            Partition.objects.bulk_create(
                [
                    Partition(queue=q, index=i, lease_period=q.lease_period, epoch=_first_epoch(q, i))
                    for i in range(old_partitions, q.partitions)
                ]
            )
            if "lease_period" in fields:
                # Owned rows take the new period from their owner's next renewal (leases.renew).
                Partition.objects.filter(queue=q, owner__isnull=True).update(lease_period=q.lease_period)
            audit.record(caller, "change", q.name, fields=_json_fields(fields))
    except IntegrityError as exc:
        raise Conflict(f"{q.name}: a queue it names was changed meanwhile; retry ({exc})", "concurrent_change") from exc
    get_runtime().queue_changed(q)
    if q.partitions > old_partitions:
        _others_claim(q)
    return q


def learn_estimate(name: str, stage: str, estimate: float, *, caller: Caller) -> float | None:
    """Set queue ``name``'s default ``stage`` estimate (``preprocess`` or ``process``: seconds
    per message, which the workers' scheduler uses for messages that bring none) to a learned
    value (the dashboards job, as ``access.SYSTEM``); ``manage``. Returns the value it had, None
    when there is no such queue.

    Not in the audit trail: the job records every fit it learned, applied or not, with the
    value it replaced (``consoles.EstimateFit``). The nodes read the value with the queue's row
    at their next pass (this process's runtime, if it runs one, once the caller's transaction
    commits): a job that runs outside a node starts no runtime. Raises ``access.Forbidden``,
    InvalidRequest (``unknown_stage``, ``out_of_range``)."""
    if stage not in ("preprocess", "process"):
        raise InvalidRequest(f"unknown stage {stage!r}: preprocess or process", "unknown_stage")
    low, high = LIMITS["estimate"]
    if not low <= estimate <= high:
        raise InvalidRequest(f"an estimate is {low} to {high} seconds, not {estimate}", "out_of_range")
    column = f"{stage}_estimate"
    with transaction.atomic():
        q = Queue.objects.select_for_update().filter(name=name).first()
        if q is None:
            return None
        _require(caller, "manage", q)
        previous: float = getattr(q, column)
        if previous != estimate:
            setattr(q, column, estimate)
            q.save(update_fields=[column, "updated_at"])
            rt = current_runtime()
            if rt is not None:
                transaction.on_commit(lambda: rt.queue_changed(q))
    return previous


def _require_dead_letter_queue(caller: Caller, dlq: Queue | None) -> None:
    """Dead letters are moved by the service itself: naming a dead-letter queue needs
    ``produce`` on it, or a manager of one queue could fill another it may not write to."""
    if isinstance(dlq, Queue):
        _require(caller, "produce", dlq)


def _json_fields(fields: Mapping[str, object]) -> dict[str, Any]:
    """Changed settings as the audit trail keeps them (a related queue by its name)."""
    return {k: (v if v is None or isinstance(v, (bool, int, float, str)) else str(v)) for k, v in fields.items()}


def delete_queue(q: Queue, *, caller: Caller) -> None:
    """Delete the queue (``manage``; its rows cascade) and its keys in the store, then its
    managers here. The other owners are told to drop their managers (else they do at their next
    pass: the rows are gone; their writes are refused from the moment the fences move past
    their epochs).

    The keys are this incarnation's (``keys.incarnation``: the row's id), so a queue created
    again under the name has keys of its own, and no owner of the deleted one, whatever its
    epoch, can write into the new tree. They go under the row's lock. Only the partitions'
    fences stay, one past the last epoch, so that an owner still opening a partition of the
    deleted queue cannot raise an absent fence and leave writes behind. The queue's dedup_ids
    go too. The answer comes ``partition.FENCE_TRUST`` after the fences moved: from then on no
    manager of the deleted queue delivers, on any node, told or not (it reads its fence before
    delivering). Raises QueueNotFound (also when deleted meanwhile by another call) /
    ``access.Forbidden``."""
    _require(caller, "manage", q)
    name, queue_id, kind = q.name, q.pk, q.kind
    rt = get_runtime()
    with transaction.atomic():
        row = Queue.objects.select_for_update().filter(pk=queue_id).first()
        if row is None:
            raise QueueNotFound(name)
        # The partitions' rows too (as the delete would), so no claim moves an epoch meanwhile.
        parts = list(
            Partition.objects.select_for_update(of=("self",)).filter(queue_id=queue_id).select_related("owner")
        )
        owners = {
            p.owner.address
            for p in parts
            if p.owner is not None and p.owner.stopped_at is None and p.owner_id != rt.node_id
        }
        store = rt.store.within(keys.incarnation(queue_id))
        store.delete_prefix(keys.queue_prefix(name))
        for p in parts:
            # The fence stays, past every epoch an owner of this queue held: a late write of
            # one is refused, rather than left behind in the deleted incarnation's keys.
            store.advance_fence(keys.fence_key(name, p.index), p.epoch + 1)
        row.delete()
        # Under the row's lock too: no dedup_id of a queue created again under the name is
        # taken for the old queue's (the database's rows go with this transaction).
        get_dedup().forget(name)
        audit.record(caller, "delete", name, kind=kind)
    fenced_at = time.monotonic()
    rt.queue_deleted(name, queue_id)
    # The other owners drop their managers now rather than serve the deleted queue from memory
    # until their next pass (they keep those of a queue created again under the name since).
    for address in sorted(owners):
        try:
            get_peers().close_purged(address, name)
        except Exception as exc:  # noqa: BLE001 - it drops them at its next pass anyway
            log.info("deleting %s: telling %s failed: %s", name, address, exc)
    # A manager of the deleted queue that was not told (its partition's owner already cleared
    # by a purge under way, the call failed, it was still opening) delivers nothing from memory
    # once this has passed: it reads its moved fence first (partition.FENCE_TRUST).
    wait_out_trust(fenced_at)


def partition_owners(queue: str, *, caller: Caller) -> list[PartitionOwner]:
    """Who serves each partition now (clients may call the owner directly); ``read``."""
    cfg, _ = authorize(queue, "read", caller=caller)
    rows = Partition.objects.filter(queue_id=cfg.id).select_related("owner").order_by("index")
    return [
        {
            "index": p.index,
            "owner_id": p.owner_id,
            "owner_address": p.owner.address if p.owner else None,
            "owner": p.owner_id,
            "address": p.owner.address if p.owner else None,
            "epoch": p.epoch,
            "cooling": bool(p.owner and p.owner.cooling),
        }
        for p in rows
    ]


# --- subscriptions ------------------------------------------------------------------------------
def get_subscription(topic: str, name: str, *, caller: Caller) -> Subscription:
    """``read`` on the topic. Raises QueueNotFound (no such topic, or one the caller may not
    read), SubscriptionNotFound."""
    t = get_queue(topic, Queue.Kind.TOPIC, caller=caller)
    sub = None
    try:
        sub = Subscription.objects.filter(topic=t, name=checked_name(name)).select_related("topic").first()
    except QueueNotFound:
        pass
    if sub is None:
        raise SubscriptionNotFound(f"{topic}/{name}")
    return sub


def create_subscription(topic: Queue, *, caller: Caller, **fields: Unpack[NewSubscriptionFields]) -> Subscription:
    """A new reader of ``topic`` (``manage`` on it). ``start="newest"``: it gets what is
    published from now on; ``"oldest"``: also every message the topic still holds. The owners
    reopen the topic's partitions with the new reader (here at once, elsewhere when told, or at
    their next heartbeat if they cannot be reached). Raises QueueNotFound (also when the topic
    was deleted meanwhile) / ``access.Forbidden``, Conflict (``subscription_exists``)."""
    _require(caller, "manage", topic)
    _require_dead_letter_queue(caller, fields.get("dead_letter_queue"))
    with transaction.atomic():
        # The topic's row locked: a concurrent create of the same name waits and then finds
        # this one, a concurrent delete of the topic waits or went first.
        if Queue.objects.select_for_update().filter(pk=topic.pk).values_list("pk", flat=True).first() is None:
            raise QueueNotFound(topic.name)
        if topic.subscriptions.filter(name=fields.get("name")).exists():
            raise Conflict(f"{topic.name} already has a subscription {fields.get('name')!r}", "subscription_exists")
        sub = Subscription(topic=topic, **fields)
        if sub.start == Subscription.Start.NEWEST:
            sub.starts_at = timezone.now()
        sub.full_clean()
        sub.save()
        audit.record(caller, "subscribe", f"{topic.name}/{sub.name}", start=sub.start)
    _subscriptions_changed(topic)
    return sub


def delete_subscription(sub: Subscription, *, caller: Caller) -> None:
    """Remove a reader (``manage`` on its topic); what only it held stays until the topic's
    retention removes it. Raises QueueNotFound / ``access.Forbidden``."""
    topic = sub.topic
    _require(caller, "manage", topic, f"{topic.name}/{sub.name}")
    with transaction.atomic():
        sub.delete()
        audit.record(caller, "unsubscribe", f"{topic.name}/{sub.name}")
    _subscriptions_changed(topic)
    store = get_runtime().store.within(keys.incarnation(topic.pk))
    for index in range(topic.partitions):
        store.delete_prefix(keys.acks_bucket(topic.name, index, sub.name))
        store.delete_prefix(keys.receives_bucket(topic.name, index, sub.name))


#: what a subscription's owner may change after it is made (its name, topic and start stay).
SUBSCRIPTION_SETTINGS = ("visibility_timeout", "dead_letter_queue", "max_receives")


def update_subscription(sub: Subscription, *, caller: Caller, **fields: Unpack[SubscriptionFields]) -> Subscription:
    """Change a subscription's settings (:data:`SUBSCRIPTION_SETTINGS`) under its row's lock:
    ``manage`` on its topic, and ``produce`` on a dead-letter queue it is pointed to (the
    service moves the dead letters there, so naming one is writing to it). Recorded as
    ``change`` of ``topic/subscription``; the owners reopen the topic's partitions with the new
    settings (here at once, elsewhere when told, or at their next heartbeat). Raises
    QueueNotFound (also when the topic was deleted meanwhile) / ``access.Forbidden``,
    SubscriptionNotFound (deleted meanwhile), InvalidRequest (``read_only_setting``), django's
    ValidationError."""
    check_subscription_update(sub, caller=caller, **fields)
    if not fields:
        return sub  # nothing to change, nothing to record
    topic = sub.topic
    target = f"{topic.name}/{sub.name}"
    with transaction.atomic():
        locked = Subscription.objects.select_for_update().filter(pk=sub.pk).first()
        if locked is None:
            raise SubscriptionNotFound(target)
        for k, v in fields.items():
            setattr(locked, k, v)
        locked.full_clean()
        locked.save(update_fields=list(fields))
        audit.record(caller, "change", target, fields=_json_fields(fields))
    _subscriptions_changed(topic)
    return locked


def check_subscription_update(sub: Subscription, *, caller: Caller, **fields: Unpack[SubscriptionFields]) -> None:
    """Raise what :func:`update_subscription` refuses before it changes anything (a form's
    check): the caller's rights, a setting that cannot change."""
    target = f"{sub.topic.name}/{sub.name}"
    _require(caller, "manage", sub.topic, target)
    fixed = sorted(set(fields) - set(SUBSCRIPTION_SETTINGS))
    if fixed:
        raise InvalidRequest(
            f"{target}: {', '.join(fixed)} cannot be changed (only {', '.join(SUBSCRIPTION_SETTINGS)})",
            "read_only_setting",
        )
    _require_dead_letter_queue(caller, fields.get("dead_letter_queue"))


def reload(name: str, *, caller: Caller) -> None:
    """Queue or topic ``name`` was created or changed through another node: describe it afresh
    and claim this node's share of its partitions now; a topic whose subscriptions changed has
    its partitions held here reopened (``read``: it changes nothing but this node's memory)."""
    get_runtime().reload(authorize(name, "read", caller=caller)[0].name)


#: Seconds a create waits for the other nodes to claim their shares of the new partitions.
CLAIM_WAIT = 2.0


def _others_claim(q: Queue) -> None:
    """Have every other live node (this node's sibling processes first among them) claim its
    share of the queue's partitions now, so that the queue is served by all of them when the
    create returns. A node that does not answer within :data:`CLAIM_WAIT` claims at its next
    pass; until then the calls for its share wait for an owner (``cluster.routing.owner``)."""
    rt = get_runtime()
    try:
        addresses = sorted({n.address for n in rt.live_nodes() if n.pk != rt.node_id and n.address != rt.address})
    except Exception as exc:  # noqa: BLE001 - the others find it at their next pass
        log.warning("telling the other nodes of %s: %s", q.name, exc)
        return
    if not addresses:
        return
    peers = get_peers()

    def tell(address: str) -> None:
        try:
            peers.reload(address, q.name)
        except Exception as exc:  # noqa: BLE001 - it claims at its next pass
            log.info("telling %s of %s: %s", address, q.name, exc)

    pool = ThreadPoolExecutor(max_workers=min(8, len(addresses)), thread_name_prefix="claim")
    try:
        wait([pool.submit(tell, a) for a in addresses], timeout=CLAIM_WAIT)
    finally:
        pool.shutdown(wait=False)
    rt.router.forget(q.pk)


def _subscriptions_changed(topic: Queue) -> None:
    rt = get_runtime()
    rt.reload(topic.name)
    owners = set(
        Partition.objects.filter(queue=topic, owner__isnull=False, owner__stopped_at=None)
        .exclude(owner_id=rt.node_id)
        .values_list("owner__address", flat=True)
    )
    for address in sorted(owners):
        try:
            get_peers().reload(address, topic.name)
        except Exception as exc:  # noqa: BLE001 - it sees the change at its next heartbeat
            log.warning("telling %s about %s's subscriptions: %s", address, topic.name, exc)


# --- figures ------------------------------------------------------------------------------------
def queue_stats(queue: str, *, caller: Caller) -> QueueStats:
    """Depth, in flight, oldest age, per partition (``read``): live from this node's managers,
    else as the owners last published them. Raises QueueNotFound."""
    rt = get_runtime()
    cfg, _ = authorize(queue, "read", caller=caller)
    local = {m.index: m.stats() for m in rt.local_managers(queue)}
    parts: list[PartitionStats] = []
    now = time.time()
    for p in Partition.objects.filter(queue_id=cfg.id).select_related("owner").order_by("index"):
        s = local.get(p.index)
        if s is not None:
            entry: PartitionStats = {
                "index": p.index,
                "owner_id": rt.node_id,
                "owner_address": rt.address,
                "owner": rt.address,
                "epoch": s.epoch,
                "live": True,
                "depth": s.visible,
                "in_flight": s.in_flight,
                "delayed": s.delayed,
                "depth_exact": s.depth_exact,
                "oldest_age": round(now - s.oldest_enqueued_at, 3) if s.oldest_enqueued_at else None,
                "head_block": s.head_block,
                "enqueue_id": s.enqueue_id,
                "dequeue_id": s.dequeue_id,
                "tree_height": s.tree_height,
                "live_blocks": s.live_blocks,
                "enqueued": s.enqueued_total,
                "acked": s.acked_total,
                "redelivered": s.redelivered_total,
            }
        else:
            entry = {
                "index": p.index,
                "owner_id": p.owner_id,
                "owner_address": p.owner.address if p.owner else None,
                "owner": p.owner.address if p.owner else None,
                "epoch": p.epoch,
                "live": False,
                "depth": p.depth,
                "in_flight": p.in_flight,
                "delayed": p.delayed,
                "depth_exact": False,
                "oldest_age": round(now - p.oldest_enqueued_at.timestamp(), 3) if p.oldest_enqueued_at else None,
                "head_block": p.head_block,
                "enqueue_id": p.enqueue_id,
                "dequeue_id": p.dequeue_id,
                "tree_height": p.tree_height,
                "live_blocks": p.live_blocks,
                "enqueued": p.enqueued_total,
                "acked": p.acked_total,
                "redelivered": p.redelivered_total,
            }
        parts.append(entry)
    ages = [e["oldest_age"] for e in parts if e["oldest_age"] is not None]
    out: QueueStats = {
        "queue": queue,
        "depth": sum(e["depth"] for e in parts),
        "in_flight": sum(e["in_flight"] for e in parts),
        "delayed": sum(e["delayed"] for e in parts),
        "oldest_age": max(ages) if ages else None,
        "partitions": parts,
    }
    if cfg.kind == "topic":
        out["subscriptions"] = {
            s.name: subscription_stats(queue, s.name, caller=caller) for s in cfg.subscriptions or ()
        }
    return out


def subscription_stats(topic: str, sub: str, *, caller: Caller) -> SubscriptionStats:
    """What a subscription holds: messages not yet acked by it (in flight included), per
    partition (``read`` on the topic); live from this node's managers, else as the owners last
    published it. Raises QueueNotFound."""
    rt = get_runtime()
    cfg, _ = authorize(topic, "read", caller=caller)
    local = {m.index: m.stats().cursors.get(sub) for m in rt.local_managers(topic)}
    now = time.time()
    parts: list[SubscriptionPartitionStats] = []
    for p in Partition.objects.filter(queue_id=cfg.id).order_by("index"):
        figures = local.get(p.index) or (p.cursors or {}).get(sub) or {}
        oldest = figures.get("oldest_enqueued_at")  # held, in flight included
        held, in_flight = figures.get("held", 0), figures.get("in_flight", 0)
        parts.append(
            {
                "index": p.index,
                "live": local.get(p.index) is not None,
                "held": held,
                "in_flight": in_flight,
                "acked": figures.get("acked", 0),
                "redelivered": figures.get("redelivered", 0),
                "archived": figures.get("archived", 0),
                "dequeue_id": figures.get("dequeue_id", ""),
                "oldest_age": round(now - oldest, 3) if oldest else None,
                "depth": max(held - in_flight, 0),
            }
        )
    ages = [e["oldest_age"] for e in parts if e["oldest_age"] is not None]
    # "queue", "depth", "in_flight" and "oldest_age" as in a queue's stats: clients read both
    # the same way.
    return {
        "queue": f"{topic}/{sub}",
        "topic": topic,
        "subscription": sub,
        "held": sum(e["held"] for e in parts),
        "depth": sum(e["depth"] for e in parts),
        "in_flight": sum(e["in_flight"] for e in parts),
        "acked": sum(e["acked"] for e in parts),
        "archived": sum(e["archived"] for e in parts),
        "oldest_age": max(ages) if ages else None,
        "partitions": parts,
    }
