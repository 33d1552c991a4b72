"""Partition leases on the ``Partition`` row, by compare-and-set.

The seed's rule against clock skew: a node that finds a partition owned notes the time on its
*own* monotonic clock and the row's ``lease_nonce``. The owner writes a new nonce at every
renewal. Only when the same nonce has stood for a whole lease period, by the observer's clock,
may the observer take the row, and only by a compare-and-set on that very nonce. No wall
clock is compared across machines, so clocks minutes apart cannot make two owners; what must
hold is only that clocks *run* at about the same rate, which the owner's safety margin covers.

The owner, for its part, treats its lease as valid until ``LEASE_SAFETY`` of the period after
it *started* its last successful claim or renewal, which is before any observer could have
read that nonce.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from django.db import InterfaceError, OperationalError, connection, models, transaction
from django.db.models import QuerySet
from django.utils import timezone

from queues.errors import LeaseLost as LeaseLost  # (the partition engine raises it too)
from queues.models import Partition

#: The share of a lease period the owner relies on: it stops acting at 80 % of the period,
#: which leaves room for clocks that run up to 20 % apart in rate (real ones are 1e-4).
LEASE_SAFETY = 0.8

#: What the row's statements raise when the database is down or did not answer (an outage, not
#: a lost lease): the partition manager serves on once it is back (``queues.engine.ports.LeaseRow``).
ROW_OUTAGES: tuple[type[Exception], ...] = (OperationalError, InterfaceError)

monotonic = time.monotonic


@dataclass(frozen=True)
class Clock:
    """A node's clocks. Tests give nodes skewed ones; only ``monotonic`` decides anything."""

    #: seconds, only ever compared with other readings of the same clock.
    monotonic: Callable[[], float] = time.monotonic
    #: wall-clock time written to the row for people to read (never compared across nodes).
    wall: Callable[[], datetime] = timezone.now


SYSTEM_CLOCK = Clock()


@dataclass
class Lease:
    partition_id: int
    queue: str
    index: int
    epoch: int
    nonce: str
    period: float
    #: monotonic time until which this node may act as owner.
    valid_until: float
    head_block: str
    #: monotonic time of the last successful claim or renewal.
    renewed_at: float = field(default=0.0)
    clock: Clock = field(default=SYSTEM_CLOCK, repr=False)

    def valid(self, now: float | None = None) -> bool:
        return (self.clock.monotonic() if now is None else now) < self.valid_until

    def renewal_due(self, now: float | None = None) -> bool:
        now = self.clock.monotonic() if now is None else now
        return now - self.renewed_at >= self.period / 3


@dataclass
class Observation:
    """What a would-be owner saw of a partition owned by someone else."""

    owner_id: str | None
    epoch: int
    nonce: str
    seen_at: float


def _new_nonce() -> str:
    return secrets.token_hex(8)


class PartitionRow(NamedTuple):
    """What a claim reads of a partition row (:func:`try_claim`, and the lease it makes).

    A claim pass reads every partition row at every heartbeat (an owner that stopped renewing
    is found by watching its nonce stand), so it reads these columns as tuples
    (:func:`claim_rows`): model instances cost several times as much a pass
    (``bench/housekeeping.py``; figures in ``docs/explanation/performance.md``)."""

    pk: int
    queue_id: int
    queue_name: str
    index: int  # type: ignore[assignment]  # (the field hides tuple.index(), which nothing calls)
    owner_id: str | None
    epoch: int
    lease_nonce: str
    lease_period: int
    head_block: str

    @classmethod
    def of(cls, p: Partition) -> PartitionRow:
        return cls(
            p.pk, p.queue_id, p.queue.name, p.index, p.owner_id, p.epoch, p.lease_nonce, p.lease_period, p.head_block
        )


#: The columns of a :class:`PartitionRow`, in its order.
CLAIM_COLUMNS = (
    "pk",
    "queue_id",
    "queue__name",
    "index",
    "owner_id",
    "epoch",
    "lease_nonce",
    "lease_period",
    "head_block",
)


def claim_rows(rows: QuerySet[Partition]) -> list[PartitionRow]:
    """The claim columns of ``rows`` (one query)."""
    return [PartitionRow._make(r) for r in rows.values_list(*CLAIM_COLUMNS)]


def try_claim(
    partition: PartitionRow | Partition,
    node_id: str,
    observations: dict[int, Observation],
    *,
    clock: Clock = SYSTEM_CLOCK,
) -> Lease | None:
    """Claim ``partition`` for ``node_id`` if the seed's rule allows it now.

    ``partition`` is a fresh read of the row (its claim columns, or the model instance);
    ``observations`` is this node's memory of rows it found owned (updated in place). Returns
    the lease, or None.
    """
    if isinstance(partition, Partition):
        partition = PartitionRow.of(partition)
    now = clock.monotonic()
    pid = partition.pk
    owner_id = partition.owner_id
    if owner_id is not None and owner_id != "":
        seen = observations.get(pid)
        sighting = (owner_id, partition.epoch, partition.lease_nonce)
        if seen is None or (seen.owner_id, seen.epoch, seen.nonce) != sighting:
            observations[pid] = Observation(owner_id, partition.epoch, partition.lease_nonce, now)
            return None
        if now - seen.seen_at < partition.lease_period:
            return None
    # Free, or the same nonce has stood for a whole period on our clock: compare-and-set.
    nonce = _new_nonce()
    started = clock.monotonic()
    wall = clock.wall()
    updated = Partition.objects.filter(
        pk=pid,
        owner_id=partition.owner_id,
        epoch=partition.epoch,
        lease_nonce=partition.lease_nonce,
    ).update(
        owner_id=node_id, epoch=partition.epoch + 1, lease_nonce=nonce, lease_acquired_at=wall, lease_renewed_at=wall
    )
    observations.pop(pid, None)
    if updated != 1:
        return None  # another node got there first
    return Lease(
        pid,
        partition.queue_name,
        partition.index,
        partition.epoch + 1,
        nonce,
        float(partition.lease_period),
        started + partition.lease_period * LEASE_SAFETY,
        partition.head_block,
        renewed_at=started,
        clock=clock,
    )


def renew(lease: Lease, node_id: str, period: float | None = None) -> None:
    """Write a new nonce; raises :class:`LeaseLost` if the row is no longer ours.

    A changed lease ``period`` is written here, with the new nonce, and never to an owned row
    by anyone else: an observer restarts its wait when the nonce changes, so it waits the new
    period from a moment after which the owner relies on that period too.
    """
    nonce = _new_nonce()
    started = lease.clock.monotonic()
    period = lease.period if period is None else float(period)
    updated = Partition.objects.filter(pk=lease.partition_id, owner_id=node_id, epoch=lease.epoch).update(
        lease_nonce=nonce, lease_renewed_at=lease.clock.wall(), lease_period=int(period)
    )
    if updated != 1:
        raise _lost_error(lease)
    _renewed(lease, period, nonce, started)


def _renewed(lease: Lease, period: float, nonce: str, started: float) -> None:
    lease.period = period
    lease.nonce = nonce
    lease.renewed_at = started
    lease.valid_until = started + lease.period * LEASE_SAFETY


#: Leases renewed by one statement at most: 1,004 parameters (two a lease, four besides), past
#: the 999 of SQLite before 3.32, but ``RETURNING`` needs 3.35 anyway.
RENEW_BATCH = 500


def renew_many(
    due: list[tuple[Lease, float | None]], node_id: str, lost: dict[int, LeaseLost] | None = None
) -> dict[int, LeaseLost]:
    """Renew each ``(lease, new period or None)`` as :func:`renew` does; the leases found lost,
    by partition id, in ``lost`` (given, or a new dict) as they are found: a database error
    partway through raises with the ones found before it still there, for the caller to drop.
    A lost lease is no longer valid (``valid_until`` 0) from the moment it is found.

    One statement renews up to :data:`RENEW_BATCH` leases of one clock and period, with one new
    nonce for all of them: an observer keys what it saw by partition, so what matters is that
    each row's nonce changes at each renewal. A node of a thousand partitions renews about 300
    a second (every ``period / 3``), and one UPDATE each would cost the node most of its time
    building statements (``bench/housekeeping.py``).

    On PostgreSQL the statement takes the rows' locks in id order and skips a row another
    transaction holds (a queue's delete or a purge, which hold theirs while the store works):
    the others are not held up behind it. The rows a statement did not renew are read at once,
    without waiting for a lock: one no longer ours under the lease's epoch is lost there and
    then; one still ours was locked by that other transaction, and goes through :func:`renew`
    (which waits for the lock as before) once every statement has run, so that no other group
    waits behind it.
    """
    if lost is None:
        lost = {}
    groups: dict[tuple[Clock, float], list[Lease]] = {}
    for lease, period in due:
        groups.setdefault((lease.clock, lease.period if period is None else float(period)), []).append(lease)
    locked: list[tuple[Lease, float]] = []
    for (clock, period), group in groups.items():
        for i in range(0, len(group), RENEW_BATCH):
            chunk = group[i : i + RENEW_BATCH]
            started = clock.monotonic()
            nonce = _new_nonce()
            renewed = _renew_rows(chunk, node_id, nonce, clock.wall(), int(period))
            missed = []
            for lease in chunk:
                if lease.partition_id in renewed:
                    _renewed(lease, period, nonce, started)
                else:
                    missed.append(lease)
            if missed:
                ours = _still_ours(missed, node_id)
                for lease in missed:
                    if lease.partition_id in ours:
                        locked.append((lease, period))
                    else:
                        _lost(lease, lost, _lost_error(lease))
    for lease, period in locked:
        try:
            renew(lease, node_id, period)
        except LeaseLost as exc:
            _lost(lease, lost, exc)
    return lost


def _lost_error(lease: Lease) -> LeaseLost:
    return LeaseLost(f"{lease.queue}/{lease.index}: lease epoch {lease.epoch} lost")


def _lost(lease: Lease, lost: dict[int, LeaseLost], exc: LeaseLost) -> None:
    lease.valid_until = 0.0
    lost[lease.partition_id] = exc


def _still_ours(chunk: list[Lease], node_id: str) -> set[int]:
    """The ids of ``chunk``'s rows that are ours under the lease's epoch, as committed (a plain
    read: it waits for no lock)."""
    epochs = {lease.partition_id: lease.epoch for lease in chunk}
    rows = Partition.objects.filter(pk__in=epochs, owner_id=node_id).values_list("pk", "epoch")
    return {pk for pk, epoch in rows if epochs[pk] == epoch}


def _renew_rows(chunk: list[Lease], node_id: str, nonce: str, wall: datetime, period: int) -> set[int]:
    """One UPDATE of the rows of ``chunk`` still ours under the lease's epoch (on PostgreSQL, of
    those no other transaction holds); the ids it renewed."""
    if connection.vendor not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"renewing leases in one statement on {connection.vendor}")
    meta, qn = Partition._meta, connection.ops.quote_name
    col: dict[str, models.Field[Any, Any]] = {}
    for name in ("owner", "epoch", "lease_nonce", "lease_renewed_at", "lease_period"):
        f = meta.get_field(name)
        assert isinstance(f, models.Field)
        col[name] = f
    c = {name: qn(str(f.column)) for name, f in col.items()}
    table, pk = qn(meta.db_table), qn(str(meta.pk.column))
    pairs = ", ".join(["(%s, %s)"] * len(chunk))
    mine = f"{c['owner']} = %s AND ({pk}, {c['epoch']}) IN (VALUES {pairs})"
    if connection.vendor == "postgresql":
        mine = f"{pk} IN (SELECT {pk} FROM {table} WHERE {mine} ORDER BY {pk} FOR UPDATE SKIP LOCKED)"
    sql = (
        f"UPDATE {table} SET {c['lease_nonce']} = %s, {c['lease_renewed_at']} = %s, "
        f"{c['lease_period']} = %s WHERE {mine} RETURNING {pk}"
    )
    renewed_at = col["lease_renewed_at"].get_db_prep_save(wall, connection)
    params = [nonce, renewed_at, period, node_id, *(v for lease in chunk for v in (lease.partition_id, lease.epoch))]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] for row in cursor.fetchall()}


def move_epoch(lease: Lease, node_id: str, epoch: int) -> None:
    """Move our row on to ``epoch`` (past a fence ahead of it, see
    ``PartitionManager.open_head``) by compare-and-set on the epoch we hold; raises
    :class:`LeaseLost` if the row is no longer ours. The nonce stays: the lease is not renewed."""
    if epoch <= lease.epoch:
        raise ValueError(f"epoch {epoch} does not move on from {lease.epoch}")
    updated = Partition.objects.filter(pk=lease.partition_id, owner_id=node_id, epoch=lease.epoch).update(epoch=epoch)
    if updated != 1:
        raise LeaseLost(f"{lease.queue}/{lease.index}: epoch {lease.epoch} lost before moving to {epoch}")
    lease.epoch = epoch


_SET_HEAD: str | None = None


def _set_head_sql() -> str:
    meta = Partition._meta
    col = {}
    for name in ("head_block", "owner", "epoch"):
        field = meta.get_field(name)
        assert isinstance(field, models.Field)
        col[name] = field.column
    return (
        f"UPDATE {meta.db_table} SET {col['head_block']} = %s "
        f"WHERE {meta.pk.column} = %s AND {col['owner']} = %s AND {col['epoch']} = %s"
    )


def set_head(lease: Lease, node_id: str, head_block: str) -> None:
    """Point the partition at its newest block, only while we still own epoch ``lease.epoch``.

    The statement of ``Partition.objects.filter(pk=, owner_id=, epoch=).update(head_block=)``,
    written out: it runs on the enqueue path for every new block, and building it through the
    ORM costs more than running it."""
    global _SET_HEAD
    if _SET_HEAD is None:
        _SET_HEAD = _set_head_sql()
    with connection.cursor() as cursor:
        cursor.execute(_SET_HEAD, [head_block, lease.partition_id, node_id, lease.epoch])
        updated = cursor.rowcount
    if updated != 1:
        raise LeaseLost(f"{lease.queue}/{lease.index}: epoch {lease.epoch} fenced at head update")
    lease.head_block = head_block


def read_head(lease: Lease) -> str | None:
    """The partition's head pointer as the row holds it now."""
    head = Partition.objects.filter(pk=lease.partition_id).values_list("head_block", flat=True).first()
    return head or None


def release(lease: Lease, node_id: str) -> bool:
    """Give the partition up (graceful stop); the next claimant need not wait."""
    with transaction.atomic():
        updated = Partition.objects.filter(pk=lease.partition_id, owner_id=node_id, epoch=lease.epoch).update(
            owner_id=None, lease_nonce=_new_nonce()
        )
    lease.valid_until = 0.0
    return updated == 1
