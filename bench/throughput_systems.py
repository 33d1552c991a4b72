"""The systems bench/throughput.py measures, parent side: setup, a fresh target per round,
teardown, and the server CPU each one burns (the client side is in throughput_clients.py).

  ours[<backend>]  our node (common.BenchNode) on a key-value backend: file, redis or postgres.
  redis-streams    Redis Streams on the same Redis, in its own DB.
  pgqueuer         pgqueuer installed into a schema of its own on the same PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import time

import throughput_clients as tc
from common import BenchError, BenchNode, log, redact

from queues.testing import with_redis_db

CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------------------
# CPU time, from /proc
# --------------------------------------------------------------------------------------


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
    """Our service: one node (a :class:`common.BenchNode`) on the key-value ``backend``."""

    kind = "ours"
    is_ours = True

    def __init__(self, args, backend: str) -> None:
        self.args = args
        self.backend = backend
        self.name = f"ours[{backend}]"
        self.node = BenchNode(
            self.name,
            backend,
            database_url=args.database_url,
            redis_url=args.redis_url,
            kv_redis_db=args.kv_redis_db,
            python=args.python,
            repo=args.repo,
            port=args.port,
            user=args.user,
            extra_env=args.node_env,
            startup_timeout=args.startup_timeout,
            keep_tmp=args.keep_tmp,
        )
        self.queues: set[str] = set()

    def start(self) -> None:
        self.node.start()

    def stop(self) -> None:
        for q in list(self.queues):
            self._delete_queue(q)
        self.node.stop()

    def client_spec(self) -> dict:
        a = self.args
        return {
            "base_url": self.node.url,
            "token": self.node.token,
            "visibility_timeout": a.visibility_timeout,
            "http_client": a.http_client,
            "http_timeout": 60.0,
        }

    def new_target(self, tag: str, strict: bool = False) -> dict:
        name = f"bench-{tag}"
        spec = {"name": name, "partitions": self.args.partitions}
        if strict:
            spec["strict"] = True
        status, body = self.node.api("POST", "/api/v1/queues", spec)
        if status != 201:
            raise BenchError(f"create queue {name}: HTTP {status}: {body[:300]!r}")
        self.queues.add(name)
        return {"queue": name}

    def _delete_queue(self, name: str) -> None:
        try:
            status, body = self.node.api("DELETE", f"/api/v1/queues/{name}")
            if status >= 300:
                log(f"{self.name}: delete queue {name}: HTTP {status}: {body[:200]!r}")
        except OSError as exc:
            log(f"{self.name}: delete queue {name}: {exc}")
        self.queues.discard(name)

    def drop_target(self, target: dict) -> None:
        self._delete_queue(target["queue"])

    def server_cpu(self) -> float | None:
        if self.node.pid is None:
            return None
        v = tree_cpu_seconds(self.node.pid)
        return None if v != v else v

    def describe(self) -> str:
        return (
            f"{self.name}: node pid {self.node.pid or '?'} on 127.0.0.1:{self.node.port}, "
            f"{self.args.partitions} partitions, KV backend {self.backend}, HTTP client {self.args.http_client} "
            f"(server CPU = the node process)"
        )
