"""A node under hostile callers: its memory under a hostile producer and consumers, and other
users' latency while callers holding something cheap (a token with no grants, an access key ID)
trickle bodies or send large ones.

Starts one real node (``common.BenchNode``: migrate, a token, ``manage.py runnode`` through
``tests.launcher.NodeProcess``) and drives it, each phase bounded in count and time, only
against 127.0.0.1:

1. large attributes: batches of 1-character bodies with 16 attributes of 1 KB each (what the
   body cache used to charge 97 bytes for, holding ~18 KB);
2. maximal bodies: batches of 1 MiB bodies (the largest ``max_message_size``) from several
   threads at once, up to the request limit;
3. oversized claims: requests whose Content-Length is far past the limit (refused unread);
4. many consumers: heartbeats under many consumer IDs, each listing the most held IDs;
5. many long polls: far more concurrent ``wait`` dequeues than the cap;
6. a token with no grants trickling 100 bodies to ``POST /api/v1/queues`` (a byte every 2 s);
7. an access key's ID with a made-up, well-formed signature trickling 100 SQS calls;
8. a token with no grants sending 48 bodies of 8 MiB at once, 3 rounds;
9. a connection reused after an answer that left its body unread (405, 401, 413, 415).

Phases 6-9 come from 127.0.0.2 (``tests.hostile``) while another user (127.0.0.1) runs
enqueue-dequeue-ack cycles and ``readyz`` with a 5 s timeout; each prints that user's worst
latency and failures, and phase 8 the node's RSS before, at its peak and 10 s after.

It prints what each phase was answered (status counts) and the node worker's peak RSS
(``VmHWM`` of ``/proc/<pid>/status``) against the stated bound: the RSS after start, plus the
body cache's budget, plus ``--producers`` requests parsed at once at the limit (about 24 times
a request's bytes while orjson builds the objects and the checks copy them). It prints figures;
it does not pass or fail.

    python bench/hostile.py --database-url postgres://... --redis-url redis://127.0.0.1:6379
    python bench/hostile.py --repo /path/to/another/checkout   # the same load on other code
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from bench.common import REPO, BenchNode, log
from tests import hostile

MiB = 1024 * 1024


def worker_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (runnode's granian worker is a child process)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children[int(fields[1])].append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def node_memory(pid: int) -> tuple[int, int]:
    """(current RSS, peak RSS) in bytes of the node's largest process (its worker)."""
    pids = worker_pids(pid)
    peak = max(pids, key=lambda p: status_kib(p, "VmHWM"))
    return status_kib(peak, "VmRSS") * 1024, status_kib(peak, "VmHWM") * 1024


class Api:
    def __init__(self, port: int, token: str, timeout: float = 60):
        self.port, self.token, self.timeout = port, token, timeout

    def post(self, path: str, payload=None, *, raw: bytes | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        body = raw if raw is not None else json.dumps(payload).encode()
        h = {"Authorization": f"Token {self.token}", "Content-Type": "application/json"}
        h.update(headers or {})
        try:
            conn.request("POST", f"/api/v1/{path}", body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
            return r.status, data
        except OSError as exc:
            return f"error:{type(exc).__name__}", b""
        finally:
            conn.close()

    def claim(self, path: str, length: int):
        """A request that says it has ``length`` bytes and sends none: answered unread, or not."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.putrequest("POST", f"/api/v1/{path}")
            conn.putheader("Authorization", f"Token {self.token}")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(length))
            conn.endheaders()
            return conn.getresponse().status
        except OSError as exc:
            return f"error:{type(exc).__name__}"
        finally:
            conn.close()


def run_threads(n: int, target) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def one(k: int) -> None:
        for status in target(k):
            with lock:
                counts[status] += 1

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or os.environ.get("MQ_TEST_PG_URL"))
    p.add_argument("--redis-url", default=os.environ.get("MQ_TEST_REDIS_URL", ""))
    p.add_argument("--kv", choices=("redis", "postgres", "file"), default="redis")
    p.add_argument("--kv-redis-db", type=int, default=7)
    p.add_argument("--repo", default=str(REPO), help="the checkout whose node runs (default: this one)")
    p.add_argument("--producers", type=int, default=4, help="threads sending at once in phases 1-2")
    p.add_argument("--attribute-batches", type=int, default=60, help="phase 1: batches of 400 messages")
    p.add_argument("--body-batches", type=int, default=24, help="phase 2: batches of 7 bodies of 1 MiB")
    p.add_argument("--consumers", type=int, default=300, help="phase 4: consumer IDs heartbeating")
    p.add_argument("--long-polls", type=int, default=200, help="phase 5: concurrent long polls")
    p.add_argument("--poll-wait", type=float, default=5, help="phase 5: each long poll's wait (seconds)")
    p.add_argument("--cache-bytes", type=int, default=64 * MiB, help="the node's NODE_BODY_CACHE_BYTES")
    p.add_argument("--request-bytes", type=int, default=8 * MiB, help="the node's API_MAX_REQUEST_BYTES")
    p.add_argument("--dribblers", type=int, default=100, help="phases 6-7: connections trickling bodies")
    p.add_argument("--big-at-once", type=int, default=48, help="phase 8: 8 MiB bodies sent at once")
    p.add_argument("--big-rounds", type=int, default=3, help="phase 8: rounds of them")
    p.add_argument("--settle", type=float, default=10, help="phase 8: seconds before the RSS after")
    args = p.parse_args(argv)
    if not args.database_url:
        p.error("--database-url (or DATABASE_URL / MQ_TEST_PG_URL) is required")
    node = BenchNode(
        "hostile",
        args.kv,
        database_url=args.database_url,
        redis_url=args.redis_url,
        kv_redis_db=args.kv_redis_db,
        repo=args.repo,
        user=f"hostile-{uuid.uuid4().hex[:6]}",
        extra_env=[f"NODE_BODY_CACHE_BYTES={args.cache_bytes}", f"API_MAX_REQUEST_BYTES={args.request_bytes}"],
    )
    node.start()
    try:
        return drive(node, args)
    finally:
        node.stop()


def drive(node: BenchNode, args) -> int:
    api = Api(node.port, node.token)
    pid = node.pid
    assert pid is not None
    time.sleep(1.0)
    base_rss, _ = node_memory(pid)
    name = f"hostile-{uuid.uuid4().hex[:6]}"
    status, data = api.post("queues", {"name": name, "partitions": 4, "max_message_size": MiB})
    if status != 201:
        log(f"create queue: {status} {data[:300]!r}")
        return 1
    phases: dict[str, collections.Counter] = {}

    # 1. large attributes: 1-character bodies, 16 attributes of 1 KB (~18 KB held each)
    attrs = {f"attribute-{k:02d}": "a" * 1024 for k in range(16)}
    batch = json.dumps({"messages": [{"body": "x", "attributes": attrs}] * 400}).encode()
    per = max(1, args.attribute_batches // args.producers)
    t0 = time.monotonic()
    phases["1 large attributes (400 x 17 KB a request)"] = run_threads(
        args.producers, lambda k: (api.post(f"queues/{name}/enqueue", raw=batch)[0] for _ in range(per))
    )
    log(f"phase 1: {time.monotonic() - t0:.1f}s")

    # 2. maximal bodies: 7 x 1 MiB a request
    bodies = json.dumps({"messages": [{"body": "b" * (MiB - 16)}] * 7}).encode()
    per = max(1, args.body_batches // args.producers)
    t0 = time.monotonic()
    phases[f"2 maximal bodies (7 x 1 MiB a request, {len(bodies) // MiB} MiB)"] = run_threads(
        args.producers, lambda k: (api.post(f"queues/{name}/enqueue", raw=bodies)[0] for _ in range(per))
    )
    log(f"phase 2: {time.monotonic() - t0:.1f}s")

    # 3. oversized claims: Content-Length of 1 GiB, no body sent
    phases["3 Content-Length 1 GiB, nothing sent"] = run_threads(
        args.producers, lambda k: (api.claim(f"queues/{name}/enqueue", 1 << 30) for _ in range(5))
    )

    # 4. many consumers, each listing the most held IDs (each fake: lost to it)
    held = [{"id": f"{name}/0/00000001-{i:016x}/0", "receipt": "r"} for i in range(1000)]

    def beats(k: int):
        for c in range(k, args.consumers, args.producers):
            yield api.post("consumers/heartbeat", {"consumer": f"hostile-{c}", "held": held})[0]

    t0 = time.monotonic()
    phases[f"4 heartbeats of {args.consumers} consumers x 1000 held"] = run_threads(args.producers, beats)
    log(f"phase 4: {time.monotonic() - t0:.1f}s")

    # 5. many concurrent long polls on an empty queue
    empty = f"hostile-empty-{uuid.uuid4().hex[:6]}"
    api.post("queues", {"name": empty, "partitions": 2})
    t0 = time.monotonic()
    phases[f"5 {args.long_polls} concurrent long polls (wait {args.poll_wait:g} s)"] = run_threads(
        args.long_polls, lambda k: [api.post(f"queues/{empty}/dequeue", {"wait": args.poll_wait})[0]]
    )
    log(f"phase 5: {time.monotonic() - t0:.1f}s")

    rss, peak = node_memory(pid)
    cheap = cheap_callers(node, name, args)
    parse = args.producers * 24 * args.request_bytes
    bound = base_rss + args.cache_bytes + parse
    print(f"\nnode: {node.url} (code: {args.repo})")
    for label, counts in phases.items():
        print(f"  {label}: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=str)))
    print(f"RSS after start           {base_rss / MiB:8.1f} MiB")
    print(f"RSS at the end            {rss / MiB:8.1f} MiB")
    print(f"peak RSS (VmHWM)          {peak / MiB:8.1f} MiB")
    print(
        f"stated bound              {bound / MiB:8.1f} MiB  = start {base_rss / MiB:.0f} + body cache "
        f"{args.cache_bytes / MiB:.0f} + {args.producers} requests x 24 x {args.request_bytes / MiB:.0f} MiB parsed"
    )
    print(f"peak / bound              {peak / bound:8.2f}")
    print("\ncallers holding something cheap (from 127.0.0.2), another user's calls beside them:")
    for line in cheap:
        print(f"  {line}")
    return 0


def _current_rss(pid: int) -> int:
    return node_memory(pid)[0]


def cheap_callers(node: BenchNode, queue: str, args: argparse.Namespace) -> list[str]:
    """Phases 6-9; a line each of what they were answered and what the other user saw."""
    out = node.manage(
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model\n"
        "from rest_framework.authtoken.models import Token\n"
        "import uuid\n"
        "u = get_user_model().objects.create(username='nogrant-' + uuid.uuid4().hex[:6])\n"
        "print('NOGRANT=' + Token.objects.create(user=u).key)\n",
    )
    nogrant = out.rsplit("NOGRANT=", 1)[1].split()[0]
    key_id, _ = node.sqs_key("hostile bench")
    api = Api(node.port, node.token, timeout=5)

    def cycle() -> int:
        status, data = api.post(f"queues/{queue}/enqueue", {"messages": [{"body": "u"}]})
        if status != 201:
            return status if isinstance(status, int) else 599
        status, data = api.post(f"queues/{queue}/dequeue", {"max": 10})
        got = json.loads(data)["messages"] if status == 200 else []
        if got:
            status, _ = api.post(
                f"queues/{queue}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]}
            )
        return status if isinstance(status, int) else 599

    def ready() -> int:
        conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=5)
        try:
            conn.request("GET", "/api/v1/readyz")
            return conn.getresponse().status
        finally:
            conn.close()

    lines = []
    token_headers = {"Authorization": f"Token {nogrant}", "Content-Type": "application/json"}
    attacks = [
        (
            f"6 no-grant token, {args.dribblers} trickled bodies",
            lambda: hostile.dribble(node.port, "/api/v1/queues", token_headers, connections=args.dribblers),
        ),
        (
            f"7 key ID + made-up signature, {args.dribblers} trickled SQS calls",
            lambda: hostile.dribble(
                node.port, "/sqs/", hostile.sqs_dribble_headers(key_id), connections=args.dribblers
            ),
        ),
    ]
    for label, attack in attacks:
        with hostile.Users({"cycle": cycle, "readyz": ready}) as users:
            answered = attack()
        lines.append(f"{label}: answered {_counts(answered)}; user: {users.summary()}; failures {len(users.failures)}")
    pid = node.pid
    assert pid is not None
    before = _current_rss(pid)
    peak = before
    with hostile.Users({"cycle": cycle, "readyz": ready}) as users:
        done = threading.Event()

        def watch() -> None:
            nonlocal peak
            while not done.wait(0.05):
                peak = max(peak, _current_rss(pid))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        answered = hostile.large_bodies(
            node.port, "/api/v1/queues", token_headers, at_once=args.big_at_once, rounds=args.big_rounds
        )
        done.set()
        watcher.join()
    time.sleep(args.settle)
    after = _current_rss(pid)
    lines.append(
        f"8 no-grant token, {args.big_rounds} x {args.big_at_once} bodies of 8 MiB: answered {_counts(answered)}; "
        f"RSS before {before / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, {args.settle:g} s after {after / MiB:.0f} MiB "
        f"(+{(after - before) / MiB:.0f}); "
        f"user: {users.summary()}; failures {len(users.failures)}"
    )
    kept = hostile.keep_alive_after_unread(node.port, node.token, rounds=args.dribblers)
    lines.append(f"9 a request after a body left unread, {args.dribblers} connections: {kept}")
    return lines


def _counts(counts: collections.Counter) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=str))


if __name__ == "__main__":
    sys.exit(main())
