#!/usr/bin/env python
"""Enqueue-to-receive latency under a steady load, on nodes of 1, 2, ... processes.

It MEASURES AND PRINTS; it never passes or fails.

A run, on a fresh queue of --partitions partitions (4), once every partition has an owner:
  - one producer thread sends --rate single messages a second (500) for --seconds (12) over one
    keep-alive connection, each body carrying its send time;
  - --consumers threads (2) long-poll (``max`` --max, ``wait`` --wait: 10 and 5) on keep-alive
    connections of their own, and ack what they get (one call per dequeue, with the receipts);
  - a message's latency is the time from its send to the return of the dequeue that brought it,
    both read on this machine's monotonic clock; the messages sent in the first --warmup seconds
    (2) are left out.
Figures per run: p50, p99 and max latency, the messages measured, and those never received
(within 10 s of the last send). Where the connections are is printed too: a node of several
processes hands each new connection to one of them, and a process serving a long poll may leave a
sibling's messages waiting. ``--placement apart`` puts the producer's connection on one process and
every consumer's on another (new connections until the kernel does), the case where that shows.

--runs runs (10) per node; one node per count of --node-processes (1,2), started as
bench/throughput.py starts its nodes (bench/common.py: migrate, a staff user and token,
``manage.py runnode --processes N``) on --backend (redis) with PostgreSQL as the database. A
table per count, its summary line (median p50 and p99 over the runs, worst p99), and the summary
lines together at the end.

Examples:
  scripts/with-services.sh python bench/latency.py
  scripts/with-services.sh python bench/latency.py --runs 3 --node-processes 1,2
  scripts/with-services.sh python bench/latency.py --rate 200 --seconds 6 --node-processes 2 --placement apart
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import REPO, BenchError, BenchNode, exit_on_sigterm, log, median, redact

#: Seconds a run waits, after its last send, for the messages still out.
DRAIN_S = 10.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Enqueue-to-receive latency under a steady load (measures and prints, never fails).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--rate", type=float, default=500, help="messages the producer sends a second, one a call")
    p.add_argument("--seconds", type=float, default=12, help="how long the producer sends")
    p.add_argument("--warmup", type=float, default=2, help="seconds of sends left out of the figures")
    p.add_argument("--consumers", type=int, default=2, help="consumer threads, each on a keep-alive connection")
    p.add_argument("--max", type=int, default=10, help="max of each dequeue")
    p.add_argument("--wait", type=float, default=5, help="wait of each dequeue (a long poll)")
    p.add_argument("--visibility", type=float, default=30, help="visibility timeout of each dequeue")
    p.add_argument("--partitions", type=int, default=4, help="partitions of each run's queue")
    p.add_argument(
        "--placement",
        choices=("kernel", "apart"),
        default="kernel",
        help="where the connections go on a node of several processes: where the kernel puts them, or "
        "the producer's on one process and every consumer's on another (the case where a process's "
        "long polls can leave a sibling's messages waiting)",
    )
    p.add_argument("--runs", type=int, default=10, help="runs per node")
    p.add_argument(
        "--node-processes", default="1,2", metavar="N[,N...]", help="a node per count: runnode --processes N"
    )
    p.add_argument("--backend", default="redis", help="the nodes' key-value store: redis, postgres, file")
    p.add_argument("--redis-url", default=os.environ.get("MQ_TEST_REDIS_URL", "redis://127.0.0.1:63799"))
    p.add_argument("--pg-url", default=os.environ.get("MQ_TEST_PG_URL", "postgres://mq:mq@127.0.0.1:54329/mq"))
    p.add_argument("--database-url", default=None, help="DATABASE_URL of the nodes (default: --pg-url)")
    p.add_argument("--kv-redis-db", type=int, default=1, help="Redis DB number of the redis store")
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE", help="extra env of the nodes")
    p.add_argument("--startup-timeout", type=float, default=90)
    p.add_argument("--keep-tmp", action="store_true", help="keep the nodes' temp dirs (logs)")
    p.add_argument("--json", metavar="OUT.json", help="write every run's figures here")
    a = p.parse_args(argv)
    a.database_url = a.database_url or a.pg_url
    try:
        a.counts = [int(x) for x in a.node_processes.split(",") if x.strip()]
    except ValueError:
        p.error(f"--node-processes: a comma list of counts, not {a.node_processes!r}")
    if not a.counts or min(a.counts) < 1:
        p.error("--node-processes: counts of 1 or more")
    if a.warmup >= a.seconds:
        p.error("--warmup must be shorter than --seconds")
    return a


# --- one run ----------------------------------------------------------------------------------
@dataclass
class Run:
    run: int
    processes: int
    sent: int = 0
    measured: list[float] = field(default_factory=list)  # seconds, after the warm-up
    lost: int = 0
    refused: int = 0
    errors: list[str] = field(default_factory=list)
    send_rate: float = 0.0
    placement: str = ""

    def pct(self, q: float) -> float | None:
        if not self.measured:
            return None
        xs = sorted(self.measured)
        return xs[min(len(xs) - 1, int(len(xs) * q))]

    def figures(self) -> dict:
        return {
            "run": self.run,
            "processes": self.processes,
            "p50_ms": ms(self.pct(0.5)),
            "p99_ms": ms(self.pct(0.99)),
            "max_ms": ms(max(self.measured) if self.measured else None),
            "messages": len(self.measured),
            "sent": self.sent,
            "lost": self.lost,
            "refused": self.refused,
            "send_rate": round(self.send_rate, 1),
            "placement": self.placement,
            "errors": self.errors[:5],
        }


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def call(
    node: BenchNode, conn: http.client.HTTPConnection, method: str, path: str, payload: dict | None = None
) -> tuple[int, dict | None]:
    """One call on the kept-alive ``conn``; reconnects once if the node closed it between calls."""
    for attempt in (1, 2):
        try:
            status, raw = node.api(method, path, payload, conn=conn)
            return status, (json.loads(raw) if raw else None)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            conn.close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def process_of(port: int, pids: list[int], conn: http.client.HTTPConnection) -> int | None:
    """The pid of the node's process holding ``conn`` (``/proc/net/tcp`` and the processes' fds)."""
    if conn.sock is None:
        return None
    client_port = conn.sock.getsockname()[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) == port and int(f[2].split(":")[1], 16) == client_port and f[3] == "01":
            inode = f"socket:[{f[9]}]"
    if inode is None:
        return None
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    if os.readlink(fd) == inode:
                        return pid
                except OSError:
                    continue
        except OSError:
            continue
    return None


def placement(
    node: BenchNode, producer: http.client.HTTPConnection, consumers: list[http.client.HTTPConnection]
) -> str:
    """Which process holds each connection: ``P:a C:a,b``, the processes lettered in pid order."""
    assert node.process is not None
    pids = sorted(node.process.member_pids())
    names = {pid: chr(ord("a") + i) for i, pid in enumerate(pids)}

    def name(conn: http.client.HTTPConnection) -> str:
        pid = process_of(node.port, pids, conn)
        return "?" if pid is None else names.get(pid, "?")

    return f"P:{name(producer)} C:{','.join(name(c) for c in consumers)}"


def connected(node: BenchNode, timeout: float) -> tuple[http.client.HTTPConnection, int | None]:
    """A new connection, used once (so that the process holding it can be seen), and that process."""
    assert node.process is not None
    conn = node.connection(timeout)
    call(node, conn, "GET", "/api/v1/healthz")
    return conn, process_of(node.port, node.process.member_pids(), conn)


def connections(
    args: argparse.Namespace, node: BenchNode, processes: int
) -> tuple[http.client.HTTPConnection, list[http.client.HTTPConnection]]:
    """The producer's connection and the consumers'. ``--placement kernel``: where the kernel
    puts them; ``apart`` (on a node of several processes): new connections until the producer's
    is on one process and every consumer's on another, the same for all."""
    producer, producer_pid = connected(node, 30)
    consumers = [connected(node, args.wait + 30) for _ in range(args.consumers)]
    if args.placement == "kernel" or processes < 2:
        return producer, [c for c, _ in consumers]
    target: int | None = None
    placed = []
    for conn, pid in consumers:
        for _ in range(60):
            if pid is not None and pid != producer_pid and target in (None, pid):
                break
            conn.close()
            conn, pid = connected(node, args.wait + 30)
        else:
            log(f"no connection landed apart from the producer's in 60 tries; consumer on {pid}")
        target = target or pid
        placed.append(conn)
    return producer, placed


def wait_for_owners(node: BenchNode, queue: str, processes: int, timeout: float = 30) -> None:
    """Until every partition of ``queue`` has an owner and as many processes own some as can."""
    deadline = time.monotonic() + timeout
    seen: list = []
    while time.monotonic() < deadline:
        status, raw = node.api("GET", f"/api/v1/queues/{queue}/partitions")
        if status == 200:
            seen = [p["owner_id"] for p in json.loads(raw)["partitions"]]
            if seen and None not in seen and len(set(seen)) >= min(processes, len(seen)):
                return
        time.sleep(0.1)
    log(f"{queue}: partitions not served by every process after {timeout} s (owners: {seen}); running anyway")


def one_run(args: argparse.Namespace, node: BenchNode, processes: int, index: int) -> Run:
    run = Run(index, processes)
    queue = f"latency-{uuid.uuid4().hex[:10]}"
    status, raw = node.api("POST", "/api/v1/queues", {"name": queue, "partitions": args.partitions})
    if status != 201:
        raise BenchError(f"create {queue}: {status} {raw[:300]!r}")
    wait_for_owners(node, queue, processes)
    path = f"/api/v1/queues/{queue}"
    producer_conn, consumer_conns = connections(args, node, processes)
    run.placement = placement(node, producer_conn, consumer_conns)

    total = int(args.rate * args.seconds)
    received: dict[int, float] = {}
    lock = threading.Lock()
    produced = threading.Event()
    done = threading.Event()
    start = time.monotonic() + 0.2  # the consumers are polling by then

    def produce() -> None:
        sent = 0
        try:
            for i in range(total):
                delay = start + i / args.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                body = json.dumps({"i": i, "t": time.monotonic()})
                status, answer = call(node, producer_conn, "POST", f"{path}/enqueue", {"body": body})
                sent += 1
                if status not in (200, 201):
                    run.refused += 1
                    if len(run.errors) < 5:
                        run.errors.append(f"enqueue {status}: {answer}")
        except Exception as exc:  # printed with the run
            run.errors.append(f"producer: {exc!r}")
        finally:
            run.sent = sent
            run.send_rate = sent / max(time.monotonic() - start, 1e-9)
            produced.set()

    def consume(conn: http.client.HTTPConnection) -> None:
        payload = {"max": args.max, "wait": args.wait, "visibility_timeout": args.visibility}
        try:
            while not done.is_set():
                status, answer = call(node, conn, "POST", f"{path}/dequeue", payload)
                now = time.monotonic()
                if status != 200 or answer is None:
                    run.errors.append(f"dequeue {status}: {answer}")
                    time.sleep(0.05)
                    continue
                got = answer["messages"]
                with lock:
                    for d in got:
                        sent = json.loads(d["body"])
                        received.setdefault(sent["i"], now - sent["t"])
                    if produced.is_set() and len(received) >= run.sent - run.refused:
                        done.set()
                if got:
                    items = [{"id": d["id"], "receipt": d["receipt"]} for d in got]
                    status, answer = call(node, conn, "POST", f"{path}/ack", {"messages": items})
                    if status != 200:
                        run.errors.append(f"ack {status}: {answer}")
        except Exception as exc:  # printed with the run
            run.errors.append(f"consumer: {exc!r}")

    threads = [threading.Thread(target=consume, args=(c,), daemon=True) for c in consumer_conns]
    threads.append(threading.Thread(target=produce, daemon=True))
    for t in threads:
        t.start()
    produced.wait(args.seconds * 3 + 60)
    done.wait(DRAIN_S)
    done.set()
    for t in threads:
        t.join(args.wait + 10)
    for c in [producer_conn, *consumer_conns]:
        c.close()
    first_measured = int(args.rate * args.warmup)
    run.measured = [age for i, age in received.items() if i >= first_measured]
    run.lost = run.sent - run.refused - len(received)
    status, raw = node.api("DELETE", path)
    if status not in (200, 204):
        log(f"delete {queue}: {status} {raw[:200]!r}")
    return run


# --- report -----------------------------------------------------------------------------------
def fmt_ms(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.1f} ms" if x < 100 else f"{x:,.0f} ms"


def summary_line(processes: int, runs: list[Run]) -> str:
    p50s = [ms(r.pct(0.5)) for r in runs]
    p99s = [ms(r.pct(0.99)) for r in runs]
    worst = max((x for x in p99s if x is not None), default=None)
    return (
        f"{processes} process{'es' if processes > 1 else ''}: median p50 {fmt_ms(median(p50s))}, "
        f"median p99 {fmt_ms(median(p99s))}, worst p99 {fmt_ms(worst)} ({len(runs)} runs)"
    )


def print_table(processes: int, runs: list[Run], rate: float) -> None:
    print(f"\n### node of {processes} process{'es' if processes > 1 else ''}\n")
    print("| run | p50 | p99 | max | messages | lost | sent/s | connections |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in runs:
        print(
            f"| {r.run} | {fmt_ms(ms(r.pct(0.5)))} | {fmt_ms(ms(r.pct(0.99)))} | "
            f"{fmt_ms(ms(max(r.measured)) if r.measured else None)} | {len(r.measured):,} | {r.lost} | "
            f"{r.send_rate:,.0f} | {r.placement} |"
        )
    for r in runs:
        for e in r.errors[:3]:
            print(f"run {r.run}: {e}")
    short = [r.run for r in runs if r.send_rate < 0.95 * rate]
    if short:
        print(
            f"\nthe producer sent under 95% of {rate:g} msg/s in run(s) {', '.join(map(str, short))}: "
            "those figures are of a lighter load (a busy machine: each call waits for the one before)"
        )
    print(f"\n{summary_line(processes, runs)}")
    sys.stdout.flush()


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        )
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"# latency: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, commit {commit()}, {os.cpu_count()} CPUs, "
        f"{platform.platform()}, Python {platform.python_version()}"
    )
    print(
        f"one producer at {args.rate:g} msg/s for {args.seconds:g} s (warm-up {args.warmup:g} s), "
        f"{args.consumers} consumers (max {args.max}, wait {args.wait:g}), {args.partitions} partitions, "
        f"KV {args.backend}, database {redact(args.database_url)}; connections ({args.placement}): "
        "P producer, C consumers, on the node's processes a, b, ... (in pid order)"
    )
    sys.stdout.flush()
    results: dict[int, list[Run]] = {}
    for processes in args.counts:
        node = BenchNode(
            f"ours[{args.backend},p{processes}]",
            args.backend,
            database_url=args.database_url,
            redis_url=args.redis_url,
            kv_redis_db=args.kv_redis_db,
            extra_env=args.node_env,
            startup_timeout=args.startup_timeout,
            keep_tmp=args.keep_tmp,
            processes=processes,
        )
        try:
            node.start()
            runs = results.setdefault(processes, [])
            for i in range(1, args.runs + 1):
                run = one_run(args, node, processes, i)
                log(
                    f"{node.name} run {i}: p50 {fmt_ms(ms(run.pct(0.5)))}, p99 {fmt_ms(ms(run.pct(0.99)))}, "
                    f"{len(run.measured)} messages, {run.lost} lost, {run.placement}"
                )
                runs.append(run)
        except BenchError as exc:
            log(f"{node.name}: {exc}\n{node.log_tail()}")
        finally:
            node.stop()
        if results.get(processes):
            print_table(processes, results[processes], args.rate)
    print("\n## summary\n")
    for processes, runs in results.items():
        print(summary_line(processes, runs))
    if args.json:
        doc = {
            "commit": commit(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cpus": os.cpu_count(),
            "config": {k: v for k, v in vars(args).items() if k != "counts"}
            | {"pg_url": redact(args.pg_url), "database_url": redact(args.database_url)},
            "runs": [r.figures() for runs in results.values() for r in runs],
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
