"""The service facade: what the API (and anything else in-process) calls.

Each function validates nothing about HTTP; it takes checked Python values, routes them to the
partition managers of this node, and raises the domain errors the API maps to status codes.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from . import keys
from .messages import MessageId, StoredMessage
from .models import Partition, Queue, Subscription
from .node import NodeRuntime, QueueConfig, QueueNotFound, SubscriptionNotFound
from .partition import Delivery, NotServedHere, PartitionUnavailable, ReceiptMismatch

log = logging.getLogger(__name__)

__all__ = [
    "QueueNotFound",
    "SubscriptionNotFound",
    "PartitionUnavailable",
    "ReceiptMismatch",
    "get_runtime",
    "set_runtime",
    "create_queue",
    "delete_queue",
    "enqueue",
    "dequeue",
    "ack",
    "change_visibility",
    "queue_stats",
]

monotonic = time.monotonic

_runtime: NodeRuntime | None = None
_runtime_lock = threading.Lock()

#: Longest long poll, as SQS.
MAX_WAIT = 20.0


def get_runtime() -> NodeRuntime:
    """This process's node, started on first use (``runnode`` starts it explicitly)."""
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                address = settings.NODE_ADDRESS or "in-process"
                _runtime = NodeRuntime(
                    address, heartbeat=settings.NODE_HEARTBEAT, cache_bytes=settings.NODE_BODY_CACHE_BYTES
                ).start()
    return _runtime


def set_runtime(runtime: NodeRuntime | None) -> None:
    global _runtime
    with _runtime_lock:
        _runtime = runtime


# --- queues -----------------------------------------------------------------------------------
def create_queue(**fields) -> Queue:
    with transaction.atomic():
        q = Queue(**fields)
        q.full_clean()
        q.save()
        Partition.objects.bulk_create(
            [Partition(queue=q, index=i, lease_period=q.lease_period) for i in range(q.partitions)]
        )
    get_runtime().queue_created(q)
    return q


def update_queue(q: Queue, **fields) -> Queue:
    """Change settings; partitions may only grow (existing ones hold messages)."""
    with transaction.atomic():
        q = Queue.objects.select_for_update().get(pk=q.pk)
        old_partitions = q.partitions
        for k, v in fields.items():
            setattr(q, k, v)
        q.full_clean()
        if q.partitions < old_partitions:
            raise ValueError("partitions can only grow: existing partitions hold messages")
        q.save()
        Partition.objects.bulk_create(
            [Partition(queue=q, index=i, lease_period=q.lease_period) for i in range(old_partitions, q.partitions)]
        )
        if "lease_period" in fields:
            # Owned rows take the new period from their owner's next renewal (leases.renew).
            Partition.objects.filter(queue=q, owner__isnull=True).update(lease_period=q.lease_period)
    get_runtime().queue_changed(q)
    return q


def delete_queue(q: Queue) -> None:
    name = q.name
    with transaction.atomic():
        q.delete()
    get_runtime().queue_deleted(name)


# --- subscriptions ----------------------------------------------------------------------------
def create_subscription(topic: Queue, **fields) -> Subscription:
    """A new reader of ``topic``. ``start="newest"``: it gets what is published from now on;
    ``"oldest"``: also every message the topic still holds. The owners reopen the topic's
    partitions with the new reader (here at once, elsewhere when told, or at their next
    heartbeat if they cannot be reached)."""
    from django.utils import timezone

    with transaction.atomic():
        sub = Subscription(topic=topic, **fields)
        if sub.start == Subscription.Start.NEWEST:
            sub.starts_at = timezone.now()
        sub.full_clean()
        sub.save()
    _subscriptions_changed(topic)
    return sub


def delete_subscription(sub: Subscription) -> None:
    """Remove a reader; what only it held stays until the topic's retention removes it."""
    topic = sub.topic
    with transaction.atomic():
        sub.delete()
    _subscriptions_changed(topic)
    store = get_runtime().store
    for index in range(topic.partitions):
        store.delete_prefix(keys.acks_bucket(topic.name, index, sub.name))
        store.delete_prefix(keys.receives_bucket(topic.name, index, sub.name))


def _subscriptions_changed(topic: Queue) -> None:
    rt = get_runtime()
    rt.topic_changed(topic.name)
    owners = set(
        Partition.objects.filter(queue=topic, owner__isnull=False, owner__stopped_at=None)
        .exclude(owner_id=rt.node_id)
        .values_list("owner__address", flat=True)
    )
    for address in sorted(owners):
        try:
            rt.router.forward(address, topic.name, "refresh", {}, 1)
        except Exception as exc:  # noqa: BLE001 - it sees the change at its next heartbeat
            log.warning("telling %s about %s's subscriptions: %s", address, topic.name, exc)


# --- messages ---------------------------------------------------------------------------------
def enqueue_to(queue: str, index: int, messages: list[StoredMessage]) -> list[str]:
    """Store the messages in partition ``index`` (their group's), which must be served here."""
    return get_runtime().manager(queue, index).enqueue(messages)


def enqueue(queue: str, messages: list[StoredMessage], *, even_if_cooling: bool = False) -> list[str]:
    """Store the messages in one partition, in order. Tries each local partition in turn.

    Raises :class:`NotServedHere` when this node has no partition of the queue, or is
    cooling (over its load or failure threshold) and ``even_if_cooling`` is false.
    """
    rt = get_runtime()
    rt.queue(queue)
    managers = [m for m in rt.local_managers(queue) if m.enqueue_ready]
    if not managers:
        raise NotServedHere(f"no partition of {queue!r} is served by this node now; retry")
    if rt.cooling and not even_if_cooling:
        raise NotServedHere(f"node {rt.address} is cooling: enqueues go to other nodes")
    start = rt.rotation(len(managers))
    last: Exception | None = None
    for i in range(len(managers)):
        m = managers[(start + i) % len(managers)]
        try:
            return m.enqueue(messages)
        except PartitionUnavailable as exc:
            last = exc
    raise last  # type: ignore[misc]


def dequeue(queue: str, max_messages: int, visibility: float | None, wait: float, sub: str = "") -> list[Delivery]:
    """Up to ``max_messages`` deliveries (to subscription ``sub`` of a topic), waiting up to
    ``wait`` seconds for the first."""
    rt = get_runtime()
    cfg: QueueConfig = rt.queue(queue)
    visibility = cfg.visibility_timeout if visibility is None else visibility
    give_up = monotonic() + min(wait, MAX_WAIT)
    while True:
        seq = rt.change_seq()
        managers = rt.local_managers(queue)
        out: list[Delivery] = []
        if managers:
            start = rt.rotation(len(managers))
            for i in range(len(managers)):
                m = managers[(start + i) % len(managers)]
                try:
                    got = m.dequeue(max_messages - len(out), visibility, sub)
                    if got:  # what cannot be read now is given back, not left hidden
                        out.extend(m.load_bodies(got, sub))
                except PartitionUnavailable:
                    continue
                if len(out) >= max_messages:
                    break
        if out:
            return out
        now = monotonic()
        if now >= give_up:
            return out
        # Sleep until something is enqueued or until the next visibility deadline passes.
        timeout = give_up - now
        for m in managers:
            nd = m.next_wakeup(sub)
            if nd is not None:
                timeout = min(timeout, max(nd - now, 0.0) + 0.001)
        rt.wait_for_change(seq, timeout)


def _group(items: list[tuple[MessageId, str | None]], queue: str):
    rt = get_runtime()
    rt.queue(queue)
    by_partition: dict[int, list[tuple[MessageId, str | None]]] = {}
    for mid, receipt in items:
        by_partition.setdefault(mid.partition, []).append((mid, receipt))
    # Locks are taken in partition order, so two batches never wait on each other in a cycle.
    return [(rt.manager(queue, p), by_partition[p]) for p in sorted(by_partition)]


@dataclass
class AckResult:
    #: messages removed by this call.
    acked: int
    #: IDs that were no longer stored (acknowledged before, or never existed).
    not_found: int


def ack(queue: str, items: list[tuple[MessageId, str | None]], sub: str = "") -> AckResult:
    """Acknowledge; all receipts are checked before anything is removed (409 changes nothing).

    Receipts are checked with every involved partition locked (in index order), and the
    messages pinned against redelivery; the deletes then run without the locks.
    """
    unique = list({str(mid): (mid, receipt) for mid, receipt in items}.values())
    groups = _group(unique, queue)
    if len(groups) == 1:
        m, group = groups[0]
        removed = m.ack(group, sub=sub)
        return AckResult(removed, len(unique) - removed)
    pins: list[dict[str, float]] = []
    locked = []
    try:
        for m, _ in groups:
            m.lock.acquire()
            locked.append(m)
            m._check_serving()
        for m, group in groups:
            m.check_receipts(group, sub)
        pins = [m.pin_for_ack([mid for mid, _ in group], sub) for m, group in groups]
    finally:
        for m in reversed(locked):
            m.lock.release()
    acked = 0
    failure: Exception | None = None
    for (m, group), pinned in zip(groups, pins):
        mids = [mid for mid, _ in group]
        try:
            removed = m.delete_acked(mids, sub=sub)
        except PartitionUnavailable as exc:
            failure = exc
            with m.lock:
                m.unpin(pinned, sub)
            continue
        acked += removed
        try:
            with m.lock:
                m.settle_acked(mids, removed, sub)
        except PartitionUnavailable as exc:
            failure = exc  # deleted; the manager closed itself and its memory goes with it
    if failure is not None:
        raise failure
    return AckResult(acked, len(unique) - acked)


def change_visibility(queue: str, mid: MessageId, receipt: str | None, timeout: float, sub: str = "") -> None:
    ((m, _),) = _group([(mid, receipt)], queue)
    with m.lock:
        m._check_serving()
        m.change_visibility_locked(mid, receipt, timeout, sub)


def queue_stats(queue: str) -> dict:
    rt = get_runtime()
    cfg = rt.queue(queue)
    local = {m.index: m.stats() for m in rt.local_managers(queue)}
    parts = []
    now = time.time()
    for p in Partition.objects.filter(queue_id=cfg.id).select_related("owner").order_by("index"):
        s = local.get(p.index)
        if s is not None:
            entry = {
                "index": p.index,
                "owner": rt.address,
                "epoch": s.epoch,
                "live": True,
                "depth": s.visible,
                "in_flight": s.in_flight,
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
                "owner": p.owner.address if p.owner else None,
                "epoch": p.epoch,
                "live": False,
                "depth": p.depth,
                "in_flight": p.in_flight,
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
    out = {
        "queue": queue,
        "depth": sum(e["depth"] for e in parts),
        "in_flight": sum(e["in_flight"] for e in parts),
        "oldest_age": max(ages) if ages else None,
        "partitions": parts,
    }
    if cfg.kind == "topic":
        out["subscriptions"] = {s.name: subscription_stats(queue, s.name) for s in cfg.subscriptions or ()}
    return out


def subscription_stats(topic: str, sub: str) -> dict:
    """What a subscription holds: messages not yet acked by it (in flight included), per
    partition; live from this node's managers, else as the owners last published it."""
    rt = get_runtime()
    cfg = rt.queue(topic)
    local = {m.index: m.stats().cursors.get(sub) for m in rt.local_managers(topic)}
    now = time.time()
    parts = []
    for p in Partition.objects.filter(queue_id=cfg.id).order_by("index"):
        figures = local.get(p.index) or (p.cursors or {}).get(sub) or {}
        entry = {
            "index": p.index,
            "live": local.get(p.index) is not None,
            **{k: figures.get(k, 0) for k in ("held", "in_flight", "acked", "redelivered", "archived")},
            "dequeue_id": figures.get("dequeue_id", ""),
        }
        oldest = figures.get("oldest_enqueued_at")  # held, in flight included
        entry["oldest_age"] = round(now - oldest, 3) if oldest else None
        entry["depth"] = max(entry["held"] - entry["in_flight"], 0)
        parts.append(entry)
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
