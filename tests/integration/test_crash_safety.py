"""Crash safety: SIGKILL a node mid-load, start another, and get every confirmed message back.

For each key-value backend (Redis Cluster too: the three primaries ``make test`` starts):
producers enqueue 5,000 messages through the API in batches while a consumer dequeues and acks some and leaves others in flight; the node is killed with
SIGKILL part-way; a new node process takes the partitions over (after the lease period) and
a drain dequeues and acks everything. Every enqueue that was answered 201 must come back
unless it was acknowledged; no acknowledged message may come back.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.conf import settings

from tests.integration.nodes import Client, member_addresses
from tests.launcher import NodeProcess, wait_until

pytestmark = pytest.mark.cluster

TOTAL = 5000
BATCH = 100
#: ``runnode --processes``: the killed node is every process of it at once (its group), the
#: partitions are spread over them, and calls for a sibling's partition are forwarded.
PROCESSES = 2


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "redis", "redis-cluster", "postgres"])
def test_sigkill_loses_no_confirmed_message(backend, node_factory, token, request):
    # (the factory empties the Redis db or skips the test without a Redis Cluster)
    first = node_factory(backend=backend, processes=PROCESSES)
    second = node_factory(backend=backend, processes=PROCESSES, start=False)
    try:
        _run(first, second, token, backend)
        if backend == "redis-cluster":
            # the nodes kept each partition's fence under its hash tag (on the cluster, not
            # elsewhere), in the queue's incarnation (keys.incarnation: its row's id)
            from queues.engine.keys import incarnation
            from queues.models import Queue

            cluster = request.getfixturevalue("redis_cluster_client")
            queue_id = Queue.objects.get(name=f"crash-{backend}").pk
            for p in range(4):
                tagged = f"{settings.KV_PREFIX}{incarnation(queue_id)}{{crash-{backend}/{p}}}"
                assert cluster.hget(tagged, "_fence") is not None, tagged
    finally:
        first.stop()
        second.stop()


def all_live(node: NodeProcess, token: str, queue: str) -> bool:
    """Every partition of ``queue`` open in one of ``node``'s processes (its stats are live
    there: each process answers for the partitions it holds, at its own address)."""
    live: set[int] = set()
    count = 0
    for address in member_addresses(node):
        stats = Client(f"http://{address}", token).get(f"queues/{queue}/stats").json()
        count = len(stats["partitions"])
        live |= {p["index"] for p in stats["partitions"] if p["live"]}
    return count > 0 and len(live) == count


def _run(first: NodeProcess, second: NodeProcess, token: str, backend: str) -> None:
    # given a queue with a short lease, on the first node
    c = Client(first.url, token)
    name = f"crash-{backend}"
    r = c.post("queues", {"name": name, "partitions": 4, "block_size": 64, "lease_period": 2})
    assert r.status_code == 201, r.text
    confirmed: dict[str, str] = {}
    acked: set[str] = set()  # ack answered 200: must never come back
    ack_sent: set[str] = set()  # ack sent, maybe cut off by the kill: may or may not
    in_flight_at_crash: set[str] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def producer(k: int) -> None:
        pc = Client(first.url, token)
        for b in range(k, 2 * TOTAL // BATCH, 4):  # more than TOTAL: the kill comes mid-load
            if stop.is_set():
                return
            bodies = [f"{b}:{i}" for i in range(BATCH)]
            try:
                resp = pc.post(f"queues/{name}/enqueue", {"messages": [{"body": x} for x in bodies]})
            except Exception:  # noqa: BLE001 - the node is being killed
                return
            if resp.status_code == 201:
                with lock:
                    confirmed.update(zip(resp.json()["ids"], bodies))

    def consumer() -> None:
        cc = Client(first.url, token)
        while not stop.is_set():
            try:
                got = cc.post(f"queues/{name}/dequeue", {"max": 50, "visibility_timeout": 60}).json()["messages"]
                if not got:
                    continue
                # ack two thirds, keep a third in flight (it must come back after the crash)
                keep = got[: len(got) // 3]
                done = got[len(got) // 3 :]
                with lock:
                    in_flight_at_crash.update(m["id"] for m in keep)
                    ack_sent.update(m["id"] for m in done)
                resp = cc.post(
                    f"queues/{name}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in done]}
                )
                if resp.status_code == 200:
                    with lock:
                        acked.update(m["id"] for m in done)
            except Exception:  # noqa: BLE001 - the node was killed mid-call: the crash this test makes
                return

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
    threads.append(threading.Thread(target=consumer))
    for t in threads:
        t.start()
    # when the node is killed once 5,000 enqueues are confirmed, with producers still going
    while len(confirmed) < TOTAL and any(t.is_alive() for t in threads[:4]):
        time.sleep(0.01)
    first.kill()
    killed_at = time.monotonic()
    stop.set()
    for t in threads:
        t.join(timeout=30)
    # and a new node takes over
    second.start()
    c2 = Client(second.url, token)
    first_enqueue = first_dequeue = None
    while first_enqueue is None:
        r = c2.post(f"queues/{name}/enqueue", {"body": "after-crash"})
        if r.status_code == 201:
            first_enqueue = time.monotonic() - killed_at
            confirmed[r.json()["id"]] = "after-crash"
        else:
            assert r.status_code == 503, r.text
            time.sleep(0.05)
    # (and its processes have shared the partitions out: the first to see the orphans takes them
    # all, then gives the surplus back to its sibling, and a partition given back forgets what
    # it had in flight, so a drain begun before would see those messages again, as at-least-once
    # delivery allows; the drain below counts every delivery)
    members = set(member_addresses(second))

    def shared_out() -> bool:
        parts = c2.get(f"queues/{name}/partitions").json()["partitions"]
        owners = [p["address"] for p in parts]
        return set(owners) == members and all(owners.count(a) == len(parts) // PROCESSES for a in members)

    wait_until(shared_out, 30, "the partitions shared out among the new node's processes")
    # then a drain gets back every confirmed message that was not acknowledged
    delivered: dict[str, int] = {}
    idle_since = None
    while True:
        r = c2.post(f"queues/{name}/dequeue", {"max": 100, "wait": 0.5, "visibility_timeout": 60})
        assert r.status_code == 200, r.text
        got = r.json()["messages"]
        if got:
            if first_dequeue is None:
                first_dequeue = time.monotonic() - killed_at
            idle_since = None
            for m in got:
                delivered[m["id"]] = delivered.get(m["id"], 0) + 1
                assert m["body"] == confirmed.get(m["id"], m["body"])
            a = c2.post(f"queues/{name}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]})
            assert a.status_code == 200, a.text
        elif all_live(second, token, name):
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > 1.0:
                break
    expected = set(confirmed) - ack_sent
    lost = expected - set(delivered)
    resurrected = acked & set(delivered)
    redelivered = in_flight_at_crash & set(delivered)
    print(
        f"\n[{backend}] confirmed={len(confirmed)} acked-before-crash={len(acked)} "
        f"delivered-after={len(delivered)} redelivered(in flight at crash)={len(redelivered)} "
        f"enqueue-resumed={first_enqueue:.2f}s dequeue-resumed={first_dequeue:.2f}s (lease 2 s)"
    )
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:3]}"
    # (and the crash met grown blocks, not only blocks of 64: see queues.engine.tree.next_block_size)
    assert max(int(mid.rsplit("/", 1)[1]) for mid in confirmed) >= 64
    assert not resurrected, f"{len(resurrected)} acknowledged messages came back"
    assert all(n == 1 for n in delivered.values()), "a message was delivered twice in the drain"
    assert len(confirmed) >= TOTAL
