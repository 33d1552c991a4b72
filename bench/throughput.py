#!/usr/bin/env python
"""Throughput benchmark: our service vs Redis Streams, pgqueuer and a hand-written PostgreSQL
SKIP LOCKED queue, same workload, same run, with the CPU each side spends per message.

It MEASURES AND PRINTS; it never passes or fails.

Workload, per system and per mode (``single``: one message per call; ``batch100``: 100 per call):
  1. enqueue N messages (~100-byte bodies), split over --clients client processes;
  2. dequeue them all (max 1 or 100 per call) without acking;
  3. ack everything each client received (1 or 100 per call).
Each phase is timed on its own (wall time from the moment all clients start together to the
last one finishing). Figures: enqueue/s, dequeue/s, ack/s, and full cycle/s = acked messages /
(enqueue + dequeue + ack seconds). Each measurement is repeated --repeat times after one
untimed warm-up round; medians are printed, with ratios ours / baseline.

Strict modes (``strict-single``, ``strict-batch<B>``; our service only, only when listed in
--modes): the queue is created with ``"strict": true`` and message i gets
``group = f"g{i % --strict-groups}"`` (default 1,000 groups). A strict queue delivers a group's
next message only after the previous one is acked, so "dequeue all, then ack all" cannot drain
it. The strict workload instead is:
  1. enqueue N messages with their groups (1 or B per call), as above;
  2. drain: each client loops dequeue(max 1|B) -> ack what it got (1|B per call, with receipts)
     until all N are acked; this combined dequeue+ack phase is timed as one.
Figures: enqueue/s, (dequeue+ack)/s = acked / drain seconds, cycle/s = acked / (enqueue + drain
seconds); printed beside the standard mode of the same batch size (strict-batch100 beside
batch100, strict-single beside single) on the same node in the same run, with the ratios
strict / standard; the standard mode's (dequeue+ack)/s is acked / (dequeue + ack seconds).
Redis Streams and pgqueuer have no per-group one-at-a-time delivery, so no baseline runs in the
strict modes. Every strict round also checks, from client-side timestamps, that no group had two
messages out at once and that each group came out in its sequence order.

Systems:
  ours[<backend>]  our REST API over HTTP keep-alive, one node started by this script per
                   key-value backend (file, redis, postgres, redis-cluster): migrate, bench user
                   + token, `manage.py runnode`, wait for /api/v1/healthz, one fresh queue per
                   round. With --node-processes 1,2: one node per backend and per count N,
                   named ours[<backend>,p<N>], started with `runnode --processes N`.
                   redis-cluster: KV_URL=redis-cluster://h1:p1,h2:p2,h3:p3 from
                   --redis-cluster-url, else from `scripts/services.sh redis-cluster start`
                   (skipped, with a line saying why, when neither gives one).
  redis-streams    XADD / XREADGROUP (consumer group, one consumer per client) / XACK on the
                   same Redis (separate DB, default 3); batch = a pipeline of 100 XADDs,
                   XREADGROUP COUNT 100, XACK of 100 ids. One fresh stream per round, deleted.
  pgqueuer         pgqueuer 1.6.0 on the same PostgreSQL, installed by this script into its own
                   schema (default mqbench_pgq) and uninstalled at the end. Its Queries API:
                   enqueue (single / lists of 100), dequeue(batch_size=1|100), and
                   log_jobs(successful) as the ack -- the calls its QueueManager makes.
  skip-locked      the queue a user writes by hand on the same PostgreSQL (schema
                   --skip-locked-schema, dropped at the end): a table (id, body, visible_at,
                   receives); enqueue = INSERT of one row / of 100 through unnest; dequeue =
                   UPDATE ... SET visible_at = now() + visibility timeout FROM (SELECT id ...
                   WHERE visible_at <= now() ORDER BY visible_at, id LIMIT 1|100 FOR UPDATE
                   SKIP LOCKED) RETURNING; ack = DELETE of the (id, receive count) pairs.
  thin[wsgi], thin[rsgi]
                   a reference, not a product (bench/serving_apps.py, the thin queue): our API's
                   message calls with nothing behind them but the store round trips our node
                   makes (enqueue: one HSET; dequeue: none, from memory; ack: one HDEL), served
                   by granian on request threads (as our node) and on one event loop (RSGI).
                   Our clients call it; the summary prints each node's ratio to it and its own
                   ratio to Redis Streams ("the ceiling").

CPU per message, every system, each side apart (bench/throughput_cpu.py): server = ours: every
process of the node's session (all its serving processes and its worker); redis-streams:
redis-server's INFO cpu; pgqueuer, skip-locked: the PostgreSQL backends of their connections
(pg_stat_activity by application_name, /proc/<pid>/stat). store = ours only: redis-server (every
node of a Redis Cluster) plus the node's own PostgreSQL backends (PGAPPNAME). client = the
client processes' own process time. Printed per mode as microseconds per acked message over the
full cycle (and per call), then a summary for the closing note: the full-cycle table with the
server CPU per message, the same-run ratios beside issue 17's goals, and our nodes compared
(1 vs N processes, Redis vs Redis Cluster).

Topic run (``--topic``; our service on the redis backend and Redis Streams, nothing else): for 1, 3
and 10 subscriptions, --repeat rounds per system, interleaved (ours, streams, ours, streams, ...).
A round publishes --topic-messages messages of 100 bytes, 100 per call, then drains every
subscription in turn, one client, 100 per call:
  ours           a topic with 4 partitions and one subscription per reader; publish 100 per call;
                 dequeue(max 100) + ack of those with their receipts; the topic is deleted after.
  redis-streams  one stream with one consumer group per subscription (in --streams-db); publish =
                 a pipeline of 100 XADDs; XREADGROUP COUNT 100 + XACK of those ids; the stream is
                 deleted after.
Figures (medians): publish/s = messages / publish seconds; deliveries/s = messages delivered and
acked over all subscriptions / drain seconds; bytes/message = Redis used_memory growth over the
publish phase / messages (the whole Redis instance, read right after publishing, before any
delivery). Printed in one table with the ratios ours / streams for publish and deliveries.
Our calls go over one keep-alive HTTP connection. Not alike: XACK leaves the entry in the
stream (until trimmed), while our last subscription's ack deletes the message, so our
deliveries include the removal.

Everything (servers and Python clients) shares this machine: client CPU competes with server
CPU, which is printed next to the rates.

Examples:
  python bench/throughput.py --skip-ours                       # baselines only
  python bench/throughput.py --backends redis,postgres --modes single,batch100 --repeat 3
  python bench/throughput.py --backends redis --node-processes 1,2 --modes batch100
  python bench/throughput.py --backends redis,redis-cluster --modes single,batch100
  python bench/throughput.py --backends redis --modes batch100,strict-batch100 --skip-baselines
  python bench/throughput.py --backends redis --repeat 5 --json /tmp/tp.json
  python bench/throughput.py --topic --repeat 3 --topic-messages 3000     # topics vs Redis Streams
  MQ_TEST_REDIS_URL=redis://127.0.0.1:63899 MQ_TEST_PG_URL=postgres://mq:mq@127.0.0.1:54399/mq \
      python bench/throughput.py --skip-ours --n 5000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import REPO, box_speed, exit_on_sigterm, log, redact
from throughput_report import print_report, summarize
from throughput_rounds import run_groups
from throughput_systems import OursSystem, PgqSystem, SkipLockedSystem, StreamsSystem, System, ThinSystem
from throughput_topic import run_topic

CLUSTER_URL = re.compile(r"redis-cluster://[^\s'\"]+")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Throughput of our service vs Redis Streams vs pgqueuer (measures and prints, never fails).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--n",
        type=int,
        default=None,
        help="messages per round for every mode (default: 2000 for single, 20000 for batch)",
    )
    p.add_argument("--n-single", type=int, default=2000)
    p.add_argument("--n-batch", type=int, default=20000)
    p.add_argument(
        "--modes",
        default="single,batch100",
        help="comma list of: single, batch<B> (e.g. batch100), and the strict modes strict-single, "
        "strict-batch<B> (e.g. strict-batch100): our service only (no baselines), a strict queue, "
        "message i in group g<i %% --strict-groups>, enqueue N then a timed drain of repeated "
        "dequeue(max B) + ack(B) until all are acked; printed beside the standard mode of the same "
        "batch (list it too, e.g. batch100,strict-batch100) with the ratios strict / standard",
    )
    p.add_argument(
        "--strict-groups",
        type=int,
        default=1000,
        help="strict modes: number of message groups (message i gets group g<i %% this>)",
    )
    p.add_argument("--clients", type=int, default=4, help="concurrent client processes")
    p.add_argument("--repeat", type=int, default=3, help="timed rounds per system and mode (medians printed)")
    p.add_argument("--warmup", type=int, default=500, help="messages in the untimed warm-up round (0: none)")
    p.add_argument(
        "--backends",
        default="file,redis,postgres",
        help="our service's key-value backends to run: file, redis, postgres, redis-cluster",
    )
    p.add_argument(
        "--node-processes",
        default=None,
        metavar="N[,N...]",
        help="run each of our backends once per count N, with `manage.py runnode --processes N` "
        "(the node's CPU = all its processes); default: one node per backend as "
        "tests.launcher.NodeProcess starts it",
    )
    p.add_argument(
        "--redis-cluster-url",
        default=None,
        help="KV_URL of the redis-cluster backend (redis-cluster://h1:p1,h2:p2,...); default: "
        "`scripts/services.sh redis-cluster start` and the URL `services.sh env` prints, else "
        "$MQ_TEST_REDIS_CLUSTER_URL",
    )
    p.add_argument("--skip-ours", action="store_true", help="do not run our service")
    p.add_argument("--skip-baselines", action="store_true", help="do not run redis-streams and pgqueuer")
    p.add_argument(
        "--topic",
        action="store_true",
        help="the topic run instead: publish rate, delivery rate and Redis bytes per message with 1, "
        "3 and 10 subscriptions, on our node (redis backend) and on Redis Streams as the fan-out "
        "baseline (one stream, one consumer group per subscription, in --streams-db), rounds "
        "interleaved, with the ratios ours / streams",
    )
    p.add_argument("--topic-messages", type=int, default=5000, help="messages published per topic run")
    p.add_argument(
        "--only-baselines",
        default="redis-streams,pgqueuer,skip-locked,thin-wsgi,thin-rsgi",
        help="which baselines to run (thin-wsgi, thin-rsgi: the thin queue, our calls with nothing but our "
        "node's store round trips: about the ceiling of a Python HTTP queue over this Redis)",
    )
    p.add_argument("--json", metavar="OUT.json", help="write all samples, medians and ratios here")
    p.add_argument("--redis-url", default=os.environ.get("MQ_TEST_REDIS_URL", "redis://127.0.0.1:63799"))
    p.add_argument("--pg-url", default=os.environ.get("MQ_TEST_PG_URL", "postgres://mq:mq@127.0.0.1:54329/mq"))
    p.add_argument("--streams-db", type=int, default=3, help="Redis DB number for the streams baseline")
    p.add_argument("--kv-redis-db", type=int, default=1, help="Redis DB number for our redis KV backend")
    p.add_argument("--pg-schema", default="mqbench_pgq", help="schema pgqueuer is installed into (dropped at the end)")
    p.add_argument(
        "--skip-locked-schema",
        default="mqbench_skiplocked",
        help="schema of the skip-locked table (dropped at the end)",
    )
    p.add_argument(
        "--keep-pgq-schema", action="store_true", help="leave pgqueuer's and the skip-locked schema installed"
    )
    p.add_argument("--database-url", default=None, help="DATABASE_URL for our nodes (default: --pg-url)")
    p.add_argument("--repo", default=str(REPO), help="repository root (where manage.py is)")
    p.add_argument("--python", default=sys.executable, help="python that runs manage.py")
    p.add_argument("--port", type=int, default=0, help="node port (default: a free one)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of each bench queue")
    p.add_argument("--user", default="mqbench", help="API user created for the bench")
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE", help="extra env for the node")
    p.add_argument(
        "--http-client",
        choices=("pycurl", "httpclient", "requests"),
        default="pycurl",
        help="our clients' HTTP: libcurl through pycurl (the least client CPU: it parses in C, as the Redis "
        "Streams clients' hiredis does), http.client or requests.Session; each keeps its connection alive",
    )
    p.add_argument(
        "--visibility-timeout",
        type=int,
        default=300,
        help="seconds; every message stays in flight from the dequeue to the ack phase",
    )
    p.add_argument("--startup-timeout", type=float, default=90)
    p.add_argument("--phase-timeout", type=float, default=600, help="give up a dequeue phase after this")
    p.add_argument("--empty-sleep", type=float, default=0.001, help="client pause after an empty dequeue")
    p.add_argument("--keep-tmp", action="store_true", help="keep the nodes' temp dirs (logs, file KV)")
    a = p.parse_args(argv)
    a.database_url = a.database_url or a.pg_url
    modes = []
    for m in [x.strip() for x in a.modes.split(",") if x.strip()]:
        if m == "single":
            modes.append((m, 1, a.n or a.n_single))
        elif re.fullmatch(r"batch\d+", m):
            modes.append((m, int(m[5:]), a.n or a.n_batch))
        elif m == "strict-single":
            modes.append((m, 1, a.n or a.n_single))
        elif re.fullmatch(r"strict-batch\d+", m):
            modes.append((m, int(m[12:]), a.n or a.n_batch))
        else:
            p.error(f"unknown mode {m!r}")
    if a.strict_groups < 1:
        p.error("--strict-groups must be at least 1")
    a.mode_list = modes
    try:
        a.process_counts = parse_counts(a.node_processes)
    except ValueError as exc:
        p.error(f"--node-processes: {exc}")
    return a


def parse_counts(text: str | None) -> list[int | None]:
    """``"1,2"`` -> ``[1, 2]``; None or empty -> ``[None]`` (NodeProcess' default)."""
    if not text or not text.strip():
        return [None]
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"{item!r} is not a count of processes (1, 2, ...)")
        if int(item) not in out:
            out.append(int(item))
    return out


def find_cluster_url(text: str) -> str | None:
    """The first ``redis-cluster://...`` URL in ``text`` (what services.sh printed)."""
    m = CLUSTER_URL.search(text)
    return m.group(0) if m else None


def resolve_cluster_url(args) -> tuple[str | None, str]:
    """The redis-cluster backend's KV_URL, or None and why there is none.

    --redis-cluster-url is used as given. Otherwise ``scripts/services.sh redis-cluster start``
    (it returns at once when the cluster is up) and the URL it or ``services.sh env`` prints,
    else the environment's MQ_TEST_REDIS_CLUSTER_URL (a cluster run by other means)."""
    if args.redis_cluster_url:
        return args.redis_cluster_url, ""
    from_env = os.environ.get("MQ_TEST_REDIS_CLUSTER_URL")
    script = Path(args.repo) / "scripts" / "services.sh"
    log("redis-cluster: scripts/services.sh redis-cluster start")
    r = subprocess.run(
        [str(script), "redis-cluster", "start"], capture_output=True, text=True, timeout=300, check=False
    )
    if r.returncode != 0:
        return None, f"`scripts/services.sh redis-cluster start` exited {r.returncode}: {(r.stdout + r.stderr)[-500:]}"
    url = find_cluster_url(r.stdout + r.stderr)
    if url is None:
        env = subprocess.run([str(script), "env"], capture_output=True, text=True, timeout=60, check=False)
        url = find_cluster_url(env.stdout) or from_env
    if url is None:
        return None, (
            "`scripts/services.sh redis-cluster start` ran, but neither it nor `services.sh env` printed a "
            "redis-cluster:// URL; pass --redis-cluster-url"
        )
    log(f"redis-cluster: {url} (left running; `scripts/services.sh redis-cluster stop` stops it)")
    return url, ""


def our_systems(args, notes: list[str]) -> list[System]:
    """One of our systems per backend and per count of node processes."""
    out: list[System] = []
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        kv = None
        if backend == "redis-cluster":
            kv, why = resolve_cluster_url(args)
            if kv is None:
                log(f"ours[redis-cluster]: SKIPPED: {why}")
                notes.append(f"ours[redis-cluster] skipped: {why}")
                continue
        out += [OursSystem(args, backend, processes=n, kv=kv) for n in args.process_counts]
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.topic:
        run_topic(args)
        return 0
    modes = args.mode_list
    systems: list[System] = []
    notes: list[str] = []
    if not args.skip_ours:
        systems += our_systems(args, notes)
    if not args.skip_baselines:
        wanted = {x.strip() for x in args.only_baselines.split(",")}
        if "skip-locked" in wanted:
            systems.append(SkipLockedSystem(args))
        if "pgqueuer" in wanted:
            systems.append(PgqSystem(args))
        if "redis-streams" in wanted:
            systems.append(StreamsSystem(args))
        systems += [ThinSystem(args, model) for model in ("wsgi", "rsgi") if f"thin-{model}" in wanted]
    if not systems:
        print("nothing to run (both --skip-ours and --skip-baselines)")
        return 0
    results: dict = {}
    started = time.time()
    speed = {"start": box_speed(args.redis_url)}
    ours = [x for x in systems if x.is_ours]
    baselines = [x for x in systems if not x.is_ours]
    groups = [(o.name, [o, *baselines]) for o in ours] or [("baselines", baselines)]
    run_groups(groups, baselines, args, modes, results, notes)
    speed["end"] = box_speed(args.redis_url)
    summary = summarize(results, modes, systems)
    print_report(args, modes, systems, results, summary, notes, speed)
    if args.json:
        doc = {
            "started": started,
            "duration_s": time.time() - started,
            "config": {k: v for k, v in vars(args).items() if k not in ("mode_list", "process_counts")}
            | {"pg_url": redact(args.pg_url), "database_url": redact(args.database_url)},
            "modes": [{"mode": m, "batch": b, "n": n} for m, b, n in modes],
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "speed": speed,
            },
            "notes": notes,
            "summary": summary,
            "results": results,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
