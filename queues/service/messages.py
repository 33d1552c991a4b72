"""The message operations: enqueue, dequeue, ack, change of visibility, and the dead-letter move.

Each takes a *target* (a queue, or ``"topic/subscription"`` for the reading calls) and checked
values, runs on this node's partition managers where it can, and asks the owner node through
:mod:`.peers` where it cannot (``hops`` counts how often the call was forwarded already; past
``router.MAX_HOPS`` it is answered where it is, so nothing loops).

Locking: a partition manager's lock guards its memory and is held across its store writes;
callers here never hold one while calling another node. Several partitions are locked in
index order (:func:`ack`), so two calls never wait on each other in a cycle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from typing import TypeVar

from django.conf import settings

from queues import metrics, tracing
from queues.access import SYSTEM, Caller, granted_now
from queues.cluster.dedup import get_dedup
from queues.cluster.router import MAX_HOPS
from queues.cluster.siblings import Board
from queues.engine.config import QueueConfig
from queues.engine.ids import MessageId, StoredMessage, group_partition, parse_message_id
from queues.engine.isotime import iso
from queues.engine.partition import Delivery, PartitionManager
from queues.engine.ports import Lease
from queues.models import Queue
from queues.service import served
from queues.service.errors import (
    InvalidRequest,
    NotServedHere,
    PartitionUnavailable,
    PeerUnreachable,
    QueueNotFound,
    RemoteError,
    TooManyWaits,
)
from queues.service.limits import MAX_BATCH, MAX_WAIT
from queues.service.peers import get_peers
from queues.service.runtime import get_runtime
from queues.service.targets import authorize, queue_config
from queues.service.types import AckResult, MessageDraft
from queues.signals import given_back, redelivered

log = logging.getLogger(__name__)
T = TypeVar("T")

monotonic = time.monotonic


# --- enqueue ----------------------------------------------------------------------------------
def enqueue(
    queue: str,
    drafts: Sequence[MessageDraft],
    *,
    caller: Caller,
    hops: int = 0,
    check_only: bool = False,
    _in_span: bool = False,
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
    """
    if tracing.ON and not (_in_span or check_only):  # its span (queues.tracing), then this again
        return tracing.enqueue_span(enqueue, queue, drafts, hops, caller=caller, _in_span=True)
    cfg, _ = authorize(queue, "produce", caller=caller)
    check_drafts(cfg, drafts)
    if check_only:
        return []
    if hops < MAX_HOPS:
        _check_elsewhere(cfg, drafts, hops, caller)
    now = datetime.now(UTC).timestamp()
    ids: list[str | None] = [None] * len(drafts)
    dedup = get_dedup() if any(d.dedup_id for d in drafts) else None
    reserved: dict[str, int] = {}  # dedup_id -> index of the draft that stores it
    try:
        # Inside the try: a later reservation that fails (busy elsewhere, store down) must give
        # back the ones already taken, or their dedup_ids stay blocked for the whole window.
        for i, d in enumerate(drafts):
            if d.dedup_id is None or d.dedup_id in reserved:
                continue  # a repeat inside the batch takes the first one's ID below
            assert dedup is not None
            existing = dedup.reserve(cfg.name, d.dedup_id, cfg.dedup_window)
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
    for dedup_id, i in reserved.items():
        assert dedup is not None
        dedup.confirm(cfg.name, dedup_id, stored[i], cfg.dedup_window)
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
    rt = get_runtime()
    remote: dict[str, list[MessageDraft]] = {}
    for index, share in shares.items():
        if index is None:
            if not rt.cooling and any(m.enqueue_ready for m in rt.local_managers(cfg.name)):
                continue
            address = next(iter(rt.router.other_nodes(cfg.id, cfg.name)), None)
        elif (cfg.name, index) in rt.managers:
            continue
        else:
            address = rt.router.owner_of(cfg.id, cfg.name, index)
        if address is not None:
            remote.setdefault(address, []).extend(share)
    for address, share in remote.items():
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
        d.body, now, d.group, 0, d.not_before, d.attributes, d.size, d.estimates, d.history, False, d.subscription
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
        return _local_or_forward(
            cfg,
            hops,
            lambda even_if_cooling: _enqueue_any_local(cfg.name, messages, even_if_cooling=even_if_cooling),
            lambda address: get_peers().enqueue(address, cfg.name, _without_dedup(drafts), hops, caller),
        )
    if (cfg.name, index) in rt.managers or hops >= MAX_HOPS:
        return _enqueue_here(rt.manager(cfg.name, index), messages)
    return _at_owner(
        cfg,
        index,
        lambda: _enqueue_here(rt.manager(cfg.name, index), messages),
        lambda address: get_peers().enqueue(address, cfg.name, _without_dedup(drafts), hops, caller),
    )


def _enqueue_here(m: PartitionManager[Lease], messages: list[StoredMessage]) -> list[str]:
    """Store ``messages`` in this node's partition ``m``; their IDs."""
    ids = m.enqueue(messages)
    served.record(m)
    return ids


def _owner_wait() -> float:
    """Seconds a call waits for a partition that has no live owner to get one: a queue just
    created whose other nodes claim at their next pass (a heartbeat), or a partition between
    two owners."""
    return min(OWNER_WAIT_MAX, 1.5 * get_runtime().heartbeat + 0.5)


#: The most a call waits for a partition's owner (:func:`_owner_wait`).
OWNER_WAIT_MAX = 5.0


def _owner(cfg: QueueConfig, index: int, give_up: float) -> str | None:
    """The address of the owner of partition ``index``, None when it is this node; waits for
    one until ``give_up`` (monotonic) when it has none, then raises NotServedHere (503: retry)
    or QueueNotFound (it was deleted)."""
    rt = get_runtime()
    while True:
        if (cfg.name, index) in rt.managers:
            return None
        address = rt.router.owner_of(cfg.id, cfg.name, index)
        if address is not None:
            return address
        if monotonic() >= give_up:
            raise _unserved(cfg, f"partition {cfg.name}/{index} has no live owner now; retry")
        if cfg.name not in rt.queues:
            raise _unserved(cfg, f"queue {cfg.name!r} is not described on this node now; retry")
        time.sleep(OWNER_LOOK)
        rt.router.forget(cfg.id)


#: Seconds between two looks for a partition's owner.
OWNER_LOOK = 0.05


def _at_owner(cfg: QueueConfig, index: int, local: Callable[[], T], remote: Callable[[str], T]) -> T:
    """``remote(address)`` at the owner of partition ``index``, or ``local()`` when that is
    this node. An owner that refuses the connection is looked up again: it died, and its row
    names it until its lease passes to a live node, while the call never reached it (safe to
    make again, whatever it is). The lookups and the waits for an owner share one
    :func:`_owner_wait`, so a call answers 503 within it (past the calls' own timeouts)."""
    give_up = monotonic() + _owner_wait()
    while True:
        address = _owner(cfg, index, give_up)
        if address is None:
            return local()
        try:
            return remote(address)
        except PeerUnreachable as exc:
            if not exc.refused or monotonic() >= give_up:
                raise
        time.sleep(OWNER_LOOK)
        get_runtime().router.forget(cfg.id)


def _without_dedup(drafts: list[MessageDraft]) -> list[MessageDraft]:
    """The drafts as forwarded (built only when forwarding: most enqueues are served here)."""
    return [
        MessageDraft(d.body, d.group, None, d.not_before, d.attributes, d.size, d.estimates, d.history, d.subscription)
        for d in drafts
    ]


def _enqueue_any_local(queue: str, messages: list[StoredMessage], *, even_if_cooling: bool = False) -> list[str]:
    """Store the messages in one partition of this node, in order; each in turn until one takes them.

    Raises NotServedHere when this node has no partition of the queue, or is cooling (over its
    load or failure threshold) and ``even_if_cooling`` is false.
    """
    rt = get_runtime()
    managers = [m for m in rt.local_managers(queue) if m.enqueue_ready]
    if not managers:
        raise NotServedHere(f"no partition of {queue!r} is served by this node now; retry")
    if rt.cooling and not even_if_cooling:
        raise NotServedHere(f"node {rt.address} is cooling: enqueues go to other nodes")
    start = rt.rotation(len(managers))
    last: PartitionUnavailable | None = None
    for i in range(len(managers)):
        m = managers[(start + i) % len(managers)]
        try:
            return _enqueue_here(m, messages)
        except PartitionUnavailable as exc:
            last = exc
    assert last is not None
    raise last


def _local_or_forward(
    cfg: QueueConfig, hops: int, local: Callable[[bool], list[str]], remote: Callable[[str], list[str]]
) -> list[str]:
    """Run ``local``; if this node does not serve the call, pass it to a node that does; if
    none can, a cooling node still serves rather than refuse."""
    try:
        return local(hops >= MAX_HOPS)
    except NotServedHere:
        if hops >= MAX_HOPS:
            raise
    rt = get_runtime()
    last: Exception | None = None
    give_up = monotonic() + _owner_wait()
    while True:
        for address in rt.router.other_nodes(cfg.id, cfg.name):
            try:
                return remote(address)
            except RemoteError as exc:
                if exc.status < 500:
                    raise  # the owner refused it: so would the others
                last = exc
            except Exception as exc:  # noqa: BLE001 - unreachable or unavailable: try the next owner
                last = exc
        if rt.local_managers(cfg.name):
            return local(True)
        if last is not None or monotonic() >= give_up or cfg.name not in rt.queues:
            raise _unserved(cfg, f"no node serves queue {cfg.name!r} now ({last or 'no owner'}); retry")
        # No owner at all yet (a queue just created, its partitions not claimed yet): wait.
        time.sleep(OWNER_LOOK)
        rt.router.forget(cfg.id)


def _unserved(cfg: QueueConfig, detail: str) -> Exception:
    """Why no node serves the queue: it was deleted (this node's description of it is a moment
    old: QueueNotFound), else no owner now (NotServedHere, 503: retry).

    A queue of the name whose row is not the one described here was deleted and created again
    without this node being told (it was unreachable): the old description and its managers
    are dropped now, so that the client's retry is served by the new queue rather than answered
    503 until this node's next pass."""
    current = Queue.objects.filter(name=cfg.name).values_list("pk", flat=True).first()
    if current is None:
        return QueueNotFound(cfg.name)
    if current != cfg.id:
        get_runtime().queue_deleted(cfg.name, cfg.id)
    return NotServedHere(detail)


# --- dequeue ----------------------------------------------------------------------------------
def dequeue(
    target: str,
    *,
    caller: Caller,
    max_messages: int = 1,
    visibility_timeout: float | None = None,
    wait: float = 0.0,
    hops: int = 0,
    _in_span: bool = False,
) -> list[Delivery]:
    """Up to ``max_messages`` deliveries, each hidden for ``visibility`` seconds (None: the
    queue's or subscription's default); here first, then from the other owners (deepest first),
    then waiting here up to ``wait`` seconds for the first.

    Redeliveries are announced (``signals.redelivered``); messages past ``max_receives`` are moved
    to the dead-letter queue. ``consume``; other owners are asked for ``caller``, once: a
    forwarded dequeue (``hops`` >= 1) never forwards again. Raises QueueNotFound,
    ``access.Forbidden``, SubscriptionNotFound, InvalidRequest (``is_a_topic``), TooManyWaits
    (``wait`` > 0 past the node's cap on concurrent long polls: :class:`WaitSlots`).
    """
    if tracing.ON and not _in_span:  # its span (queues.tracing), then this again
        return tracing.dequeue_span(
            dequeue,
            target,
            caller=caller,
            max_messages=max_messages,
            visibility_timeout=visibility_timeout,
            wait=wait,
            hops=hops,
            _in_span=True,
        )
    cfg, sub = authorize(target, "consume", caller=caller, reading=True)
    if wait > 0:
        with _WAITS.slot(caller):
            return _dequeue(target, cfg, sub, caller, max_messages, visibility_timeout, wait, hops)
    return _dequeue(target, cfg, sub, caller, max_messages, visibility_timeout, wait, hops)


class WaitSlots:
    """Concurrent long polls on this node, per user and in all: each holds a request thread
    for up to ``MAX_WAIT`` seconds (granian's WSGI worker runs a request on one thread until
    it returns), so a user past ``LONG_POLL_MAX_PER_USER`` or a node past
    ``LONG_POLL_MAX_PER_NODE`` is answered 429 at once rather than starving acks and enqueues.

    A runnode of several processes (``NODE_PROCESSES`` sibling nodes) counts in each: a process
    takes at most ``ceil(LONG_POLL_MAX_PER_USER / NODE_PROCESSES)`` of a user's polls, so the
    user holds at most about its cap over the runnode; ``LONG_POLL_MAX_PER_NODE`` bounds each process, as it
    guards the process's own request threads (``NODE_THREADS`` are per process).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_user: dict[object, int] = {}
        self.total = 0

    def slot(self, caller: Caller) -> _Slot:
        key = caller.user_id if caller.user_id is not None else caller.username
        per_user = -(-settings.LONG_POLL_MAX_PER_USER // max(1, settings.NODE_PROCESSES))
        per_node = settings.LONG_POLL_MAX_PER_NODE
        with self._lock:
            held = self._by_user.get(key, 0)
            if held >= per_user:
                raise TooManyWaits(
                    f"{held} long polls of this user are waiting on this node already (at most {per_user}); "
                    "retry, or poll with a shorter wait"
                )
            if self.total >= per_node:
                raise TooManyWaits(f"{self.total} long polls are waiting on this node already (at most {per_node})")
            self._by_user[key] = held + 1
            self.total += 1
        return _Slot(self, key)

    def _release(self, key: object) -> None:
        with self._lock:
            self.total -= 1
            left = self._by_user[key] - 1
            if left:
                self._by_user[key] = left
            else:
                del self._by_user[key]

    def held(self, caller: Caller) -> int:
        return self._by_user.get(caller.user_id if caller.user_id is not None else caller.username, 0)


class _Slot:
    def __init__(self, slots: WaitSlots, key: object):
        self.slots, self.key = slots, key

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.slots._release(self.key)


#: This process's long polls.
_WAITS = WaitSlots()


def _dequeue(
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
    local_visibility_timeout = visibility_timeout
    if local_visibility_timeout is None and spec is not None:
        local_visibility_timeout = spec.visibility_timeout
    if local_visibility_timeout is None:
        local_visibility_timeout = cfg.visibility_timeout
    rt = get_runtime()
    # A forwarded dequeue (hops >= 1) answers from here only: forwarding again made every
    # empty poll cost N(N-1) internal calls on N nodes, each with its own timeout.
    board = rt.board if hops == 0 else None
    asked: set[str] = set()
    found = _dequeue_node(
        target, cfg, sub, caller, max_messages, visibility_timeout, local_visibility_timeout, board, asked
    )
    if (spec.max_receives if spec is not None else cfg.max_receives) is not None:
        _move_dead_letters(cfg, sub)
    if found or hops >= 1:
        if not found and wait:
            found = _waited(target, cfg, sub, caller, max_messages, visibility_timeout, local_visibility_timeout, wait)
        return found
    for address in rt.router.other_nodes(cfg.id, cfg.name):
        if address in asked:
            continue
        try:
            got = get_peers().dequeue(address, target, max_messages, visibility_timeout, hops, caller)
        except Exception:  # noqa: BLE001, S112 - that owner is unreachable or refused: try the next
            continue
        if got:
            return got
    if wait:
        found = _waited(target, cfg, sub, caller, max_messages, visibility_timeout, local_visibility_timeout, wait)
    return found


#: Seconds by which a sibling process's oldest deliverable message must have waited longer than
#: this process's for a dequeue to ask the sibling first. Within it, this process's own come
#: first: under a backlog, the processes' oldest messages are always some time apart, and a
#: call between processes for every dequeue would cost more than the order it buys. Past it,
#: the node's oldest come first, so no message waits much longer than its node's newest.
SIBLING_AHEAD = 0.5


def _dequeue_node(
    target: str,
    cfg: QueueConfig,
    sub: str,
    caller: Caller,
    max_messages: int,
    visibility_timeout: float | None,
    local_visibility_timeout: float,
    board: Board | None,
    asked: set[str],
) -> list[Delivery]:
    """One look, no wait: this process's partitions, and (``board``: a runnode of several
    processes) the siblings that hold deliverable messages of ``target``, so that any process
    answers with the node's oldest. A sibling whose oldest has waited longer than this
    process's by :data:`SIBLING_AHEAD` is asked first; one that holds some is asked while the
    dequeue has room. ``asked``: the siblings asked, filled in."""
    holders = board.holders(target) if board is not None else []
    if not holders:
        found = _dequeue_local(cfg, sub, max_messages, local_visibility_timeout)
        _announce(target, found)
        return found
    mine = _oldest_here(cfg.name, sub)
    found = []
    later: list[str] = []
    for oldest, address in holders:
        if mine is None or oldest < mine - SIBLING_AHEAD:
            found.extend(_from_sibling(address, target, max_messages - len(found), visibility_timeout, caller, asked))
            if len(found) >= max_messages:
                return found
        else:
            later.append(address)
    here = _dequeue_local(cfg, sub, max_messages - len(found), local_visibility_timeout)
    _announce(target, here)
    found.extend(here)
    for address in later:
        if len(found) >= max_messages:
            break
        found.extend(_from_sibling(address, target, max_messages - len(found), visibility_timeout, caller, asked))
    return found


def _oldest_here(queue: str, sub: str) -> float | None:
    """The wall time this process's oldest deliverable message of the target has waited since."""
    oldest: float | None = None
    now, wall = monotonic(), time.time()
    for m in get_runtime().local_managers(queue):
        o, due = m.waiting_since(sub)
        if due is not None and due <= now:
            o = min(o if o is not None else wall, wall - (now - due))
        if o is not None and (oldest is None or o < oldest):
            oldest = o
    return oldest


def _from_sibling(
    address: str, target: str, room: int, visibility_timeout: float | None, caller: Caller, asked: set[str]
) -> list[Delivery]:
    """A dequeue of up to ``room`` from a sibling process (which answers from its own memory)."""
    asked.add(address)
    if room <= 0:
        return []
    try:
        return get_peers().dequeue(address, target, room, visibility_timeout, 0, caller)
    except Exception as exc:  # noqa: BLE001 - gone or busy: its messages are its own consumers' then
        log.info("dequeue of %s from sibling %s: %s", target, address, exc)
        return []


def _waited(
    target: str,
    cfg: QueueConfig,
    sub: str,
    caller: Caller,
    max_messages: int,
    visibility_timeout: float | None,
    local_visibility_timeout: float,
    wait: float,
) -> list[Delivery]:
    """Wait up to ``wait`` seconds for the first delivery: woken by an enqueue here, by a
    sibling process that stored one (``board``), or by the next visibility deadline.

    The caller's right is checked again at the end: it was checked when the call started, up
    to ``MAX_WAIT`` seconds ago. A caller that lost ``consume`` meanwhile gets nothing of this
    process's, and what the wait took is given back, deliverable at once to those who may
    still read it, with the receive count it had (a sibling asked at the end checked the right
    itself)."""
    rt = get_runtime()
    board = rt.board
    give_up = monotonic() + min(wait, MAX_WAIT)
    with board.waiting(target) if board is not None else nullcontext():
        while True:
            seq = rt.change_seq()
            asked: set[str] = set()
            found = _dequeue_node(
                target, cfg, sub, caller, max_messages, visibility_timeout, local_visibility_timeout, board, asked
            )
            now = monotonic()
            if found or now >= give_up:
                break
            timeout = give_up - now
            for m in rt.local_managers(cfg.name):
                nd = m.next_wakeup(sub)
                if nd is not None:
                    timeout = min(timeout, max(nd - now, 0.0) + 0.001)
            if board is not None:
                due = board.next_due(target)
                if due is not None:
                    timeout = min(timeout, max(due - now, 0.0) + 0.001)
                timeout = min(timeout, BOARD_LOOK)
                if asked:
                    # A sibling's hint named messages it no longer had (another consumer took
                    # them): wait for news after this look, not for the wake-up the hint sent.
                    seq = rt.change_seq()
                    timeout = min(timeout, SIBLING_RETRY)
            rt.wait_for_change(seq, timeout)
    local = [d for d in found if (cfg.name, _message_id(d.id).partition) in rt.managers]
    if local and "consume" not in granted_now(caller, cfg.id, cfg.name, cfg.created_by):
        by_partition: dict[int, list[Delivery]] = {}
        for d in local:
            by_partition.setdefault(_message_id(d.id).partition, []).append(d)
        for index, deliveries in by_partition.items():
            holder = rt.managers.get((cfg.name, index))
            if holder is not None:  # (one closed meanwhile: its next owner delivers them again)
                holder.give_back(deliveries, sub)
        log.info(
            "a long poll of %s on %s ended after its right was revoked: %d given back", caller, cfg.name, len(local)
        )
        return []
    return found


#: The longest a long poll of a runnode of several processes sleeps between two looks at its
#: siblings' boards: a wake-up lost (a sibling that started meanwhile) costs at most this.
BOARD_LOOK = 1.0
#: After a look that asked a sibling and found nothing, the longest wait before the next one.
SIBLING_RETRY = 0.01


def _announce(target: str, deliveries: list[Delivery]) -> None:
    again = [d for d in deliveries if d.receive_count > 1]
    if again:
        redelivered.send_robust(sender=None, target=target, deliveries=again)


def _dequeue_local(cfg: QueueConfig, sub: str, max_messages: int, visibility_timeout: float) -> list[Delivery]:
    """This process's partitions only, in turn, no wait."""
    rt = get_runtime()
    managers = rt.local_managers(cfg.name)
    out: list[Delivery] = []
    if not managers or max_messages <= 0:
        return out
    start = rt.rotation(len(managers))
    for i in range(len(managers)):
        m = managers[(start + i) % len(managers)]
        try:
            got = m.dequeue(max_messages - len(out), visibility_timeout, sub)
            if got:  # what cannot be read now is given back, not left hidden
                out.extend(m.load_bodies(got, sub))
                served.record(m)
        except PartitionUnavailable:
            continue
        if len(out) >= max_messages:
            break
    if rt.board is not None:
        rt.hint(cfg.name)  # the siblings see this process's new oldest (or that it has none)
    return out


def _move_dead_letters(cfg: QueueConfig, sub: str = "") -> None:
    """Move the messages this node set aside (past max_receives) to the dead-letter queue,
    each on its own.

    Each is stored there first, then removed from the source: a crash in between leaves a
    message in both queues (at least once), never in neither. One that cannot be moved (the
    dead-letter queue or the owner of its partition there refuses it, or no owner can be reached)
    is given back to the source, where the next dequeue sets it aside and tries again; it is
    counted (``mq_dead_letter_moves_failed``) and logged, and the others move on. After a failure
    that is not the message's own (a 5xx, an owner unreachable), the rest bound for the same
    partition of the dead-letter queue are given back untried, as are the rest of a failed
    one's group (kept in order): a dequeue never waits out one timeout per dead letter.
    """
    rt = get_runtime()
    spec = cfg.subscription(sub) if sub else None
    dead_letter_queue = spec.dead_letter_queue if spec is not None else cfg.dead_letter_queue
    source = f"{cfg.name}/{sub}" if sub else cfg.name
    for m in rt.local_managers(cfg.name):
        dead = m.take_dead(sub)
        if not dead:
            continue
        try:
            if dead_letter_queue is None:
                raise NotServedHere("the queue no longer names a dead-letter queue")
            dlq = queue_config(dead_letter_queue)
            found = m.load_bodies([Delivery(mid, "", count) for mid, count in dead])
        except Exception as exc:  # noqa: BLE001 - none can move now: given back, tried again later
            _not_moved(source, dead_letter_queue, [mid for mid, _ in dead], exc)
            m.give_back_dead([mid for mid, _ in dead], sub)
            continue
        now = datetime.now(UTC).timestamp()
        moved: list[str] = []
        held: list[str] = []
        unreachable: set[int | None] = set()  # the dead-letter queue's partitions that failed
        failed_groups: set[str] = set()
        for d in found:
            msg = d.message
            assert msg is not None
            # In its group still: a strict dead-letter queue needs one, and its dead letters
            # keep their order there (and when redriven).
            index = group_partition(msg.group, dlq.partitions) if msg.group else None
            if index in unreachable or (msg.group is not None and msg.group in failed_groups):
                held.append(d.id)
                continue
            history = {
                "source": source,
                "id": d.id,
                "receive_count": d.receive_count,
                "group": msg.group,
                "enqueued_at": iso(msg.enqueued_at),
                "dead_lettered_at": iso(now),
            }
            draft = MessageDraft(
                msg.body,
                group=msg.group,
                attributes=msg.attributes,
                size=msg.size,
                estimates=msg.estimates,
                history=history,
            )
            try:
                check_drafts(dlq, [draft])
                # Through the routing of any enqueue: the partition may be on another node.
                _enqueue_somewhere(dlq, index, [draft], now, 0, SYSTEM)
            except Exception as exc:  # noqa: BLE001 - this one stays; the others move on
                _not_moved(source, dead_letter_queue, [d.id], exc)
                held.append(d.id)
                if msg.group is not None:
                    failed_groups.add(msg.group)
                if not _refused(exc):
                    unreachable.add(index)
                continue
            moved.append(d.id)
        if held:
            m.give_back_dead(held, sub)
        if not moved:
            continue
        try:
            m.remove_dead_lettered([_message_id(mid) for mid in moved], sub)  # not archived
        except Exception:
            # Copied already: given back, a later move copies them again (at least once).
            log.exception("removing %d moved dead letters of %s", len(moved), source)
            m.give_back_dead(moved, sub)
            continue
        with m.lock:
            m.dead_lettered_total += len(moved)
        metrics.DEAD_LETTERED.labels(cfg.name, sub).inc(len(moved))


def _refused(exc: Exception) -> bool:
    """Whether a dead letter's move failed for the message itself (the dead-letter queue's
    rules, a 4xx of its owner), not for the way there."""
    return isinstance(exc, InvalidRequest) or (isinstance(exc, RemoteError) and exc.status < 500)


def _not_moved(source: str, dead_letter_queue: str | None, mids: list[str], exc: Exception) -> None:
    """Count and log dead letters of ``source`` (a queue, or ``topic/subscription``) that stay."""
    queue, _, sub = source.partition("/")
    metrics.DEAD_LETTER_MOVES_FAILED.labels(queue, sub).inc(len(mids))
    expected = isinstance(exc, (InvalidRequest, RemoteError, PartitionUnavailable, QueueNotFound))
    log.warning(
        "%s: %d dead letter(s) not moved to %s, kept to try again (%s): %s",
        source,
        len(mids),
        dead_letter_queue,
        ", ".join(mids[:5]) + (" ..." if len(mids) > 5 else ""),
        exc if expected else repr(exc),
        exc_info=None if expected else exc,
    )


# --- ack and visibility -----------------------------------------------------------------------
def ack(
    target: str,
    items: Sequence[tuple[MessageId, str | None]],
    *,
    caller: Caller,
    hops: int = 0,
    check_only: bool = False,
    unexpired: bool = False,
    _in_span: bool = False,
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
    if tracing.ON and not (_in_span or check_only):  # its span (queues.tracing), then this again
        return tracing.ack_span(ack, target, items, caller=caller, hops=hops, unexpired=unexpired, _in_span=True)
    cfg, sub = authorize(target, "consume", caller=caller, reading=True)
    rt = get_runtime()
    give_up: float | None = None  # (set at the first miss: nearly every ack finds its owners)
    while True:
        local, remote, unowned = _ack_route(cfg, items, hops)
        missed: PeerUnreachable | None = None
        if unowned is None:
            try:
                if check_only or remote:
                    if local:
                        _check_local(cfg.name, local, sub, unexpired)
                    if check_only:
                        return AckResult(0, 0)
                    for address, batch in remote.items():
                        get_peers().check_ack(address, target, batch, hops, caller, unexpired=unexpired)
                break
            except PeerUnreachable as exc:  # a check removes nothing: it may be made elsewhere
                missed = exc
        # No owner now, or one that did not answer: look again for where the partitions are,
        # as an enqueue waits for its partition's owner.
        give_up = give_up or monotonic() + _owner_wait()
        if hops >= MAX_HOPS or monotonic() >= give_up or cfg.name not in rt.queues:
            if missed is not None:
                raise missed
            raise _unserved(cfg, f"partition {cfg.name}/{unowned} has no live owner now; retry")
        time.sleep(OWNER_LOOK)
        rt.router.forget(cfg.id)
    acked = not_found = 0
    if local:
        result = _ack_local(cfg.name, local, sub, unexpired)
        acked, not_found = result.acked, result.not_found
    for address, batch in remote.items():
        result = get_peers().ack(address, target, batch, hops, caller, unexpired=unexpired)
        acked += result.acked
        not_found += result.not_found
    return AckResult(acked, not_found)


def _ack_route(
    cfg: QueueConfig, items: Sequence[tuple[MessageId, str | None]], hops: int
) -> tuple[list[tuple[MessageId, str | None]], dict[str, list[tuple[MessageId, str | None]]], int | None]:
    """The acks for this node's partitions, those for each other owner, and a partition that
    has no live owner now (None: every partition has one)."""
    rt = get_runtime()
    local: list[tuple[MessageId, str | None]] = []
    remote: dict[str, list[tuple[MessageId, str | None]]] = {}
    for mid, receipt in items:
        if (cfg.name, mid.partition) in rt.managers:
            local.append((mid, receipt))
            continue
        address = rt.router.owner_of(cfg.id, cfg.name, mid.partition) if hops < MAX_HOPS else None
        if address is None:
            return local, remote, mid.partition
        remote.setdefault(address, []).append((mid, receipt))
    return local, remote, None


def _message_id(text: str) -> MessageId:
    """The parsed ID of a message this node stored (so well-formed)."""
    mid = parse_message_id(text)
    assert mid is not None, text
    return mid


def _managers_of(
    queue: str, items: list[tuple[MessageId, str | None]]
) -> list[tuple[PartitionManager[Lease], list[tuple[MessageId, str | None]]]]:
    rt = get_runtime()
    by_partition: dict[int, list[tuple[MessageId, str | None]]] = {}
    for mid, receipt in items:
        by_partition.setdefault(mid.partition, []).append((mid, receipt))
    return [(rt.manager(queue, p), by_partition[p]) for p in sorted(by_partition)]


@contextmanager
def _serving_locked(groups: list[tuple[PartitionManager[Lease], list[tuple[MessageId, str | None]]]]) -> Iterator[None]:
    """Every manager of ``groups`` locked, in index order (so two batch calls never deadlock),
    each checked to be serving still; released in reverse order, whatever happens."""
    locked: list[PartitionManager[Lease]] = []
    try:
        for m, _ in groups:
            m.lock.acquire()
            locked.append(m)
            m.check_serving()
        yield
    finally:
        for m in reversed(locked):
            m.lock.release()


def _check_local(queue: str, items: Sequence[tuple[MessageId, str | None]], sub: str, unexpired: bool = False) -> None:
    """Raise ReceiptMismatch if a receipt of this node's partitions is not current; removes
    nothing. The partitions are locked as :func:`_ack_local` locks them."""
    groups = _managers_of(queue, list(items))
    with _serving_locked(groups):
        for m, group in groups:
            m.check_receipts(group, sub, unexpired=unexpired)


def _ack_local(
    queue: str, items: Sequence[tuple[MessageId, str | None]], sub: str = "", unexpired: bool = False
) -> AckResult:
    """Acknowledge on this node's partitions; all receipts are checked before anything is removed.

    Receipts are checked with every involved partition locked (in index order), and the
    messages pinned against redelivery; the deletes then run without the locks.
    """
    unique = list({str(mid): (mid, receipt) for mid, receipt in items}.values())
    groups = _managers_of(queue, unique)
    for m, _ in groups:
        served.record(m)
    if len(groups) == 1:
        m, group = groups[0]
        removed = m.ack(group, sub=sub, unexpired=unexpired)
        return AckResult(removed, len(unique) - removed)
    with _serving_locked(groups):
        for m, group in groups:
            m.check_receipts(group, sub, unexpired=unexpired)
        pins = [m.pin_for_ack([mid for mid, _ in group], sub) for m, group in groups]
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


def change_visibility(
    target: str, mid: MessageId, receipt: str | None, visibility_timeout: float, *, caller: Caller, hops: int = 0
) -> None:
    """Hide a message in flight for ``visibility_timeout`` more seconds from now; 0 gives it back at once
    (announced as ``signals.given_back``). At the partition's owner, wherever that is.

    ``consume``. Raises QueueNotFound, ``access.Forbidden``, SubscriptionNotFound,
    ReceiptMismatch (not in flight, or an earlier delivery's receipt), PartitionUnavailable,
    RemoteError.
    """
    cfg, sub = authorize(target, "consume", caller=caller, reading=True)
    rt = get_runtime()
    if (cfg.name, mid.partition) not in rt.managers and hops < MAX_HOPS:
        address = rt.router.owner_of(cfg.id, cfg.name, mid.partition)
        if address is not None:
            _at_owner(
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
    ((m, _),) = _managers_of(cfg.name, [(mid, receipt)])
    with m.lock:
        m.check_serving()
        receive_count = m.change_visibility_locked(mid, receipt, visibility_timeout, sub)
    served.record(m)
    if visibility_timeout == 0:
        given_back.send_robust(sender=None, target=target, message_id=str(mid), receive_count=receive_count)


def publish(topic: str, drafts: Sequence[MessageDraft], *, caller: Caller, hops: int = 0) -> list[str]:
    """Enqueue to a topic (``produce``): stored once, read by every subscription. Raises
    QueueNotFound when ``topic`` is not a topic, and what :func:`enqueue` raises."""
    if queue_config(topic).kind != "topic":
        raise QueueNotFound(topic)
    return enqueue(topic, drafts, caller=caller, hops=hops)
