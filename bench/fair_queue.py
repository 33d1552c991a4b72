#!/usr/bin/env python
"""Fair queues: how long the quiet tenants' messages wait while one tenant floods the queue.

It MEASURES AND PRINTS; it never passes or fails.

A run sends, for --seconds (20), --groups (10) tenants' messages to a fresh queue of
--partitions partitions (4): each tenant --rate messages a second, except the first, which sends
--flood (10) times as many; --consumers threads (4) each dequeue up to --max (10), handle each
message for --handler-ms (5 ms: a sleep), and ack them together. The offered load is --load (0.9)
of what the consumers process: before the runs, the same consumers drain a backlog of
--calibrate seconds' worth of messages (at ``consumers * 1000 / handler_ms`` a second, what
they could handle if calls cost nothing), and their rate sets --rate unless given; their calls'
round trips count, so the load is the one they meet. A message's dwell time is from its send to the return of the
dequeue that brought it (this machine's monotonic clock); the first --warmup seconds (3) are left
out. Three cases, side by side in each run:

- ``baseline``: every tenant at --rate, the flood's extra load left out, with fairness keys;
- ``fair``: the flood on, each message's ``fairness_key`` its tenant (an SQS fair queue's
  ``MessageGroupId``);
- ``fifo``: the same traffic as ``fair``, sent without keys (one first-come, first-served order).

Figures: the quiet tenants' p50 and p99 dwell per case, the flood's, messages measured and
lost, and the ratios ``fair / baseline`` and ``fifo / baseline`` of the quiet tenants' p99. --runs
runs (3) on one node started as bench/throughput.py starts its nodes (bench/common.py), on
--backend (redis) with PostgreSQL as the database.

Examples:
  scripts/with-services.sh python bench/fair_queue.py
  scripts/with-services.sh python bench/fair_queue.py --runs 1 --seconds 10 --load 1.2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import BenchError, BenchNode, exit_on_sigterm, log, median
from latency import call, wait_for_owners

#: Seconds a case waits, after its last send, for the messages still queued.
DRAIN_S = 30.0
#: Seconds between two sends of the producer (each one batch of what is due).
TICK_S = 0.02
CASES = ("baseline", "fair", "fifo")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Quiet tenants' dwell time while one floods (measures and prints, never fails).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--groups", type=int, default=10, help="tenants, the first of which floods")
    p.add_argument("--flood", type=float, default=10, help="the flooding tenant's rate, times the others'")
    p.add_argument("--consumers", type=int, default=4, help="consumer threads")
    p.add_argument("--handler-ms", type=float, default=5, help="each message's handling (a sleep)")
    p.add_argument("--max", type=int, default=10, help="messages a dequeue asks for (1-10)")
    p.add_argument("--load", type=float, default=0.9, help="offered load, of the consumers' capacity")
    p.add_argument("--rate", type=float, default=None, help="a quiet tenant's messages a second (else from --load)")
    p.add_argument("--seconds", type=float, default=20, help="how long each case sends")
    p.add_argument("--warmup", type=float, default=3, help="seconds of sends left out of the figures")
    p.add_argument("--partitions", type=int, default=4, help="partitions of each case's queue")
    p.add_argument("--runs", type=int, default=3, help="runs, each of the three cases")
    p.add_argument("--backend", default="redis", help="the node's key-value store: redis, postgres, file")
    p.add_argument("--redis-url", default=os.environ.get("MQ_TEST_REDIS_URL", "redis://127.0.0.1:63799"))
    p.add_argument("--pg-url", default=os.environ.get("MQ_TEST_PG_URL", "postgres://mq:mq@127.0.0.1:54329/mq"))
    p.add_argument("--kv-redis-db", type=int, default=1, help="Redis DB number of the redis store")
    p.add_argument("--calibrate", type=float, default=4, help="seconds of backlog the consumers' rate is measured on")
    p.add_argument("--startup-timeout", type=float, default=90)
    p.add_argument("--json", metavar="OUT.json", help="write every case's figures here")
    a = p.parse_args(argv)
    if a.groups < 2:
        p.error("--groups: 2 or more (one floods)")
    if a.warmup >= a.seconds:
        p.error("--warmup must be shorter than --seconds")
    if not 1 <= a.max <= 10:
        p.error("--max: 1 to 10")
    return a


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))]


def fresh_queue(args: argparse.Namespace, node: BenchNode, tag: str) -> str:
    """A new queue of --partitions partitions, served; its API path."""
    queue = f"fair-{tag}-{uuid.uuid4().hex[:8]}"
    status, raw = node.api("POST", "/api/v1/queues", {"name": queue, "partitions": args.partitions})
    if status != 201:
        raise BenchError(f"create {queue}: {status} {raw[:300]!r}")
    wait_for_owners(node, queue, 1)
    return f"/api/v1/queues/{queue}"


def consume_loop(
    args: argparse.Namespace,
    node: BenchNode,
    path: str,
    on_batch: Callable[[list[dict[str, Any]], float], bool],
    done: threading.Event,
    errors: list[str],
) -> None:
    """One consumer until ``done``: dequeue up to --max, ``on_batch(messages, when received)``
    (True: the case is over), handle each for --handler-ms, ack them together."""
    conn = node.connection(40)
    payload = {"max": args.max, "wait": 1, "visibility_timeout": 60}
    try:
        while not done.is_set():
            status, answer = call(node, conn, "POST", f"{path}/dequeue", payload)
            now = time.monotonic()
            if status != 200 or answer is None:
                errors.append(f"dequeue {status}: {answer}")
                time.sleep(0.05)
                continue
            got = answer["messages"]
            over = on_batch(got, now)
            for _ in got:
                time.sleep(args.handler_ms / 1000)
            if got:
                items = [{"id": d["id"], "receipt": d["receipt"]} for d in got]
                status, answer = call(node, conn, "POST", f"{path}/ack", {"messages": items})
                if status != 200:
                    errors.append(f"ack {status}: {answer}")
            if over:
                done.set()
    except Exception as exc:  # printed with the case
        errors.append(f"consumer: {exc!r}")
    finally:
        conn.close()


def calibrate(args: argparse.Namespace, node: BenchNode) -> float:
    """Messages a second the consumers process, draining a backlog (their calls included)."""
    path = fresh_queue(args, node, "calibrate")
    total = max(100, int(args.calibrate * args.consumers * 1000 / args.handler_ms))
    conn = node.connection(30)
    try:
        for i in range(0, total, 100):
            batch = [{"body": json.dumps({"g": 0, "t": 0})} for _ in range(min(100, total - i))]
            status, answer = call(node, conn, "POST", f"{path}/enqueue", {"messages": batch})
            if status != 201:
                raise BenchError(f"calibrate: enqueue {status}: {answer}")
    finally:
        conn.close()
    errors: list[str] = []
    done = threading.Event()
    lock = threading.Lock()
    received = [0]
    last = [0.0]

    def on_batch(got: list[dict[str, Any]], now: float) -> bool:
        with lock:
            received[0] += len(got)
            last[0] = max(last[0], now + len(got) * args.handler_ms / 1000)
            return received[0] >= total

    started = time.monotonic()
    threads = [
        threading.Thread(target=consume_loop, args=(args, node, path, on_batch, done, errors), daemon=True)
        for _ in range(args.consumers)
    ]
    for t in threads:
        t.start()
    done.wait(DRAIN_S + args.calibrate * 10)
    done.set()
    for t in threads:
        t.join(10)
    node.api("DELETE", path)
    if errors or received[0] < total:
        raise BenchError(f"calibrate: {received[0]} of {total} received; {errors[:3]}")
    return total / (last[0] - started)


def one_case(args: argparse.Namespace, node: BenchNode, case: str) -> dict[str, Any]:
    """One case on a fresh queue: the quiet tenants' and the flood's dwell times (seconds)."""
    path = fresh_queue(args, node, case)
    rates = [args.rate * (args.flood if g == 0 and case != "baseline" else 1) for g in range(args.groups)]
    keyed = case != "fifo"
    dwell: dict[str, list[float]] = {"quiet": [], "flood": []}
    errors: list[str] = []
    sent = [0]
    received = [0]
    lock = threading.Lock()
    produced = threading.Event()
    done = threading.Event()
    start = time.monotonic() + 0.3
    measured_from = start + args.warmup

    def produce() -> None:
        conn = node.connection(30)
        counts = [0] * args.groups
        try:
            while (now := time.monotonic()) < start + args.seconds:
                batch = []
                for g, rate in enumerate(rates):
                    due = int((now - start) * rate) if now > start else 0
                    for _ in range(due - counts[g]):
                        body = json.dumps({"g": g, "t": time.monotonic()})
                        batch.append({"body": body, **({"fairness_key": f"tenant-{g}"} if keyed else {})})
                    counts[g] = max(counts[g], due)
                for i in range(0, len(batch), 100):
                    status, answer = call(node, conn, "POST", f"{path}/enqueue", {"messages": batch[i : i + 100]})
                    if status != 201:
                        errors.append(f"enqueue {status}: {answer}")
                    else:
                        sent[0] += len(batch[i : i + 100])
                time.sleep(TICK_S)
        except Exception as exc:  # printed with the case
            errors.append(f"producer: {exc!r}")
        finally:
            conn.close()
            produced.set()

    def on_batch(got: list[dict[str, Any]], now: float) -> bool:
        for d in got:
            body = json.loads(d["body"])
            if body["t"] >= measured_from:
                with lock:
                    dwell["flood" if body["g"] == 0 else "quiet"].append(now - body["t"])
        with lock:
            received[0] += len(got)
            return produced.is_set() and received[0] >= sent[0]

    def consume() -> None:
        consume_loop(args, node, path, on_batch, done, errors)

    threads = [threading.Thread(target=consume, daemon=True) for _ in range(args.consumers)]
    threads.append(threading.Thread(target=produce, daemon=True))
    for t in threads:
        t.start()
    produced.wait(args.seconds + 60)
    done.wait(DRAIN_S)
    done.set()
    for t in threads:
        t.join(10)
    node.api("DELETE", path)
    return {
        "case": case,
        "quiet_p50_ms": _ms(pct(dwell["quiet"], 0.5)),
        "quiet_p99_ms": _ms(pct(dwell["quiet"], 0.99)),
        "flood_p99_ms": _ms(pct(dwell["flood"], 0.99)),
        "quiet_measured": len(dwell["quiet"]),
        "sent": sent[0],
        "lost": sent[0] - received[0],
        "offered_per_s": round(sum(rates), 1),
        "errors": errors[:3],
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    node = BenchNode(
        "fair",
        args.backend,
        database_url=args.pg_url,
        redis_url=args.redis_url,
        kv_redis_db=args.kv_redis_db,
        startup_timeout=args.startup_timeout,
    )
    every: list[dict[str, Any]] = []
    node.start()
    try:
        if args.rate is None:
            processed = calibrate(args, node)
            args.rate = args.load * processed / (args.groups - 1 + args.flood)
            log(f"fair_queue: the consumers process {processed:.0f} messages a second (a backlog drained)")
        log(
            f"fair_queue: {args.groups} tenants at {args.rate:.1f}/s, one at {args.flood:g}x; {args.consumers} "
            f"consumers of {args.handler_ms:g} ms taking up to {args.max}; load {args.load:g}; "
            f"{args.partitions} partitions; {platform.node()}, {os.cpu_count()} CPUs"
        )
        for run in range(1, args.runs + 1):
            for case in CASES:
                figures = one_case(args, node, case) | {"run": run}
                every.append(figures)
                print(json.dumps(figures), flush=True)
    finally:
        node.stop()
    print()
    print(f"{'case':9} {'quiet p50 ms':>13} {'quiet p99 ms':>13} {'flood p99 ms':>13} {'offered/s':>10} {'lost':>5}")
    summary = {}
    for case in CASES:
        rows = [f for f in every if f["case"] == case]

        def med(key: str, rows: list[dict[str, Any]] = rows) -> float | None:
            values = [r[key] for r in rows if r[key] is not None]
            return float(median(values)) if values else None  # type: ignore[no-untyped-call]

        summary[case] = med("quiet_p99_ms")
        print(
            f"{case:9} {med('quiet_p50_ms')!s:>13} {summary[case]!s:>13} {med('flood_p99_ms')!s:>13} "
            f"{rows[0]['offered_per_s']:>10} {sum(r['lost'] for r in rows):>5}"
        )
    base = summary["baseline"]
    if base:
        for case in ("fair", "fifo"):
            p99 = summary[case]
            if p99 is not None:
                print(f"quiet p99, {case} / baseline: {p99 / base:.2f}x (medians of {args.runs} runs)")
    if args.json:
        Path(args.json).write_text(json.dumps(every, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
