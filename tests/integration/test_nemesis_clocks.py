"""Clock drift for the nemesis run (nemesis/clocks.py): a child process under libfaketime and
its companion library runs its clocks at the rate asked, with the offset asked, and its
timeouts last their time on its own clock; a node serves under drift.

Needs Debian's faketime package and a C compiler (scripts/services.sh packages installs both);
skipped, with the reason, where they are missing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime

import pytest

from mq_client import Client
from nemesis import clocks
from nemesis.clocks import Drift

AVAILABLE, WHY = clocks.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"needs libfaketime and cc: {WHY}")

#: Prints its monotonic and wall clocks, sleeps 2 s of its own, prints them again.
CLOCKS = """
import time
print(time.monotonic(), time.time(), flush=True)
time.sleep(2)
print(time.monotonic(), time.time(), flush=True)
"""

#: Waits 1 s of its own in each way a node's threads wait, printing each wait's length on its
#: own monotonic clock.
WAITS = """
import queue, selectors, socket, threading, time

def lock():
    held = threading.Lock()
    held.acquire()
    held.acquire(timeout=1)

def condition():
    with (c := threading.Condition()):
        c.wait(1)

def get():
    try:
        queue.Queue().get(timeout=1)
    except queue.Empty:
        pass

def recv():
    a, b = socket.socketpair()
    a.settimeout(1)
    try:
        a.recv(1)
    except TimeoutError:
        pass

def select():
    a, b = socket.socketpair()
    s = selectors.DefaultSelector()
    s.register(a, selectors.EVENT_READ)
    s.select(1)

for wait in (lock, condition, lambda: threading.Event().wait(1), get, recv, select, lambda: time.sleep(1)):
    started = time.monotonic()
    wait()
    print(round(time.monotonic() - started, 3), flush=True)
"""


def run_child(script: str, env: dict[str, str], timeout: float = 30) -> list[tuple[float, float, list[float]]]:
    """Run ``script`` under ``env``; each line it prints, as (this process's monotonic and wall
    clocks when it arrived, its numbers)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, **env}, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines = []
    try:
        for line in proc.stdout:
            lines.append((time.monotonic(), time.time(), [float(x) for x in line.split()]))
        assert proc.wait(timeout) == 0
    finally:
        proc.kill()
    return lines


@pytest.mark.parametrize("rate", [1.1, 0.9, 1.0])
def test_a_childs_monotonic_and_wall_clocks_run_at_the_rate_asked(rate):
    (m0, _, (cm0, cw0)), (m1, _, (cm1, cw1)) = run_child(CLOCKS, Drift(rate).env())
    real = m1 - m0
    # the child slept 2 s of its own: 2 / rate real seconds
    assert real == pytest.approx(2 / rate, rel=0.02)
    assert (cm1 - cm0) / real == pytest.approx(rate, rel=0.02)
    assert (cw1 - cw0) / real == pytest.approx(rate, rel=0.02)


@pytest.mark.parametrize("offset", [120.0, -300.0])
def test_a_childs_wall_clock_is_offset_by_the_offset_asked(offset):
    (_, w0, (_, cw0)), _ = run_child(CLOCKS, Drift(1.05, offset).env())
    assert cw0 - w0 == pytest.approx(offset, abs=1.0)


@pytest.mark.parametrize("rate", [1.1, 0.9])
def test_a_childs_timeouts_last_their_time_on_its_own_clock(rate):
    started = time.monotonic()
    waits = [numbers[0] for _, _, numbers in run_child(WAITS, Drift(rate, 60).env())]
    real = time.monotonic() - started
    assert len(waits) == 7
    for waited in waits:
        assert 0.99 <= waited <= 1.05
    # seven waits of 1 s of the child's own: 7 / rate real seconds (and a start)
    assert 7 / rate < real < 7 / rate + 2


def test_without_the_companion_a_timed_lock_wait_never_ends():
    # why Drift.env preloads it: libfaketime's monotonic clock reads as the wall clock does
    # (about 1.8e9), and CPython hands a deadline on it to sem_clockwait, which it leaves alone
    env = {**Drift(1.0).env(), "LD_PRELOAD": str(clocks.library())}
    script = "import threading; held = threading.Lock(); held.acquire(); held.acquire(timeout=0.2)"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, timeout=5)
    subprocess.run([sys.executable, "-c", script], env={**os.environ, **Drift(1.0).env()}, timeout=5, check=True)


def test_a_drift_out_of_bounds_is_refused():
    with pytest.raises(ValueError, match="rate"):
        Drift(2.0)
    assert Drift(1.05, -12.5).spec == "-12.500 x1.050000"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("rate", [1.1, 0.9])
def test_a_node_under_drift_serves(node_factory, token, rate):
    node = node_factory(**Drift(rate, 120).env())
    mq = Client(node.url, token)
    name = f"drift-{uuid.uuid4().hex[:8]}"
    mq.create_queue(name, partitions=1)
    ids = mq.enqueue_batch(name, [f"m{i}" for i in range(20)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < len(ids) and time.monotonic() < deadline:
        got += mq.dequeue(name, 100, visibility_timeout=30, wait=1)
    assert sorted(m.id for m in got) == sorted(ids)
    mq.ack(name, got)
    # the node stamps messages with its wall clock, 120 s ahead
    ahead = [(m.enqueued_at - datetime.now(UTC)).total_seconds() for m in got if m.enqueued_at]
    assert len(ahead) == len(ids)
    assert all(115 < a < 125 for a in ahead), ahead
    # a long poll on an empty queue ends after its wait on the node's clock: 4 / rate real seconds
    started = time.monotonic()
    assert mq.dequeue(name, 1, wait=4) == []
    print(f"rate {rate}: a long poll of 4 s took {time.monotonic() - started:.3f} s")
    assert time.monotonic() - started == pytest.approx(4 / rate, abs=0.35)
