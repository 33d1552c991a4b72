"""The SQS API beside the REST API on one node: the same work in batches of 10, same run.

    scripts/with-services.sh python bench/sqs.py [--n 2000] [--repeat 3]

One node on PostgreSQL + the Redis key-value store. Each round sends N messages in batches of
10, receives them all (10 per call, every message in flight at once) and deletes them in
batches of 10: with boto3 (``send_message_batch`` / ``receive_message`` /
``delete_message_batch``, signed with SigV4, JSON protocol) and with the REST API's batches of
10 (``enqueue`` / ``dequeue`` / ``ack`` on one keep-alive connection). Rounds alternate SQS,
REST, SQS, ... on two queues of the same settings. It prints each phase's rate, the full cycle
and the node's CPU per message (from its own CPU counters), also net of what the idle node
spends over the round's time (measured before the rounds: the slower system's longer rounds
would carry more of the node's housekeeping), with medians and the ratio SQS / REST. It
measures and prints; it never fails on a figure.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import boto3
from botocore.config import Config
from common import BenchNode, exit_on_sigterm, fmt_rate, fmt_ratio, log, median
from throughput_cpu import session_cpu_seconds

BATCH = 10


def chunks(xs: list, n: int):
    for i in range(0, len(xs), n):
        yield xs[i : i + n]


class Sqs:
    name = "sqs (boto3)"

    def __init__(self, node: BenchNode, key_id: str, secret: str, queue: str, path: str) -> None:
        self.client = boto3.client(
            "sqs",
            endpoint_url=node.url + path,
            region_name="us-east-1",
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            config=Config(retries={"max_attempts": 0}, max_pool_connections=1),
        )
        self.url = self.client.get_queue_url(QueueName=queue)["QueueUrl"]

    def send(self, bodies: list[str]) -> None:
        for chunk in chunks(bodies, BATCH):
            r = self.client.send_message_batch(
                QueueUrl=self.url, Entries=[{"Id": str(i), "MessageBody": b} for i, b in enumerate(chunk)]
            )
            assert not r.get("Failed"), r["Failed"]

    def receive(self, n: int) -> list[str]:
        handles: list[str] = []
        while len(handles) < n:
            r = self.client.receive_message(QueueUrl=self.url, MaxNumberOfMessages=BATCH, VisibilityTimeout=600)
            handles += [m["ReceiptHandle"] for m in r.get("Messages", [])]
        return handles

    def delete(self, handles: list[str]) -> None:
        for chunk in chunks(handles, BATCH):
            r = self.client.delete_message_batch(
                QueueUrl=self.url, Entries=[{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(chunk)]
            )
            assert not r.get("Failed"), r["Failed"]


class Rest:
    name = "REST API"

    def __init__(self, node: BenchNode, queue: str) -> None:
        self.node, self.queue, self.conn = node, queue, node.connection()

    def _post(self, action: str, payload: dict, ok: int) -> dict:
        path = f"/api/v1/queues/{self.queue}/{action}"
        try:
            status, data = self.node.api("POST", path, payload, conn=self.conn)
        except (ConnectionError, http.client.HTTPException):  # the server closed an idle keep-alive
            self.conn.close()
            self.conn = self.node.connection()
            status, data = self.node.api("POST", path, payload, conn=self.conn)
        assert status == ok, (status, data[:300])
        return json.loads(data)

    def send(self, bodies: list[str]) -> None:
        for chunk in chunks(bodies, BATCH):
            self._post("enqueue", {"messages": [{"body": b} for b in chunk]}, 201)

    def receive(self, n: int) -> list[tuple[str, str]]:
        handles: list[tuple[str, str]] = []
        while len(handles) < n:
            r = self._post("dequeue", {"max": BATCH, "visibility_timeout": 600, "wait": 0}, 200)
            handles += [(m["id"], m["receipt"]) for m in r["messages"]]
        return handles

    def delete(self, handles: list) -> None:
        for chunk in chunks(handles, BATCH):
            r = self._post("ack", {"messages": [{"id": i, "receipt": rc} for i, rc in chunk]}, 200)
            assert r["acked"] == len(chunk), r


def node_cpu(pid: int) -> float:
    """CPU seconds of every process of the node (runnode leads a session of its own: its
    serving processes and its worker are in it)."""
    return session_cpu_seconds(pid)


def idle_rate(pid: int, seconds: float) -> float:
    """The node's CPU seconds a second while no call comes (its housekeeping: heartbeat,
    leases, the queues read again, figures published)."""
    cpu0, t0 = node_cpu(pid), time.perf_counter()
    time.sleep(seconds)
    return (node_cpu(pid) - cpu0) / (time.perf_counter() - t0)


def one_round(system, n: int, pid: int, idle: float = 0.0) -> dict[str, float]:
    """Rates of each phase and the node's CPU a message; ``node_net_us`` less what the idle
    node (``idle`` CPU seconds a second) would have spent over the round's time, so that the
    slower of two systems is not charged the housekeeping of its longer rounds."""
    bodies = [f"m{i:06d}-" + "x" * 90 for i in range(n)]
    cpu0, t0 = node_cpu(pid), time.perf_counter()
    system.send(bodies)
    t1 = time.perf_counter()
    handles = system.receive(n)
    t2 = time.perf_counter()
    system.delete(handles)
    t3 = time.perf_counter()
    cpu = node_cpu(pid) - cpu0
    return {
        "send": n / (t1 - t0),
        "receive": n / (t2 - t1),
        "delete": n / (t3 - t2),
        "cycle": n / (t3 - t0),
        "node_us": cpu / n * 1e6,
        "node_net_us": max(0.0, cpu - idle * (t3 - t0)) / n * 1e6,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000, help="messages per round")
    p.add_argument("--repeat", type=int, default=3, help="timed rounds per API (medians printed)")
    p.add_argument("--sqs-path", default="/sqs", help="the SQS endpoint's path on the node")
    p.add_argument("--idle", type=float, default=5.0, help="seconds the idle node's CPU is measured over")
    p.add_argument("--redis-url", default=os.environ.get("MQ_TEST_REDIS_URL", "redis://127.0.0.1:63799"))
    p.add_argument("--pg-url", default=os.environ.get("MQ_TEST_PG_URL", "postgres://mq:mq@127.0.0.1:54329/mq"))
    p.add_argument("--kv-redis-db", type=int, default=1)
    a = p.parse_args(argv)

    node = BenchNode(
        "node", "redis", database_url=a.pg_url, redis_url=a.redis_url, kv_redis_db=a.kv_redis_db, user="mqbench-sqs"
    )
    node.start()
    queues: dict[str, str] = {}
    try:
        key_id, secret = node.sqs_key("bench/sqs.py")
        tag = uuid.uuid4().hex[:6]
        queues.update(sqs=f"bench-sqs-{tag}", rest=f"bench-rest-{tag}")
        for q in queues.values():
            status, body = node.api("POST", "/api/v1/queues", {"name": q, "partitions": 4})
            assert status == 201, body
        time.sleep(2)  # the node claims the partitions
        systems = [Sqs(node, key_id, secret, queues["sqs"], a.sqs_path), Rest(node, queues["rest"])]
        for s in systems:  # warm-up
            one_round(s, min(a.n, 200), node.pid)
        idle = idle_rate(node.pid, a.idle)
        log(f"idle node: {idle * 1e3:.1f} ms of CPU a second")
        results: dict[str, list[dict]] = {s.name: [] for s in systems}
        for r in range(a.repeat):
            for s in systems:
                fig = one_round(s, a.n, node.pid, idle)
                results[s.name].append(fig)
                log(
                    f"round {r + 1}/{a.repeat} {s.name}: send {fmt_rate(fig['send'])}/s  receive "
                    f"{fmt_rate(fig['receive'])}/s  delete {fmt_rate(fig['delete'])}/s  cycle "
                    f"{fmt_rate(fig['cycle'])}/s  node CPU {fig['node_us']:.0f} us/msg "
                    f"({fig['node_net_us']:.0f} net of idle)"
                )
    finally:
        # (a queue left behind would be the next run's: its node would hold its partitions too)
        for q in queues.values():
            node.api("DELETE", f"/api/v1/queues/{q}")
        node.stop()

    keys = ["send", "receive", "delete", "cycle", "node_us", "node_net_us"]
    med = {name: {k: median([f[k] for f in figs]) for k in keys} for name, figs in results.items()}
    print()
    print(f"SQS API vs REST API, batches of {BATCH}, N={a.n:,} per round, {a.repeat} rounds each (medians), one node")
    print(
        f"{'':14}{'send/s':>10}{'receive/s':>11}{'delete/s':>10}{'cycle/s':>10}{'node µs/msg':>13}{'net of idle':>13}"
    )
    for name, m_ in med.items():
        print(
            f"{name:14}{fmt_rate(m_['send']):>10}{fmt_rate(m_['receive']):>11}{fmt_rate(m_['delete']):>10}"
            f"{fmt_rate(m_['cycle']):>10}{m_['node_us']:>13.0f}{m_['node_net_us']:>13.0f}"
        )
    s, r = med["sqs (boto3)"], med["REST API"]
    print(
        f"{'sqs / rest':14}{fmt_ratio(s['send'], r['send']):>10}{fmt_ratio(s['receive'], r['receive']):>11}"
        f"{fmt_ratio(s['delete'], r['delete']):>10}{fmt_ratio(s['cycle'], r['cycle']):>10}"
        f"{fmt_ratio(s['node_us'], r['node_us']):>13}{fmt_ratio(s['node_net_us'], r['node_net_us']):>13}"
    )
    print(f"idle node: {idle * 1e3:.1f} ms of CPU a second (measured over {a.idle:g} s before the rounds)")
    print("client: one boto3 client / one keep-alive http.client connection, in this process, on the same machine")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
