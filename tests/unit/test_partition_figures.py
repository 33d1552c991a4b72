"""A partition's figures in its row (``NodeRuntime._publish_stats``, one statement for every row
due): what the console and the other nodes read. Here on SQLite (``make test-unit``); the full
suite runs it on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from queues.models import Partition


@pytest.fixture
def row(runtime, make_queue, purge_kv):
    q = make_queue(partitions=2)
    runtime.tick()
    return q, lambda index: Partition.objects.get(queue__name=q, index=index)


def test_every_figure_is_written_as_the_manager_has_it(runtime, api, row):
    q, get = row
    for i in range(3):
        assert (
            api.post(f"/api/v1/queues/{q}/enqueue", {"body": f"m{i}", "group": "g"}, format="json").status_code == 201
        )
    got = api.post(f"/api/v1/queues/{q}/dequeue", {"max": 1}, format="json").json()["messages"]
    assert len(got) == 1
    runtime.tick()
    index = int(got[0]["id"].split("/")[1])  # the group's partition
    m, r = runtime.manager(q, index), get(index)
    s = m.stats()
    assert (r.depth, r.in_flight, r.enqueued_total, r.acked_total) == (2, 1, 3, 0)
    assert (r.depth, r.in_flight, r.delayed) == (s.visible, s.in_flight, s.delayed)
    assert (r.enqueue_id, r.dequeue_id) == (s.enqueue_id, s.dequeue_id) and r.enqueue_id
    assert (r.tree_height, r.live_blocks, r.cursors) == (s.tree_height, s.live_blocks, s.cursors)
    assert r.oldest_enqueued_at == datetime.fromtimestamp(s.oldest_enqueued_at, tz=UTC)
    assert r.enqueue_rate > 0 and r.stats_at is not None
    other = get(1 - index)  # the other partition's row: its own (empty) figures
    assert (other.depth, other.in_flight, other.enqueued_total, other.oldest_enqueued_at) == (0, 0, 0, None)
    assert other.stats_at is not None


@pytest.mark.parametrize("moved", [{"epoch": 999}, {"owner": None}], ids=["epoch", "owner"])
def test_a_row_that_is_no_longer_ours_is_not_written(runtime, api, row, moved):
    q, get = row
    for i in range(4):
        assert api.post(f"/api/v1/queues/{q}/enqueue", {"body": f"m{i}"}, format="json").status_code == 201
    Partition.objects.filter(queue__name=q, index=0).update(**moved)  # taken over, as far as the row says
    stale = get(0).stats_at
    assert runtime.manager(q, 0) is not None  # still served here: only the statement's WHERE can refuse it
    runtime._published.clear()  # every row due
    runtime._publish_stats()  # (not tick(): its _drop_stale would drop the manager first)
    assert get(0).stats_at == stale  # not ours under that owner and epoch: left as it was
    assert get(1).stats_at > stale  # the row still ours is written in the same pass


def test_the_rows_due_are_written_by_one_statement(runtime, make_queue, purge_kv, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from queues.cluster import node

    q = make_queue(partitions=5)
    runtime.tick()
    Partition.objects.filter(queue__name=q).update(stats_at=None, depth=7)
    runtime._published.clear()
    with CaptureQueriesContext(connection) as queries:
        runtime._publish_stats()
    updates = [x["sql"] for x in queries if "UPDATE" in x["sql"]]
    assert len(updates) == 1, updates
    assert list(Partition.objects.filter(queue__name=q).values_list("depth", flat=True)) == [0] * 5
    assert Partition.objects.filter(queue__name=q, stats_at=None).count() == 0
    monkeypatch.setattr(node, "STATS_BATCH", 2)
    runtime._published.clear()
    with CaptureQueriesContext(connection) as queries:
        runtime._publish_stats()
    assert len([x for x in queries if "UPDATE" in x["sql"]]) == 3  # 2 + 2 + 1


def test_a_row_not_written_is_due_again_at_the_next_pass(runtime, api, row):
    q, get = row
    m = runtime.manager(q, 0)
    epoch = m.lease.epoch
    Partition.objects.filter(queue__name=q, index=0).update(epoch=epoch + 1)  # the statement will not match
    runtime._published.clear()
    runtime._publish_stats()
    assert (q, 0) not in runtime._published and (q, 1) in runtime._published
    Partition.objects.filter(queue__name=q, index=0).update(
        epoch=epoch, depth=7
    )  # (ours again, as far as the row says)
    runtime._publish_stats()  # the figures have not changed, but they were never written
    assert get(0).depth == 0 and (q, 0) in runtime._published


def test_no_rows_is_no_statement(db):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from queues.cluster import node

    with CaptureQueriesContext(connection) as queries:
        assert node._write_stats([], "node-a", datetime.now(UTC)) == set()
    assert len(queries) == 0
