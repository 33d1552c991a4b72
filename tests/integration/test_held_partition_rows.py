"""On PostgreSQL, a partition row another transaction holds (a queue's delete, a purge: they lock
the rows while the store works) holds up no other row's lease renewal or figures: the batched
statements skip it. The held row's lease then waits for the lock alone, as one renewal did; its
figures wait for the next pass."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from django.db import connection, connections, transaction

from queues.cluster import leases
from queues.models import Node, Partition, Queue

WALL = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def _holding(partition_id: int):
    """A thread that holds the row's lock, as delete_queue and purge_partition do, until the
    event it returns with is set."""
    held, release = threading.Event(), threading.Event()

    def hold_row() -> None:
        try:
            with transaction.atomic():
                Partition.objects.select_for_update().filter(pk=partition_id).first()
                held.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_row)
    holder.start()
    assert held.wait(10)
    return holder, release


@pytest.fixture
def postgres():
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL (make test)")


@pytest.mark.django_db(transaction=True)
def test_a_held_row_lease_waits_alone(postgres):
    q = Queue.objects.create(name="renewals-locked", partitions=3, lease_period=10)
    for i in range(3):
        Partition.objects.create(queue=q, index=i, lease_period=10)
    Node.objects.create(id="node-a", address="node-a", started_at=WALL, heartbeat_at=WALL)
    owned = [
        leases.try_claim(p, "node-a", {})
        for p in Partition.objects.select_related("queue").filter(queue=q).order_by("index")
    ]
    assert all(owned)
    before = dict(Partition.objects.values_list("pk", "lease_nonce"))
    result: dict = {}

    def renew() -> None:
        try:
            result["lost"] = leases.renew_many([(x, None) for x in owned], "node-a")
        finally:
            connections.close_all()

    holder, release = _holding(owned[1].partition_id)
    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            now = dict(Partition.objects.values_list("pk", "lease_nonce"))
            if all(now[x.partition_id] != before[x.partition_id] for x in (owned[0], owned[2])):
                break
            time.sleep(0.02)
        else:
            pytest.fail("the rows nobody held were not renewed while another one was held")
        assert now[owned[1].partition_id] == before[owned[1].partition_id]
        assert renewer.is_alive(), "the held row's lease waits for the lock"
    finally:
        release.set()
        holder.join(10)
        renewer.join(10)
    assert result["lost"] == {}
    after = dict(Partition.objects.values_list("pk", "lease_nonce"))
    assert after[owned[1].partition_id] != before[owned[1].partition_id], "renewed once the lock was let go"
    assert owned[1].nonce == after[owned[1].partition_id] != owned[0].nonce


@pytest.mark.django_db(transaction=True)
def test_a_held_row_figures_wait_for_the_next_pass(postgres, runtime, make_queue, purge_kv):
    q = make_queue(partitions=3)
    runtime.tick()
    rows = {p.index: p.pk for p in Partition.objects.filter(queue__name=q)}
    Partition.objects.filter(queue__name=q).update(stats_at=None)
    holder, release = _holding(rows[1])
    try:
        runtime._published.clear()
        started = time.monotonic()
        runtime._publish_stats()
        assert time.monotonic() - started < 2, "the pass did not wait for the held row"
        written = dict(Partition.objects.filter(queue__name=q).values_list("index", "stats_at"))
        assert written[0] is not None and written[2] is not None and written[1] is None
        assert (q, 1) not in runtime._published
    finally:
        release.set()
        holder.join(10)
    runtime._publish_stats()
    assert Partition.objects.get(pk=rows[1]).stats_at is not None and (q, 1) in runtime._published
