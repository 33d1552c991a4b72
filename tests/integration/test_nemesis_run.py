"""The nemesis run inside the suite: a seeded run of mixed faults on three nodes of their own
stores, checked whole (nemesis/run.py); and the same run on a build whose fencing is patched
out, which the checker must catch.

``NEMESIS_SEED=n`` repeats a run's schedule; a failing run names the directory of its history,
summary and picture (``nemesis-runs/`` at the repository's root)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from nemesis import clocks
from nemesis.faults import DEFAULT_KINDS, schedule
from nemesis.history import read
from nemesis.netns import Network
from nemesis.run import LEASE_PERIOD, ROOT, Options, run

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

OUT = ROOT / "nemesis-runs"


def _seed() -> int:
    seed = int(os.environ.get("NEMESIS_SEED") or secrets.randbelow(10**6))
    print(f"nemesis seed: {seed} (NEMESIS_SEED={seed} repeats this schedule)")
    return seed


#: The suite's run: the default faults, and clock drift where libfaketime is installed (the
#: project's scripts install it: scripts/services.sh packages).
KINDS = (*DEFAULT_KINDS, "drift") if clocks.available()[0] else DEFAULT_KINDS


def _covers(seed: int, duration: float) -> bool:
    """Whether the schedule of ``seed`` (a pure function of it) has a kill, a pause and a store fault."""
    kinds = {f.kind for f in schedule(seed, duration, KINDS, ["n1", "n2", "n3"], LEASE_PERIOD)}
    return {"kill", "pause"} <= kinds and bool(kinds & {"redis-kill", "redis-pause", "pg-restart", "pg-pause"})


def test_a_seeded_run_of_mixed_faults_keeps_every_guarantee():
    seed = _seed()
    if "NEMESIS_SEED" not in os.environ:
        # a drawn seed whose 100 s hold no pause (seed 131494) tests less than the run says:
        # the next seed whose schedule has every kind the run is about (its seed printed)
        while not _covers(seed, 100):
            seed += 1
        print(
            f"nemesis seed used: {seed}, the first from there whose schedule has a kill, a pause and a store fault (NEMESIS_SEED={seed} repeats it)"
        )
    outcome = run(Options(seed, duration=100, kinds=KINDS, out=OUT))
    anomalies = {name: n for name, n in outcome.result.anomalies.items() if n}
    assert outcome.valid, (
        f"seed {seed}: {anomalies or outcome.errors}; history, summary.json and picture.png in {outcome.directory}"
    )
    # the run did what it says: faults of every default kind, traffic through them, every
    # confirmed message delivered, owners reported
    kinds = {f.kind for f in outcome.schedule}
    assert {"kill", "pause"} <= kinds and kinds & {"redis-kill", "redis-pause", "pg-restart", "pg-pause"}, kinds
    summary = outcome.summary.read_text()
    assert '"ownership_events": 0' not in summary
    assert outcome.result.enqueues["confirmed"] > 1000, outcome.result.enqueues


#: What the broken build changes, each an exact text replacement: the owner never finds its
#: lease expired, never reads the fence before delivering, ignores a renewal that found its lease
#: taken, and never drops a manager whose row moved on. A paused owner then serves on when it
#: wakes, beside the node that took its partitions, until a write of its is refused by the
#: store's epoch (which stays: a build without it loses messages outright).
BROKEN = (
    (
        "queues/cluster/leases.py",
        "    def valid(self, now: float | None = None) -> bool:\n",
        "    def valid(self, now: float | None = None) -> bool:\n        return True\n",
    ),
    (
        "queues/engine/delivery.py",
        "    def check_fence(self) -> None:\n",
        "    def check_fence(self) -> None:\n        return\n",
    ),
    ("queues/cluster/node.py", "exc = lost.get(m.lease.partition_id)", "exc = None"),
    (
        "queues/cluster/node.py",
        "    def _drop_stale(self, queue: str | None = None) -> None:\n",
        "    def _drop_stale(self, queue: str | None = None) -> None:\n        return\n",
    ),
)


def _without_fencing(tmp: Path) -> Path:
    """A copy of this tree (tracked files and those not ignored) with :data:`BROKEN` applied."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        source = ROOT / name
        if source.is_file():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tmp / name)
    for path, old, new in BROKEN:
        text = (tmp / path).read_text()
        assert text.count(old) == 1, f"the patch no longer applies to {path}: {old!r}"
        (tmp / path).write_text(text.replace(old, new))
    return tmp


#: Schedules a broken build gets to be caught in, one after the other until one catches it: a
#: catch takes a client's call to land on a paused owner in the moments after it wakes, which
#: seven pauses of 45 s nearly always give, not always (seed 305014: none).
CATCH_TRIES = 3


def test_a_build_without_fencing_is_caught(tmp_path):
    seed = _seed()
    code = _without_fencing(tmp_path / "broken")
    # It serves on beside the next owner (overlapping owners), answers calls under a superseded
    # epoch, delivers groups out of order.
    kinds = ("overlapping_owners", "stale_epoch", "lost", "group_order")
    missed = []
    for tried in range(CATCH_TRIES):
        outcome = run(Options(seed + tried, duration=45, kinds=("pause",), out=OUT, code=code))
        caught = {name: outcome.result.anomalies[name] for name in kinds}
        if sum(caught.values()) > 0:
            break
        missed.append(f"seed {seed + tried}: {outcome.result.anomalies}; {outcome.directory}")
    assert len(missed) < CATCH_TRIES, f"a build without fencing passed the checker {CATCH_TRIES} times: {missed}"


#: Runs that found a fault in the service, kept as they were: (seed, seconds, faults). Seed 5
#: found a node with its wall clock minutes off refused by its peers (tests/integration/test_cluster_clock.py).
FOUND = [(5, 60, ("drift", "partition-stores", "partition-peers", "kill"))]


@pytest.mark.parametrize(("seed", "seconds", "kinds"), FOUND, ids=[f"seed{seed}" for seed, _, _ in FOUND])
def test_a_run_that_found_a_fault_passes_since(seed, seconds, kinds):
    if not clocks.available()[0]:
        pytest.skip(f"libfaketime: {clocks.available()[1]}")
    if not Network.available()[0]:
        pytest.skip(f"network namespaces: {Network.available()[1]}")
    outcome = run(Options(seed, duration=seconds, kinds=kinds, out=OUT))
    anomalies = {name: n for name, n in outcome.result.anomalies.items() if n}
    assert outcome.valid, f"seed {seed}: {anomalies or outcome.errors}; {outcome.directory}"
    # and no client was refused for what the nodes did among themselves
    refused = [op for op in read(outcome.directory / "history.jsonl").ops if op.status in (401, 403)]
    assert not refused, refused[:3]
