"""Lease renewals in one statement (``queues.cluster.leases.renew_many``, what a node's lease thread
runs): every due lease renewed, one new nonce, a lost lease told apart from the others, a new
period written with the renewal. Here on SQLite (``make test-unit``); the full suite runs it on
PostgreSQL, where ``tests/integration/test_held_partition_rows.py`` adds a row another
transaction holds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from queues.cluster import leases
from queues.models import Node, Partition, Queue

WALL = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


@pytest.fixture
def owned(db):
    """Five partitions of one queue, each claimed by node-a: their rows and leases."""
    q = Queue.objects.create(name="renewals", partitions=5, lease_period=10)
    for i in range(5):
        Partition.objects.create(queue=q, index=i, lease_period=10)
    for nid in ("node-a", "node-b"):
        Node.objects.create(id=nid, address=nid, started_at=WALL, heartbeat_at=WALL)
    got = []
    for p in Partition.objects.select_related("queue").filter(queue=q).order_by("index"):
        lease = leases.try_claim(p, "node-a", {})
        assert lease is not None
        got.append(lease)
    return got


def _nonces(lease_list):
    rows = dict(Partition.objects.filter(pk__in=[x.partition_id for x in lease_list]).values_list("pk", "lease_nonce"))
    return [rows[x.partition_id] for x in lease_list]


def test_one_statement_renews_every_due_lease(owned):
    before = _nonces(owned)
    was = [(x.renewed_at, x.valid_until) for x in owned]
    with CaptureQueriesContext(connection) as queries:
        lost = leases.renew_many([(x, None) for x in owned], "node-a")
    assert lost == {}
    assert len(queries) == 1, [q["sql"][:120] for q in queries]
    after = _nonces(owned)
    assert len(set(after)) == 1 and not set(after) & set(before), "one new nonce for the rows it renewed"
    for x, (renewed_at, valid_until) in zip(owned, was):
        assert x.nonce == after[0]
        assert x.renewed_at >= renewed_at and x.valid_until > valid_until
        assert x.valid_until == pytest.approx(x.renewed_at + 10 * leases.LEASE_SAFETY)


@pytest.mark.parametrize("moved", [{"epoch": 99}, {"owner_id": "node-b"}, {"owner_id": None}], ids=str)
def test_a_lease_whose_row_moved_on_is_lost_and_the_others_renew(owned, moved):
    taken = owned[2]
    Partition.objects.filter(pk=taken.partition_id).update(**moved)  # another owner, or freed
    before = _nonces(owned)
    valid_until = taken.valid_until
    lost = leases.renew_many([(x, None) for x in owned], "node-a")
    assert list(lost) == [taken.partition_id]
    assert isinstance(lost[taken.partition_id], leases.LeaseLost)
    assert f"renewals/2: lease epoch {taken.epoch} lost" in str(lost[taken.partition_id])
    after = _nonces(owned)
    assert after[2] == before[2], "the lost row is left as it was"
    assert valid_until > 0 and taken.valid_until == 0.0 and not taken.valid(), "the lost lease is no longer valid"
    assert all(a != b for i, (a, b) in enumerate(zip(after, before)) if i != 2)


def test_a_new_period_is_written_with_the_renewal(owned):
    due = [(owned[0], 30.0), (owned[1], 5.0), (owned[2], None), (owned[3], 30.0)]
    assert leases.renew_many(due, "node-a") == {}
    periods = dict(Partition.objects.values_list("pk", "lease_period"))
    assert [periods[x.partition_id] for x, _ in due] == [30, 5, 10, 30]
    assert [x.period for x, _ in due] == [30.0, 5.0, 10.0, 30.0]
    assert owned[1].valid_until == pytest.approx(owned[1].renewed_at + 5 * leases.LEASE_SAFETY)
    assert periods[owned[4].partition_id] == 10, "a lease not due is not touched"


def test_more_leases_than_one_statement_takes(owned, monkeypatch):
    monkeypatch.setattr(leases, "RENEW_BATCH", 2)
    with CaptureQueriesContext(connection) as queries:
        assert leases.renew_many([(x, None) for x in owned], "node-a") == {}
    assert len(queries) == 3  # 2 + 2 + 1
    assert len(set(_nonces(owned))) == 3


class StepClock:
    """A clock that moves on at every reading: what a renewal reads, and when, shows."""

    def __init__(self, start: float) -> None:
        self.now = start
        self.readings: list[float] = []

    def monotonic(self) -> float:
        self.now += 5.0
        self.readings.append(self.now)
        return self.now


def test_validity_runs_from_a_reading_taken_before_the_statement(owned, monkeypatch):
    """A renewal counts its period from before it asked the database, never after: the
    statement's own time (a slow commit) must not be credited to the lease."""
    steps = StepClock(1000.0)
    clock = leases.Clock(monotonic=steps.monotonic, wall=lambda: WALL)
    for x in owned:
        x.clock = clock
    statement = leases._renew_rows

    def slow(*args, **kwargs):
        renewed = statement(*args, **kwargs)
        steps.monotonic()  # the clock moves on while the statement runs
        return renewed

    monkeypatch.setattr(leases, "_renew_rows", slow)
    assert leases.renew_many([(x, None) for x in owned], "node-a") == {}
    before_statement = steps.readings[0]
    for x in owned:
        assert x.renewed_at == before_statement
        assert x.valid_until == before_statement + 10 * leases.LEASE_SAFETY


def test_leases_of_different_clocks_are_renewed_each_by_its_own(owned):
    first = StepClock(100.0)
    second = StepClock(5000.0)
    owned[0].clock = leases.Clock(monotonic=first.monotonic, wall=lambda: WALL)
    owned[1].clock = leases.Clock(monotonic=second.monotonic, wall=lambda: WALL)
    assert leases.renew_many([(owned[0], None), (owned[1], None)], "node-a") == {}
    assert owned[0].renewed_at == first.readings[0] and 100 < owned[0].renewed_at < 5000
    assert owned[1].renewed_at == second.readings[0] and owned[1].renewed_at > 5000


def test_a_row_the_statement_passed_over_is_renewed_one_by_one_not_lost(owned, monkeypatch):
    """On PostgreSQL a row another transaction holds is skipped by the statement; it is then
    renewed on its own (waiting for the lock), not taken for lost."""
    statement = leases._renew_rows
    skipped = {owned[1].partition_id, owned[3].partition_id}

    def skipping(chunk, *args):
        return statement([x for x in chunk if x.partition_id not in skipped], *args)

    monkeypatch.setattr(leases, "_renew_rows", skipping)
    before = _nonces(owned)
    with CaptureQueriesContext(connection) as queries:
        assert leases.renew_many([(x, None) for x in owned], "node-a") == {}
    assert len(queries) == 4, "the statement, a read of the two it passed over, an UPDATE each"
    after = _nonces(owned)
    assert all(a != b for a, b in zip(after, before))
    assert all(x.valid() for x in owned)


def _fail_the_second_statement(monkeypatch) -> list[int]:
    """The second renewal statement raises as a lost connection would; the statements run."""
    statement = leases._renew_rows
    calls: list[int] = []

    def failing_second(*args):
        calls.append(1)
        if len(calls) == 2:
            raise OperationalError("connection lost")
        return statement(*args)

    monkeypatch.setattr(leases, "_renew_rows", failing_second)
    return calls


def test_a_database_error_keeps_what_was_found_lost_before_it(owned, monkeypatch):
    """A statement that fails (an outage, a timeout) raises, and the leases found lost before
    it are still reported, and already invalid: the node must not go on serving them."""
    monkeypatch.setattr(leases, "RENEW_BATCH", 2)
    Partition.objects.filter(pk=owned[0].partition_id).update(epoch=owned[0].epoch + 1)  # taken over
    calls = _fail_the_second_statement(monkeypatch)
    lost: dict[int, leases.LeaseLost] = {}
    with pytest.raises(OperationalError):
        leases.renew_many([(x, None) for x in owned], "node-a", lost)
    assert calls == [1, 1]
    assert list(lost) == [owned[0].partition_id]
    assert not owned[0].valid() and owned[1].valid()


def test_the_node_drops_the_partition_whose_lease_it_lost_and_keeps_the_others(runtime, make_queue, purge_kv):
    from prometheus_client import REGISTRY

    def lost_count() -> float:
        return REGISTRY.get_sample_value("mq_leases_lost_total", {"queue": q, "partition": "1"}) or 0.0

    q = make_queue(partitions=3)
    runtime.tick()
    managers = [runtime.manager(q, i) for i in range(3)]
    for m in managers:
        m.lease.renewed_at -= m.lease.period  # every renewal due
    Partition.objects.filter(queue__name=q, index=1).update(epoch=managers[1].lease.epoch + 1)  # taken over
    before = dict(Partition.objects.filter(queue__name=q).values_list("index", "lease_nonce"))
    lost = lost_count()
    runtime.renew()
    after = dict(Partition.objects.filter(queue__name=q).values_list("index", "lease_nonce"))
    assert managers[1].closed and (q, 1) not in runtime.managers
    assert lost_count() == lost + 1
    for i in (0, 2):
        assert runtime.manager(q, i) is managers[i] and not managers[i].closed
        assert after[i] != before[i] and managers[i].lease.nonce == after[i]
        assert not managers[i].lease.renewal_due()
    assert after[1] == before[1]


def test_a_database_error_midway_still_drops_the_partitions_found_lost(runtime, make_queue, purge_kv, monkeypatch):
    q = make_queue(partitions=3)
    runtime.tick()
    for i in range(3):
        runtime.manager(q, i).lease.renewed_at -= runtime.manager(q, i).lease.period  # every renewal due
    order = [m for m in runtime.managers.values() if m.queue == q]  # the order the renewals go in
    first = order[0]
    Partition.objects.filter(queue__name=q, index=first.index).update(epoch=first.lease.epoch + 1)  # taken over
    monkeypatch.setattr(leases, "RENEW_BATCH", 1)
    calls = _fail_the_second_statement(monkeypatch)
    with pytest.raises(OperationalError):
        runtime.renew()
    assert calls == [1, 1]
    assert first.closed and (q, first.index) not in runtime.managers
    assert all(not m.closed and runtime.manager(q, m.index) is m for m in order[1:])
