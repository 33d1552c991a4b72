#!/usr/bin/env python
"""A node's housekeeping CPU: the thread CPU of each step of one pass (``NodeRuntime.tick``,
once a heartbeat) for a number of queues this process serves, with every partition's figures
due to be written (as on a busy node, where they change at every pass) and every lease due to
be renewed (each is every third of its period: with the default 10 s, a third of them a pass).

It MEASURES AND PRINTS; it never passes or fails. The pass runs whatever the load, once a
heartbeat (``NODE_HEARTBEAT``, 1 s by default) in every process of a node, so its cost per
second is a share of a core taken from serving. The steps are those of ``tick``:
``_update_cooling``, ``renew`` (heartbeat and leases), ``refresh_queues`` (the queues' rows),
``_drop_stale``, ``_claim_partitions`` and ``_publish_stats`` (the partitions' figures).

Run it on the stores a node would use, e.g. with the test services::

    scripts/with-services.sh python bench/housekeeping.py --queues 8 --partitions 8

It uses ``DATABASE_URL`` (migrated here) and ``REDIS_URL``'s database 1 for ``--kv redis``, as
``bench/inprocess.py`` does; the queues it makes are deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import inprocess
from common import exit_on_sigterm

STEPS = ("_update_cooling", "renew", "refresh_queues", "_drop_stale", "_claim_partitions", "_publish_stats")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--kv", choices=("redis", "redis-cluster", "postgres", "file"), default="redis")
    p.add_argument("--queues", type=int, default=1)
    p.add_argument("--partitions", type=int, default=8, help="partitions per queue")
    p.add_argument("--passes", type=int, default=20, help="timed passes (medians printed)")
    args = p.parse_args()
    inprocess.setup(args.kv)

    from queues import service
    from queues.cluster.node import NodeRuntime
    from queues.http.auth import SYSTEM
    from queues.models import Queue
    from queues.service import descriptions

    # A runtime without its own housekeeping and lease threads: this process runs the passes it
    # times, and nothing else runs one beside them.
    rt = NodeRuntime("bench-housekeeping", background=False).start()
    service.set_runtime(rt)
    names = [f"housekeeping-{os.getpid()}-{i}" for i in range(args.queues)]
    try:
        for name in names:
            descriptions.create_queue(caller=SYSTEM, name=name, partitions=args.partitions)
        want = args.queues * args.partitions
        deadline = time.monotonic() + 60
        while sum(len(rt.local_managers(n)) for n in names) < want:
            if time.monotonic() > deadline:
                sys.exit(f"the node did not claim the {want} partitions within 60 s")
            rt.tick()
            time.sleep(0.1)
        spent: dict[str, list[float]] = {step: [] for step in STEPS}
        for _ in range(args.passes):
            rt._published.clear()  # every partition's figures due, as on a busy node
            for m in list(rt.managers.values()):  # and every lease's renewal (a third come due a pass)
                m.lease.renewed_at -= m.lease.period
            for step in STEPS:
                started = time.thread_time()
                getattr(rt, step)()
                spent[step].append(time.thread_time() - started)
        medians = {step: statistics.median(s) * 1e3 for step, s in spent.items()}
        steps = ", ".join(f"{step.lstrip('_')} {ms:.2f}" for step, ms in medians.items())
        print(
            f"kv={args.kv} {args.queues} queue(s) x {args.partitions} partitions: one pass "
            f"{sum(medians.values()):.1f} ms of thread CPU ({steps} ms; medians of {args.passes})"
        )
    finally:
        try:
            for name in names:
                try:
                    q = Queue.objects.filter(name=name).first()
                    if q is not None:
                        descriptions.delete_queue(q, caller=SYSTEM)
                except Exception as exc:
                    print(f"could not delete queue {name}: {exc}", file=sys.stderr)
        finally:
            rt.stop(release=True)


if __name__ == "__main__":
    exit_on_sigterm()
    main()
