"""Invariant 3 under clock skew: no partition ever has two owners, checked from an ownership log.

The nodes are simulated in one thread over the real database (the ``Partition`` rows and the
compare-and-set in ``queues.cluster.leases``), under one global simulated time ``T``. Each node has its
own ``Clock``: ``monotonic() = T * rate + offset`` with offsets of minutes (far more than a
lease period) and rates within 1 % of each other; ``wall()`` is skewed by the same offset.

The ownership log records, in global time, every interval during which a node *believed* it
owned a partition: from its successful claim (or a renewal that made an expired lease valid
again) until the first step at which ``lease.valid()`` returns False on its own clock. Ends are
taken at step granularity, i.e. never earlier than the true end, so the check is conservative.
A crashed node is kept in the log as a zombie until its lease runs out (others cannot tell it
from a paused one). The test then asserts that no two intervals of different nodes on the same
partition overlap, and that a crashed owner's partitions are taken over in bounded time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from queues.cluster import leases
from queues.models import Node, Partition, Queue

PERIOD = 10  # seconds, the partitions' lease period
STEP = 0.5  # seconds of global time per simulation step
STEPS = 1000  # 500 s = 50 lease periods per seed
SEEDS = [1, 2, 3, 4]
OFFSETS = [-300.0, 0.0, 420.0, 1234.5, -3600.0]  # minutes apart: far more than a period
PROGRESS_SLACK = 2 * PERIOD + 4 * STEP
WALL_BASE = datetime(2024, 5, 1, tzinfo=UTC)  # a clock reading of 0 s


# --- the ownership log and its checker -----------------------------------------------------------
@dataclass
class Interval:
    partition: int
    node: str
    epoch: int
    start: float
    end: float = float("inf")  # still open


def overlaps(intervals: list[Interval]) -> list[tuple[Interval, Interval]]:
    """Pairs of intervals of *different* nodes on the same partition that share some time.

    Intervals are half-open ``[start, end)``: one that ends at T and one that starts at T do
    not overlap.
    """
    found = []
    by_partition: dict[int, list[Interval]] = {}
    for iv in intervals:
        by_partition.setdefault(iv.partition, []).append(iv)
    for ivs in by_partition.values():
        ivs = sorted(ivs, key=lambda i: (i.start, i.end))
        for i, a in enumerate(ivs):
            for b in ivs[i + 1 :]:
                if b.start >= a.end:
                    break
                if a.node != b.node and b.start < a.end and a.start < b.end:
                    found.append((a, b))
    return found


# --- the simulated world -----------------------------------------------------------------------
class World:
    def __init__(self) -> None:
        self.T = 0.0

    def clock(self, rate: float, offset: float) -> leases.Clock:
        return leases.Clock(
            monotonic=lambda: self.T * rate + offset,
            wall=lambda: WALL_BASE + timedelta(seconds=self.T * rate + offset),
        )


@dataclass
class SimNode:
    node_id: str
    machine: int
    clock: leases.Clock
    started_at: float = 0.0
    crashed_at: float | None = None
    alive: bool = True
    stalled_until: float = -1.0
    observations: dict = field(default_factory=dict)
    leases: dict = field(default_factory=dict)  # partition id -> Lease
    open: dict = field(default_factory=dict)  # partition id -> open Interval
    #: global-time spans during which the node was stalled
    unavailable: list = field(default_factory=list)

    def available_throughout(self, t0: float, t1: float) -> bool:
        """Could this node act during the whole of [t0, t1]?"""
        return (
            self.started_at <= t0
            and (self.crashed_at is None or self.crashed_at > t1)
            and not any(a < t1 and t0 < b for a, b in self.unavailable)
        )


@dataclass
class SimResult:
    intervals: list[Interval]
    crash_checks: int  # crashes of an owner for which progress was checked
    stall_losses: int  # owners that woke from a stall to find their lease taken
    claims: int
    late_takeovers: list


def simulate(seed: int, steps: int = STEPS, *, check_progress: bool = True, processes: int = 1) -> SimResult:
    """``processes``: members per machine (``runnode --processes``), sharing its clock; a crash
    or a stall takes the whole machine's (the node's process group), a restart starts them all."""
    rng = random.Random(seed)
    world = World()
    queue = Queue.objects.create(name=f"skew-{seed}-{rng.getrandbits(32):08x}", partitions=3, lease_period=PERIOD)
    Partition.objects.bulk_create([Partition(queue=queue, index=i, lease_period=PERIOD) for i in range(3)])
    pids = list(Partition.objects.filter(queue=queue).order_by("index").values_list("pk", flat=True))

    k = rng.randint(3, 5)
    machines = [(rng.uniform(0.995, 1.005), OFFSETS[i]) for i in range(k)]
    serial = 0
    nodes: list[SimNode] = []
    log: list[Interval] = []
    crashes: list[tuple[float, SimNode, list[int]]] = []
    stall_losses = 0
    claims = 0

    def start_node(machine: int) -> None:
        nonlocal serial
        for k in range(processes):
            serial += 1
            node_id = f"s{seed}-m{machine}-{serial}"
            wall = world.clock(*machines[machine]).wall()
            Node.objects.create(id=node_id, address=f"10.0.0.{machine}:{8000 + k}", started_at=wall, heartbeat_at=wall)
            nodes.append(SimNode(node_id, machine, world.clock(*machines[machine]), started_at=world.T))

    def open_interval(n: SimNode, pid: int, lease: leases.Lease) -> None:
        if pid not in n.open:
            iv = Interval(pid, n.node_id, lease.epoch, world.T)
            n.open[pid] = iv
            log.append(iv)

    def close_interval(n: SimNode, pid: int) -> None:
        iv = n.open.pop(pid, None)
        if iv is not None:
            iv.end = world.T

    for m in range(k):
        start_node(m)

    for _ in range(steps):
        world.T += STEP
        # 1. Beliefs: a lease that is no longer valid on its node's own clock ends its interval.
        for n in nodes:
            for pid, lease in list(n.leases.items()):
                if not lease.valid():
                    close_interval(n, pid)
                    if not n.alive:
                        del n.leases[pid]

        # 2. Faults: crashes (for ever), restarts (a new node id on the same machine), stalls.
        live = [n for n in nodes if n.alive]
        if len(live) > 1 and rng.random() < 0.006:
            owners = [n for n in live if n.leases]
            chosen = rng.choice(owners if owners and rng.random() < 0.7 else live)  # mostly an owner
            for victim in [n for n in live if n.machine == chosen.machine]:  # its whole group
                victim.alive = False
                victim.crashed_at = world.T
                owned = list(
                    Partition.objects.filter(pk__in=pids, owner_id=victim.node_id).values_list("pk", flat=True)
                )
                crashes.append((world.T, victim, owned))
        dead_machines = sorted({n.machine for n in nodes} - {n.machine for n in nodes if n.alive})
        for m in dead_machines:
            if rng.random() < 0.01:
                start_node(m)
        for n in live:
            if n.alive and n.stalled_until <= world.T and rng.random() < 0.004:
                # A GC pause / SIGSTOP of more than a lease period: no renewals meanwhile (a
                # SIGSTOP of the node stops its every process; a GC pause one: either is a stall).
                until = world.T + rng.uniform(1.1 * PERIOD, 3 * PERIOD)
                group = [n] if rng.random() < 0.5 else [o for o in live if o.machine == n.machine and o.alive]
                for o in group:
                    if o.stalled_until <= world.T:
                        o.stalled_until = until
                        o.unavailable.append((world.T, until))

        # 3. Each node, at random steps, does what a node does.
        order = [n for n in nodes if n.alive and n.stalled_until <= world.T]
        rng.shuffle(order)
        for n in order:
            if rng.random() > 0.7:
                continue
            rows = None
            due = []  # renewed together, as a node's lease thread renews (leases.renew_many)
            for pid in pids:
                lease = n.leases.get(pid)
                if lease is not None:
                    if rng.random() < 0.002:
                        leases.release(lease, n.node_id)
                        close_interval(n, pid)
                        del n.leases[pid]
                    elif lease.renewal_due():
                        due.append((pid, lease, lease.valid()))
                    continue
                if rows is None:  # a fresh read of the rows, as a node's claim pass does
                    rows = {p.pk: p for p in Partition.objects.filter(pk__in=pids).order_by()}
                    for p in rows.values():
                        p.queue = queue  # (the same row select_related would give; saves a join)
                got = leases.try_claim(rows[pid], n.node_id, n.observations, clock=n.clock)
                if got is not None:
                    assert got.valid()
                    claims += 1
                    n.leases[pid] = got
                    open_interval(n, pid, got)
            lost = leases.renew_many([(lease, None) for _, lease, _ in due], n.node_id) if due else {}
            for pid, lease, was_valid in due:
                if pid in lost:
                    close_interval(n, pid)
                    del n.leases[pid]
                    if not was_valid:
                        stall_losses += 1
                else:
                    assert lease.valid()
                    open_interval(n, pid, lease)

    for n in nodes:
        for iv in n.open.values():
            iv.end = world.T

    # Progress: after an owner crashes, another node owns each of its partitions within
    # 2 lease periods (plus a few steps), provided some other node could act all that time.
    crash_checks = 0
    late = []
    if check_progress:
        for t_crash, victim, owned in crashes:
            deadline = t_crash + PROGRESS_SLACK
            if deadline > world.T:
                continue
            helpers = [n for n in nodes if n is not victim and n.available_throughout(t_crash, deadline)]
            if not helpers:
                continue
            for pid in owned:
                crash_checks += 1
                # someone else's interval that starts, or is already running, by the deadline
                if not any(
                    iv.partition == pid and iv.node != victim.node_id and iv.start <= deadline and iv.end > t_crash
                    for iv in log
                ):
                    late.append((seed, pid, victim.node_id, t_crash))
    return SimResult(log, crash_checks, stall_losses, claims, late)


def _describe(pairs) -> str:
    return "; ".join(
        f"p{a.partition}: {a.node}[{a.start},{a.end}) vs {b.node}[{b.start},{b.end})" for a, b in pairs[:5]
    )


# --- 1. the randomized simulation -----------------------------------------------------------------
@pytest.mark.parametrize(
    "seed, processes", [*((s, 1) for s in SEEDS), *((s, 2) for s in SEEDS[:2])], ids=lambda v: str(v)
)
def test_skewed_clocks_never_make_two_owners(db, seed, processes):
    # (processes: members per machine, as runnode --processes runs them: one clock, and crashed
    # or stopped together)
    result = simulate(seed, processes=processes)
    pairs = overlaps(result.intervals)
    assert not pairs, f"two owners at once (seed {seed}): {_describe(pairs)}"
    assert not result.late_takeovers, f"no takeover within {PROGRESS_SLACK}s of a crash: {result.late_takeovers}"
    # The run exercised what it claims to: many ownership changes, crashed owners, stalled owners
    # that found their partition taken when they woke up.
    assert result.claims >= 10, result.claims
    assert result.crash_checks >= 1, "no crash of an owner was checked for progress"
    assert result.stall_losses >= 1, "no stalled owner lost its lease"
    # The log agrees with the database's epochs: each claim was a fresh epoch.
    epochs = [(iv.partition, iv.epoch, iv.node) for iv in result.intervals]
    by_pe: dict = {}
    for pid, epoch, node in epochs:
        assert by_pe.setdefault((pid, epoch), node) == node, f"epoch {epoch} of p{pid} held by two nodes"


# --- 2. the seed's example, to the second -----------------------------------------------------------
def _hms(h: int, m: int, s: int) -> float:
    return float(h * 3600 + m * 60 + s)


def test_seed_example_wait_a_full_period_on_own_clock(db):
    """B's clock says 10:30:33 when it finds the partition owned; the period is 10 s.

    The owner's clock is 7 minutes behind B's and nobody compares them: B may take the row at
    10:30:43 on its own clock (not 10:30:42), by compare-and-set on the nonce it saw; and if the
    owner renewed in between, B starts a fresh full period from when it saw the new nonce.
    """
    world = World()
    b_offset = _hms(10, 30, 33)  # B's clock reads 10:30:33 at T=0
    a_offset = b_offset - 420.0  # A's clock: 10:23:33 at T=0
    a_clock = world.clock(1.0, a_offset)
    b_clock = world.clock(1.0, b_offset)
    assert b_clock.wall().strftime("%H:%M:%S") == "10:30:33"
    assert a_clock.wall().strftime("%H:%M:%S") == "10:23:33"

    q = Queue.objects.create(name="skew-seed-example", partitions=2, lease_period=10)
    p_plain, p_renewed = (Partition.objects.create(queue=q, index=i, lease_period=10) for i in range(2))
    for nid in ("node-a", "node-b"):
        Node.objects.create(id=nid, address=nid, started_at=WALL_BASE, heartbeat_at=WALL_BASE)

    def fresh(p):
        return Partition.objects.select_related("queue").get(pk=p.pk)

    def at(h, m, s):  # move global time so that B's clock reads h:m:s
        world.T = _hms(h, m, s) - b_offset

    world.T = -1.0  # A claims both partitions a second before B looks
    a_plain = leases.try_claim(fresh(p_plain), "node-a", {}, clock=a_clock)
    a_renewed = leases.try_claim(fresh(p_renewed), "node-a", {}, clock=a_clock)
    assert a_plain is not None and a_renewed is not None

    seen: dict = {}
    at(10, 30, 33)
    assert leases.try_claim(fresh(p_plain), "node-b", seen, clock=b_clock) is None
    assert leases.try_claim(fresh(p_renewed), "node-b", seen, clock=b_clock) is None
    assert seen[p_plain.pk].seen_at == _hms(10, 30, 33)

    # The owner renews one partition at 10:30:38 (B's clock): a new nonce.
    at(10, 30, 38)
    leases.renew(a_renewed, "node-a")
    at(10, 30, 40)  # B reads the row again and sees the new nonce
    assert leases.try_claim(fresh(p_renewed), "node-b", seen, clock=b_clock) is None
    assert seen[p_renewed.pk].seen_at == _hms(10, 30, 40)

    at(10, 30, 42)
    assert leases.try_claim(fresh(p_plain), "node-b", seen, clock=b_clock) is None
    at(10, 30, 43)
    assert not a_plain.valid(), "the owner must have stopped acting before B may take over"
    b_plain = leases.try_claim(fresh(p_plain), "node-b", seen, clock=b_clock)
    assert b_plain is not None and b_plain.epoch == a_plain.epoch + 1
    assert fresh(p_plain).owner_id == "node-b"
    # ... but the renewed one is not B's at 10:30:43: the new nonce has stood only 3 s.
    assert leases.try_claim(fresh(p_renewed), "node-b", seen, clock=b_clock) is None
    at(10, 30, 49)
    assert leases.try_claim(fresh(p_renewed), "node-b", seen, clock=b_clock) is None
    at(10, 30, 50)
    assert not a_renewed.valid()
    b_renewed = leases.try_claim(fresh(p_renewed), "node-b", seen, clock=b_clock)
    assert b_renewed is not None
    # The old owner is fenced: its renewal now fails.
    with pytest.raises(leases.LeaseLost):
        leases.renew(a_renewed, "node-a")
    # The wall times written are each node's own (for people to read), seven minutes apart.
    row = fresh(p_renewed)
    assert row.lease_acquired_at == b_clock.wall()


# --- 3. negative controls: the check can fail -------------------------------------------------------
def test_checker_catches_overlap():
    a = Interval(1, "node-a", 1, 0.0, 8.0)
    b = Interval(1, "node-b", 2, 7.5, 20.0)
    assert overlaps([a, b]) == [(a, b)]
    assert overlaps([b, a]) == [(a, b)]
    # Touching (half-open) intervals, another partition, or the same node: no overlap.
    assert overlaps([Interval(1, "a", 1, 0.0, 8.0), Interval(1, "b", 2, 8.0, 9.0)]) == []
    assert overlaps([Interval(1, "a", 1, 0.0, 8.0), Interval(2, "b", 1, 1.0, 9.0)]) == []
    assert overlaps([Interval(1, "a", 1, 0.0, 8.0), Interval(1, "a", 2, 8.0, 9.0)]) == []
    # An open interval (a zombie still believing) overlaps anything after it.
    z = Interval(3, "z", 1, 0.0)
    assert overlaps([z, Interval(3, "y", 2, 500.0, 501.0)])


def test_simulation_catches_an_owner_that_trusts_its_lease_too_long(db, monkeypatch):
    """With the owner's margin above 1 (it acts longer than observers wait), stalls make two
    owners and the same simulation and log must say so."""
    monkeypatch.setattr(leases, "LEASE_SAFETY", 1.5)
    found = []
    for seed in SEEDS[:1]:
        found += overlaps(simulate(seed, steps=800, check_progress=False).intervals)
    assert found, "the simulation did not detect an owner that outlives its lease"


# --- shrinking the lease period under an owner ----------------------------------------------------
def test_shrinking_lease_period_under_an_owner(db):
    """The new period reaches an owned row only with the owner's next renewal (a new nonce), so
    an observer's wait restarts at a moment after which the owner relies on the new period."""
    world = World()
    a_clock, b_clock = world.clock(1.0, -300.0), world.clock(1.0, 420.0)
    q = Queue.objects.create(name="skew-shrink", partitions=1, lease_period=60)
    p = Partition.objects.create(queue=q, index=0, lease_period=60)
    for nid in ("node-a", "node-b"):
        Node.objects.create(id=nid, address=nid, started_at=WALL_BASE, heartbeat_at=WALL_BASE)
    a = leases.try_claim(Partition.objects.select_related("queue").get(pk=p.pk), "node-a", {}, clock=a_clock)
    assert a is not None  # valid for 48 s on A's clock

    def b_claims(seen):
        return leases.try_claim(Partition.objects.select_related("queue").get(pk=p.pk), "node-b", seen, clock=b_clock)

    # the operator lowers the period to 10 s: service.update_queue changes free rows only
    world.T = 1.0
    Partition.objects.filter(queue=q, owner__isnull=True).update(lease_period=10)
    seen: dict = {}
    world.T = 2.0
    assert b_claims(seen) is None
    world.T = 12.0
    assert b_claims(seen) is None, "the row still says 60 s: B must wait for it"
    # the owner applies the new period at its next renewal, with a new nonce
    world.T = 15.0
    leases.renew(a, "node-a", period=10)
    assert Partition.objects.get(pk=p.pk).lease_period == 10
    world.T = 16.0
    assert b_claims(seen) is None  # a new nonce: B's wait starts again
    world.T = 25.5
    assert b_claims(seen) is None and not a.valid(), "A relied on the new period from its renewal"
    world.T = 26.5
    b = b_claims(seen)
    assert b is not None and not a.valid()
