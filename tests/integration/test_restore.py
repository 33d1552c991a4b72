"""What operators do to the stores, on real node processes, PostgreSQL and Redis.

- A partition whose fence in the key-value store is 39 epochs ahead of its row (the row
  restored from a backup taken before 39 owners came and went): a node serves it within a
  claim pass (it used to lose a lease period per epoch behind, minutes with a 10 s lease).
- The restore drill: dump the partition rows (``pg_dump``), enqueue more, let another node
  take the partitions over, restore the dump (or rebuild the rows from the queue's
  description alone), start a node: every enqueue answered 201 is delivered.

Each runs with the key-value store on Redis and on PostgreSQL (the ``postgres`` backend's table
is not in the dump: the database and the store are restored independently).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import F

from queues.engine.ids import group_partition
from queues.models import Partition, Queue
from tests.integration.nodes import Client, drain, node_info
from tests.launcher import NodeProcess, wait_until

pytestmark = pytest.mark.cluster

PARTITIONS = 2


def groups_per_partition(partitions: int) -> dict[int, str]:
    """A message group for each partition (groups hash to partitions)."""
    out: dict[int, str] = {}
    k = 0
    while len(out) < partitions:
        out.setdefault(group_partition(f"g{k}", partitions), f"g{k}")
        k += 1
    return out


def enqueue(c: Client, name: str, n: int, tag: str) -> list[str]:
    r = c.post(f"queues/{name}/enqueue", {"messages": [{"body": f"{tag}{i}"} for i in range(n)]})
    assert r.status_code == 201, r.text
    return r.json()["ids"]


def serve_every_partition(c: Client, name: str, timeout: float) -> tuple[list[str], float]:
    """Enqueue one message into each partition (by its group) until each is answered 201; the
    IDs and the seconds it took. A partition not served yet answers 503."""
    ids: dict[int, str] = {}
    groups = groups_per_partition(PARTITIONS)

    def all_served() -> bool:
        for index, group in groups.items():
            if index in ids:
                continue
            r = c.post(f"queues/{name}/enqueue", {"body": f"probe {index}", "group": group}, timeout=10)
            assert r.status_code in (201, 503), r.text
            if r.status_code == 201:
                ids[index] = r.json()["id"]
        return len(ids) == len(groups)

    took = wait_until(all_served, timeout, f"every partition of {name} to serve enqueues")
    return list(ids.values()), took


def take_over(node: NodeProcess, name: str, timeout: float) -> float:
    """Wait until ``node`` owns every partition of ``name`` (the rows say so); the seconds.
    (Until then it forwards a partition's calls to the owner the row names, dead or not.)"""
    node_id = node_info(node.url)["node"]

    def owned() -> bool:
        return set(Partition.objects.filter(queue__name=name).values_list("owner_id", flat=True)) == {node_id}

    return wait_until(owned, timeout, f"{node.url} to own every partition of {name}")


def rows(name: str) -> dict[int, tuple[int, str]]:
    fields = ("index", "epoch", "head_block")
    return {
        index: (epoch, head) for index, epoch, head in Partition.objects.filter(queue__name=name).values_list(*fields)
    }


def logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("node-*.log")))


def store_fixture(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "redis":
        request.getfixturevalue("redis_client")  # flushes db 5
    elif connection.vendor != "postgresql":
        pytest.skip("the postgres key-value backend needs PostgreSQL")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["redis", "postgres"])
def test_a_fence_39_epochs_ahead_of_a_restored_row_is_passed_in_one_claim(
    backend, tmp_path, token, request, node_factory
):
    store_fixture(backend, request)
    nodes = node_factory
    name = f"fenced-{backend}"
    try:
        # given a queue with the default lease of 10 s, a message in each partition, and a
        # backup of its rows taken while they were free
        first = nodes(backend=backend)
        c = Client(first.url, token)
        r = c.post("queues", {"name": name, "partitions": PARTITIONS, "block_size": 4, "lease_period": 10})
        assert r.status_code == 201, r.text
        before, _ = serve_every_partition(c, name, 30)
        first.stop()
        backup = list(Partition.objects.filter(queue__name=name).values())
        # ...after which 39 owners came and went (the store's fences and the rows moved on) and
        # one more, which enqueued into blocks the backup does not know
        Partition.objects.filter(queue__name=name).update(epoch=F("epoch") + 39)
        second = nodes(backend=backend)
        c = Client(second.url, token)
        middle, _ = serve_every_partition(c, name, 30)
        middle += enqueue(c, name, 10, "m")
        fence = max(epoch for epoch, _ in rows(name).values())
        second.stop()
        # when the rows are restored from the backup (epochs 39 and more behind the fences)
        for row in backup:
            Partition.objects.filter(pk=row["id"]).update(**{k: v for k, v in row.items() if k != "id"})
        assert max(epoch for epoch, _ in rows(name).values()) <= fence - 39
        third = nodes(backend=backend)
        c = Client(third.url, token)
        # then each partition serves within a claim pass, under the epoch just past its fence
        after, took = serve_every_partition(c, name, 30)
        print(f"\n{backend}: fences 39 epochs ahead: every partition served {took:.1f}s after the node started")
        assert {index: epoch for index, (epoch, _) in rows(name).items()} == dict.fromkeys(range(PARTITIONS), fence + 1)
        assert "a newer epoch fenced us at open" not in logs(tmp_path)
        # and every message is there
        delivered = {m["id"] for m in drain(c, f"queues/{name}")}
        missing = set(before + middle + after) - delivered
        assert not missing, f"{len(missing)} acknowledged enqueues never delivered: {sorted(missing)[:5]}"
    finally:
        nodes.stop()


def pg_env() -> dict[str, str]:
    s = connection.settings_dict
    return {
        **os.environ,
        "PGHOST": s["HOST"] or "127.0.0.1",
        "PGPORT": str(s["PORT"] or 5432),
        "PGUSER": s["USER"],
        "PGPASSWORD": s["PASSWORD"],
        "PGDATABASE": s["NAME"],
    }


def dump_partitions(path: Path) -> None:
    """``pg_dump`` of the partition rows (the leases, epochs and head pointers), as an
    operator's backup of the database has them."""
    subprocess.run(["pg_dump", "--data-only", "--table=queues_partition", f"--file={path}"], env=pg_env(), check=True)


def restore_partitions(path: Path) -> None:
    """The rows back as they were dumped, in one transaction."""
    subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-1", "-c", "DELETE FROM queues_partition", "-f", str(path)],
        env=pg_env(),
        check=True,
        stdout=subprocess.DEVNULL,
    )


def rebuild_partitions(name: str) -> None:
    """The rows made again from the queue's description alone: epoch 0, no owner, no head."""
    q = Queue.objects.get(name=name)
    Partition.objects.filter(queue=q).delete()
    Partition.objects.bulk_create(
        [Partition(queue=q, index=i, lease_period=q.lease_period) for i in range(q.partitions)]
    )


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "how"), [("redis", "pg_dump"), ("postgres", "pg_dump"), ("redis", "rebuilt")])
def test_restore_drill_delivers_every_acknowledged_message(backend, how, tmp_path, token, request, node_factory):
    store_fixture(backend, request)
    if connection.vendor != "postgresql":
        pytest.skip("the drill dumps PostgreSQL")
    nodes = node_factory
    name = f"drill-{backend}-{how}"
    dump = tmp_path / "partitions.sql"
    try:
        # given a queue with small blocks on a node, and messages in it
        first = nodes(backend=backend)
        c = Client(first.url, token)
        r = c.post("queues", {"name": name, "partitions": PARTITIONS, "block_size": 4, "lease_period": 3})
        assert r.status_code == 201, r.text
        acknowledged, _ = serve_every_partition(c, name, 30)
        acknowledged += enqueue(c, name, 30, "a")
        # when the database is dumped (the node running), more is enqueued (20 more blocks)...
        dump_partitions(dump)
        acknowledged += enqueue(c, name, 80, "b")
        # ...the node dies and another takes its partitions over and enqueues too...
        first.kill()
        second = nodes(backend=backend)
        c = Client(second.url, token)
        take_over(second, name, 60)
        took_over, _ = serve_every_partition(c, name, 30)
        acknowledged += took_over + enqueue(c, name, 40, "c")
        second.kill()
        # ...and the database is restored (or the rows rebuilt), and a node started
        if how == "pg_dump":
            restore_partitions(dump)
        else:
            rebuild_partitions(name)
        third = nodes(backend=backend)
        c = Client(third.url, token)
        waited = take_over(third, name, 60)  # a lease period when the dump names an owner
        probes, took = serve_every_partition(c, name, 30)
        print(f"\n{backend} ({how}): owned {waited:.1f}s and served {waited + took:.1f}s after the node started")
        # then every enqueue that was answered 201 is delivered
        delivered = {m["id"] for m in drain(c, f"queues/{name}")}
        missing = set(acknowledged + probes) - delivered
        assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged enqueues lost: {sorted(missing)[:5]}"
    finally:
        nodes.stop()
