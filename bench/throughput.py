#!/usr/bin/env python
"""Throughput benchmark: our service vs Redis Streams vs pgqueuer, same workload, same run.

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
                   key-value backend (file, redis, postgres): migrate, bench user + token,
                   `manage.py runnode`, wait for /api/v1/healthz, one fresh queue per round.
  redis-streams    XADD / XREADGROUP (consumer group, one consumer per client) / XACK on the
                   same Redis (separate DB, default 3); batch = a pipeline of 100 XADDs,
                   XREADGROUP COUNT 100, XACK of 100 ids. One fresh stream per round, deleted.
  pgqueuer         pgqueuer 1.6.0 on the same PostgreSQL, installed by this script into its own
                   schema (default mqbench_pgq) and uninstalled at the end. Its Queries API:
                   enqueue (single / lists of 100), dequeue(batch_size=1|100), and
                   log_jobs(successful) as the ack -- the calls its QueueManager makes.

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
  python bench/throughput.py --backends redis --modes batch100,strict-batch100 --skip-baselines
  python bench/throughput.py --backends redis --repeat 5 --json /tmp/tp.json
  python bench/throughput.py --topic --repeat 3 --topic-messages 3000     # topics vs Redis Streams
  MQ_TEST_REDIS_URL=redis://127.0.0.1:63899 MQ_TEST_PG_URL=postgres://mq:mq@127.0.0.1:54399/mq \
      python bench/throughput.py --skip-ours --n 5000
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import itertools
import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import throughput_clients as tc

CLK_TCK = os.sysconf("SC_CLK_TCK")
FIGURES = ("enqueue", "dequeue", "ack", "cycle")
STRICT_FIGURES = ("enqueue", "drain", "cycle")  # drain = the combined dequeue+ack phase
STRICT_LABELS = {"enqueue": "enqueue/s", "drain": "(deq+ack)/s", "cycle": "cycle/s"}


def is_strict(mode: str) -> bool:
    return mode.startswith("strict-")


def figures_of(mode: str) -> tuple:
    return STRICT_FIGURES if is_strict(mode) else FIGURES


# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def with_redis_db(url: str, db: int) -> str:
    u = urlsplit(url)
    return urlunsplit((u.scheme, u.netloc, f"/{db}", u.query, u.fragment))


def redact(url: str) -> str:
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def box_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return (sum(parts[:8]) - idle) / CLK_TCK


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime (+ reaped children) of one process, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return float("nan")
    fields = data[data.rindex(")") + 2 :].split()
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its live descendants (a node serves from a worker child)."""
    total = proc_cpu_seconds(pid)
    try:
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        children = []
    for child in children:
        v = tree_cpu_seconds(int(child))
        if v == v:
            total += v
    return total


def background_load(seconds: float) -> float:
    """Cores busy on the machine over `seconds` while the bench itself does nothing."""
    b0 = box_busy_seconds()
    time.sleep(seconds)
    return (box_busy_seconds() - b0) / seconds


def median(xs):
    xs = [x for x in xs if x is not None and x == x]
    return statistics.median(xs) if xs else None


def fmt_rate(x) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def fmt_cores(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def fmt_ratio(a, b) -> str:
    if a is None or b in (None, 0):
        return "n/a"
    return f"{a / b:.3f}x"


# --------------------------------------------------------------------------------------
# client processes
# --------------------------------------------------------------------------------------


class ClientPool:
    """--clients spawned processes, each with one connection to the system under test."""

    def __init__(self, kind: str, spec: dict, n: int, reply_timeout: float) -> None:
        ctx = mp.get_context("spawn")
        self.counter = ctx.Value("q", 0)
        self.barrier = ctx.Barrier(n)
        self.reply_timeout = reply_timeout
        self.conns, self.procs = [], []
        for i in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=tc.worker_main,
                args=(child, kind, spec, i, self.counter, self.barrier),
                name=f"mqbench-{kind}-{i}",
                daemon=True,
            )
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        self._collect("start", 120)

    def _collect(self, what: str, timeout: float) -> list:
        out, errors = [], []
        deadline = time.monotonic() + timeout
        for c in self.conns:
            if not c.poll(max(0.0, deadline - time.monotonic())):
                raise tc.BenchError(f"client did not answer {what!r} within {timeout:.0f}s")
            status, payload = c.recv()
            (errors if status == "err" else out).append(payload)
        if errors:
            # the first error is the cause, the others are usually broken barriers
            cause = next((e for e in errors if "BrokenBarrierError" not in e), errors[0])
            raise tc.BenchError(f"client failed during {what}:\n{cause}")
        return out

    def send(self, cmd: str, args_per_client: list, timeout: float | None = None) -> list:
        if self.barrier.broken:
            self.barrier.reset()
        for c, a in zip(self.conns, args_per_client):
            c.send((cmd, a))
        return self._collect(cmd, timeout or self.reply_timeout)

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("stop", None))
            except Exception:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join(5)


# --------------------------------------------------------------------------------------
# systems (parent side: setup, per-round targets, teardown, server CPU)
# --------------------------------------------------------------------------------------


class System:
    name = "?"
    kind = "?"
    is_ours = False

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def client_spec(self) -> dict:
        raise NotImplementedError

    def new_target(self, tag: str) -> dict:
        raise NotImplementedError

    def drop_target(self, target: dict) -> None: ...

    def server_cpu(self) -> float | None:
        return None

    def describe(self) -> str:
        return ""


class StreamsSystem(System):
    name, kind = "redis-streams", "streams"

    def __init__(self, args) -> None:
        self.url = with_redis_db(args.redis_url, args.streams_db)
        self.group = "mqbench"
        self.keys: set[str] = set()

    def start(self) -> None:
        import redis

        self.r = redis.Redis.from_url(self.url)
        self.r.ping()

    def client_spec(self) -> dict:
        return {"redis_url": self.url}

    def new_target(self, tag: str) -> dict:
        key = f"mqbench:stream:{tag}"
        self.r.delete(key)
        self.r.xgroup_create(key, self.group, id="0", mkstream=True)
        self.keys.add(key)
        return {"stream": key, "group": self.group}

    def drop_target(self, target: dict) -> None:
        self.r.delete(target["stream"])
        self.keys.discard(target["stream"])

    def stop(self) -> None:
        if self.keys:
            self.r.delete(*self.keys)
        self.r.close()

    def server_cpu(self) -> float | None:
        info = self.r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def describe(self) -> str:
        info = self.r.info("server")
        cfg = self.r.config_get("appendonly")
        cfg.update(self.r.config_get("appendfsync"))
        return (
            f"redis {info.get('redis_version')} at {redact(self.url)}: appendonly={cfg.get('appendonly')} "
            f"appendfsync={cfg.get('appendfsync')} (server CPU = redis-server's INFO cpu)"
        )


class PgqSystem(System):
    name, kind = "pgqueuer", "pgq"
    APP = "mqbench-pgq"

    def __init__(self, args) -> None:
        self.pg_url = args.pg_url
        self.schema = args.pg_schema
        self.keep = args.keep_pgq_schema
        self.installed = False

    def _conninfo(self) -> str:
        sep = "&" if "?" in self.pg_url else "?"
        return f"{self.pg_url}{sep}application_name={self.APP}"

    async def _with_queries(self, fn):
        import psycopg
        from pgqueuer.adapters.drivers.psycopg import PsycopgDriver

        conn = await psycopg.AsyncConnection.connect(self.pg_url, autocommit=True)
        try:
            return await fn(tc.pgq_queries(PsycopgDriver(conn), self.schema), conn)
        finally:
            await conn.close()

    def start(self) -> None:
        async def install(q, conn):
            if await q.schema_is_installed():  # leftover of an interrupted run: start clean
                await q.uninstall()
            await q.install(create_schema=True)  # what `pgq install` runs

        asyncio.run(self._with_queries(install))
        self.installed = True

    def client_spec(self) -> dict:
        return {"pg_url": self._conninfo(), "schema": self.schema}

    def new_target(self, tag: str) -> dict:
        async def clear(q, conn):
            await q.clear_queue()
            await q.clear_queue_log()
            await q.clear_statistics_log()

        asyncio.run(self._with_queries(clear))
        return {"entrypoint": "mqbench"}

    def stop(self) -> None:
        if not self.installed or self.keep:
            return

        async def uninstall(q, conn):
            await q.uninstall()
            await conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")

        asyncio.run(self._with_queries(uninstall))

    def server_cpu(self) -> float | None:
        """CPU of the PostgreSQL backends serving our clients, if they run on this machine."""
        import psycopg

        try:
            with psycopg.connect(self.pg_url, autocommit=True) as c:
                pids = [
                    r[0] for r in c.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self.APP,))
                ]
        except Exception:
            return None
        vals = [proc_cpu_seconds(p) for p in pids]
        if not vals or any(v != v for v in vals):
            return None
        return sum(vals)

    def describe(self) -> str:
        import psycopg

        with psycopg.connect(self.pg_url, autocommit=True) as c:
            ver = c.execute("SHOW server_version").fetchone()[0]
            fsync = c.execute("SHOW fsync").fetchone()[0]
            sc = c.execute("SHOW synchronous_commit").fetchone()[0]
        from pgqueuer._version import version

        dur = tc.pgq_settings(self.schema).durability.value
        return (
            f"postgres {ver} at {redact(self.pg_url)}: fsync={fsync} synchronous_commit={sc}; "
            f"pgqueuer {version} in schema {self.schema}, durability={dur} "
            f"(server CPU = the client connections' backends)"
        )


class OursSystem(System):
    kind = "ours"
    is_ours = True

    def __init__(self, args, backend: str) -> None:
        self.args = args
        self.backend = backend
        self.name = f"ours[{backend}]"
        self.proc: subprocess.Popen | None = None
        self.tmp: str | None = None
        self.token = ""
        self.port = 0
        self.queues: set[str] = set()

    # -- process management -------------------------------------------------------
    def _env(self) -> dict:
        a = self.args
        env = os.environ.copy()
        data_dir = os.path.join(self.tmp, "data")
        os.makedirs(data_dir, exist_ok=True)
        if self.backend == "redis":
            kv = with_redis_db(a.redis_url, a.kv_redis_db)
        elif self.backend == "postgres":
            kv = "postgres"
        elif self.backend == "file":
            kv_dir = os.path.join(self.tmp, "kv")
            os.makedirs(kv_dir, exist_ok=True)
            kv = f"file://{kv_dir}"
        else:
            raise tc.BenchError(f"unknown backend {self.backend!r}")
        env.update(
            DATABASE_URL=a.database_url, KV_URL=kv, REDIS_URL=a.redis_url, MQ_DATA_DIR=data_dir, PYTHONUNBUFFERED="1"
        )
        for item in a.node_env:
            k, _, v = item.partition("=")
            env[k] = v
        return env

    def _manage(self, *argv: str, timeout: float = 300, env_extra: dict | None = None) -> str:
        env = self._env()
        env.update(env_extra or {})
        cmd = [self.args.python, "manage.py", *argv]
        r = subprocess.run(cmd, cwd=self.args.repo, env=env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise tc.BenchError(f"`manage.py {argv[0]}` exited {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}")
        return r.stdout + r.stderr

    def _create_token(self) -> str:
        user = self.args.user
        code = (
            "from django.contrib.auth import get_user_model\n"
            "from rest_framework.authtoken.models import Token\n"
            f"u, _ = get_user_model().objects.get_or_create(username={user!r})\n"
            "u.is_staff = u.is_superuser = True\n"
            "u.set_unusable_password(); u.save()\n"
            "t, _ = Token.objects.get_or_create(user=u)\n"
            "print('MQBENCH_TOKEN=' + t.key)\n"
        )
        try:
            out = self._manage("shell", "-c", code, timeout=120)
            m = re.search(r"MQBENCH_TOKEN=(\w+)", out)
            if m:
                return m.group(1)
        except tc.BenchError as exc:
            log(f"{self.name}: shell -c failed, falling back to createsuperuser + drf_create_token ({exc})")
        try:
            self._manage(
                "createsuperuser",
                "--noinput",
                "--username",
                user,
                "--email",
                f"{user}@example.invalid",
                timeout=120,
                env_extra={"DJANGO_SUPERUSER_PASSWORD": uuid.uuid4().hex},
            )
        except tc.BenchError as exc:
            if "already" not in str(exc).lower():
                raise
        out = self._manage("drf_create_token", user, timeout=120)
        m = re.search(r"Generated token (\w+) for user", out)
        if not m:
            raise tc.BenchError(f"no token in drf_create_token output: {out[-500:]}")
        return m.group(1)

    def start(self) -> None:
        a = self.args
        self.tmp = tempfile.mkdtemp(prefix=f"mqbench-{self.backend}-")
        log(f"{self.name}: migrate")
        self._manage("migrate", "--noinput", timeout=600)
        self.token = self._create_token()
        self.port = a.port or free_port()
        self.logfile = os.path.join(self.tmp, "node.log")
        log(f"{self.name}: runnode on 127.0.0.1:{self.port} (log {self.logfile})")
        with open(self.logfile, "wb") as lf:
            self.proc = subprocess.Popen(
                [a.python, "manage.py", "runnode", "--host", "127.0.0.1", "--port", str(self.port)],
                cwd=a.repo,
                env=self._env(),
                stdout=lf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + a.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise tc.BenchError(f"node exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, _ = self.api("GET", "/api/v1/healthz", auth=False, timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise tc.BenchError(f"/api/v1/healthz not 200 after {a.startup_timeout}s:\n{self.log_tail()}")
            time.sleep(0.2)
        log(f"{self.name}: healthy")

    def log_tail(self, n: int = 3000) -> str:
        try:
            return Path(self.logfile).read_text(errors="replace")[-n:]
        except Exception:
            return "(no log)"

    def stop(self) -> None:
        for q in list(self.queues):
            self._delete_queue(q)
        if self.proc is not None and self.proc.poll() is None:
            # the node runs in a session of its own that this script created
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self.tmp and not self.args.keep_tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        elif self.tmp:
            log(f"{self.name}: kept {self.tmp}")

    # -- API ---------------------------------------------------------------------------
    def connection(self, timeout: float = 30) -> http.client.HTTPConnection:
        """A keep-alive connection to the node, for :meth:`api` calls in a timed loop."""
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def api(
        self,
        method: str,
        path: str,
        payload=None,
        auth: bool = True,
        timeout: float = 30,
        conn: http.client.HTTPConnection | None = None,
    ):
        """One call; on ``conn`` (kept open) if given, else on a connection of its own."""
        own = conn is None
        conn = conn or self.connection(timeout)
        headers = {"Accept": "application/json"}
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        if auth:
            headers["Authorization"] = f"Token {self.token}"
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            if own:
                conn.close()

    def client_spec(self) -> dict:
        a = self.args
        return {
            "base_url": f"http://127.0.0.1:{self.port}",
            "token": self.token,
            "visibility_timeout": a.visibility_timeout,
            "http_client": a.http_client,
            "http_timeout": 60.0,
        }

    def new_target(self, tag: str, strict: bool = False) -> dict:
        name = f"bench-{tag}"
        spec = {"name": name, "partitions": self.args.partitions}
        if strict:
            spec["strict"] = True
        status, body = self.api("POST", "/api/v1/queues", spec)
        if status != 201:
            raise tc.BenchError(f"create queue {name}: HTTP {status}: {body[:300]!r}")
        self.queues.add(name)
        return {"queue": name}

    def _delete_queue(self, name: str) -> None:
        try:
            status, body = self.api("DELETE", f"/api/v1/queues/{name}")
            if status >= 300:
                log(f"{self.name}: delete queue {name}: HTTP {status}: {body[:200]!r}")
        except OSError as exc:
            log(f"{self.name}: delete queue {name}: {exc}")
        self.queues.discard(name)

    def drop_target(self, target: dict) -> None:
        self._delete_queue(target["queue"])

    def server_cpu(self) -> float | None:
        if self.proc is None:
            return None
        v = tree_cpu_seconds(self.proc.pid)
        return None if v != v else v

    def describe(self) -> str:
        return (
            f"{self.name}: node pid {self.proc.pid if self.proc else '?'} on 127.0.0.1:{self.port}, "
            f"{self.args.partitions} partitions, KV backend {self.backend}, HTTP client {self.args.http_client} "
            f"(server CPU = the node process)"
        )


# --------------------------------------------------------------------------------------
# one round: enqueue N, dequeue N, ack N
# --------------------------------------------------------------------------------------


def run_phase(system: System, pool: ClientPool, cmd: str, args_per_client: list, timeout: float) -> dict:
    s0, b0 = system.server_cpu(), box_busy_seconds()
    res = pool.send(cmd, args_per_client, timeout=timeout)
    s1, b1 = system.server_cpu(), box_busy_seconds()
    wall = max(r["t1"] for r in res) - min(r["t0"] for r in res)
    wall = max(wall, 1e-9)
    count = sum(r["count"] for r in res)
    out = {
        "wall": wall,
        "count": count,
        "rate": count / wall,
        "calls": sum(r["calls"] for r in res),
        "empty": sum(r["empty"] for r in res),
        "errors": sum(r["errors"] for r in res),
        "error_samples": [e for r in res for e in r["error_samples"]][:3],
        "timed_out": any(r["timed_out"] for r in res),
        "client_cpu_s": sum(r["cpu"] for r in res),
        "server_cpu_s": (s1 - s0) if s0 is not None and s1 is not None else None,
        "box_cpu_s": b1 - b0,
    }
    if cmd == "dequeue":
        ids = [i for r in res for i in r["ids"]]
        out["unique"] = len(set(ids))
        out["duplicates"] = len(ids) - out["unique"]
    elif cmd == "drain":
        out["received"] = sum(r["received"] for r in res)
        out["dequeues"] = sum(r["dequeues"] for r in res)
        out["gave_up"] = sum(1 for r in res if r["gave_up"])
        out["deliveries"] = [d for r in res for d in r["deliveries"]]
    return out


def run_round(system: System, pool: ClientPool, mode: str, batch: int, n: int, tag: str, args) -> dict:
    k = len(pool.conns)
    target = system.new_target(tag)
    try:
        pool.send("target", [target] * k)
        # chunks of `batch` messages dealt round-robin to the clients
        chunks = [list(range(i, min(i + batch, n))) for i in range(0, n, batch)]
        per_client = [[i for c in chunks[w::k] for i in c] for w in range(k)]
        enq = run_phase(
            system,
            pool,
            "enqueue",
            [{"tag": tag, "indexes": idx, "batch": batch} for idx in per_client],
            args.phase_timeout + 60,
        )
        pool.counter.value = 0
        deq = run_phase(
            system,
            pool,
            "dequeue",
            [{"max": batch, "target": enq["count"], "timeout": args.phase_timeout, "empty_sleep": args.empty_sleep}]
            * k,
            args.phase_timeout + 60,
        )
        ack = run_phase(system, pool, "ack", [{"batch": batch}] * k, args.phase_timeout + 60)
    finally:
        try:
            system.drop_target(target)
        except Exception as exc:
            log(f"{system.name}: cleanup of {target}: {exc}")
    phases = {"enqueue": enq, "dequeue": deq, "ack": ack}
    wall = enq["wall"] + deq["wall"] + ack["wall"]

    def tot(key):
        vals = [p[key] for p in phases.values()]
        return None if any(v is None for v in vals) else sum(vals)

    cycle = {
        "wall": wall,
        "count": ack["count"],
        "rate": ack["count"] / wall,
        "client_cpu_s": tot("client_cpu_s"),
        "server_cpu_s": tot("server_cpu_s"),
        "box_cpu_s": tot("box_cpu_s"),
    }
    phases["cycle"] = cycle
    for p in phases.values():
        for key in ("client_cpu_s", "server_cpu_s", "box_cpu_s"):
            v = p.get(key)
            p[key.replace("_s", "_cores")] = None if v is None else v / p["wall"]
    anomalies = []
    if enq["count"] != n:
        anomalies.append(f"enqueued {enq['count']}/{n}")
    if deq["count"] != enq["count"]:
        anomalies.append(f"received {deq['count']}/{enq['count']}")
    if deq["duplicates"]:
        anomalies.append(f"{deq['duplicates']} duplicate deliveries")
    if ack["count"] != deq["unique"]:
        anomalies.append(f"acked {ack['count']}/{deq['unique']}")
    if deq["timed_out"]:
        anomalies.append("dequeue phase hit --phase-timeout")
    errs = enq["errors"] + deq["errors"] + ack["errors"]
    if errs:
        samples = enq["error_samples"] + deq["error_samples"] + ack["error_samples"]
        anomalies.append(f"{errs} request errors/retries, e.g. {samples[:2]}")
    return {"tag": tag, "n": n, "mode": mode, "phases": phases, "anomalies": anomalies}


def check_strict_order(deliveries: list) -> dict:
    """From the clients' records (group, sequence, id, t_received, t_ack_sent), all on this
    machine's monotonic clock: per group, in the order the messages reached the clients,
    sequences must increase, and each message must reach a client only after the previous
    message of its group had its ack sent (else two were out at once)."""
    ids = [d[2] for d in deliveries]
    by_group: dict = {}
    for g, seq, _id, t_recv, t_ack in deliveries:
        by_group.setdefault(g, []).append((t_recv, seq, t_ack))
    out_of_order = overlapping = 0
    for items in by_group.values():
        items.sort(key=lambda x: x[0])
        for (_t0, s0, a0), (t1, s1, _a1) in itertools.pairwise(items):
            if s0 is not None and s1 is not None and s1 <= s0:
                out_of_order += 1
            if t1 < a0:
                overlapping += 1
    return {
        "groups_seen": len([g for g in by_group if g is not None]),
        "no_group": len(by_group.get(None, [])),
        "duplicates": len(ids) - len(set(ids)),
        "out_of_order": out_of_order,
        "overlapping": overlapping,
    }


def run_strict_round(system: System, pool: ClientPool, mode: str, batch: int, n: int, tag: str, args) -> dict:
    """Strict queue: enqueue N with group g<i % groups>, then one timed drain phase in which
    every client loops dequeue(max=batch) -> ack those, until all N are acked."""
    k = len(pool.conns)
    target = system.new_target(tag, strict=True)
    try:
        pool.send("target", [target] * k)
        chunks = [list(range(i, min(i + batch, n))) for i in range(0, n, batch)]
        per_client = [[i for c in chunks[w::k] for i in c] for w in range(k)]
        enq = run_phase(
            system,
            pool,
            "enqueue",
            [{"tag": tag, "indexes": idx, "batch": batch, "groups": args.strict_groups} for idx in per_client],
            args.phase_timeout + 60,
        )
        pool.counter.value = 0
        drain = run_phase(
            system,
            pool,
            "drain",
            [
                {
                    "max": batch,
                    "batch": batch,
                    "target": enq["count"],
                    "timeout": args.phase_timeout,
                    "empty_sleep": args.empty_sleep,
                }
            ]
            * k,
            args.phase_timeout + 60,
        )
    finally:
        try:
            system.drop_target(target)
        except Exception as exc:
            log(f"{system.name}: cleanup of {target}: {exc}")
    if drain["gave_up"]:
        raise tc.BenchError(
            f"{drain['gave_up']} client(s) gave up the drain phase after failed calls, "
            f"e.g. {drain['error_samples'][:2]}"
        )
    check = check_strict_order(drain.pop("deliveries"))
    drain["order_check"] = check
    phases = {"enqueue": enq, "drain": drain}
    wall = enq["wall"] + drain["wall"]

    def tot(key):
        vals = [p[key] for p in phases.values()]
        return None if any(v is None for v in vals) else sum(vals)

    phases["cycle"] = {
        "wall": wall,
        "count": drain["count"],
        "rate": drain["count"] / wall,
        "client_cpu_s": tot("client_cpu_s"),
        "server_cpu_s": tot("server_cpu_s"),
        "box_cpu_s": tot("box_cpu_s"),
    }
    for p in phases.values():
        for key in ("client_cpu_s", "server_cpu_s", "box_cpu_s"):
            v = p.get(key)
            p[key.replace("_s", "_cores")] = None if v is None else v / p["wall"]
    anomalies = []
    if enq["count"] != n:
        anomalies.append(f"enqueued {enq['count']}/{n}")
    if drain["count"] != enq["count"]:
        anomalies.append(f"acked {drain['count']}/{enq['count']}")
    if drain["received"] != drain["count"]:
        anomalies.append(f"received {drain['received']} but acked {drain['count']}")
    if drain["timed_out"]:
        anomalies.append("drain phase hit --phase-timeout")
    for key, what in (
        ("duplicates", "duplicate deliveries"),
        ("no_group", "deliveries without a group"),
        ("out_of_order", "deliveries out of their group's sequence order"),
        ("overlapping", "deliveries while the group's previous message was still unacked"),
    ):
        if check[key]:
            anomalies.append(f"{check[key]} {what}")
    if check["groups_seen"] != min(n, args.strict_groups):
        anomalies.append(f"{check['groups_seen']} groups delivered, expected {min(n, args.strict_groups)}")
    errs = enq["errors"] + drain["errors"]
    if errs:
        samples = enq["error_samples"] + drain["error_samples"]
        anomalies.append(f"{errs} request errors/retries, e.g. {samples[:2]}")
    return {"tag": tag, "n": n, "mode": mode, "phases": phases, "anomalies": anomalies}


# --------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------


class Runner:
    """Starts systems, keeps one client pool per system, runs rounds, records failures."""

    def __init__(self, args, results: dict, notes: list) -> None:
        self.args, self.results, self.notes = args, results, notes
        self.pools: dict[str, ClientPool] = {}
        self.failed: dict[str, str] = results.setdefault("_failures", {})

    def start(self, system: System) -> bool:
        log(f"== start {system.name}")
        try:
            system.start()
            desc = system.describe()
            if desc:
                self.notes.append(desc)
            self.pools[system.name] = ClientPool(
                system.kind, system.client_spec(), self.args.clients, self.args.phase_timeout + 120
            )
            return True
        except Exception as exc:
            self.fail(system, exc)
            self.stop(system)
            return False

    def stop(self, system: System) -> None:
        pool = self.pools.pop(system.name, None)
        if pool is not None:
            pool.close()
        try:
            system.stop()
        except Exception as exc:
            log(f"{system.name}: stop/cleanup failed: {exc}")

    def fail(self, system: System, exc: Exception) -> None:
        log(f"{system.name}: FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        self.failed.setdefault(system.name, f"{type(exc).__name__}: {exc}")

    def alive(self, system: System) -> bool:
        return system.name in self.pools and system.name not in self.failed

    def round(self, system: System, mode: str, batch: int, n: int, tag: str, group: str, rep: int | None) -> None:
        if not self.alive(system):
            return
        strict = is_strict(mode)
        if strict and f"{system.name} {mode}" in self.failed:
            return
        try:
            if strict:
                r = run_strict_round(system, self.pools[system.name], mode, batch, n, tag, self.args)
            else:
                r = run_round(system, self.pools[system.name], mode, batch, n, tag, self.args)
        except Exception as exc:
            if strict:  # a strict-mode failure (e.g. a node without strict queues) spares the other modes
                log(f"{system.name} {mode}: FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                self.failed.setdefault(f"{system.name} {mode}", f"{type(exc).__name__}: {exc}")
            else:
                self.fail(system, exc)
            return
        ph = r["phases"]
        what = "warm-up" if rep is None else f"round {rep + 1}/{self.args.repeat}"
        extra = ""
        if strict:
            d = ph["drain"]
            extra = (
                f"  ({d['dequeues']:,} dequeue calls, {d['empty']:,} empty, "
                f"{d['received'] / max(1, d['dequeues'] - d['empty']):.1f} msgs per non-empty dequeue)"
            )
        log(
            f"{system.name} {mode} {what} [{group}]: "
            + "  ".join(f"{f} {fmt_rate(ph[f]['rate'])}/s" for f in figures_of(mode))
            + f"  box CPU {fmt_cores(ph['cycle']['box_cpu_cores'])}"
            + extra
            + (f"  ANOMALIES: {r['anomalies']}" if r["anomalies"] else "")
        )
        if rep is None:
            return
        r["group"], r["rep"] = group, rep
        entry = self.results.setdefault(mode, {}).setdefault(system.name, {"samples": [], "anomalies": []})
        entry["samples"].append(r)
        if r["anomalies"]:
            entry["anomalies"].append(f"[{group}] round {rep}: " + "; ".join(r["anomalies"]))


def run_groups(
    groups: list[tuple[str, list[System]]], baselines: list[System], args, modes, results: dict, notes: list
) -> None:
    """Each group = one of our nodes (if any) plus the baselines, their rounds interleaved
    (ours, redis-streams, pgqueuer, ours, ...) so that load from anything else on the machine
    hits all systems alike. Baselines stay up across groups; each node lives for its group."""
    runner = Runner(args, results, notes)
    for b in baselines:
        runner.start(b)
    try:
        ran = False
        if baselines and any(m.is_ours for _g, ms in groups for m in ms):
            # if none of our nodes comes up, the baselines still run, on their own
            groups = groups + [("baselines", list(baselines))]
        for group, members in groups:
            if group == "baselines" and ran:
                break
            ours = [m for m in members if m.is_ours]
            for o in ours:
                runner.start(o)
            try:
                live = [m for m in members if runner.alive(m)]
                if not live or (ours and not any(runner.alive(o) for o in ours)):
                    continue  # nothing of ours to pair the baselines with
                ran = True
                bg = background_load(1.0)
                notes.append(
                    f"[{group}] machine busy {bg:.2f} cores over 1 s of idleness before the rounds "
                    f"(other processes on the box{', plus the idle node' if ours else ''})"
                )
                for mode, batch, n in modes:
                    run_id = uuid.uuid4().hex[:6]
                    # strict modes: our nodes only (the baselines have no per-group ordering)
                    live_m = [m for m in live if m.is_ours] if is_strict(mode) else live
                    if args.warmup > 0:
                        for m in live_m:
                            runner.round(m, mode, batch, min(args.warmup, n), f"{mode}-{run_id}-warm", group, None)
                    for rep in range(args.repeat):
                        for m in live_m:
                            runner.round(m, mode, batch, n, f"{mode}-{run_id}-r{rep}", group, rep)
            finally:
                for o in ours:
                    runner.stop(o)
    finally:
        for b in baselines:
            runner.stop(b)


def summarize(results: dict, modes, systems: list[System]) -> dict:
    """Medians per system (all its rounds); ratios pair each node with the baseline rounds
    of its own group (run interleaved with it)."""

    def med_of(samples: list, figures=FIGURES) -> dict:
        med = {f: median([x["phases"][f]["rate"] for x in samples]) for f in figures}
        for key in ("client_cpu_cores", "server_cpu_cores", "box_cpu_cores"):
            med[key] = median([x["phases"]["cycle"][key] for x in samples])
            med["phase_" + key] = {f: median([x["phases"][f][key] for x in samples]) for f in figures}
        med["rounds"] = len(samples)
        return med

    def deq_ack_rate(x: dict) -> float:
        """A standard round's dequeue + ack phases taken together, like a strict drain phase."""
        ph = x["phases"]
        return ph["ack"]["count"] / (ph["dequeue"]["wall"] + ph["ack"]["wall"])

    summary: dict = {}
    for mode, _batch, _n in modes:
        per = results.get(mode, {})
        summary[mode] = {}
        if is_strict(mode):
            std_mode = mode[len("strict-") :]
            vs = {}
            for s in systems:
                samples = per.get(s.name, {}).get("samples", [])
                if not samples:
                    continue
                m = med_of(samples, STRICT_FIGURES)
                d = [x["phases"]["drain"] for x in samples]
                m["dequeue_calls"] = median([x["dequeues"] for x in d])
                m["empty_dequeues"] = median([x["empty"] for x in d])
                m["msgs_per_dequeue"] = median([x["received"] / max(1, x["dequeues"] - x["empty"]) for x in d])
                summary[mode][s.name] = m
                std = results.get(std_mode, {}).get(s.name, {}).get("samples", [])
                if std:
                    b = {
                        "enqueue": median([x["phases"]["enqueue"]["rate"] for x in std]),
                        "drain": median([deq_ack_rate(x) for x in std]),
                        "cycle": median([x["phases"]["cycle"]["rate"] for x in std]),
                        "rounds": len(std),
                    }
                    vs[s.name] = {
                        "standard_mode": std_mode,
                        "standard": b,
                        "ratio": {f: (m[f] / b[f] if m[f] is not None and b[f] else None) for f in STRICT_FIGURES},
                    }
            summary[mode]["_vs_standard"] = vs
            continue
        for s in systems:
            samples = per.get(s.name, {}).get("samples", [])
            if samples:
                summary[mode][s.name] = med_of(samples)
        ratios = {}
        for s in systems:
            if not s.is_ours or s.name not in summary[mode]:
                continue
            o = summary[mode][s.name]
            for base in ("redis-streams", "pgqueuer"):
                paired = [x for x in per.get(base, {}).get("samples", []) if x.get("group") == s.name]
                if paired:
                    b = med_of(paired)
                    ratios[f"{s.name} / {base}"] = {
                        f: (o[f] / b[f] if o[f] is not None and b[f] else None) for f in FIGURES
                    }
        summary[mode]["_ratios"] = ratios
    return summary


def print_report(args, modes, systems, results, summary, notes) -> None:
    out = []
    w = out.append
    w("")
    w("=" * 100)
    w("THROUGHPUT (messages per second, medians over rounds; higher is better)")
    w("=" * 100)
    w(
        f"machine: {os.cpu_count()} CPU cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"
    )
    w(f"clients: {args.clients} client processes (Python, one connection each) on the SAME machine as the servers;")
    w("         their CPU is part of the load: see the client/server/box CPU columns (in cores busy, averaged")
    w(
        f"         over the full cycle; box = whole machine from /proc/stat ticks, at most {os.cpu_count()}). Rates are lower"
    )
    w("         bounds of what each server alone could do, and the cheapest server is held back the most.")
    w("workload: enqueue N (~100-byte bodies) -> dequeue all (no ack yet) -> ack all; each phase timed separately;")
    w("          cycle/s = acked messages / (enqueue + dequeue + ack seconds)")
    w(f"rounds:   {args.repeat} per system and mode after one untimed warm-up, interleaved (ours, redis-streams,")
    w("          pgqueuer, ours, ...); the baselines run alongside each of our nodes, so they get more rounds;")
    w("          ratios pair each node with the baseline rounds interleaved with it")
    if any(is_strict(m) for m, _b, _n in modes):
        w(f'strict:   queue created with "strict": true, message i in group g<i % {args.strict_groups}>; enqueue N,')
        w("          then ONE timed drain phase: each client loops dequeue(max B) -> ack those (B per call) until")
        w("          all N are acked (a group's next message is only delivered after the previous one is acked,")
        w("          so dequeue-all-then-ack-all cannot drain it). (deq+ack)/s = acked / drain seconds; cycle/s =")
        w("          acked / (enqueue + drain seconds). Compared with the standard mode of the same batch on the")
        w("          same node in this run, whose (deq+ack)/s = acked / (dequeue + ack seconds).")
    for n_ in notes:
        w(f"  - {n_}")
    for mode, batch, n in modes:
        w("")
        if is_strict(mode):
            print_strict_mode(w, args, mode, batch, n, systems, results, summary)
            continue
        label = (
            "1 message per call"
            if batch == 1
            else f"{batch} messages per call (redis: pipeline of {batch} XADD, XREADGROUP COUNT {batch}, XACK {batch} ids)"
        )
        w(f"--- mode {mode}: N={n:,} per round, {label}")
        hdr = (
            f"{'system':<18}{'enqueue/s':>12}{'dequeue/s':>12}{'ack/s':>12}{'cycle/s':>12}  "
            f"{'client CPU':>10}{'server CPU':>11}{'box CPU':>9}{'rounds':>8}"
        )
        w(hdr)
        w("-" * len(hdr))
        for s in systems:
            m = summary.get(mode, {}).get(s.name)
            if m is None:
                fail = results.get("_failures", {}).get(s.name)
                w(f"{s.name:<18}{'(not measured' + (': ' + fail[:60] if fail else '') + ')'}")
                continue
            w(
                f"{s.name:<18}"
                + "".join(f"{fmt_rate(m[f]):>12}" for f in FIGURES)
                + f"  {fmt_cores(m['client_cpu_cores']):>10}{fmt_cores(m['server_cpu_cores']):>11}"
                f"{fmt_cores(m['box_cpu_cores']):>9}{m['rounds']:>8}"
            )
        ratios = summary.get(mode, {}).get("_ratios", {})
        if ratios:
            w("")
            hdr2 = f"{'ratio (ours / baseline)':<34}" + "".join(f"{f:>10}" for f in FIGURES)
            w(hdr2)
            w("-" * len(hdr2))
            for label2, r in ratios.items():
                w(f"{label2:<34}" + "".join(f"{('n/a' if r[f] is None else f'{r[f]:.3f}x'):>10}" for f in FIGURES))
        for s in systems:
            an = results.get(mode, {}).get(s.name, {}).get("anomalies", [])
            for a in an:
                w(f"  ! {s.name}: {a}")
    fails = results.get("_failures", {})
    if fails:
        w("")
        for k, v in fails.items():
            w(f"not measured: {k}: {v}")
    w("")
    w("notes: redis XACK only removes the entry from the group's pending list; the stream keeps the")
    w("       message until the stream is deleted (XDEL/XTRIM would be extra calls). pgqueuer's ack")
    w("       (log_jobs) deletes the job row and writes a log row. Dequeue/ack figures are measured with")
    w("       every message in flight at once (all dequeued before the first ack).")
    print("\n".join(out), flush=True)


def print_strict_mode(w, args, mode, batch, n, systems, results, summary) -> None:
    std_mode = mode[len("strict-") :]
    per_call = "1 message per call" if batch == 1 else f"{batch} messages per call"
    w(
        f"--- mode {mode}: N={n:,} per round, strict queue, {args.strict_groups:,} groups, {per_call} "
        f"(dequeue max {batch}, ack {batch} per call)"
    )
    hdr = (
        f"{'system':<18}"
        + "".join(f"{STRICT_LABELS[f]:>12}" for f in STRICT_FIGURES)
        + f"  {'client CPU':>10}{'server CPU':>11}{'box CPU':>9}{'rounds':>8}{'msgs/deq':>10}"
    )
    w(hdr)
    w("-" * len(hdr))
    fails = results.get("_failures", {})
    ours = [s for s in systems if s.is_ours]
    for s in ours:
        m = summary.get(mode, {}).get(s.name)
        if m is None:
            fail = fails.get(f"{s.name} {mode}") or fails.get(s.name)
            w(f"{s.name:<18}{'(not measured' + (': ' + fail[:70] if fail else '') + ')'}")
            continue
        w(
            f"{s.name:<18}"
            + "".join(f"{fmt_rate(m[f]):>12}" for f in STRICT_FIGURES)
            + f"  {fmt_cores(m['client_cpu_cores']):>10}{fmt_cores(m['server_cpu_cores']):>11}"
            f"{fmt_cores(m['box_cpu_cores']):>9}{m['rounds']:>8}{m['msgs_per_dequeue']:>10.1f}"
        )
    if not ours:
        w("(our service is not run: --skip-ours)")
    w("baselines: not run in strict modes (Redis Streams and pgqueuer have no per-group, one-at-a-time delivery)")
    vs = summary.get(mode, {}).get("_vs_standard", {})
    measured = [s for s in ours if s.name in summary.get(mode, {})]
    if measured:
        w("")
        hdr2 = (
            f"{'strict vs standard (' + std_mode + ')':<34}"
            + "".join(f"{STRICT_LABELS[f]:>13}" for f in STRICT_FIGURES)
            + f"{'rounds':>8}"
        )
        w(hdr2)
        w("-" * len(hdr2))
        for s in measured:
            v = vs.get(s.name)
            if v is None:
                w(f"{s.name:<34}(no {std_mode} rounds of this node in this run: add {std_mode} to --modes)")
                continue
            m = summary[mode][s.name]
            w(
                f"{s.name + ' strict':<34}"
                + "".join(f"{fmt_rate(m[f]):>13}" for f in STRICT_FIGURES)
                + f"{m['rounds']:>8}"
            )
            w(
                f"{s.name + ' ' + std_mode:<34}"
                + "".join(f"{fmt_rate(v['standard'][f]):>13}" for f in STRICT_FIGURES)
                + f"{v['standard']['rounds']:>8}"
            )
            w(
                f"{'  ratio strict / ' + std_mode:<34}"
                + "".join(
                    f"{('n/a' if v['ratio'][f] is None else format(v['ratio'][f], '.3f') + 'x'):>13}"
                    for f in STRICT_FIGURES
                )
            )
    for s in ours:
        for a in results.get(mode, {}).get(s.name, {}).get("anomalies", []):
            w(f"  ! {s.name}: {a}")
        m = summary.get(mode, {}).get(s.name)
        if m is not None:
            w(
                f"  {s.name}: drain phase, medians per round: {m['dequeue_calls']:,.0f} dequeue calls, "
                f"{m['empty_dequeues']:,.0f} of them empty; per-group order and one-at-a-time checked on every round"
                + (
                    " (see anomalies above)"
                    if results.get(mode, {}).get(s.name, {}).get("anomalies")
                    else ": no violation"
                )
            )


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
    p.add_argument("--backends", default="file,redis,postgres", help="our service's key-value backends to run")
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
    p.add_argument("--only-baselines", default="redis-streams,pgqueuer", help="which baselines to run")
    p.add_argument("--json", metavar="OUT.json", help="write all samples, medians and ratios here")
    p.add_argument("--redis-url", default=os.environ.get("MQ_TEST_REDIS_URL", "redis://127.0.0.1:63799"))
    p.add_argument("--pg-url", default=os.environ.get("MQ_TEST_PG_URL", "postgres://mq:mq@127.0.0.1:54329/mq"))
    p.add_argument("--streams-db", type=int, default=3, help="Redis DB number for the streams baseline")
    p.add_argument("--kv-redis-db", type=int, default=1, help="Redis DB number for our redis KV backend")
    p.add_argument("--pg-schema", default="mqbench_pgq", help="schema pgqueuer is installed into (dropped at the end)")
    p.add_argument("--keep-pgq-schema", action="store_true", help="leave pgqueuer's schema installed")
    p.add_argument("--database-url", default=None, help="DATABASE_URL for our nodes (default: --pg-url)")
    p.add_argument("--repo", default=str(HERE.parent), help="repository root (where manage.py is)")
    p.add_argument("--python", default=sys.executable, help="python that runs manage.py")
    p.add_argument("--port", type=int, default=0, help="node port (default: a free one)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of each bench queue")
    p.add_argument("--user", default="mqbench", help="API user created for the bench")
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE", help="extra env for the node")
    p.add_argument(
        "--http-client",
        choices=("httpclient", "requests"),
        default="httpclient",
        help="http.client keep-alive (cheaper client CPU) or requests.Session keep-alive",
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
    return a


TOPIC_SUBSCRIPTIONS = (1, 3, 10)
TOPIC_BODY = "x" * 100
TOPIC_BATCH = 100


def topic_round_ours(system: OursSystem, r, subs: int, n: int, tag: str) -> dict:
    """One round on our node: a topic with 4 partitions and `subs` subscriptions; publish n
    messages (100 per call), then drain each subscription in turn (dequeue 100 + ack them with
    their receipts). publish = n / publish seconds; deliver = deliveries / drain seconds; bytes =
    Redis used_memory growth over the publish phase / n (the store right after publishing)."""
    name = f"bt-{subs}-{tag}"
    status, body = system.api("POST", "/api/v1/topics", {"name": name, "partitions": 4})
    assert status == 201, body
    conn = system.connection()  # keep-alive, as the Redis client keeps its connection
    try:
        for k in range(subs):
            status, body = system.api("POST", f"/api/v1/topics/{name}/subscriptions", {"name": f"s{k}"})
            assert status == 201, body
        time.sleep(1.5)  # the node reopens the partitions with the subscriptions
        before = r.info("memory")["used_memory"]
        t0 = time.perf_counter()
        for i in range(0, n, TOPIC_BATCH):
            msgs = [{"body": TOPIC_BODY} for _ in range(min(TOPIC_BATCH, n - i))]
            status, body = system.api("POST", f"/api/v1/topics/{name}/publish", {"messages": msgs}, conn=conn)
            assert status == 201, body
        publish_s = time.perf_counter() - t0
        per_message = (r.info("memory")["used_memory"] - before) / n
        t0 = time.perf_counter()
        delivered = 0
        for k in range(subs):
            while True:
                status, body = system.api(
                    "POST",
                    f"/api/v1/topics/{name}/subscriptions/s{k}/dequeue",
                    {"max": TOPIC_BATCH, "visibility_timeout": 60},
                    conn=conn,
                )
                assert status == 200, body
                got = json.loads(body)["messages"]
                if not got:
                    break
                delivered += len(got)
                status, body = system.api(
                    "POST",
                    f"/api/v1/topics/{name}/subscriptions/s{k}/ack",
                    {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]},
                    conn=conn,
                )
                assert status == 200, body
        drain_s = time.perf_counter() - t0
        assert delivered == n * subs, (delivered, n * subs)
    finally:
        conn.close()
        system.api("DELETE", f"/api/v1/topics/{name}")
    return {"publish": n / publish_s, "deliver": delivered / drain_s, "bytes": per_message}


def topic_round_streams(streams: StreamsSystem, subs: int, n: int, tag: str) -> dict:
    """The same round on Redis Streams, the fan-out baseline: one stream with one consumer group
    per subscription; publish = a pipeline of 100 XADDs per call; drain each group in turn with
    XREADGROUP COUNT 100 + XACK of those ids. Same figures as topic_round_ours; bytes = used_memory
    growth over the publish phase / n (groups created before, so no pending entries are counted).
    The stream is deleted after the round."""
    r = streams.r
    key = f"mqbench:topic:{subs}-{tag}"
    groups = [f"s{k}" for k in range(subs)]
    r.delete(key)
    streams.keys.add(key)
    try:
        for g in groups:
            r.xgroup_create(key, g, id="0", mkstream=True)
        before = r.info("memory")["used_memory"]
        t0 = time.perf_counter()
        added = 0
        for i in range(0, n, TOPIC_BATCH):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(TOPIC_BATCH, n - i)):
                pipe.xadd(key, {b"body": TOPIC_BODY})
            added += sum(1 for x in pipe.execute() if x)
        publish_s = time.perf_counter() - t0
        per_message = (r.info("memory")["used_memory"] - before) / n
        assert added == n, (added, n)
        t0 = time.perf_counter()
        delivered = acked = 0
        for g in groups:
            while True:
                res = r.xreadgroup(g, "c0", {key: ">"}, count=TOPIC_BATCH)
                ids = [eid for _stream, entries in res or [] for eid, _fields in entries]
                if not ids:
                    break
                delivered += len(ids)
                acked += int(r.xack(key, g, *ids))
        drain_s = time.perf_counter() - t0
        assert delivered == n * subs, (delivered, n * subs)
        assert acked == delivered, (acked, delivered)
    finally:
        streams.drop_target({"stream": key})
    return {"publish": n / publish_s, "deliver": delivered / drain_s, "bytes": per_message}


def print_topic_table(args, rows: list[dict]) -> None:
    """Medians per system and subscription count, with the ratios ours / Redis Streams."""

    def med(system: str, subs: int, figure: str):
        return median([x[figure] for x in rows if x["system"] == system and x["subs"] == subs])

    def fmt_bytes(x) -> str:
        return "n/a" if x is None else f"{x:,.0f}"

    print(
        f"\ntopic run: {args.topic_messages} messages of 100 bytes per round, published 100 per call, "
        f"drained 100 per call (dequeue/XREADGROUP + ack/XACK), one client; medians of {args.repeat} "
        f"rounds per system, interleaved (ours, streams, ours, ...)"
    )
    print(
        "ours = our node, redis backend, topic with 4 partitions; streams = Redis Streams on the same Redis "
        f"(DB {args.streams_db}), one stream, one consumer group per subscription"
    )
    print(
        "deliv/s = messages delivered and acked over all subscriptions / drain seconds; B/msg = Redis "
        "used_memory growth over the publish phase / messages"
    )
    print(f"{'':>5} {'ours':^31} {'redis streams':^31} {'ours / streams':^19}")
    print(
        f"{'subs':>5} {'publish/s':>10} {'deliv/s':>10} {'B/msg':>9} {'publish/s':>10} {'deliv/s':>10} {'B/msg':>9}"
        f" {'publish':>9} {'deliv':>9}"
    )
    for subs in TOPIC_SUBSCRIPTIONS:
        o = {f: med("ours", subs, f) for f in ("publish", "deliver", "bytes")}
        s = {f: med("streams", subs, f) for f in ("publish", "deliver", "bytes")}
        print(
            f"{subs:>5} {fmt_rate(o['publish']):>10} {fmt_rate(o['deliver']):>10} {fmt_bytes(o['bytes']):>9} "
            f"{fmt_rate(s['publish']):>10} {fmt_rate(s['deliver']):>10} {fmt_bytes(s['bytes']):>9} "
            f"{fmt_ratio(o['publish'], s['publish']):>9} {fmt_ratio(o['deliver'], s['deliver']):>9}"
        )


def run_topic(args) -> None:
    """Topic run: for 1, 3 and 10 subscriptions, --repeat rounds on our node (redis backend) and
    on Redis Streams, interleaved round by round so background load hits both alike. Each round
    publishes --topic-messages messages and drains every subscription (see topic_round_ours and
    topic_round_streams). A message is stored once, so our bytes/message must not grow with the
    subscriptions; a stream stores it once too, which makes it the baseline for that figure."""
    import redis as redis_lib

    n = args.topic_messages
    system = OursSystem(args, "redis")
    streams = StreamsSystem(args)
    system.start()
    r = redis_lib.Redis.from_url(with_redis_db(args.redis_url, args.kv_redis_db))
    rows = []

    def record(label: str, subs: int, rep: int, row: dict) -> None:
        log(
            f"topic {label} subs={subs} round {rep + 1}/{args.repeat}: publish {fmt_rate(row['publish'])}/s"
            f"  deliveries {fmt_rate(row['deliver'])}/s  {row['bytes']:,.0f} B/msg"
        )
        rows.append({"system": label, "subs": subs} | row)

    try:
        streams.start()
        log(streams.describe())
        for subs in TOPIC_SUBSCRIPTIONS:
            for rep in range(args.repeat):
                tag = f"{rep}-{uuid.uuid4().hex[:6]}"
                record("ours", subs, rep, topic_round_ours(system, r, subs, n, tag))
                record("streams", subs, rep, topic_round_streams(streams, subs, n, tag))
    finally:
        r.close()
        try:
            streams.stop()
        except Exception as exc:
            log(f"{streams.name}: stop/cleanup failed: {exc}")
        system.stop()
    print_topic_table(args, rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.topic:
        run_topic(args)
        return 0
    modes = args.mode_list
    systems: list[System] = []
    if not args.skip_ours:
        systems += [OursSystem(args, b.strip()) for b in args.backends.split(",") if b.strip()]
    if not args.skip_baselines:
        wanted = {x.strip() for x in args.only_baselines.split(",")}
        if "redis-streams" in wanted:
            systems.append(StreamsSystem(args))
        if "pgqueuer" in wanted:
            systems.append(PgqSystem(args))
    if not systems:
        print("nothing to run (both --skip-ours and --skip-baselines)")
        return 0
    results: dict = {}
    notes: list[str] = []
    started = time.time()
    ours = [x for x in systems if x.is_ours]
    baselines = [x for x in systems if not x.is_ours]
    groups = [(o.name, [o] + baselines) for o in ours] or [("baselines", baselines)]
    run_groups(groups, baselines, args, modes, results, notes)
    summary = summarize(results, modes, systems)
    print_report(args, modes, systems, results, summary, notes)
    if args.json:
        doc = {
            "started": started,
            "duration_s": time.time() - started,
            "config": {k: v for k, v in vars(args).items() if k not in ("mode_list",)}
            | {"pg_url": redact(args.pg_url), "database_url": redact(args.database_url)},
            "modes": [{"mode": m, "batch": b, "n": n} for m, b, n in modes],
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "notes": notes,
            "summary": summary,
            "results": results,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
