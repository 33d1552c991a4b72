#!/usr/bin/env python
"""What a forwarded call costs the node that forwards it: the thread CPU of one call to another
node (``queues.api.peers.HttpPeers``: sign, send, read the answer), on the transport the node
uses (libcurl through pycurl) and on the one it used before (urllib3), side by side.

It MEASURES AND PRINTS; it never passes or fails. A forwarded call is the hot path's extra round
trip wherever a call's partition is served by another process: an ack of a message a sibling
process (``runnode --processes N``) or another node owns, a dequeue that finds nothing here.
This process signs the calls as a node of the same cluster (the same ``CLUSTER_SECRET``) and
sends ``--calls`` dequeues (``max`` 1, wait 0, an empty queue: the answer is ``{"messages":
[]}``) to one node it starts (``manage.py runnode --processes 1``), the transports' rounds
interleaved. Figures: this thread's CPU per call (``time.thread_time``), and wall time per call,
medians over ``--repeat`` rounds after one untimed round.

    scripts/with-services.sh python bench/peers.py --calls 3000 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import BenchNode, exit_on_sigterm, log

REPO = Path(__file__).resolve().parent.parent


class Urllib3Peers:
    """The transport of ``HttpPeers`` before libcurl (its ``post``, as it was)."""

    def __init__(self) -> None:
        import urllib3

        self.urllib3 = urllib3
        self.http = urllib3.PoolManager(num_pools=32, maxsize=16, retries=False)

    def post(self, address: str, path: str, payload: dict, hops: int, caller) -> tuple[int, dict]:
        import orjson

        from queues.api.peers import on_behalf_value
        from queues.cluster import peerauth

        full_path = f"/api/v1/{path}"
        data = orjson.dumps(payload)
        headers = {
            "Content-Type": "application/json",
            **peerauth.sign("POST", full_path, data, hops + 1, on_behalf_value(caller), to=address),
        }
        r = self.http.request(
            "POST",
            f"http://{address}{full_path}",
            body=data,
            headers=headers,
            timeout=self.urllib3.Timeout(connect=1.0, read=10.0),
        )
        return r.status, orjson.loads(r.data) if r.data else {}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--calls", type=int, default=3000, help="forwarded calls per transport and round")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--kv-redis-db", type=int, default=1, help="the Redis database of the node's store")
    args = p.parse_args()
    database_url, redis_url = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
    if not database_url or not redis_url:
        sys.exit("needs DATABASE_URL and REDIS_URL (scripts/with-services.sh sets them)")
    secret = secrets.token_urlsafe(32)
    os.environ.update(CLUSTER_SECRET=secret, MQ_DATA_DIR=tempfile.mkdtemp(prefix="mqbench-peers-"))
    node = BenchNode(
        "peers",
        "redis",
        database_url=database_url,
        redis_url=redis_url,
        kv_redis_db=args.kv_redis_db,
        processes=1,
        extra_env=[f"CLUSTER_SECRET={secret}"],
    )
    node.start()
    try:
        sys.path.insert(0, str(REPO))
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        import django

        django.setup()
        from django.contrib.auth import get_user_model

        from queues.access import Caller
        from queues.api.peers import HttpPeers

        user = get_user_model().objects.get(username=node.user)
        caller, address = Caller.of(user), f"127.0.0.1:{node.port}"
        queue = f"peers-{secrets.token_hex(4)}"
        status, raw = node.api("POST", "/api/v1/queues", {"name": queue, "partitions": 1})
        if status != 201:
            sys.exit(f"creating {queue}: {status} {raw[:300]!r}")
        transports = {"pycurl (now)": HttpPeers(), "urllib3 (before)": Urllib3Peers()}
        payload = {"max": 1, "wait": 0}
        for peers in transports.values():  # the first answers may wait for the queue's partition
            for _ in range(50):
                if peers.post(address, f"queues/{queue}/dequeue", payload, 0, caller)[0] == 200:
                    break
                time.sleep(0.1)
        cpu: dict[str, list[float]] = {n: [] for n in transports}
        wall: dict[str, list[float]] = {n: [] for n in transports}
        for rnd in range(args.repeat + 1):
            for name, peers in transports.items():
                c0, w0 = time.thread_time(), time.perf_counter()
                for _ in range(args.calls):
                    status, body = peers.post(address, f"queues/{queue}/dequeue", payload, 0, caller)
                    if status != 200:
                        sys.exit(f"{name}: {status} {body}")
                c1, w1 = time.thread_time(), time.perf_counter()
                if rnd:  # round 0 warms up
                    cpu[name].append((c1 - c0) / args.calls * 1e6)
                    wall[name].append((w1 - w0) / args.calls * 1e6)
                    log(
                        f"{name} round {rnd}/{args.repeat}: {cpu[name][-1]:.1f} µs CPU, {wall[name][-1]:.1f} µs wall a call"
                    )
        print(
            f"\nforwarded call (a signed dequeue, empty answer), {args.calls} a round, medians of {args.repeat} rounds"
        )
        print(f"{'transport':<18} {'CPU µs/call':>12} {'wall µs/call':>13}")
        for name in transports:
            print(f"{name:<18} {statistics.median(cpu[name]):>12.1f} {statistics.median(wall[name]):>13.1f}")
        first, second = (statistics.median(cpu[n]) for n in transports)
        print(f"ratio CPU now / before: {first / second:.3f}x")
        node.api("DELETE", f"/api/v1/queues/{queue}")
    finally:
        node.stop()


if __name__ == "__main__":
    exit_on_sigterm()
    main()
