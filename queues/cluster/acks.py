"""Acks on this node's partitions: every receipt checked with the partitions locked in index
order (so two batch calls never wait on each other in a cycle), the messages pinned against
redelivery, then the deletes without the locks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from queues.cluster import served
from queues.engine.ids import MessageId
from queues.engine.partition import PartitionManager
from queues.engine.ports import Lease
from queues.errors import PartitionUnavailable

if TYPE_CHECKING:
    from queues.cluster.node import NodeRuntime

Manager = PartitionManager[Lease]
Acks = list[tuple[MessageId, str | None]]


def managers_of(rt: NodeRuntime, queue: str, items: list[tuple[MessageId, str | None]]) -> list[tuple[Manager, Acks]]:
    """This node's managers of ``items``' partitions, in index order, each with its items."""
    partitions = {mid.partition for mid, _ in items}
    if len(partitions) == 1:
        return [(rt.manager(queue, partitions.pop()), items)]
    by_partition: dict[int, list[tuple[MessageId, str | None]]] = {}
    for mid, receipt in items:
        by_partition.setdefault(mid.partition, []).append((mid, receipt))
    return [(rt.manager(queue, p), by_partition[p]) for p in sorted(by_partition)]


@contextmanager
def serving_locked(groups: list[tuple[Manager, Acks]]) -> Iterator[None]:
    """Every manager of ``groups`` locked, in index order (so two batch calls never deadlock),
    each checked to be serving still; released in reverse order, whatever happens."""
    locked: list[Manager] = []
    try:
        for m, _ in groups:
            m.lock.acquire()
            locked.append(m)
            m.check_serving()
        yield
    finally:
        for m in reversed(locked):
            m.lock.release()


def check_here(
    rt: NodeRuntime, queue: str, items: Sequence[tuple[MessageId, str | None]], sub: str, unexpired: bool = False
) -> None:
    """Raise ReceiptMismatch if a receipt of this node's partitions is not current; removes
    nothing. The partitions are locked as :func:`ack_here` locks them."""
    groups = managers_of(rt, queue, list(items))
    with serving_locked(groups):
        for m, group in groups:
            m.check_receipts(group, sub, unexpired=unexpired)


def ack_here(
    rt: NodeRuntime, queue: str, items: Sequence[tuple[MessageId, str | None]], sub: str = "", unexpired: bool = False
) -> tuple[int, int]:
    """Acknowledge on this node's partitions; all receipts are checked before anything is
    removed. ``(acked, not found)``.

    Receipts are checked with every involved partition locked (in index order), and the
    messages pinned against redelivery; the deletes then run without the locks.
    """
    unique = list({str(mid): (mid, receipt) for mid, receipt in items}.values())
    groups = managers_of(rt, queue, unique)
    for m, _ in groups:
        served.record(m)
    if len(groups) == 1:
        m, group = groups[0]
        removed = m.ack(group, sub=sub, unexpired=unexpired)
        return removed, len(unique) - removed
    with serving_locked(groups):
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
    return acked, len(unique) - acked
