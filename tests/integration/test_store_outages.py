"""Store outages under load on two nodes: Redis and PostgreSQL restarted, and each unreachable.

Producers and consumers (``test_cluster.Load``) run against two nodes on PostgreSQL + the
Redis key-value store while ``scripts/services.sh`` does to the stores what an operator (or a
failing host) does:

- Redis **restart**: SIGKILL, then started again from its append-only file (the test Redis
  runs ``appendonly yes``, as ``services.sh`` writes it: every write Redis answered is in the
  file, written as it answered, whether or not ``appendfsync`` flushed it to the disk);
- PostgreSQL **restart**: ``pg_ctl restart -m fast`` (every connection is cut);
- either **unreachable** for 10 s: every server process SIGSTOPped, then SIGCONTed (the
  connections hang rather than being refused, the harder case for a client).

Every call must be answered within its own timeout with 200/201/204, or 503 and
``Retry-After`` (never 500, never another 5xx); service must come back by itself within
seconds of the store; and every enqueue answered 201 must be delivered (drain), none lost.
No lease is lost for an outage either: every partition keeps its owner and epoch. Each case
prints its 503s, its longest call and the time to resume.
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading
import time
from dataclasses import dataclass

import pytest
from django.db import connection

from tests.integration.nodes import Client
from tests.integration.test_cluster import Load, _make_queue, _partitions
from tests.launcher import ROOT, NodeProcess, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: The outage each "unreachable" case makes, seconds.
UNREACHABLE = 10
#: The queue's lease period, seconds: shorter than the outages (so an owner's lease runs out on
#: its clock while the store is away, and it serves on once it is back), and long enough that an
#: owner renews within it after the store is back on a loaded 2-core runner (its connection made
#: again first). With 2 s, one run of ~10 reopened three partitions after PostgreSQL's 10 s pause.
OUTAGE_LEASE = 5
#: The timeout of every call the load makes (``Load`` uses 10 s): a call not answered by
#: then hung on the store.
CALL_TIMEOUT = 10


@dataclass
class Call:
    path: str
    started: float
    ended: float
    status: int | None  # None: no answer (the exception's name is in ``error``)
    retry_after: str | None = None
    error: str = ""


class RecordingClient(Client):
    """A ``Client`` that writes down every call: when, how long, what status."""

    def __init__(self, base: str, token: str, calls: list[Call], lock: threading.Lock):
        super().__init__(base, token)
        self.calls, self.lock = calls, lock

    def post(self, path: str, payload: dict, timeout: float = 30):
        t0 = time.monotonic()
        try:
            r = super().post(path, payload, timeout=timeout)
        except Exception as exc:
            with self.lock:
                self.calls.append(Call(path, t0, time.monotonic(), None, error=type(exc).__name__))
            raise
        with self.lock:
            self.calls.append(Call(path, t0, time.monotonic(), r.status_code, r.headers.get("Retry-After")))
        return r


class RecordingLoad(Load):
    """``test_cluster.Load`` whose producers and consumers record every call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[Call] = []
        self.calls_lock = threading.Lock()

    def _clients(self):
        while True:
            for url in list(self.urls):
                yield RecordingClient(url, self.token, self.calls, self.calls_lock)

    def since(self, t: float) -> list[Call]:
        with self.calls_lock:
            return [c for c in self.calls if c.started >= t]


def services(*args: str) -> None:
    """``scripts/services.sh ARGS`` on this test run's services (same ports and folder)."""
    subprocess.run([str(ROOT / "scripts" / "services.sh"), *args], check=True, env=os.environ, timeout=120)


OUTAGES = {
    "redis": [("restart", ("redis-restart",)), (f"unreachable {UNREACHABLE} s", ("pause", "redis", str(UNREACHABLE)))],
    "postgres": [("restart", ("pg-restart",)), (f"unreachable {UNREACHABLE} s", ("pause", "pg", str(UNREACHABLE)))],
}


def _epochs(c: Client, name: str) -> dict[int, tuple[str | None, int]]:
    return {p["index"]: (p["owner"], p["epoch"]) for p in _partitions(c, name)}


def _owned(c: Client, name: str) -> list[int]:
    owners = [p["owner"] for p in _partitions(c, name)]
    return sorted(owners.count(o) for o in set(owners) if o)


def _serves(nodes: list[NodeProcess], token: str, name: str, partitions: int) -> bool:
    """Every node takes an enqueue into every partition (by group) and a dequeue: the service
    is back, not only some of it."""
    from queues.engine.ids import group_partition

    groups = {}
    for i in range(10_000):
        groups.setdefault(group_partition(f"probe-{i}", partitions), f"probe-{i}")
        if len(groups) == partitions:
            break
    for node in nodes:
        c = Client(node.url, token)
        try:
            for group in groups.values():
                if c.post(f"queues/{name}/enqueue", {"body": "probe", "group": group}, timeout=5).status_code != 201:
                    return False
            if c.post(f"queues/{name}/dequeue", {"max": 1, "visibility_timeout": 0}, timeout=5).status_code != 200:
                return False
        except Exception:  # noqa: BLE001 - a call that timed out: not back yet
            return False
    return True


@pytest.fixture
def cluster(node_factory):
    """Nodes with deadlines on the stores well inside the load's 10 s call timeout: a call that
    meets an unreachable database waits at most DB_CALL_TIMEOUT + DB_CONNECT_TIMEOUT."""
    yield functools.partial(node_factory, DB_CALL_TIMEOUT="3", DB_CONNECT_TIMEOUT="2", REDIS_TIMEOUT="1")
    node_factory.stop()
    connection.close()  # the test's own connection may predate a PostgreSQL restart


@pytest.mark.parametrize("backend", ["redis", "postgres"])
def test_store_outages_under_load(backend, cluster, token):
    # given two nodes sharing four partitions under load
    nodes = [cluster(), cluster()]
    name = _make_queue(nodes[0], token, 4, lease=OUTAGE_LEASE)
    c0 = Client(nodes[0].url, token)
    # (settled: two each, so that no rebalancing after the start counts as a lost lease)
    wait_until(lambda: _owned(c0, name) == [2, 2], 30, "two partitions on each node")
    load = RecordingLoad(nodes, token, name, batch=20).start()
    wait_until(lambda: len(load.confirmed) >= 500, 60, "500 confirmed enqueues")
    report = []
    for label, command in OUTAGES[backend]:
        before = _epochs(c0, name)
        # when the store goes away under load
        t_out = time.monotonic()
        services(*command)
        t_back = time.monotonic()
        connection.close()  # this process's connection did not survive a restart
        # then service comes back by itself, every partition on every node
        resumed = wait_until(lambda: _serves(nodes, token, name, 4), 60, f"service after the {backend} {label}")
        goal = len(load.confirmed) + 200
        wait_until(lambda: len(load.confirmed) >= goal, 60, f"load to go on after the {backend} {label}")  # noqa: B023
        calls = load.since(t_out)
        answered_503 = [c for c in calls if c.status == 503]
        after = _epochs(c0, name)
        moved = sorted(i for i in before if before[i] != after[i])
        longest = max((c.ended - c.started for c in calls), default=0.0)
        report.append((label, t_back - t_out, len(calls), len(answered_503), resumed, longest, moved))
    load.finish()
    load.drain()
    with load.calls_lock:
        calls = list(load.calls)
    unanswered = [c for c in calls if c.status is None]
    if unanswered:
        # A dequeue whose answer never came may still have handed messages out: they come
        # back once their visibility (30 s) runs out. Wait for them, so that a hang is
        # reported as a hang and not as a loss.
        time.sleep(31)
        load.drain()
    figures = load.check(f"{backend} outages")
    for label, length, n_calls, n_503, resumed, longest, moved in report:
        print(
            f"[{backend} {label}] store away {length:.1f}s; {n_calls} calls from the outage on, "
            f"{n_503} answered 503, the longest took {longest:.2f}s; every partition served on both "
            f"nodes {resumed:.2f}s after the store came back; partitions reopened (owner or epoch "
            f"changed): {moved}"
        )
    print(f"[{backend}] messages lost: 0 of {figures['confirmed']} confirmed")

    # every call was answered in time, with a success or 503 + Retry-After
    assert not unanswered, f"{len(unanswered)} calls without an answer, e.g. {unanswered[:3]}"
    slow = [c for c in calls if c.ended - c.started > CALL_TIMEOUT]
    assert not slow, f"{len(slow)} calls took longer than {CALL_TIMEOUT}s, e.g. {slow[:3]}"
    bad = [c for c in calls if c.status not in (200, 201, 204, 503)]
    assert not bad, f"{len(bad)} calls answered {sorted({c.status for c in bad})}, e.g. {bad[:3]}"
    no_retry = [c for c in calls if c.status == 503 and not c.retry_after]
    assert not no_retry, f"{len(no_retry)} 503s without Retry-After, e.g. {no_retry[:3]}"
    # and no lease was lost for the outage: every partition kept its owner and epoch (a store
    # that is back takes no takeover, no reopen)
    reopened = {label: moved for label, *_, moved in report if moved}
    assert not reopened, f"partitions reopened after an outage: {reopened}"
