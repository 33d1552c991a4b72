#!/usr/bin/env python
"""Pipeline benchmark: how close does the worker pipeline get to ``slots / T`` messages/s?

It MEASURES AND PRINTS; it never passes or fails.

Workload: every message carries ``estimates = {"preprocess": P, "process": T}`` (P = --pre x
--scale, T = --proc x --scale; default 0.3 / 2.0 x 0.05 = 15 ms / 100 ms) and its handler
sleeps P in pre-processing and T in processing. The same ``workers.pipeline.Pipeline`` drains
--messages of them with --slots slots, once with pipelining (the next message is pre-processed
while the current one is processed) and once without (pre-process, process, take the next).
Throughput = messages / seconds from the first dequeue call to the last ack; each mode is
repeated --repeat times (modes interleaved, after one untimed warm-up round) and medians are
printed beside the ideal ``slots / T`` (processing back to back) and the sequential bound
``slots / (P + T)``. The goal: the pipeline at >= 95 % of the ideal.
With --one-at-a-time a third mode runs the pipeline with neither its short tasks received
ahead nor its acks batched (one message a dequeue, one ack a call), for tasks shorter than a call
(e.g. --scale 0.0005: 1 ms tasks) where those two matter.

Targets:
  (default)  a REAL node over HTTP with the real SDK (mq_client.Client): this script runs
             migrate, creates a bench user + token, starts ``manage.py runnode`` on a free port
             and stops it at the end; one fresh queue per round (deleted afterwards). PostgreSQL
             and Redis must be running, e.g.
               MQ_SERVICES_DIR=/tmp/pb-services MQ_PG_PORT=54349 MQ_REDIS_PORT=63749 scripts/services.sh start
               eval "$(MQ_SERVICES_DIR=/tmp/pb-services MQ_PG_PORT=54349 MQ_REDIS_PORT=63749 scripts/services.sh env)"
               python bench/pipeline.py
  --fake     an in-memory client in this process (no server; --fake-rtt adds a per-call delay).

Besides the rates it prints the median idle gap between one processing's end and the next one's
start (what the pipeline loses against the ideal), the median latency of dequeue and ack calls,
and, on a node, how many attempt records the service stored (one per message expected).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from urllib.parse import urlencode

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import BenchError, BenchNode, exit_on_sigterm, log, median

from tests.stand_ins import FakeMessage
from workers.handlers import Handler
from workers.pipeline import Pipeline


def ts(value: str | None) -> float | None:
    return None if not value else datetime.fromisoformat(value).timestamp()


# --------------------------------------------------------------------------------------
# clients: a timing wrapper, and an in-memory client for --fake
# --------------------------------------------------------------------------------------


class Timed:
    """Wraps a client: when the first dequeue started, when the last ack ended, call latencies,
    and a copy of every attempt record the pipeline sends."""

    def __init__(self, client) -> None:
        self.client = client
        self.lock = threading.Lock()
        self.first_dequeue: float | None = None
        self.last_ack: float | None = None
        self.acked = 0
        self.failed_calls: list[str] = []
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.records: list[dict] = []

    def _timed(self, name: str, fn, *args, **kwargs):
        t0 = time.time()
        with self.lock:
            if name == "dequeue" and self.first_dequeue is None:
                self.first_dequeue = t0
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            with self.lock:
                self.failed_calls.append(f"{name}: {type(exc).__name__}: {exc}")
            raise
        t1 = time.time()
        with self.lock:
            self.latency[name].append(t1 - t0)
        return result, t1

    def dequeue(self, queue, max_messages=1, *, visibility_timeout=None, wait=0, node=None):
        got, _ = self._timed(
            "dequeue",
            self.client.dequeue,
            queue,
            max_messages,
            visibility_timeout=visibility_timeout,
            wait=wait,
            **({"node": node} if node is not None else {}),
        )
        return got

    def ack(self, queue, messages):
        messages = list(messages)
        result, t1 = self._timed("ack", self.client.ack, queue, messages)
        with self.lock:
            self.acked += len(messages)
            self.last_ack = t1
        return result

    def change_visibility(self, queue, message, visibility_timeout):
        return self._timed("visibility", self.client.change_visibility, queue, message, visibility_timeout)[0]

    def send_logs(self, records):
        with self.lock:
            self.records.extend(dict(r) for r in records)
        return self._timed("logs", self.client.send_logs, records)[0]

    def heartbeat(self, payload):
        return self._timed("heartbeat", self.client.heartbeat, payload)[0]


class FakeClient:
    """The pipeline-facing SDK methods over in-memory queues; ``rtt`` seconds per call."""

    def __init__(self, rtt: float = 0.0) -> None:
        self.rtt = rtt
        self.cond = threading.Condition()
        self.ready: dict[str, list[FakeMessage]] = defaultdict(list)
        self.out: dict[str, str] = {}  # id -> receipt

    def create(self, queue: str, n: int, estimates: dict) -> None:
        with self.cond:
            self.ready[queue] = [
                FakeMessage(f"{queue}/0/0/{i}", "", "x", size=1, estimates=dict(estimates)) for i in range(n)
            ]

    def _rtt(self) -> None:
        if self.rtt:
            time.sleep(self.rtt)

    def dequeue(self, queue, max_messages=1, *, visibility_timeout=None, wait=0):
        self._rtt()
        deadline = time.monotonic() + (wait or 0)
        with self.cond:
            while not self.ready[queue] and time.monotonic() < deadline:
                self.cond.wait(deadline - time.monotonic())
            got, self.ready[queue] = self.ready[queue][:max_messages], self.ready[queue][max_messages:]
            got = [replace(m, receipt=uuid.uuid4().hex) for m in got]
            self.out.update((m.id, m.receipt) for m in got)
            return got

    def ack(self, queue, messages):
        self._rtt()
        with self.cond:
            for mid, receipt in messages:
                if self.out.get(mid) == receipt:
                    del self.out[mid]
        return {}

    def change_visibility(self, queue, message, visibility_timeout):
        self._rtt()
        with self.cond:
            if self.out.pop(message.id, None) == message.receipt:
                self.ready[queue].append(replace(message, receive_count=message.receive_count + 1))
                self.cond.notify_all()
        return {}

    def send_logs(self, records):
        self._rtt()
        return {"stored": len(records)}

    def heartbeat(self, payload):
        self._rtt()
        return {"instruction": "continue", "sleep": 0, "extended": [], "lost": []}


# --------------------------------------------------------------------------------------
# a real node: common.BenchNode (migrate, user + token, runnode), and the attempt records it stored
# --------------------------------------------------------------------------------------


def start_node(args) -> BenchNode:
    node = BenchNode(
        "node",
        args.kv,
        database_url=args.database_url,
        redis_url=args.redis_url,
        kv_redis_db=args.kv_redis_db,
        python=args.python,
        port=args.port,
        user=args.user,
        startup_timeout=args.startup_timeout,
        keep_tmp=args.keep_tmp,
    )
    try:
        node.start()
    except BaseException:
        node.stop()
        raise
    return node


#: The most attempt records the service answers a call (``/api/v1/logs``'s ``limit``).
LOGS_LIMIT = 1000


def stored_records(node: BenchNode, queue: str) -> int | None:
    """How many attempt records the node stored for ``queue`` (None if it cannot say)."""
    try:
        status, body = node.api("GET", "/api/v1/logs?" + urlencode({"queue": queue, "limit": LOGS_LIMIT}), timeout=10)
        return len(json.loads(body)["records"]) if status == 200 else None
    except Exception:
        return None


# --------------------------------------------------------------------------------------
# one round
# --------------------------------------------------------------------------------------


class Target:
    """Where rounds run: fresh queues filled with the workload, a client for the pipeline."""

    def __init__(self, args, node: BenchNode | None) -> None:
        self.args = args
        self.node = node
        if node is None:
            self.fake = FakeClient(args.fake_rtt)
        else:
            from mq_client import Client

            self.sdk = Client(node.url, node.token)

    def client(self):
        return self.fake if self.node is None else self.sdk

    def new_queue(self, n: int, pre: float, proc: float) -> str:
        name = f"pipebench-{uuid.uuid4().hex[:10]}"
        estimates = {"preprocess": pre, "process": proc}
        if self.node is None:
            self.fake.create(name, n, estimates)
            return name
        self.sdk.create_queue(name, partitions=self.args.partitions, preprocess_estimate=pre, process_estimate=proc)
        self.sdk.enqueue_many(name, ({"body": f"m{i}", "estimates": estimates} for i in range(n)))
        return name

    def drop_queue(self, name: str) -> None:
        if self.node is not None:
            try:
                self.sdk.delete_queue(name)
            except Exception as exc:
                log(f"delete queue {name}: {exc}")

    def stored_records(self, name: str) -> int | None:
        return None if self.node is None else stored_records(self.node, name)


#: (mode, pipelining, the pipeline's batching: short tasks received ahead, acks batched)
MODES = {
    "pipeline": (True, True),
    "sequential": (False, True),
    "one-at-a-time": (True, False),
}


def run_round(target: Target, args, mode: str, n: int, pre: float, proc: float) -> dict:
    pipelining, batching = MODES[mode]
    queue = target.new_queue(n, pre, proc)
    timed = Timed(target.client())

    def preprocess(message):
        time.sleep(pre)

    def process(message, prepared):
        time.sleep(proc)

    handler = Handler(queue, process, preprocess)
    pipe = Pipeline(
        timed,
        {queue: handler},
        concurrency=args.slots,
        pipelining=pipelining,
        receive_ahead=batching,
        batch_acks=batching,
        wait=args.wait,
        heartbeat_every=args.heartbeat_every,
        name="bench/pipeline.py",
    )
    deadline = time.monotonic() + args.round_timeout
    pipe.start()
    try:
        while timed.acked < n and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        pipe.stop()
    stored = target.stored_records(queue)
    target.drop_queue(queue)
    out = {
        "mode": mode,
        "acked": timed.acked,
        "messages": n,
        "seconds": None,
        "rate": None,
        "failed_calls": timed.failed_calls[:5],
        "stored_records": stored,
        "records": len(timed.records),
    }
    if timed.acked and timed.first_dequeue is not None and timed.last_ack is not None:
        out["seconds"] = timed.last_ack - timed.first_dequeue
        out["rate"] = timed.acked / out["seconds"]
    # idle time of a slot between one processing's end and its next processing's start
    by_worker = sorted(
        (ts(r["process_started_at"]), ts(r["process_ended_at"])) for r in timed.records if r.get("process_started_at")
    )
    gaps = []
    if args.slots == 1:
        gaps = [b[0] - a[1] for a, b in itertools.pairwise(by_worker)]
    out["idle_gap_ms"] = median(gaps) * 1000 if gaps else None
    out["idle_gap_mean_ms"] = statistics.mean(gaps) * 1000 if gaps else None
    out["idle_gap_max_ms"] = max(gaps) * 1000 if gaps else None
    if by_worker and out["seconds"]:
        out["busy_ms"] = sum(e - s for s, e in by_worker) * 1000
        out["startup_ms"] = (by_worker[0][0] - timed.first_dequeue) * 1000
        out["tail_ms"] = (timed.last_ack - by_worker[-1][1]) * 1000
    # pre-processing that ended after the previous processing had ended (the slot waited for it)
    recs = sorted(
        (r for r in timed.records if r.get("preprocess_started_at") and r.get("process_started_at")),
        key=lambda r: ts(r["process_started_at"]),
    )
    out["late_preprocess"] = sum(
        1 for a, b in itertools.pairwise(recs) if ts(b["preprocess_ended_at"]) > ts(a["process_ended_at"]) + 0.001
    )
    out["dequeue_ms"] = (median(timed.latency["dequeue"]) or 0) * 1000
    out["ack_ms"] = (median(timed.latency["ack"]) or 0) * 1000
    return out


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------


def fmt(x, spec=".1f", none="-") -> str:
    return none if x is None else format(x, spec)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pre", type=float, default=0.3, help="pre-processing seconds before --scale")
    p.add_argument("--proc", type=float, default=2.0, help="processing seconds before --scale")
    p.add_argument("--scale", type=float, default=0.05, help="multiplies --pre and --proc")
    p.add_argument("--messages", type=int, default=60, help="messages per timed round")
    p.add_argument("--slots", type=int, default=1, help="the pipeline's concurrency")
    p.add_argument("--repeat", type=int, default=3, help="timed rounds per mode (medians printed)")
    p.add_argument("--warmup", type=int, default=5, help="messages of the untimed warm-up round (0: none)")
    p.add_argument("--wait", type=float, default=1.0, help="the pipeline's long-poll seconds")
    p.add_argument("--heartbeat-every", type=float, default=5.0)
    p.add_argument("--round-timeout", type=float, default=300)
    p.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="also the pipeline with neither receiving ahead nor batched acks (Pipeline(receive_ahead=False, batch_acks=False))",
    )
    p.add_argument("--fake", action="store_true", help="in-memory client, no server")
    p.add_argument("--fake-rtt", type=float, default=0.0, help="--fake: seconds added to every call")
    p.add_argument("--json", metavar="OUT.json", help="write every round and the medians here")
    g = p.add_argument_group("node (without --fake)")
    g.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or os.environ.get("MQ_TEST_PG_URL"))
    g.add_argument("--redis-url", default=os.environ.get("MQ_TEST_REDIS_URL", "redis://127.0.0.1:63799"))
    g.add_argument("--kv", choices=("redis", "postgres", "file"), default="redis", help="the node's KV backend")
    g.add_argument("--kv-redis-db", type=int, default=1)
    g.add_argument("--partitions", type=int, default=4)
    g.add_argument("--python", default=sys.executable, help="python that runs manage.py")
    g.add_argument("--port", type=int, default=0)
    g.add_argument("--user", default="mqbench")
    g.add_argument("--startup-timeout", type=float, default=90)
    g.add_argument("--keep-tmp", action="store_true")
    args = p.parse_args(argv)

    pre, proc = args.pre * args.scale, args.proc * args.scale
    node = None
    rounds: list[dict] = []
    try:
        if not args.fake:
            if not args.database_url:
                raise BenchError('no DATABASE_URL / MQ_TEST_PG_URL (eval "$(scripts/services.sh env)"), or use --fake')
            node = start_node(args)
        target = Target(args, node)
        if args.warmup:
            log(f"warm-up: {args.warmup} messages")
            run_round(target, args, "pipeline", args.warmup, pre, proc)
        modes = ["pipeline", "sequential"] + (["one-at-a-time"] if args.one_at_a_time else [])
        for i in range(args.repeat):
            for mode in modes:
                r = run_round(target, args, mode, args.messages, pre, proc)
                r["round"] = i + 1
                rounds.append(r)
                log(
                    f"round {i + 1} {r['mode']:<10}: {r['acked']}/{r['messages']} acked in "
                    f"{fmt(r['seconds'], '.2f')}s = {fmt(r['rate'], '.2f')} msg/s"
                    + (f"; failed calls: {r['failed_calls']}" if r["failed_calls"] else "")
                )
    except BenchError as exc:
        log(f"ERROR: {exc}")
    finally:
        if node is not None:
            node.stop()

    ideal = args.slots / proc
    seq_bound = args.slots / (pre + proc)
    where = (
        "fake in-memory client" + (f" (+{args.fake_rtt * 1000:.1f} ms/call)" if args.fake_rtt else "")
        if args.fake
        else f"real node over HTTP (KV {args.kv}, SDK mq_client.Client)"
    )
    print()
    print(
        f"Pipeline benchmark: P = {pre * 1000:.1f} ms pre-processing, T = {proc * 1000:.1f} ms processing, "
        f"{args.messages} messages, {args.slots} slot(s), {args.repeat} rounds per mode; {where}"
    )
    print("throughput = acked / (last ack - first dequeue); medians over rounds [min..max]")
    print()
    header = f"{'mode':<28}{'msg/s':>9}{'% of ideal':>12}{'   [min..max] msg/s':<22}{'idle gap':>10}{'dequeue':>9}{'ack':>8}{'logs':>8}"
    print(header)
    print("-" * len(header))
    print(f"{'ideal  slots/T':<28}{ideal:>9.2f}{100.0:>11.1f}%")
    print(f"{'bound  slots/(P+T)':<28}{seq_bound:>9.2f}{100 * seq_bound / ideal:>11.1f}%")
    summary = {}
    labels = {
        "pipeline": "pipeline (pipelining=True)",
        "sequential": "no pipelining",
        "one-at-a-time": "pipeline, one a call",
    }
    for mode, label in labels.items():
        if mode == "one-at-a-time" and not args.one_at_a_time:
            continue
        rs = [r for r in rounds if r["mode"] == mode and r["rate"]]
        rate = median([r["rate"] for r in rs])
        summary[mode] = {
            "rate": rate,
            "ratio_to_ideal": rate / ideal if rate else None,
            "rates": [r["rate"] for r in rs],
        }
        if not rs:
            print(f"{label:<28}{'-':>9}")
            continue
        rng = f"   [{min(r['rate'] for r in rs):.2f}..{max(r['rate'] for r in rs):.2f}]"
        stored = [r["stored_records"] for r in rs if r["stored_records"] is not None]
        # (the service answers at most LOGS_LIMIT records a call: "1000+" is that many or more)
        counted = f"{min(stored)}{'+' if min(stored) >= LOGS_LIMIT else ''}" if stored else None
        logs = f"{counted}/{args.messages}" if stored else f"{min(r['records'] for r in rs)}/{args.messages}"
        print(
            f"{label:<28}{rate:>9.2f}{100 * rate / ideal:>11.1f}%{rng:<22}"
            f"{fmt(median([r['idle_gap_ms'] for r in rs])):>8}ms{fmt(median([r['dequeue_ms'] for r in rs])):>7}ms"
            f"{fmt(median([r['ack_ms'] for r in rs])):>6}ms{logs:>8}"
        )
    p_rate, s_rate = summary["pipeline"]["rate"], summary["sequential"]["rate"]
    print()
    one = summary.get("one-at-a-time", {}).get("rate")
    if p_rate and one:
        print(f"pipeline / one a call (nothing received ahead, acks one a call) = {p_rate / one:.3f}x")
    if p_rate and s_rate:
        print(
            f"pipeline / no pipelining = {p_rate / s_rate:.3f}x; pipeline = {100 * p_rate / ideal:.1f}% of ideal "
            f"(goal >= 95%: {'met' if p_rate >= 0.95 * ideal else 'NOT met'})"
        )
    print(
        "idle gap = median time a slot waits between one processing's end and the next one's start "
        "(1 slot only); dequeue/ack = median call latency; logs = attempt records "
        + ("stored by the service (min over rounds)" if not args.fake else "sent by the pipeline")
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"args": vars(args), "pre": pre, "proc": proc, "ideal": ideal, "rounds": rounds, "summary": summary},
                f,
                indent=2,
                default=str,
            )
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
