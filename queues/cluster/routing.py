"""Where a call runs: here, at a partition's owner, or at any node that serves the queue.

The service says *what* a call does; this module decides *where*, with the node runtime's
managers and the router's owner cache, and runs the call there through the two callables the
service gives it (``local``: on this node's managers; ``remote(address)``: forwarded, the
service's peers carry it). Owner lookup, the wait for an owner, the choice between here and
elsewhere, and cooling (a node over its load or failure threshold passes enqueues on) are all
here.

``hops`` counts how often a call was forwarded already; past :data:`~queues.cluster.router.MAX_HOPS`
it is answered where it is, so nothing loops.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from queues.cluster import served
from queues.cluster.router import MAX_HOPS
from queues.engine.config import QueueConfig
from queues.engine.ids import MessageId, StoredMessage
from queues.engine.partition import PartitionManager
from queues.engine.ports import Lease
from queues.errors import NotServedHere, PartitionUnavailable, PeerUnreachable, QueueNotFound, RemoteError
from queues.models import Queue

if TYPE_CHECKING:
    from queues.cluster.node import NodeRuntime

log = logging.getLogger(__name__)
Manager = PartitionManager[Lease]
T = TypeVar("T")
D = TypeVar("D")

monotonic = time.monotonic

#: The most a call waits for a partition's owner (:func:`owner_wait`).
OWNER_WAIT_MAX = 5.0
#: Seconds between two looks for a partition's owner.
OWNER_LOOK = 0.05


def owner_wait(rt: NodeRuntime) -> float:
    """Seconds a call waits for a partition that has no live owner to get one: a queue just
    created whose other nodes claim at their next pass (a heartbeat), or a partition between
    two owners."""
    return min(OWNER_WAIT_MAX, 1.5 * rt.heartbeat + 0.5)


def owner(rt: NodeRuntime, cfg: QueueConfig, index: int, give_up: float) -> str | None:
    """The address of the owner of partition ``index``, None when it is this node; waits for
    one until ``give_up`` (monotonic) when it has none, then raises NotServedHere (503: retry)
    or QueueNotFound (it was deleted)."""
    while True:
        if (cfg.name, index) in rt.managers:
            return None
        address = rt.router.owner_of(cfg.id, cfg.name, index)
        if address is not None:
            return address
        if monotonic() >= give_up:
            raise unserved(rt, cfg, f"partition {cfg.name}/{index} has no live owner now; retry")
        if cfg.name not in rt.queues:
            raise unserved(rt, cfg, f"queue {cfg.name!r} is not described on this node now; retry")
        time.sleep(OWNER_LOOK)
        rt.router.forget(cfg.id)


def at_owner(rt: NodeRuntime, cfg: QueueConfig, index: int, local: Callable[[], T], remote: Callable[[str], T]) -> T:
    """``remote(address)`` at the owner of partition ``index``, or ``local()`` when that is
    this node. An owner that refuses the connection is looked up again: it died, and its row
    names it until its lease passes to a live node, while the call never reached it (safe to
    make again, whatever it is). The lookups and the waits for an owner share one
    :func:`owner_wait`, so a call answers 503 within it (past the calls' own timeouts)."""
    give_up = monotonic() + owner_wait(rt)
    while True:
        address = owner(rt, cfg, index, give_up)
        if address is None:
            return local()
        try:
            return remote(address)
        except PeerUnreachable as exc:
            if not exc.refused or monotonic() >= give_up:
                raise
        time.sleep(OWNER_LOOK)
        rt.router.forget(cfg.id)


def to_partition(
    rt: NodeRuntime, cfg: QueueConfig, index: int, hops: int, local: Callable[[], T], remote: Callable[[str], T]
) -> T:
    """A call for partition ``index``: here when this node serves it (or the call may not be
    forwarded again), else at its owner (:func:`at_owner`)."""
    if (cfg.name, index) in rt.managers or hops >= MAX_HOPS:
        return local()
    return at_owner(rt, cfg, index, local, remote)


def enqueue_here(m: Manager, messages: list[StoredMessage]) -> list[str]:
    """Store ``messages`` in this node's partition ``m``; their IDs (who served it recorded)."""
    ids = m.enqueue(messages)
    served.record(m)
    return ids


def enqueue_any_local(
    rt: NodeRuntime, queue: str, messages: list[StoredMessage], *, even_if_cooling: bool = False
) -> list[str]:
    """Store the messages in one partition of this node, in order; each in turn until one takes them.

    Raises NotServedHere when this node has no partition of the queue, or is cooling (over its
    load or failure threshold) and ``even_if_cooling`` is false.
    """
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
            return enqueue_here(m, messages)
        except PartitionUnavailable as exc:
            last = exc
    assert last is not None
    raise last


def local_or_forward(
    rt: NodeRuntime, cfg: QueueConfig, hops: int, local: Callable[[bool], list[str]], remote: Callable[[str], list[str]]
) -> list[str]:
    """Run ``local`` (its argument: even if this node is cooling); if this node does not serve
    the call, pass it to a node that does; if none can, a cooling node still serves rather than
    refuse. A node that may have run the call (:class:`PeerUnreachable` after the connection
    was made: a timeout, a reset, an answer it could not read) ends it there, as in
    :func:`at_owner`: the next node would store the messages a second time."""
    try:
        return local(hops >= MAX_HOPS)
    except NotServedHere:
        if hops >= MAX_HOPS:
            raise
    last: Exception | None = None
    give_up = monotonic() + owner_wait(rt)
    while True:
        for address in rt.router.other_nodes(cfg.id, cfg.name):
            try:
                return remote(address)
            except RemoteError as exc:
                if exc.status < 500:
                    raise  # the owner refused it: so would the others
                last = exc
            except PeerUnreachable as exc:
                if not exc.refused:
                    raise  # it may have stored them: 503, the client decides
                last = exc
            except Exception as exc:  # noqa: BLE001 - unavailable: try the next owner
                last = exc
        if rt.local_managers(cfg.name):
            return local(True)
        if last is not None or monotonic() >= give_up or cfg.name not in rt.queues:
            raise unserved(rt, cfg, f"no node serves queue {cfg.name!r} now ({last or 'no owner'}); retry")
        # No owner at all yet (a queue just created, its partitions not claimed yet): wait.
        time.sleep(OWNER_LOOK)
        rt.router.forget(cfg.id)


def unserved(rt: NodeRuntime, cfg: QueueConfig, detail: str) -> Exception:
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
        rt.queue_deleted(cfg.name, cfg.id)
    return NotServedHere(detail)


def shares_elsewhere(rt: NodeRuntime, cfg: QueueConfig, shares: dict[int | None, list[D]]) -> dict[str, list[D]]:
    """The shares of a multi-partition enqueue (by partition; None: any) that another node
    would store, by that node's address: those this node stores itself, or that have no owner
    now, are left out (storing finds out about the latter)."""
    remote: dict[str, list[D]] = {}
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
    return remote


Acks = list[tuple[MessageId, str | None]]


def ack_route(
    rt: NodeRuntime, cfg: QueueConfig, items: Sequence[tuple[MessageId, str | None]], hops: int
) -> tuple[Acks, dict[str, Acks], int | None]:
    """The acks for this node's partitions, those for each other owner, and a partition that
    has no live owner now (None: every partition has one)."""
    managers = rt.managers
    if all((cfg.name, p) in managers for p in {mid.partition for mid, _ in items}):
        return list(items), {}, None  # (nearly always: the acks of a dequeue made here)
    local: Acks = []
    remote: dict[str, Acks] = {}
    for mid, receipt in items:
        if (cfg.name, mid.partition) in rt.managers:
            local.append((mid, receipt))
            continue
        address = rt.router.owner_of(cfg.id, cfg.name, mid.partition) if hops < MAX_HOPS else None
        if address is None:
            return local, remote, mid.partition
        remote.setdefault(address, []).append((mid, receipt))
    return local, remote, None


def routed_ack(
    rt: NodeRuntime,
    cfg: QueueConfig,
    items: Sequence[tuple[MessageId, str | None]],
    hops: int,
    check: Callable[[Acks, dict[str, Acks]], None],
) -> tuple[Acks, dict[str, Acks]]:
    """Route the acks (:func:`ack_route`) and run ``check(local, remote)`` on the route; again
    while a partition has no live owner or an owner did not answer a check (a check removes
    nothing: it may be made elsewhere), as an enqueue waits for its partition's owner. The
    route the check passed on."""
    give_up: float | None = None  # (set at the first miss: nearly every ack finds its owners)
    while True:
        local, remote, unowned = ack_route(rt, cfg, items, hops)
        missed: PeerUnreachable | None = None
        if unowned is None:
            try:
                check(local, remote)
                return local, remote
            except PeerUnreachable as exc:
                missed = exc
        give_up = give_up or monotonic() + owner_wait(rt)
        if hops >= MAX_HOPS or monotonic() >= give_up or cfg.name not in rt.queues:
            if missed is not None:
                raise missed
            raise unserved(rt, cfg, f"partition {cfg.name}/{unowned} has no live owner now; retry")
        time.sleep(OWNER_LOOK)
        rt.router.forget(cfg.id)
