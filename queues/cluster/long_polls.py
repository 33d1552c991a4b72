"""Where a dequeue looks, and how a long poll waits: this process's partitions, its sibling
processes (a runnode of several processes), the queue's other owners, then a wait for the first
delivery; and the node's cap on concurrent long polls (:class:`WaitSlots`).

The service gives the call's terms as a :class:`Poll`, with the two ways to ask another node
(``ask``: a sibling, ``remote``: another owner), which its peers carry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings

from queues.access import Caller, granted_now
from queues.cluster import served
from queues.cluster.siblings import Board
from queues.engine.config import QueueConfig
from queues.engine.ids import MessageId, parse_message_id
from queues.engine.partition import Delivery, PartitionManager
from queues.errors import PartitionUnavailable, TooManyWaits
from queues.signals import redelivered

if TYPE_CHECKING:
    from queues.cluster.leases import Lease
    from queues.cluster.node import NodeRuntime

log = logging.getLogger(__name__)

monotonic = time.monotonic

#: Seconds by which a sibling process's oldest deliverable message must have waited longer than
#: this process's for a dequeue to ask the sibling first. Within it, this process's own come
#: first: under a backlog, the processes' oldest messages are always some time apart, and a
#: call between processes for every dequeue would cost more than the order it buys. Past it,
#: the node's oldest come first, so no message waits much longer than its node's newest.
SIBLING_AHEAD = 0.5
#: The longest a long poll of a runnode of several processes sleeps between two looks at its
#: siblings' boards: a wake-up lost (a sibling that started meanwhile) costs at most this.
BOARD_LOOK = 1.0
#: After a look that asked a sibling and found nothing, the longest wait before the next one.
SIBLING_RETRY = 0.01


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
WAITS = WaitSlots()


@dataclass(slots=True)
class Poll:
    """One dequeue's terms: ``visibility`` is the resolved one this process hides its
    deliveries for; ``ask(address, room)`` dequeues up to ``room`` from a sibling process,
    ``remote(address)`` from another owner (both with the caller's own terms)."""

    target: str
    cfg: QueueConfig
    sub: str
    caller: Caller
    max_messages: int
    visibility: float
    ask: Callable[[str, int], list[Delivery]]
    remote: Callable[[str], list[Delivery]]


def dequeue(
    rt: NodeRuntime, poll: Poll, wait: float, hops: int, after_look: Callable[[], None] | None = None
) -> list[Delivery]:
    """Up to ``poll.max_messages`` deliveries: here (and the siblings), then from the other
    owners (deepest first), then waiting here up to ``wait`` seconds for the first (the
    service bounds it).
    ``after_look``: run after the first look (the service's dead-letter moves)."""
    # A forwarded dequeue (hops >= 1) answers from here only: forwarding again made every
    # empty poll cost N(N-1) internal calls on N nodes, each with its own timeout.
    board = rt.board if hops == 0 else None
    asked: set[str] = set()
    found = look(rt, poll, board, asked)
    if after_look is not None:
        after_look()
    if found or hops >= 1:
        if not found and wait:
            found = waited(rt, poll, wait)
        return found
    for address in rt.router.other_nodes(poll.cfg.id, poll.cfg.name):
        if address in asked:
            continue
        try:
            got = poll.remote(address)
        except Exception:  # noqa: BLE001, S112 - that owner is unreachable or refused: try the next
            continue
        if got:
            return got
    if wait:
        found = waited(rt, poll, wait)
    return found


def look(rt: NodeRuntime, poll: Poll, board: Board | None, asked: set[str]) -> list[Delivery]:
    """One look, no wait: this process's partitions, and (``board``: a runnode of several
    processes) the siblings that hold deliverable messages of the target, so that any process
    answers with the node's oldest. A sibling whose oldest has waited longer than this
    process's by :data:`SIBLING_AHEAD` is asked first; one that holds some is asked while the
    dequeue has room. ``asked``: the siblings asked, filled in."""
    holders = board.holders(poll.target) if board is not None else []
    if not holders:
        found = dequeue_here(rt, poll.cfg, poll.sub, poll.max_messages, poll.visibility)
        announce(poll.target, found)
        return found
    mine = oldest_here(rt, poll.cfg.name, poll.sub)
    found = []
    later: list[str] = []
    for oldest, address in holders:
        if mine is None or oldest < mine - SIBLING_AHEAD:
            found.extend(from_sibling(poll, address, poll.max_messages - len(found), asked))
            if len(found) >= poll.max_messages:
                return found
        else:
            later.append(address)
    here = dequeue_here(rt, poll.cfg, poll.sub, poll.max_messages - len(found), poll.visibility)
    announce(poll.target, here)
    found.extend(here)
    for address in later:
        if len(found) >= poll.max_messages:
            break
        found.extend(from_sibling(poll, address, poll.max_messages - len(found), asked))
    return found


def oldest_here(rt: NodeRuntime, queue: str, sub: str) -> float | None:
    """The wall time this process's oldest deliverable message of the target has waited since."""
    now, wall = monotonic(), time.time()
    waits = [w for w in (waiting_since(m, sub, now, wall) for m in rt.local_managers(queue)) if w is not None]
    return min(waits, default=None)


def waiting_since(m: PartitionManager[Lease], sub: str, now: float, wall: float) -> float | None:
    """The wall time the partition's oldest deliverable message has waited since (None: it has
    none): its oldest undelivered one, or one whose visibility timeout ran out (waiting since
    then, as far as the partition's figures tell)."""
    o, due = m.waiting_since(sub)
    if due is not None and due <= now:
        o = min(o if o is not None else wall, wall - (now - due))
    return o


def from_sibling(poll: Poll, address: str, room: int, asked: set[str]) -> list[Delivery]:
    """A dequeue of up to ``room`` from a sibling process (which answers from its own memory)."""
    asked.add(address)
    if room <= 0:
        return []
    try:
        return poll.ask(address, room)
    except Exception as exc:  # noqa: BLE001 - gone or busy: its messages are its own consumers' then
        log.info("dequeue of %s from sibling %s: %s", poll.target, address, exc)
        return []


def waited(rt: NodeRuntime, poll: Poll, wait: float) -> list[Delivery]:
    """Wait up to ``wait`` seconds (the service's bound: ``MAX_WAIT``) for the first delivery: woken by an enqueue here, by a
    sibling process that stored one (``board``), or by the next visibility deadline.

    The caller's right is checked again at the end: it was checked when the call started, up
    to ``MAX_WAIT`` seconds ago. A caller that lost ``consume`` meanwhile gets nothing of this
    process's, and what the wait took is given back, deliverable at once to those who may
    still read it, with the receive count it had (a sibling asked at the end checked the right
    itself). A wait whose queue is deleted through this node ends at once with nothing; one
    deleted through another node finds no partition of it and ends with nothing at its end.
    Neither takes anything of a queue created under the name since (a sibling process asked
    meanwhile answers by name: what it gave is kept)."""
    cfg, sub = poll.cfg, poll.sub
    board = rt.board
    give_up = monotonic() + wait
    found: list[Delivery] = []
    with board.waiting(poll.target) if board is not None else nullcontext():
        while rt.serves(cfg):
            seq = rt.change_seq()
            asked: set[str] = set()
            found = look(rt, poll, board, asked)
            now = monotonic()
            if found or now >= give_up:
                break
            timeout = give_up - now
            for m in rt.local_managers(cfg.name):
                nd = m.next_wakeup(sub)
                if nd is not None:
                    timeout = min(timeout, max(nd - now, 0.0) + 0.001)
            if board is not None:
                due = board.next_due(poll.target)
                if due is not None:
                    timeout = min(timeout, max(due - now, 0.0) + 0.001)
                timeout = min(timeout, BOARD_LOOK)
                if asked:
                    # A sibling's hint named messages it no longer had (another consumer took
                    # them): wait for news after this look, not for the wake-up the hint sent.
                    seq = rt.change_seq()
                    timeout = min(timeout, SIBLING_RETRY)
            rt.wait_for_change(seq, timeout)
    local = [d for d in found if (cfg.name, message_id(d.id).partition) in rt.managers]
    if local and (not rt.serves(cfg) or "consume" not in granted_now(poll.caller, cfg.id, cfg.name, cfg.created_by)):
        by_partition: dict[int, list[Delivery]] = {}
        for d in local:
            by_partition.setdefault(message_id(d.id).partition, []).append(d)
        for index, deliveries in by_partition.items():
            holder = rt.managers.get((cfg.name, index))
            if holder is not None:  # (one closed meanwhile: its next owner delivers them again)
                holder.give_back(deliveries, sub)
        log.info(
            "a long poll of %s on %s ended after its right was revoked or its queue deleted: %d given back",
            poll.caller,
            cfg.name,
            len(local),
        )
        return []
    return found


def announce(target: str, deliveries: list[Delivery]) -> None:
    again = [d for d in deliveries if d.receive_count > 1]
    if again:
        redelivered.send_robust(sender=None, target=target, deliveries=again)


def dequeue_here(rt: NodeRuntime, cfg: QueueConfig, sub: str, max_messages: int, visibility: float) -> list[Delivery]:
    """This process's partitions only, in turn, no wait."""
    managers = rt.local_managers(cfg.name)
    out: list[Delivery] = []
    if not managers or max_messages <= 0 or not rt.serves(cfg):
        return out
    if cfg.strict and len(managers) > 1:
        # FIFO: the partition whose waiting message is oldest first (each hands out its groups
        # oldest first), so that a receive starts with the group whose message was sent earliest
        now, wall = monotonic(), time.time()
        waits = [(waiting_since(m, sub, now, wall), i) for i, m in enumerate(managers)]
        managers = [managers[i] for w, i in sorted(waits, key=lambda x: (x[0] is None, x[0] or 0.0, x[1]))]
    else:
        start = rt.rotation(len(managers))
        managers = managers[start:] + managers[:start]
        if len(managers) > 1 and max_messages > 1 and any(m.keyed(sub) for m in managers):
            # A fair queue: first a share from each partition, so that a key flooding one
            # partition does not fill the receive while other keys wait in the others (each
            # partition's lanes take turns within its share), then the rest from any.
            _take(managers, sub, -(-max_messages // len(managers)), max_messages, visibility, out)
    _take(managers, sub, max_messages, max_messages, visibility, out)
    if rt.board is not None:
        rt.hint(cfg.name)  # the siblings see this process's new oldest (or that it has none)
    return out


def _take(
    managers: list[PartitionManager[Lease]],
    sub: str,
    share: int,
    max_messages: int,
    visibility: float,
    out: list[Delivery],
) -> None:
    """Up to ``share`` deliveries from each of ``managers`` in turn into ``out``, until it holds
    ``max_messages``."""
    for m in managers:
        room = min(share, max_messages - len(out))
        if room <= 0:
            break
        try:
            got = m.dequeue(room, visibility, sub)
            if got:  # what cannot be read now is given back, not left hidden
                out.extend(m.load_bodies(got, sub))
                served.record(m)
        except PartitionUnavailable:
            continue


def message_id(text: str) -> MessageId:
    """The parsed ID of a message this node stored (so well-formed)."""
    mid = parse_message_id(text)
    assert mid is not None, text
    return mid
