"""On PostgreSQL, a lease whose row another transaction holds (a queue's delete, a purge: they
lock the rows while the store works) does not hold up the renewal of the others: the batched
statement skips the locked row, and only that lease waits for the lock, as one renewal did."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from django.db import connection, connections, transaction

from queues import leases
from queues.models import Node, Partition, Queue

WALL = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


@pytest.mark.django_db(transaction=True)
def test_a_locked_row_waits_alone():
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL (make test)")
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
    held, release = threading.Event(), threading.Event()

    def hold_row() -> None:  # as delete_queue / purge_partition hold a row while the store works
        try:
            with transaction.atomic():
                Partition.objects.select_for_update().filter(pk=owned[1].partition_id).first()
                held.set()
                release.wait(30)
        finally:
            connections.close_all()

    result: dict = {}

    def renew() -> None:
        try:
            result["lost"] = leases.renew_many([(x, None) for x in owned], "node-a")
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_row)
    holder.start()
    assert held.wait(10)
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
