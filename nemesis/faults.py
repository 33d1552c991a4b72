"""The nemesis: a schedule of faults drawn from a seed, and the thread that carries it out.

The schedule is a pure function of the seed and the run's shape (:func:`schedule`), so a seed
names a run's faults: when each starts (seconds after the clients start), on what, for how
long. Faults overlap: the next one is drawn a few seconds after the last one *started*, so a
node may be killed while the database is paused. Two faults never hit one target at once.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: Every kind of fault, and what it targets: a node (``node``) or a store.
KINDS: dict[str, str] = {
    "kill": "node",  # SIGKILL of every process of the node; started again after the fault's time
    "pause": "node",  # SIGSTOP past the lease, then SIGCONT
    "drift": "node",  # its clocks run fast or slow (faketime), its wall clock offset by minutes
    "partition-stores": "node",  # cut from PostgreSQL and Redis (network namespaces)
    "partition-peers": "node",  # cut from the other nodes
    "upgrade": "node",  # replaced by the previous release, then back
    "redis-kill": "redis",  # SIGKILL of Redis, started again from its append-only file
    "redis-pause": "redis",
    "pg-restart": "pg",
    "pg-pause": "pg",
}

#: The faults a run does unless told otherwise.
DEFAULT_KINDS = ("kill", "pause", "redis-kill", "redis-pause", "pg-restart", "pg-pause")


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: ``kind`` on ``target`` from ``at`` for ``duration`` seconds
    (``rate``/``offset``: a drift's clock rate and wall-clock offset in seconds)."""

    at: float
    kind: str
    target: str
    duration: float
    rate: float = 1.0
    offset: float = 0.0

    def describe(self) -> str:
        extra = f" rate {self.rate:.3f} offset {self.offset:+.0f}s" if self.kind == "drift" else ""
        return f"{self.at:7.1f}s  {self.kind:<16} {self.target:<6} {self.duration:5.1f}s{extra}"


def schedule(
    seed: int, duration: float, kinds: Sequence[str], nodes: Sequence[str], lease: float, *, warmup: float = 5.0
) -> list[Fault]:
    """The faults of a run of ``duration`` seconds: one every 2 to 6 s after ``warmup``, each
    over by ``duration`` minus 5 s. ``lease``: the queues' lease period (a pause or a cut lasts
    past it)."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)} (known: {', '.join(KINDS)})")
    if not kinds:
        return []
    rng = random.Random(seed)
    busy: dict[str, float] = {}  # target: until when a fault holds it
    faults: list[Fault] = []
    t = warmup
    while True:
        t += rng.uniform(2.0, 6.0)
        kind = rng.choice(list(kinds))
        length = _length(rng, kind, lease)
        if t + length > duration - 5.0:
            break
        if kind == "upgrade" and busy.get("upgrade", 0.0) > t:
            continue  # a rolling upgrade: one node at a time
        if KINDS[kind] == "node":
            free = [n for n in nodes if busy.get(n, 0.0) <= t]
            # at most all but one node down at once: the run checks safety, but a client with
            # no node at all learns nothing
            if len(free) <= 1 and len(nodes) > 1:
                continue
            target = rng.choice(free)
        else:
            target = KINDS[kind]
            if busy.get(target, 0.0) > t:
                continue
        rate = rng.choice([rng.uniform(0.9, 0.97), rng.uniform(1.03, 1.1)]) if kind == "drift" else 1.0
        offset = rng.uniform(-300.0, 300.0) if kind == "drift" else 0.0
        busy[target] = t + length + 1.0
        if kind == "upgrade":
            busy["upgrade"] = busy[target]
        faults.append(Fault(round(t, 2), kind, target, round(length, 2), round(rate, 4), round(offset, 1)))
    return faults


def _length(rng: random.Random, kind: str, lease: float) -> float:
    if kind in ("pause", "partition-stores", "partition-peers"):
        return rng.uniform(1.2 * lease, 2.5 * lease)  # past the lease: another node takes over
    if kind == "kill":
        return rng.uniform(1.0, 2.0 * lease)  # down this long before it starts again
    if kind == "drift":
        return rng.uniform(10.0, 25.0)
    if kind == "upgrade":
        return rng.uniform(8.0, 15.0)
    if kind in ("redis-pause", "pg-pause"):
        return rng.uniform(0.5, 3.0)
    return 0.0  # a restart: the fault lasts as long as the restart takes


#: ``apply(fault)`` starts a fault, ``heal(fault)`` ends it; both block until done.
Action = Callable[[Fault], None]


class Nemesis(threading.Thread):
    """Carries out ``faults`` from the moment it starts: each fault on a thread of its own, its
    start and stop written to the history by ``record(kind, event, target)`` when each really
    happened."""

    def __init__(
        self,
        faults: Sequence[Fault],
        actions: dict[str, tuple[Action, Action]],
        record: Callable[[str, str, str], None],
        stop: threading.Event,
        locks: Mapping[str, threading.RLock] | None = None,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.faults, self.actions, self.record, self.stop = list(faults), actions, record, stop
        #: one lock per target, held while a fault is applied or healed on it (the run holds it
        #: too while it restarts a node): a fault's window starts when the target is really
        #: hit, not while it waits for another fault's healing to finish
        self.locks = locks or {}
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.done: list[Fault] = []

    def run(self) -> None:
        start = time.monotonic()
        for fault in self.faults:
            if self.stop.wait(max(0.0, start + fault.at - time.monotonic())):
                break
            thread = threading.Thread(target=self._one, args=(fault,), name=f"fault-{fault.kind}", daemon=True)
            thread.start()
            self.threads.append(thread)
        for thread in self.threads:
            thread.join()

    def _one(self, fault: Fault) -> None:
        apply, heal = self.actions[fault.kind]
        lock = self.locks.get(fault.target) or threading.RLock()
        # the window is written around the fault: it starts before the signal or the cut, and
        # stops once the target is whole again
        try:
            with lock:
                self.record(fault.kind, "start", fault.target)
                apply(fault)
            self.stop.wait(fault.duration)
        except Exception as exc:
            self.errors.append(f"{fault.describe()}: applying: {type(exc).__name__}: {exc}")
        finally:
            with lock:
                try:
                    heal(fault)
                except Exception as exc:
                    self.errors.append(f"{fault.describe()}: healing: {type(exc).__name__}: {exc}")
                finally:
                    self.record(fault.kind, "stop", fault.target)
                    self.done.append(fault)
