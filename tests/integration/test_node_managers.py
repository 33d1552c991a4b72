"""A node finds the partition managers of a queue by the queue (``NodeRuntime.local_managers``,
asked by every message call), not by walking every manager it holds."""

from __future__ import annotations

import pytest


def _served(runtime, queue: str) -> list[int]:
    return sorted(m.index for m in runtime.local_managers(queue))


def test_each_queue_has_its_own_managers_and_they_go_with_it(runtime, api, make_queue, purge_kv):
    a, b = make_queue(partitions=3), make_queue(partitions=2)
    runtime.tick()
    assert _served(runtime, a) == [0, 1, 2]
    assert _served(runtime, b) == [0, 1]
    assert _served(runtime, "no-such-queue") == []
    # a deleted queue's managers are gone; the other's stay
    assert api.delete(f"/api/v1/queues/{b}").status_code == 204
    assert _served(runtime, b) == []
    assert _served(runtime, a) == [0, 1, 2]
    # a closed manager is not served even before it is forgotten
    victim = runtime.manager(a, 1)
    with victim.lock:
        victim.closed = True
    assert _served(runtime, a) == [0, 2]
    # and a queue of the same name made again is served by new managers
    assert api.delete(f"/api/v1/queues/{a}").status_code == 204
    make_queue(name=a, partitions=1)
    runtime.tick()
    assert _served(runtime, a) == [0]
    assert runtime.local_managers(a)[0] is not victim


def test_a_partitions_row_is_written_when_its_figures_change_and_now_and_then_otherwise(
    runtime, api, make_queue, purge_kv, monkeypatch
):
    from queues.cluster import node
    from queues.models import Partition

    q = make_queue(partitions=1)
    runtime.tick()

    def row() -> Partition:
        return Partition.objects.get(queue__name=q, index=0)

    first = row().stats_at
    assert first is not None
    runtime.tick()
    assert row().stats_at == first  # nothing changed: the row is not written again
    assert api.post(f"/api/v1/queues/{q}/enqueue", {"body": "x"}, format="json").status_code == 201
    runtime.tick()
    after = row()
    assert after.stats_at > first and after.depth == 1 and after.enqueued_total == 1
    assert after.enqueue_rate > 0
    monkeypatch.setattr(node, "STATS_REFRESH", 0.0)  # an idle row is rewritten when due
    runtime.tick()
    assert row().stats_at > after.stats_at


def test_a_description_reads_every_column_of_the_row_and_its_subscriptions(db):
    # the housekeeping pass reads descriptions as values (catalog.load), all at once or
    # one by name: every column, subscriptions included
    from datetime import UTC, datetime

    from queues.cluster import catalog, leases
    from queues.engine.config import QueueConfig
    from queues.models import Partition, Queue, Subscription

    dlq = Queue.objects.create(name="desc-dlq", partitions=1)
    queue = Queue.objects.create(
        name="desc-queue", partitions=3, strict=True, delay=4, dead_letter_queue=dlq, max_receives=5, archive="acked"
    )
    plain = Queue.objects.create(name="desc-plain", partitions=2, max_receives=7)  # (no DLQ: no max_receives)
    topic = Queue.objects.create(name="desc-topic", partitions=2, kind=Queue.Kind.TOPIC)
    Subscription.objects.create(topic=topic, name="b-slow", visibility_timeout=90)
    Subscription.objects.create(
        topic=topic, name="a-audit", starts_at=datetime(2026, 1, 2, tzinfo=UTC), dead_letter_queue=dlq, max_receives=3
    )
    read = catalog.load()
    for q in (dlq, queue, plain, topic):
        assert read[q.name] == catalog.load(q.name)[q.name]
    q = queue
    q.refresh_from_db()
    assert read["desc-queue"] == QueueConfig(
        q.pk, "desc-queue", 3, q.block_size, q.lease_period, q.visibility_timeout, q.max_message_size, q.retention,
        True, 4, "desc-dlq", 5, q.dedup_window, q.preprocess_estimate, q.process_estimate, "acked", "queue", None,
        q.created_by_id,
    )  # fmt: skip
    assert read["desc-queue"].dead_letter_queue == "desc-dlq" and read["desc-queue"].max_receives == 5
    assert read["desc-plain"].max_receives is None
    assert [(s.name, s.starts_at, s.max_receives, s.dead_letter_queue) for s in read["desc-topic"].subscriptions] == [
        ("a-audit", datetime(2026, 1, 2, tzinfo=UTC).timestamp(), 3, "desc-dlq"),
        ("b-slow", None, None, None),
    ]
    assert catalog.load("no-such-queue") == {}

    # and a claim pass reads a partition row as the row holds it
    p = Partition.objects.create(queue=queue, index=1, owner_id=None, epoch=4, lease_period=12)
    [row] = leases.claim_rows(Partition.objects.filter(pk=p.pk))
    assert row == leases.PartitionRow.of(p)
    assert (row.queue_name, row.queue_id, row.index, row.epoch, row.lease_period) == ("desc-queue", queue.pk, 1, 4, 12)


def test_a_partition_whose_open_failed_is_handed_back_and_taken_again_at_the_next_pass(
    runtime, make_queue, monkeypatch, caplog
):
    # given a queue this node serves
    from queues.engine.partition import PartitionManager
    from queues.kv import KVError
    from queues.models import Partition

    name = make_queue(partitions=1)
    runtime.tick()
    first = runtime.manager(name, 0)
    epoch = first.lease.epoch
    # when its manager closes after a failure and the reopen fails too (the store refuses a read)
    real = PartitionManager.open_head
    failures = []

    def open_head(self):
        if not failures:
            failures.append(self.index)
            raise KVError("redis: connection refused")
        return real(self)

    monkeypatch.setattr(PartitionManager, "open_head", open_head)
    with first.lock:
        first.closed = True
    runtime.tick()  # the renewal drops the closed manager and hands its lease back; the claim's open fails
    # then the row names no owner (not this node, whose claim nobody would take before a lease period)
    assert failures == [0]
    assert runtime.local_managers(name) == []
    row = Partition.objects.get(queue__name=name, index=0)
    assert row.owner_id is None and row.epoch == epoch + 1
    assert f"opening {name}/0 failed: KVError" in caplog.text
    # and the next pass takes it again and serves it, under a new epoch
    runtime.tick()
    again = runtime.manager(name, 0)
    assert again is not first and not again.closed and again.lease.epoch == epoch + 2


def test_a_partition_that_cannot_open_here_is_left_to_other_nodes_for_a_lease_period(runtime, make_queue, monkeypatch):
    # given a queue whose partition's tree this node cannot read (a head block gone)
    from queues.engine.partition import PartitionManager
    from queues.engine.tree import CorruptTree
    from queues.models import Partition

    real = PartitionManager.open_head

    def open_head(self):
        raise CorruptTree("head block 00000001-0000000000000000 is missing")

    monkeypatch.setattr(PartitionManager, "open_head", open_head)
    name = make_queue(partitions=1)
    runtime.tick()
    # then the row is handed back (another node may take it at once), and this node holds off
    assert runtime.local_managers(name) == []
    assert Partition.objects.get(queue__name=name, index=0).owner_id is None
    runtime.tick()
    assert Partition.objects.get(queue__name=name, index=0).owner_id is None  # not again here yet
    # and once the lease period is over (and the tree readable again) it serves it
    monkeypatch.setattr(PartitionManager, "open_head", real)
    runtime.hold_off[(name, 0)] = 0.0
    runtime.tick()
    assert runtime.manager(name, 0).lease.epoch > 0


def test_an_outage_met_opening_a_partition_ends_the_claims_of_that_pass(runtime, make_queue, monkeypatch):
    # given a store that refuses every read: each open would wait on it
    from queues.engine.partition import PartitionManager
    from queues.kv import KVError
    from queues.models import Partition

    real = PartitionManager.open_head
    tried = []

    def open_head(self):
        tried.append(self.index)
        raise KVError("redis: connection refused")

    monkeypatch.setattr(PartitionManager, "open_head", open_head)
    name = make_queue(partitions=3)  # (its creation claims at once)
    runtime.tick()
    # then each claim pass tried one partition, handed it back, and stopped
    assert len(tried) == 2
    assert list(Partition.objects.filter(queue__name=name).values_list("owner_id", flat=True)) == [None] * 3
    # and once the store answers, the next pass takes them all
    monkeypatch.setattr(PartitionManager, "open_head", real)
    runtime.tick()
    assert sorted(m.index for m in runtime.local_managers(name)) == [0, 1, 2]


@pytest.mark.django_db(transaction=True)  # (the passes' threads read what the test wrote)
def test_two_claim_passes_at_once_take_one_share_between_them(runtime, make_queue, monkeypatch):
    # given a second live node, so this one's share of a 4-partition queue is 2
    import threading
    import time

    from django.db import connection
    from django.utils import timezone

    from queues.cluster import leases
    from queues.models import Node

    if connection.vendor == "sqlite":
        pytest.skip("two threads writing at once: PostgreSQL (make test)")
    Node.objects.create(id="other-node", address="127.0.0.1:1", started_at=timezone.now(), heartbeat_at=timezone.now())
    monkeypatch.setattr(runtime, "queue_created", lambda q: None)  # (no claim at creation: the passes below do it)
    name = make_queue(partitions=4)
    runtime.refresh_queues()
    # when two passes (the housekeeping thread's, a request's) read the rows at the same time
    real = leases.claim_rows

    def slow_claim_rows(rows):
        read = real(rows)
        time.sleep(0.3)  # both have read the rows before either claims
        return read

    monkeypatch.setattr(leases, "claim_rows", slow_claim_rows)

    def claim() -> None:
        try:
            runtime._claim_partitions(name)
        finally:
            connection.close()  # (this thread's)

    passes = [threading.Thread(target=claim) for _ in range(2)]
    for t in passes:
        t.start()
    for t in passes:
        t.join()
    # then they took this node's share between them, not a share each
    assert len(runtime.local_managers(name)) == 2
