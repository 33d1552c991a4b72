"""The message operations: enqueue, dequeue, ack, change of visibility, and the dead-letter move.

Each takes a *target* (a queue, or ``"topic/subscription"`` for the reading calls) and checked
values, and reads: authorize, check, deduplicate, route, record. Where a call runs is the
cluster's (:mod:`queues.cluster.routing`, :mod:`queues.cluster.long_polls`): this node's
partition managers where it can, the owner node through :mod:`.peers` where it cannot
(``hops`` counts how often the call was forwarded already; past ``router.MAX_HOPS`` it is
answered where it is, so nothing loops). Dead-letter moves are :mod:`.dead_letters`'.

Locking: a partition manager's lock guards its memory and is held across its store writes;
callers here never hold one while calling another node. Several partitions are locked in
index order (:func:`ack`), so two calls never wait on each other in a cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from queues.access import SYSTEM, Caller
from queues.cluster import acks, long_polls, routing
from queues.cluster.dedup import get_dedup
from queues.cluster.long_polls import WAITS, Poll, WaitSlots
from queues.cluster.router import MAX_HOPS
from queues.engine.config import QueueConfig
from queues.engine.ids import MessageId, StoredMessage, group_partition
from queues.engine.partition import Delivery
from queues.service import served
from queues.service.dead_letters import move_dead_letters
from queues.service.errors import InvalidRequest, QueueNotFound, RemoteError, TooManyWaits
from queues.service.limits import MAX_BATCH, MAX_WAIT
from queues.service.middleware import MIDDLEWARE
from queues.service.peers import get_peers
from queues.service.runtime import get_runtime
from queues.service.targets import Checked, authorized, queue_config
from queues.service.types import AckResult, MessageDraft
from queues.signals import given_back

__all__ = [
    "TooManyWaits",
    "WaitSlots",
    "ack",
    "change_visibility",
    "check_drafts",
    "dequeue",
    "enqueue",
    "publish",
]

log = logging.getLogger(__name__)


# --- enqueue ----------------------------------------------------------------------------------
def enqueue(
    queue: str,
    drafts: Sequence[MessageDraft],
    *,
    caller: Caller,
    hops: int = 0,
    check_only: bool = False,
    checked: Checked | None = None,
) -> list[str]:
    """Store ``drafts`` and return their IDs in the caller's order (``produce``; forwarded
    shares act for ``caller`` at their owners).

    A call that stores in several partitions, some of them at other nodes, first has each of
    those owners check its share (``check_only``: the rights and the queue's rules as that node
    sees them, nothing stored, ``[]`` returned), so that an owner's refusal (4xx) comes before
    anything is stored anywhere. What can still fail after the checks is a 5xx (an owner lost,
    the store down): retry, with ``dedup_id`` to make the retry exact.

    Dedup first (the reservations are shared by all nodes), then each message goes to its
    group's partition (here or at its owner), ungrouped ones to any partition; one call's
    messages of one partition are stored in order. A repeated ``dedup_id`` gets the first
    message's ID.

    Raises QueueNotFound, ``access.Forbidden``, InvalidRequest (a message the queue's rules
    refuse: nothing stored), PartitionUnavailable / NotServedHere (503: retry), RemoteError (an
    owner's refusal).

    The middleware that hook enqueues (:mod:`.middleware`) run around it, not around a check.
    ``checked``: the caller's right to produce on ``queue`` as an entrance checked it already
    (:func:`.targets.check`), not checked again.
    """
    hooks = MIDDLEWARE.enqueue
    if not hooks or check_only:
        return _enqueue(queue, drafts, caller, hops, check_only, checked)
    for m in hooks:
        drafts = m.before_enqueue(queue, drafts, hops)
    try:
        ids = _enqueue(queue, drafts, caller, hops, False, checked)
    except BaseException as exc:
        for m in reversed(hooks):
            m.after_enqueue(queue, drafts, hops, exception=exc)
        raise
    for m in reversed(hooks):
        m.after_enqueue(queue, drafts, hops, result=ids)
    return ids


def _enqueue(
    queue: str, drafts: Sequence[MessageDraft], caller: Caller, hops: int, check_only: bool, checked: Checked | None
) -> list[str]:
    """:func:`enqueue`: authorize, check, deduplicate, route."""
    cfg, _ = authorized(checked, queue, "produce", caller=caller)
    check_drafts(cfg, drafts)
    if check_only:
        return []
    grouped = any(d.group for d in drafts)
    if hops < MAX_HOPS and grouped:  # (without groups, one share: nobody else to ask)
        _check_elsewhere(cfg, drafts, hops, caller)
    now = datetime.now(UTC).timestamp()
    if not grouped and not any(d.dedup_id for d in drafts):
        # One share, nothing to reserve or give back: stored as they are, or not at all.
        return _enqueue_somewhere(cfg, None, list(drafts), now, hops, caller)
    ids: list[str | None] = [None] * len(drafts)
    dedup = get_dedup() if any(d.dedup_id for d in drafts) else None
    reserved: dict[str, int] = {}  # dedup_id -> index of the draft that stores it
    try:
        # Inside the try: a reservation taken here must be given back if storing fails (the
        # reservations themselves are all or nothing: reserve_many gives back its own).
        if dedup is not None:
            first: dict[str, int] = {}  # dedup_id -> its first draft (a repeat takes its ID below)
            for i, d in enumerate(drafts):
                if d.dedup_id is not None and d.dedup_id not in first:
                    first[d.dedup_id] = i
            for dedup_id, existing in dedup.reserve_many(cfg.name, list(first), cfg.dedup_window).items():
                if existing is not None:
                    ids[first[dedup_id]] = existing
                else:
                    reserved[dedup_id] = first[dedup_id]
        todo = [
            i for i, d in enumerate(drafts) if ids[i] is None and (d.dedup_id is None or reserved.get(d.dedup_id) == i)
        ]
        by_partition: dict[int | None, list[int]] = {}
        for i in todo:
            group = drafts[i].group
            by_partition.setdefault(group_partition(group, cfg.partitions) if group else None, []).append(i)
        for index, positions in by_partition.items():
            stored = _enqueue_somewhere(cfg, index, [drafts[i] for i in positions], now, hops, caller)
            for i, mid in zip(positions, stored):
                ids[i] = mid
    except BaseException:
        # Stored ones keep their dedup_id (a retry gets their IDs); the rest are given back.
        for dedup_id, i in reserved.items():
            assert dedup is not None
            stored_id = ids[i]
            if stored_id is None:
                dedup.release(cfg.name, dedup_id)
            else:
                dedup.confirm(cfg.name, dedup_id, stored_id, cfg.dedup_window)
        raise
    stored = [mid if mid is not None else "" for mid in ids]  # every reserved one is stored now
    if reserved:
        assert dedup is not None
        dedup.confirm_many(cfg.name, [(dedup_id, stored[i]) for dedup_id, i in reserved.items()], cfg.dedup_window)
    for i, d in enumerate(drafts):
        if not stored[i] and d.dedup_id is not None:
            stored[i] = stored[reserved[d.dedup_id]]  # a repeat inside the batch: the first one's ID
    return stored


def _check_elsewhere(cfg: QueueConfig, drafts: Sequence[MessageDraft], hops: int, caller: Caller) -> None:
    """Have each other node that would store a share of a multi-partition enqueue check it
    first (see :func:`enqueue`). A call that stores in one partition needs none: one owner stores
    all or nothing. Only a refusal (4xx) counts; an owner that cannot be asked now is left to
    the store itself (which tries the next node, or answers 503)."""
    shares: dict[int | None, list[MessageDraft]] = {}
    for d in drafts:
        shares.setdefault(group_partition(d.group, cfg.partitions) if d.group else None, []).append(d)
    if len(shares) < 2:
        return
    for address, share in routing.shares_elsewhere(get_runtime(), cfg, shares).items():
        try:
            get_peers().check_enqueue(address, cfg.name, _without_dedup(share), hops, caller)
        except RemoteError as exc:
            if exc.status < 500:
                raise
        except Exception as exc:  # noqa: BLE001 - not a refusal: storing will find out
            log.info("enqueue to %s: %s could not check its share first: %s", cfg.name, address, exc)


def check_drafts(cfg: QueueConfig, drafts: Sequence[MessageDraft]) -> None:
    """The queue's own rules, whoever built the drafts (the API checks the same, and more)."""
    if not 1 <= len(drafts) <= MAX_BATCH:
        raise InvalidRequest(f"1 to {MAX_BATCH} messages per call, got {len(drafts)}", "batch_too_large")
    for i, d in enumerate(drafts):
        if cfg.strict and d.group is None:
            raise InvalidRequest(
                f"messages[{i}]: queue {cfg.name!r} is strict: every message needs a group", "missing_group"
            )
        if len(d.body) * 4 > cfg.max_message_size and len(d.body.encode("utf-8")) > cfg.max_message_size:
            raise InvalidRequest(
                f"messages[{i}]: body is over the queue's max_message_size of {cfg.max_message_size}",
                "body_too_large",
            )


def _stored(d: MessageDraft, now: float) -> StoredMessage:
    # Positional (no keyword binding): this runs once per enqueued message.
    return StoredMessage(
        d.body,
        now,
        d.group,
        0,
        d.not_before,
        d.attributes,
        d.size,
        d.estimates,
        d.history,
        False,
        d.subscription,
        d.fairness_key,
    )


def _enqueue_somewhere(
    cfg: QueueConfig, index: int | None, drafts: list[MessageDraft], now: float, hops: int, caller: Caller
) -> list[str]:
    """Store in partition ``index`` (None: any), here if this node serves it, else at its owner.

    A forwarded call carries no dedup_id: the reservations are held here.
    """
    rt = get_runtime()
    messages = [_stored(d, now) for d in drafts]
    if index is None:
        return routing.local_or_forward(
            rt,
            cfg,
            hops,
            lambda even_if_cooling: routing.enqueue_any_local(rt, cfg.name, messages, even_if_cooling=even_if_cooling),
            lambda address: get_peers().enqueue(address, cfg.name, _without_dedup(drafts), hops, caller),
        )
    if (cfg.name, index) in rt.managers or hops >= MAX_HOPS:
        return routing.enqueue_here(rt.manager(cfg.name, index), messages)
    return routing.at_owner(
        rt,
        cfg,
        index,
        lambda: routing.enqueue_here(rt.manager(cfg.name, index), messages),
        lambda address: get_peers().enqueue(address, cfg.name, _without_dedup(drafts), hops, caller),
    )


def _without_dedup(drafts: list[MessageDraft]) -> list[MessageDraft]:
    """The drafts as forwarded (built only when forwarding: most enqueues are served here)."""
    return [
        MessageDraft(
            d.body,
            d.group,
            None,
            d.not_before,
            d.attributes,
            d.size,
            d.estimates,
            d.history,
            d.subscription,
            d.fairness_key,
        )
        for d in drafts
    ]


# --- dequeue ----------------------------------------------------------------------------------
def dequeue(
    target: str,
    *,
    caller: Caller,
    max_messages: int = 1,
    visibility_timeout: float | None = None,
    wait: float = 0.0,
    hops: int = 0,
    checked: Checked | None = None,
) -> list[Delivery]:
    """Up to ``max_messages`` deliveries, each hidden for ``visibility`` seconds (None: the
    queue's or subscription's default); here first, then from the other owners (deepest first),
    then waiting here up to ``wait`` seconds for the first.

    Redeliveries are announced (``signals.redelivered``); messages past ``max_receives`` are moved
    to the dead-letter queue. ``consume``; other owners are asked for ``caller``, once: a
    forwarded dequeue (``hops`` >= 1) never forwards again. Raises QueueNotFound,
    ``access.Forbidden``, SubscriptionNotFound, InvalidRequest (``is_a_topic``), TooManyWaits
    (``wait`` > 0 past the node's cap on concurrent long polls: ``cluster.long_polls.WaitSlots``).
    """
    hooks = MIDDLEWARE.dequeue
    if not hooks:
        return _dequeue(target, caller, max_messages, visibility_timeout, wait, hops, checked)
    for m in hooks:
        m.before_dequeue(target, hops)
    try:
        found = _dequeue(target, caller, max_messages, visibility_timeout, wait, hops, checked)
    except BaseException as exc:
        for m in reversed(hooks):
            m.after_dequeue(target, hops, exception=exc)
        raise
    for m in reversed(hooks):
        m.after_dequeue(target, hops, result=found)
    return found


def _dequeue(
    target: str,
    caller: Caller,
    max_messages: int,
    visibility_timeout: float | None,
    wait: float,
    hops: int,
    checked: Checked | None,
) -> list[Delivery]:
    """:func:`dequeue`: authorize, then look (and wait) within a long-poll slot."""
    cfg, sub = authorized(checked, target, "consume", caller=caller, reading=True)
    if wait > 0:
        with WAITS.slot(caller):
            return _routed_dequeue(target, cfg, sub, caller, max_messages, visibility_timeout, wait, hops)
    return _routed_dequeue(target, cfg, sub, caller, max_messages, visibility_timeout, wait, hops)


def _routed_dequeue(
    target: str,
    cfg: QueueConfig,
    sub: str,
    caller: Caller,
    max_messages: int,
    visibility_timeout: float | None,
    wait: float,
    hops: int,
) -> list[Delivery]:
    spec = cfg.subscription(sub) if sub else None
    visibility = visibility_timeout
    if visibility is None and spec is not None:
        visibility = spec.visibility_timeout
    if visibility is None:
        visibility = cfg.visibility_timeout
    poll = Poll(
        target,
        cfg,
        sub,
        caller,
        max_messages,
        visibility,
        lambda address, room: get_peers().dequeue(address, target, room, visibility_timeout, 0, caller),
        lambda address: get_peers().dequeue(address, target, max_messages, visibility_timeout, hops, caller),
    )
    dead_letters = (spec.max_receives if spec is not None else cfg.max_receives) is not None
    return long_polls.dequeue(
        get_runtime(),
        poll,
        min(wait, MAX_WAIT),
        hops,
        (lambda: move_dead_letters(cfg, sub, _store_dead_letters)) if dead_letters else None,
    )


def _store_dead_letters(dlq: QueueConfig, index: int | None, drafts: list[MessageDraft], now: float) -> None:
    """Dead letters, checked by the dead-letter queue's rules and stored through the routing of
    any enqueue, for the service itself."""
    check_drafts(dlq, drafts)
    _enqueue_somewhere(dlq, index, drafts, now, 0, SYSTEM)


# --- ack and visibility -----------------------------------------------------------------------
def ack(
    target: str,
    items: Sequence[tuple[MessageId, str | None]],
    *,
    caller: Caller,
    hops: int = 0,
    check_only: bool = False,
    unexpired: bool = False,
    checked: Checked | None = None,
) -> AckResult:
    """Acknowledge (remove) messages: this node's partitions here, the rest at their owners,
    one call per owner. With ``unexpired``, a receipt whose visibility timeout ran out is
    refused (ReceiptMismatch) even if nobody received the message since (SQS's FIFO receipts),
    here and at the other owners alike.

    Every receipt is checked before anything is removed anywhere: here with the partitions
    locked, then at each other owner (``check_only``: it checks the receipts of its partitions
    and removes nothing), and only then are the acks applied, so a ReceiptMismatch (409) from
    any owner changes nothing. A receipt can still go stale between the check and the ack at
    another node (its visibility ran out in between): that owner then answers 409 after the
    others removed theirs, the same as an ack that came too late. ``consume``. Raises
    QueueNotFound, ``access.Forbidden``, SubscriptionNotFound, ReceiptMismatch, NotServedHere
    (a partition with no live owner), RemoteError.
    """
    hooks = MIDDLEWARE.ack
    if not hooks or check_only:
        return _ack(target, items, caller, hops, check_only, unexpired, checked)
    for m in hooks:
        m.before_ack(target, items, hops)
    try:
        result = _ack(target, items, caller, hops, False, unexpired, checked)
    except BaseException as exc:
        for m in reversed(hooks):
            m.after_ack(target, items, hops, exception=exc)
        raise
    for m in reversed(hooks):
        m.after_ack(target, items, hops, result=result)
    return result


def _ack(
    target: str,
    items: Sequence[tuple[MessageId, str | None]],
    caller: Caller,
    hops: int,
    check_only: bool,
    unexpired: bool,
    checked: Checked | None,
) -> AckResult:
    """:func:`ack`: authorize, check every receipt, then apply here and at the other owners."""
    cfg, sub = authorized(checked, target, "consume", caller=caller, reading=True)
    rt = get_runtime()

    def check(local: list[tuple[MessageId, str | None]], remote: dict[str, list[tuple[MessageId, str | None]]]) -> None:
        if check_only or remote:
            if local:
                acks.check_here(rt, cfg.name, local, sub, unexpired)
            if not check_only:
                for address, batch in remote.items():
                    get_peers().check_ack(address, target, batch, hops, caller, unexpired=unexpired)

    local, remote = routing.routed_ack(rt, cfg, items, hops, check)
    if check_only:
        return AckResult(0, 0)
    acked = not_found = 0
    if local:
        acked, not_found = acks.ack_here(rt, cfg.name, local, sub, unexpired)
    for address, batch in remote.items():
        result = get_peers().ack(address, target, batch, hops, caller, unexpired=unexpired)
        acked += result.acked
        not_found += result.not_found
    return AckResult(acked, not_found)


def change_visibility(
    target: str,
    mid: MessageId,
    receipt: str | None,
    visibility_timeout: float,
    *,
    caller: Caller,
    hops: int = 0,
    checked: Checked | None = None,
) -> None:
    """Hide a message in flight for ``visibility_timeout`` more seconds from now; 0 gives it back at once
    (announced as ``signals.given_back``). At the partition's owner, wherever that is.

    ``consume``. Raises QueueNotFound, ``access.Forbidden``, SubscriptionNotFound,
    ReceiptMismatch (not in flight, or an earlier delivery's receipt), PartitionUnavailable,
    RemoteError.
    """
    cfg, sub = authorized(checked, target, "consume", caller=caller, reading=True)
    rt = get_runtime()
    if (cfg.name, mid.partition) not in rt.managers and hops < MAX_HOPS:
        address = rt.router.owner_of(cfg.id, cfg.name, mid.partition)
        if address is not None:
            routing.at_owner(
                rt,
                cfg,
                mid.partition,
                lambda: _change_visibility_here(target, cfg, sub, mid, receipt, visibility_timeout),
                lambda a: get_peers().change_visibility(a, target, mid, receipt, visibility_timeout, hops, caller),
            )
            return
    _change_visibility_here(target, cfg, sub, mid, receipt, visibility_timeout)


def _change_visibility_here(
    target: str,
    cfg: QueueConfig,
    sub: str,
    mid: MessageId,
    receipt: str | None,
    visibility_timeout: float,
) -> None:
    ((m, _),) = acks.managers_of(get_runtime(), cfg.name, [(mid, receipt)])
    with m.lock:
        m.check_serving()
        receive_count = m.change_visibility_locked(mid, receipt, visibility_timeout, sub)
    served.record(m)
    if visibility_timeout == 0:
        given_back.send_robust(sender=None, target=target, message_id=str(mid), receive_count=receive_count)


def publish(
    topic: str, drafts: Sequence[MessageDraft], *, caller: Caller, hops: int = 0, checked: Checked | None = None
) -> list[str]:
    """Enqueue to a topic (``produce``): stored once, read by every subscription. Raises
    QueueNotFound when ``topic`` is not a topic, and what :func:`enqueue` raises."""
    if queue_config(topic).kind != "topic":
        raise QueueNotFound(topic)
    return enqueue(topic, drafts, caller=caller, hops=hops, checked=checked)
