"""The systems bench/throughput.py measures, parent side: setup, a fresh target per round,
teardown, and the CPU each one burns on the server side (the client side is in
throughput_clients.py; the counters in throughput_cpu.py).

  ours[<backend>]  our node (common.BenchNode) on a key-value backend: file, redis, postgres or
                   redis-cluster; ``ours[<backend>,p<N>]`` with ``runnode --processes N``.
                   Server CPU = every process of the node's session; store CPU = what the
                   stores spent for it: redis-server (INFO cpu, every node of a cluster) and the
                   PostgreSQL backends of its connections (application_name from PGAPPNAME).
                   Forwarded calls = mq_forwarded_calls_total of its /metrics (every process).
  redis-streams    Redis Streams on the same Redis, in its own DB. Server CPU = redis-server.
  pgqueuer         pgqueuer installed into a schema of its own on the same PostgreSQL. Server
                   CPU = the backends of its clients' connections.
  skip-locked      the queue a user writes by hand: one PostgreSQL table, dequeued with
                   ``FOR UPDATE SKIP LOCKED`` under a visibility deadline (throughput_clients.
                   SkipLockedClient has the statements). Server CPU = its clients' backends.
  thin[wsgi], thin[rsgi]
                   a reference, not a product: the thin queue (``serving_apps.ThinQueue``), our
                   message calls with nothing but the store round trips our node makes, served
                   by granian as our node is (request threads, redis-py) and on one event loop
                   (RSGI, the store calls awaited). Our clients call it. Server CPU = its
                   process; store CPU = redis-server.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import subprocess
import uuid

import throughput_clients as tc
from common import BenchError, BenchNode, log, redact
from serving import start_server
from throughput_cpu import (
    PgBackendMeter,
    parse_cluster_nodes,
    parse_cluster_url,
    parse_forwarded_calls,
    redis_cpu_seconds,
    session_cpu_seconds,
    session_pids,
    summed,
)

from tests.launcher import free_port, with_redis_db

# --------------------------------------------------------------------------------------
# systems (parent side: setup, per-round targets, teardown, server CPU)
# --------------------------------------------------------------------------------------


def app_conninfo(pg_url: str, app: str) -> str:
    """``pg_url`` with ``application_name=app``: the server side finds its backends by it."""
    sep = "&" if "?" in pg_url else "?"
    return f"{pg_url}{sep}application_name={app}"


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
        """Cumulative CPU seconds of the server side (the node, for ours); None if unknown."""
        return None

    def store_cpu(self) -> float | None:
        """Ours only: cumulative CPU seconds of the stores the node uses; None otherwise."""
        return None

    def forwarded_calls(self) -> float | None:
        """Ours only: calls the node has forwarded so far (every process); None otherwise."""
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
        return redis_cpu_seconds([self.r])

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
        self.meter = PgBackendMeter(self.pg_url, self.APP)

    def _conninfo(self) -> str:
        return app_conninfo(self.pg_url, self.APP)

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

        self.meter.close()
        asyncio.run(self._with_queries(uninstall))

    def server_cpu(self) -> float | None:
        """CPU of the PostgreSQL backends serving our clients, if they run on this machine."""
        return self.meter.read()

    def describe(self) -> str:
        import psycopg

        with psycopg.connect(self.pg_url, autocommit=True) as c:
            ver = c.execute("SHOW server_version").fetchone()[0]
            fsync = c.execute("SHOW fsync").fetchone()[0]
            sc = c.execute("SHOW synchronous_commit").fetchone()[0]
        version = importlib.metadata.version("pgqueuer")
        dur = tc.pgq_settings(self.schema).durability.value
        return (
            f"postgres {ver} at {redact(self.pg_url)}: fsync={fsync} synchronous_commit={sc}; "
            f"pgqueuer {version} in schema {self.schema}, durability={dur} "
            f"(server CPU = the client connections' backends)"
        )


class SkipLockedSystem(System):
    """The queue a user writes by hand on PostgreSQL: one table, ``FOR UPDATE SKIP LOCKED``.

    Its schema (``--skip-locked-schema``) is created at the start and dropped at the end; the
    table is emptied (TRUNCATE) for each round. The statements are in
    throughput_clients.SkipLockedClient."""

    name, kind = "skip-locked", "skip"
    APP = "mqbench-skiplocked"

    def __init__(self, args) -> None:
        self.pg_url = args.pg_url
        self.schema = args.skip_locked_schema
        self.keep = args.keep_pgq_schema
        self.vt = args.visibility_timeout
        self.created = False
        self.meter = PgBackendMeter(self.pg_url, self.APP)

    def _run(self, *statements: str) -> None:
        import psycopg

        with psycopg.connect(self.pg_url, autocommit=True) as c:
            for st in statements:
                c.execute(st)

    def start(self) -> None:
        self._run(*tc.skip_locked_ddl(self.schema))
        self.created = True

    def client_spec(self) -> dict:
        return {
            "pg_url": app_conninfo(self.pg_url, self.APP),
            "table": tc.skip_locked_table(self.schema),
            "visibility_timeout": self.vt,
        }

    def new_target(self, tag: str) -> dict:
        self._run(f"TRUNCATE {tc.skip_locked_table(self.schema)} RESTART IDENTITY")
        return {}

    def stop(self) -> None:
        self.meter.close()
        if self.created and not self.keep:
            self._run(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")

    def server_cpu(self) -> float | None:
        return self.meter.read()

    def describe(self) -> str:
        return (
            f"skip-locked: table {tc.skip_locked_table(self.schema)} on the same PostgreSQL: INSERT (one row or "
            f"unnest of B), UPDATE ... SET visible_at = now() + vt FROM (SELECT ... WHERE visible_at <= now() "
            f"ORDER BY visible_at, id LIMIT B FOR UPDATE SKIP LOCKED) RETURNING, DELETE by (id, receive count); "
            f"autocommit, one statement per call (server CPU = the client connections' backends)"
        )


class OursSystem(System):
    """Our service: one node (a :class:`common.BenchNode`) on the key-value ``backend``, with
    ``runnode --processes N`` when ``processes`` is given; ``kv`` is the KV_URL of a backend
    the bench cannot derive (``redis-cluster://...``)."""

    kind = "ours"
    is_ours = True

    def __init__(self, args, backend: str, processes: int | None = None, kv: str | None = None) -> None:
        self.args = args
        self.backend = backend
        self.processes = processes
        self.name = f"ours[{backend}]" if processes is None else f"ours[{backend},p{processes}]"
        # the node's PostgreSQL connections (Django's, and the postgres store's) carry this name
        self.app = f"mqbench-node-{uuid.uuid4().hex[:8]}"
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
            extra_env=[f"PGAPPNAME={self.app}", *args.node_env],
            startup_timeout=args.startup_timeout,
            keep_tmp=args.keep_tmp,
            kv=kv,
            processes=processes,
        )
        self.kv = kv
        self.queues: set[str] = set()
        self.redis_servers: list = []
        self.pg_meter: PgBackendMeter | None = None
        self.node_pids: list[int] = []
        self.other_queues: list[str] = []

    def start(self) -> None:
        self.redis_servers = self._redis_servers()
        if self.args.database_url.startswith(("postgres://", "postgresql://")):
            self.pg_meter = PgBackendMeter(self.args.database_url, self.app)
        self.node.start()
        if self.node.pid is not None:
            self.node_pids = session_pids(self.node.pid)
        self.other_queues = self._other_queues()
        if self.other_queues:
            log(
                f"WARNING {self.name}: the database holds {len(self.other_queues)} queues or topics the bench did "
                f"not make ({', '.join(self.other_queues[:5])}{', ...' if len(self.other_queues) > 5 else ''}): "
                "the node serves their partitions too, and their housekeeping is in its CPU figures"
            )

    def _other_queues(self) -> list[str]:
        """Queues and topics in the node's database that are not this run's (left by an
        interrupted run, or another user of the database)."""
        names = []
        for path in ("/api/v1/queues", "/api/v1/topics"):
            status, body = self.node.api("GET", path)
            if status == 200:
                names += [q["name"] for q in json.loads(body)]
        return sorted(n for n in names if not n.startswith("bench-"))

    def _redis_servers(self) -> list:
        """One redis-py client per Redis server the node's store runs on (for INFO cpu)."""
        import redis

        if self.backend == "redis":
            return [redis.Redis.from_url(self.args.redis_url)]
        if self.backend == "redis-cluster" and self.kv:
            seeds = parse_cluster_url(self.kv)
            host, port = seeds[0]
            first = redis.Redis(host=host, port=port)
            nodes = parse_cluster_nodes(first.execute_command("CLUSTER NODES"))
            first.close()
            return [redis.Redis(host=h, port=p) for h, p in nodes or seeds]
        return []

    def stop(self) -> None:
        for q in list(self.queues):
            self._delete_queue(q)
        self.node.stop()
        for r in self.redis_servers:
            r.close()
        if self.pg_meter is not None:
            self.pg_meter.close()

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
        """Every process of the node (runnode leads a session of its own: its serving
        processes and its worker are in it)."""
        if self.node.pid is None:
            return None
        v = session_cpu_seconds(self.node.pid)
        return None if v != v else v

    def store_cpu(self) -> float | None:
        meters = []
        if self.redis_servers:
            meters.append(lambda: redis_cpu_seconds(self.redis_servers))
        if self.pg_meter is not None:
            meters.append(self.pg_meter.read)
        return summed(*meters) if meters else None

    def forwarded_calls(self) -> float | None:
        """``mq_forwarded_calls_total`` of the node's ``/metrics`` (one scrape sums every
        process; loopback needs no token); None if the scrape fails."""
        try:
            status, body = self.node.api("GET", "/metrics", auth=False)
        except OSError:
            return None
        return parse_forwarded_calls(body.decode()) if status == 200 else None

    def describe(self) -> str:
        procs = "NodeProcess' default processes" if self.processes is None else f"--processes {self.processes}"
        store = []
        if self.redis_servers:
            n = len(self.redis_servers)
            store.append("redis-server (INFO cpu)" if n == 1 else f"{n} Redis Cluster nodes (INFO cpu)")
        if self.pg_meter is not None:
            store.append("the node's PostgreSQL backends")
        return (
            f"{self.name}: node pid {self.node.pid or '?'} on 127.0.0.1:{self.node.port}, {procs} "
            f"({len(self.node_pids)} processes in its session at start), {self.args.partitions} partitions, "
            f"KV {redact(self.kv) if self.kv else self.backend}, HTTP client {self.args.http_client} (server CPU = all the node's "
            f"processes; store CPU = {' + '.join(store) or 'n/a'})"
            + (
                f"; ALSO SERVING {len(self.other_queues)} other queues found in its database"
                if self.other_queues
                else ""
            )
        )


class ThinSystem(System):
    """The thin queue (``bench/serving_apps.py``): what an HTTP queue service over the same
    Redis costs per call when it does nothing but the store round trips our node makes (an
    enqueue: one write; a dequeue: none; an ack: one delete). ``model``: ``wsgi`` (granian's
    request threads and redis-py, as our node serves) or ``rsgi`` (one event loop, the store
    calls awaited). One process, like ``ours[...,p1]``. Its rates bound ours from above: our
    node's ratio to it is the share of the ceiling we reach; its ratio to Redis Streams is
    about the best such a service in Python shows on this machine."""

    kind = "ours"  # our API's paths and JSON: our client calls it

    def __init__(self, args, model: str) -> None:
        self.args = args
        self.model = model
        self.name = f"thin[{model}]"
        self.url = with_redis_db(args.redis_url, args.kv_redis_db)
        self.token = uuid.uuid4().hex
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> None:
        import redis

        self.r = redis.Redis.from_url(self.url)
        self.port = free_port()
        env = dict(os.environ, MQ_SERVING_REDIS_URL=self.url, MQ_THIN_TOKEN=self.token)
        self.proc = start_server(f"thin-{self.model}", self.port, env, python=self.args.python)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.r.close()

    def client_spec(self) -> dict:
        a = self.args
        return {
            "base_url": f"http://127.0.0.1:{self.port}",
            "token": self.token,
            "visibility_timeout": a.visibility_timeout,
            "http_client": a.http_client,
            "http_timeout": 60.0,
        }

    def new_target(self, tag: str) -> dict:
        return {"queue": f"bench-{tag}"}

    def drop_target(self, target: dict) -> None:
        self.r.delete(f"mq:thin:{target['queue']}")

    def server_cpu(self) -> float | None:
        if self.proc is None:
            return None
        v = session_cpu_seconds(self.proc.pid)
        return None if v != v else v

    def store_cpu(self) -> float | None:
        return redis_cpu_seconds([self.r])

    def describe(self) -> str:
        serving = (
            "granian request threads + redis-py (our node's serving model)"
            if self.model == "wsgi"
            else "one event loop (RSGI), store calls awaited on a pipelined connection"
        )
        return (
            f"{self.name}: the thin queue (bench/serving_apps.py) on 127.0.0.1:{self.port}, pid "
            f"{self.proc.pid if self.proc else '?'}, {serving}; one HSET an enqueue, none a dequeue, one HDEL an "
            f"ack, on {redact(self.url)} (a reference: no tree, lease, fence, validation or grants)"
        )
