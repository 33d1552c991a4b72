"""The message calls, independent of the transport.

Each function takes the queue name and the parsed JSON body and returns ``(status, payload)``,
raising the API's exceptions for errors. The DRF views and the fast path (``fastpath``) both
call these, so the two cannot drift apart in what they accept or answer.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.db.models import F
from django.utils.timezone import now as timezone_now

from .. import service
from ..dedup import get_dedup
from ..messages import StoredMessage, group_partition, parse_message_id
from ..models import LIMITS, QUEUE_NAME_RE, Partition, Queue
from ..partition import Delivery, NotServedHere, PartitionUnavailable
from ..router import MAX_HOPS, Forwarded
from . import validation
from .errors import BadRequest

log = logging.getLogger(__name__)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def checked_name(name: str) -> str:
    """A name no queue can have (NUL, '/', too long...) is unknown, not a database error."""
    if not QUEUE_NAME_RE.fullmatch(name):
        raise service.QueueNotFound(name)
    return name


def queue_config(name: str):
    return service.get_runtime().queue(checked_name(name))


def target(name: str, *, reading: bool = True):
    """``(config, subscription)`` of a call's target: a queue (``"orders"``, subscription "")
    or a topic's subscription (``"news/mail"``). A topic is published to by name and read
    only through a subscription."""
    queue, slash, sub = name.partition("/")
    cfg = queue_config(queue)
    if slash:
        if cfg.kind != "topic":
            raise service.QueueNotFound(name)
        if cfg.subscription(sub) is None:
            raise service.SubscriptionNotFound(name)
    elif reading and cfg.kind == "topic":
        raise BadRequest(
            f"{queue} is a topic: read it through a subscription (/api/v1/topics/{queue}/subscriptions/<name>/...)",
            "is_a_topic",
        )
    return cfg, sub


def _local_or_forward(name: str, call: str, data, hops: int, local):
    """Run ``local``; if this node does not serve the call, pass it to a node that does."""
    try:
        return local()
    except NotServedHere:
        if hops >= MAX_HOPS:
            raise
    rt = service.get_runtime()
    cfg = rt.queue(name)
    last: Exception | None = None
    for address in rt.router.other_nodes(cfg.id, name):
        try:
            status, payload = rt.router.forward(address, name, call, data, hops)
        except Exception as exc:  # noqa: BLE001 - try the next owner
            last = exc
            continue
        if status < 500:
            return status, payload
    if call == "enqueue" and rt.local_managers(name):
        # Nobody else could take it: a cooling node still serves rather than refuse.
        return local(even_if_cooling=True)
    raise NotServedHere(f"no node serves queue {name!r} now ({last or 'no owner'}); retry")


def enqueue(name: str, data, hops: int = 0, trusted: bool = False) -> tuple[int, dict]:
    """Dedup first (shared by all nodes), then each message to its group's partition (here or
    at its owner), ungrouped ones to any partition; the IDs come back in the caller's order.
    ``trusted``: the caller is a node (it may carry a dead letter's history)."""
    cfg = queue_config(name)
    now = datetime.now(UTC).timestamp()
    drafts, batch = validation.enqueue_request(data, cfg, now, trusted)
    items = data["messages"] if batch else [data]
    ids: list[str | None] = [None] * len(drafts)
    dedup = get_dedup() if any(d.dedup_id for d in drafts) else None
    reserved: dict[str, int] = {}  # dedup_id -> index of the draft that stores it
    try:
        # Inside the try: a later reservation that fails (busy elsewhere, store down) must give
        # back the ones already taken, or their dedup_ids stay blocked for the whole window.
        for i, d in enumerate(drafts):
            if d.dedup_id is None:
                continue
            if d.dedup_id in reserved:
                continue  # a repeat inside the batch: takes the first one's ID below
            existing = dedup.reserve(name, d.dedup_id, cfg.dedup_window)
            if existing is not None:
                ids[i] = existing
            else:
                reserved[d.dedup_id] = i
        todo = [
            i for i, d in enumerate(drafts) if ids[i] is None and (d.dedup_id is None or reserved.get(d.dedup_id) == i)
        ]
        by_partition: dict[int | None, list[int]] = {}
        for i in todo:
            group = drafts[i].group
            by_partition.setdefault(group_partition(group, cfg.partitions) if group else None, []).append(i)
        for index, positions in by_partition.items():
            stored = _enqueue_somewhere(
                cfg, index, [drafts[i] for i in positions], [items[i] for i in positions], now, hops
            )
            for i, mid in zip(positions, stored):
                ids[i] = mid
    except BaseException:
        # Stored ones keep their dedup_id (a retry gets their IDs); the rest are given back.
        for dedup_id, i in reserved.items():
            if ids[i] is None:
                dedup.release(name, dedup_id)
            else:
                dedup.confirm(name, dedup_id, ids[i], cfg.dedup_window)
        raise
    for dedup_id, i in reserved.items():
        dedup.confirm(name, dedup_id, ids[i], cfg.dedup_window)
    for i, d in enumerate(drafts):
        if ids[i] is None:
            ids[i] = ids[reserved[d.dedup_id]]
    return 201, ({"ids": ids} if batch else {"id": ids[0]})


def _stored(d, now: float) -> StoredMessage:
    return StoredMessage(
        d.body,
        now,
        group=d.group,
        not_before=d.not_before,
        attributes=d.attributes,
        size=d.size,
        estimates=d.estimates,
        history=d.history,
    )


def _enqueue_somewhere(cfg, index: int | None, drafts, items, now: float, hops: int) -> list[str]:
    """Store in partition ``index`` (None: any), here if this node serves it, else at its owner."""
    rt = service.get_runtime()
    messages = [_stored(d, now) for d in drafts]
    # A forwarded call must not take the dedup reservations again: they are held here.
    forward = {"messages": [{k: v for k, v in item.items() if k != "dedup_id"} for item in items]}
    if index is None:

        def local(even_if_cooling: bool = False):
            return 201, {
                "ids": service.enqueue(cfg.name, messages, even_if_cooling=even_if_cooling or hops >= MAX_HOPS)
            }

        status, payload = _local_or_forward(cfg.name, "enqueue", forward, hops, local)
        return payload["ids"]
    if (cfg.name, index) in rt.managers or hops >= MAX_HOPS:
        return service.enqueue_to(cfg.name, index, messages)
    address = rt.router.owner_of(cfg.id, cfg.name, index)
    if address is None:
        raise NotServedHere(f"partition {cfg.name}/{index} has no live owner now; retry")
    status, payload = rt.router.forward(address, cfg.name, "enqueue", forward, hops)
    if status != 201:
        raise Forwarded(status, payload)
    return payload["ids"]


def _deliveries(deliveries, cfg) -> list[dict]:
    out = []
    for d in deliveries:
        m = d.message
        estimates = {"preprocess": cfg.preprocess_estimate, "process": cfg.process_estimate}
        if m.estimates:
            estimates.update(m.estimates)
        item = {
            "id": d.id,
            "receipt": d.receipt,
            "body": m.body,
            "receive_count": d.receive_count,
            "enqueued_at": _iso(m.enqueued_at),
            "sequence": m.sequence,
            "group": m.group,
            "attributes": m.attributes or {},
            "size": m.size,
            "estimates": estimates,
        }
        if m.history:
            item["history"] = m.history
        if d.from_archive:
            item["archived"] = True  # retention had moved it to the archive: read from there
        out.append(item)
    return out


def _record_abandoned(deliveries) -> None:
    """A redelivery means the previous attempt ran out of visibility without an ack: log it as
    abandoned, unless its worker already reported that attempt (failed, timed out...)."""
    again = [d for d in deliveries if d.receive_count > 1]
    if not again:
        return
    from workers.models import AttemptLog, Consumer

    reported = set(AttemptLog.objects.filter(message_id__in=[d.id for d in again]).values_list("message_id", "attempt"))
    holders = {}
    for c in Consumer.objects.filter(last_heartbeat__gte=timezone_now() - timedelta(hours=1)).only("id", "held"):
        for mid in c.held:
            holders[mid] = c.pk
    rows = []
    for d in again:
        if (d.id, d.receive_count - 1) in reported:
            continue
        mid = parse_message_id(d.id)
        rows.append(
            AttemptLog(
                message_id=d.id,
                queue=mid.queue,
                partition=mid.partition,
                group=d.message.group or "",
                worker_id=holders.get(d.id),
                attempt=d.receive_count - 1,
                outcome=AttemptLog.Outcome.ABANDONED,
                error="visibility timeout ran out without an ack",
                size=d.message.size,
            )
        )
    AttemptLog.objects.bulk_create(rows)


def dequeue(name: str, data, hops: int = 0, trusted: bool = False) -> tuple[int, dict]:
    """Here first; if nothing here, from the other owners (deepest first); then wait here."""
    cfg, sub = target(name)
    max_messages, visibility, wait = validation.dequeue_request(data)
    if visibility is None and sub:
        visibility = cfg.subscription(sub).visibility_timeout
    rt = service.get_runtime()
    found = service.dequeue(cfg.name, max_messages, visibility, 0, sub)
    _record_abandoned(found)
    got = _deliveries(found, cfg)
    if (cfg.subscription(sub).max_receives if sub else cfg.max_receives) is not None:
        _move_dead_letters(cfg, sub)
    if got or hops >= MAX_HOPS:
        if not got and wait:
            found = service.dequeue(cfg.name, max_messages, visibility, wait, sub)
            _record_abandoned(found)
            got = _deliveries(found, cfg)
        return 200, {"messages": got}
    remote = {**data, "wait": 0}
    for address in rt.router.other_nodes(cfg.id, name):
        try:
            status, payload = rt.router.forward(address, name, "dequeue", remote, hops)
        except Exception:  # noqa: BLE001 - that owner is unreachable: try the next
            continue
        if status == 200 and payload.get("messages"):
            return 200, payload
    if wait:
        found = service.dequeue(cfg.name, max_messages, visibility, wait, sub)
        _record_abandoned(found)
        got = _deliveries(found, cfg)
    return 200, {"messages": got}


def _move_dead_letters(cfg, sub: str = "") -> None:
    """Move the messages this node set aside (past max_receives) to the dead-letter queue.

    The copy is stored first, then the original removed: a crash in between leaves a message
    in both queues (at least once), never in neither.
    """
    rt = service.get_runtime()
    dead_letter_queue = cfg.subscription(sub).dead_letter_queue if sub else cfg.dead_letter_queue
    source = f"{cfg.name}/{sub}" if sub else cfg.name
    for m in rt.local_managers(cfg.name):
        dead = m.take_dead(sub)
        if not dead:
            continue
        mids = [mid for mid, _ in dead]
        try:
            if dead_letter_queue is None:
                raise NotServedHere("the queue no longer names a dead-letter queue")
            found = m.load_bodies([Delivery(mid, "", count) for mid, count in dead])
            now = datetime.now(UTC).timestamp()
            items = []
            for d in found:
                msg = d.message
                history = {
                    "source": source,
                    "id": d.id,
                    "receive_count": d.receive_count,
                    "group": msg.group,
                    "enqueued_at": _iso(msg.enqueued_at),
                    "dead_lettered_at": _iso(now),
                }
                items.append(
                    {
                        k: v
                        for k, v in (
                            ("body", msg.body),
                            ("attributes", msg.attributes),
                            ("size", msg.size),
                            ("estimates", msg.estimates),
                            ("history", history),
                        )
                        if v is not None
                    }
                )
            if items:
                # Through the routing of any enqueue: the dead-letter queue's partitions may
                # be on another node (the history field is accepted from nodes only).
                dlq = queue_config(dead_letter_queue)
                drafts, _ = validation.enqueue_request({"messages": items}, dlq, now, trusted=True)
                _enqueue_somewhere(dlq, None, drafts, items, now, 0)
            m.remove_dead_lettered([parse_message_id(mid) for mid in mids], sub)  # not archived
            with m.lock:
                m.dead_lettered_total += len(found)
        except Exception:
            log.exception("moving %d dead letters of %s", len(mids), cfg.name)
            m.give_back_dead(mids, sub)


def redrive(name: str, data, hops: int = 0, trusted: bool = False) -> tuple[int, dict]:
    """Move dead letters back to the queues they came from (up to ``max``)."""
    queue_config(name)
    data = validation._object(data)
    validation._no_extra(data, {"max"}, "the request")
    limit = validation.number(data, "max", 1, validation.MAX_DEQUEUE, 100, integer=True)
    moved = skipped = 0
    while moved + skipped < limit:
        got = service.dequeue(name, min(100, limit - moved - skipped), 60, 0)
        if not got:
            break
        by_source: dict[str, list] = {}
        back = []
        for d in got:
            source = (d.message.history or {}).get("source")
            if source is None or not QUEUE_NAME_RE.fullmatch(source):
                skipped += 1
                continue
            by_source.setdefault(source, []).append(d)
        for source, ds in by_source.items():
            payload = {
                "messages": [
                    {
                        k: v
                        for k, v in (
                            ("body", d.message.body),
                            ("group", (d.message.history or {}).get("group")),
                            ("attributes", d.message.attributes),
                            ("size", d.message.size),
                            ("estimates", d.message.estimates),
                        )
                        if v is not None
                    }
                    for d in ds
                ]
            }
            enqueue(source, payload, hops)
            back.extend(ds)
            moved += len(ds)
        if back:
            service.ack(name, [(parse_message_id(d.id), d.receipt) for d in back])
    return 200, {"moved": moved, "skipped": skipped}


def expire(name: str, data, hops: int = 0, trusted: bool = False) -> tuple[int, dict]:
    """The retention rule on the partitions this node owns: remove messages older than the
    queue's retention (or ``older_than`` seconds, for operators). Counted on the queue. On a
    topic that archives, what a subscription still holds moves to the archive instead
    (``archived``)."""
    cfg = queue_config(name)
    data = validation._object(data)
    validation._no_extra(data, {"older_than"}, "the request")
    older_than = validation.number(data, "older_than", 0, LIMITS["retention"][1], cfg.retention)
    cutoff = datetime.now(UTC).timestamp() - older_than
    expired = archived = 0
    deferred = {}
    for m in service.get_runtime().local_managers(name):
        # Counted from the manager's totals: a pass that fails half-way did part of its work.
        before = (m.expired_total, m.archived_total)
        try:
            m.expire(cutoff)
        except PartitionUnavailable as exc:  # the others go on; this one tries at the next pass
            deferred[m.index] = str(exc)
        expired += m.expired_total - before[0]
        archived += m.archived_total - before[1]
    if expired:
        Queue.objects.filter(pk=cfg.id).update(expired_total=F("expired_total") + expired)
    return 200, {"expired": expired, "archived": archived, **({"deferred": deferred} if deferred else {})}


def purge(name: str, data, hops: int = 0, trusted: bool = False) -> tuple[int, dict]:
    """Remove every message of the queue (see ``queues.purge``), then tell the owners.

    Done here whoever owns the partitions; the owners are then asked to drop their managers
    (``{"close_only": true}``, from nodes only), which they would do anyway at their next
    renewal. Messages in flight are gone too: their acks answer ``not_found``.
    """
    from ..purge import purge_partition

    cfg = queue_config(name)
    data = validation._object(data)
    validation._no_extra(data, {"close_only"} if trusted else set(), "the request")
    rt = service.get_runtime()
    if data.get("close_only") is True:
        rt.purged(name)
        return 200, {"closed": True}
    rows = list(Partition.objects.filter(queue_id=cfg.id).select_related("owner").order_by("index"))
    owners = {
        p.owner.address for p in rows if p.owner is not None and p.owner.stopped_at is None and p.owner_id != rt.node_id
    }
    removed = sum(purge_partition(p.pk, rt.store) for p in rows)
    rt.purged(name)
    for address in sorted(owners):
        try:
            rt.router.forward(address, name, "purge", {"close_only": True}, MAX_HOPS - 1)
        except Exception as exc:  # noqa: BLE001 - it stops at its next renewal anyway
            log.warning("purge of %s: telling %s failed: %s", name, address, exc)
    Queue.objects.filter(pk=cfg.id).update(purged_total=F("purged_total") + removed)
    log.info("purged %s: %d messages", name, removed)
    return 200, {"purged": removed}


def release_partition(name: str, index: int, hops: int = 0) -> tuple[int, dict]:
    """The owner gives the partition's lease up (an operator's action); asked of the owner."""
    cfg = queue_config(name)
    if not 0 <= index < cfg.partitions:
        raise BadRequest(f"{name} has partitions 0..{cfg.partitions - 1}, not {index}", "no_such_partition")
    rt = service.get_runtime()
    if rt.release_partition(name, index):
        return 200, {"released": True, "node": rt.address}
    address = rt.router.owner_of(cfg.id, name, index) if hops < MAX_HOPS else None
    if address is None:
        return 409, {"error": "not_owned", "detail": f"no live node holds {name}/{index} now"}
    return rt.router.forward(address, name, f"partitions/{index}/release", {}, hops)


def ack(name: str, data, hops: int = 0, trusted: bool = False) -> tuple[int, dict]:
    """Local partitions here; the rest at their owners, one call per owner.

    Receipts are all checked before anything is removed on each node; across nodes the
    calls are separate, so a 409 from one owner leaves the other owners' acks done.
    """
    cfg, sub = target(name)
    items = validation.ack_request(data, cfg)
    rt = service.get_runtime()
    local = [(mid, r) for mid, r in items if (cfg.name, mid.partition) in rt.managers]
    remote: dict[str, list] = {}
    for mid, receipt in items:
        if (cfg.name, mid.partition) in rt.managers:
            continue
        address = rt.router.owner_of(cfg.id, cfg.name, mid.partition) if hops < MAX_HOPS else None
        if address is None:
            raise NotServedHere(f"partition {cfg.name}/{mid.partition} has no live owner now; retry")
        remote.setdefault(address, []).append({"id": str(mid), "receipt": receipt})
    acked = not_found = 0
    if local:
        result = service.ack(cfg.name, local, sub)
        acked, not_found = result.acked, result.not_found
    for address, batch in remote.items():
        status, payload = rt.router.forward(address, name, "ack", {"messages": batch}, hops)
        if status != 200:
            raise Forwarded(status, payload)
        acked += payload.get("acked", 0)
        not_found += payload.get("not_found", 0)
    return 200, {"acked": acked, "not_found": not_found}


def visibility(name: str, data, hops: int = 0, trusted: bool = False) -> tuple[int, dict]:
    cfg, sub = target(name)
    mid, receipt, timeout = validation.visibility_request(data, cfg)
    rt = service.get_runtime()
    if (cfg.name, mid.partition) not in rt.managers and hops < MAX_HOPS:
        address = rt.router.owner_of(cfg.id, cfg.name, mid.partition)
        if address is not None:
            status, payload = rt.router.forward(address, name, "visibility", data, hops)
            if status != 200:
                raise Forwarded(status, payload)
            return status, payload
    service.change_visibility(cfg.name, mid, receipt, timeout, sub)
    return 200, {"id": str(mid), "visibility_timeout": timeout}


def publish(name: str, data, hops: int = 0, trusted: bool = False) -> tuple[int, dict]:
    """Enqueue to a topic: stored once, read by every subscription."""
    if queue_config(name).kind != "topic":
        raise service.QueueNotFound(name)
    return enqueue(name, data, hops, trusted)


def refresh(name: str, data, hops: int = 0, trusted: bool = False) -> tuple[int, dict]:
    """From a node: a topic's subscriptions changed; reopen its partitions held here."""
    queue_config(name)
    service.get_runtime().topic_changed(name)
    return 200, {"refreshed": True}


#: The calls the fast path serves, by the last segment of their path.
CALLS = {"enqueue": enqueue, "dequeue": dequeue, "ack": ack, "visibility": visibility, "publish": publish}
#: Calls served only through DRF (not hot).
OTHER_CALLS = {"redrive": redrive, "expire": expire}
