"""A claim pass (``NodeRuntime._claim_partitions``, once a heartbeat) reads every partition row:
what it reads of them, and that the reads do not grow with the rows."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connection
from django.test.utils import CaptureQueriesContext

from queues.models import Node, Partition


def test_the_pass_reads_the_rows_in_one_query_whoever_owns_them(runtime, make_queue, purge_kv):
    queues = [make_queue(partitions=4) for _ in range(3)]
    runtime.tick()
    assert all(len(runtime.local_managers(q)) == 4 for q in queues)
    wall = datetime(2026, 11, 24, tzinfo=UTC)
    Node.objects.create(id="node-b", address="node-b", started_at=wall, heartbeat_at=wall)
    for i in range(4):  # the first queue's rows owned by another node, as far as they say
        runtime._release(runtime.manager(queues[0], i))
    Partition.objects.filter(queue__name=queues[0]).update(owner_id="node-b", epoch=7, lease_nonce="theirs")
    with CaptureQueriesContext(connection) as queries:
        runtime._claim_partitions()
    selects = [x["sql"] for x in queries if x["sql"].lstrip().upper().startswith("SELECT")]
    assert len(selects) == 2, selects  # the live nodes, then the partitions with their queues' names
    assert "cursors" not in selects[1] and "stats_at" not in selects[1]
    for i in range(4):  # seen owned by node-b: noted, to be taken only once its nonce stood a period
        pid = Partition.objects.get(queue__name=queues[0], index=i).pk
        assert runtime.observations[pid].owner_id == "node-b" and runtime.observations[pid].nonce == "theirs"
