"""Client sides of bench/throughput.py: one class per system and the worker-process loop.

Each benchmark client is a separate OS process (spawned, so no state is inherited from the
parent) that owns one connection to the system under test. The parent drives all clients
through pipes, phase by phase; the clients start each timed phase together on a barrier and
report their own monotonic start/end times, CPU seconds and counts.

Four systems, one interface (``set_target``, ``enqueue_phase``, ``dequeue_phase``,
``ack_phase``); our service alone also has ``drain_phase`` for the strict modes (a strict
queue delivers one message per group at a time, so it is drained by dequeue+ack cycles):

* ``OursClient``      -- our service's REST API over HTTP/1.1 keep-alive (libcurl through
                          pycurl, http.client or requests.Session).
* ``StreamsClient``   -- Redis Streams: XADD / XREADGROUP (consumer group) / XACK.
* ``PgqClient``       -- pgqueuer 1.6.0's own ``Queries`` object over a psycopg async
                          connection: ``enqueue`` / ``dequeue`` / ``log_jobs(successful)``,
                          which is exactly what pgqueuer's QueueManager calls internally.
* ``SkipLockedClient`` -- the queue a user writes by hand: a PostgreSQL table, INSERT, UPDATE ...
                          RETURNING over a FOR UPDATE SKIP LOCKED subselect, DELETE.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import socket
import time
import traceback
import uuid
from datetime import timedelta
from urllib.parse import urlsplit

from common import BenchError

BODY_LEN = 100
DRAIN_ABORT = 1 << 50  # added to the shared counter by a client that gives up a drain phase


def make_body(tag: str, i: int) -> str:
    """A ~100-byte ASCII body, unique per message."""
    head = f"{tag}:{i:09d}:"
    return (head + "x" * BODY_LEN)[:BODY_LEN]


# --------------------------------------------------------------------------------------
# shared bookkeeping
# --------------------------------------------------------------------------------------


class PhaseStats:
    """What one client did during one phase (sent back to the parent as a dict)."""

    def __init__(self) -> None:
        self.count = 0  # messages successfully enqueued / received / acked
        self.calls = 0  # requests / round trips made
        self.empty = 0  # dequeue calls that returned nothing
        self.errors = 0
        self.error_samples: list[str] = []
        self.timed_out = False
        self.ids: list[str] = []  # dequeue phase: ids received (for duplicate accounting)
        # drain phase (strict modes) only
        self.received = 0  # messages delivered by dequeue calls (count = messages acked)
        self.dequeues = 0  # dequeue calls (calls also counts the ack calls)
        self.gave_up = False  # a call failed for good: this client stopped, and stopped the others
        self.deliveries: list = []  # (group, sequence, id, t_received, t_ack_sent) per message

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(text[:300])

    def as_dict(self) -> dict:
        return {
            "count": self.count,
            "calls": self.calls,
            "empty": self.empty,
            "errors": self.errors,
            "error_samples": self.error_samples,
            "timed_out": self.timed_out,
            "ids": self.ids,
            "received": self.received,
            "dequeues": self.dequeues,
            "gave_up": self.gave_up,
            "deliveries": self.deliveries,
        }


def chunked(seq: list, size: int) -> list[list]:
    return [seq[i : i + size] for i in range(0, len(seq), size)]


# --------------------------------------------------------------------------------------
# (a) our service over HTTP
# --------------------------------------------------------------------------------------


class _HttpConn:
    """Minimal keep-alive JSON client on http.client (far less client CPU than requests)."""

    def __init__(self, base_url: str, token: str, timeout: float) -> None:
        u = urlsplit(base_url)
        self.host, self.port = u.hostname, u.port or 80
        self.prefix = u.path.rstrip("/")
        self.timeout = timeout
        self.headers = {
            "Authorization": f"Token {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Connection": "keep-alive",
        }
        self.conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self.conn.connect()
        # as urllib3 does: no Nagle delay on small requests
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.conn

    def request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        for attempt in (0, 1):
            conn = self.conn or self._connect()
            try:
                conn.request(method, self.prefix + path, body=body, headers=self.headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    conn.close()
                    self.conn = None
                return resp.status, data
            except (
                http.client.RemoteDisconnected,
                ConnectionError,
                http.client.CannotSendRequest,
                http.client.BadStatusLine,
            ):
                # a keep-alive connection the server closed: reconnect once
                conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class _CurlConn:
    """Keep-alive JSON client on libcurl (pycurl): the HTTP counterpart of redis-py with hiredis,
    whose replies the Redis Streams clients parse in C. http.client parses each response's
    headers in Python (``email.parser``): 82 µs of client CPU a call against 32 here, measured
    on one node's empty dequeue; the clients share the machine with the servers, so that CPU
    was taken from the node."""

    def __init__(self, base_url: str, token: str, timeout: float) -> None:
        import pycurl

        self.pycurl = pycurl
        self.base = base_url.rstrip("/")
        self.buf = io.BytesIO()
        c = self.curl = pycurl.Curl()
        c.setopt(
            pycurl.HTTPHEADER,
            [
                f"Authorization: Token {token}",
                "Content-Type: application/json",
                "Accept: application/json",
                "Expect:",  # no 100-continue round trip before a large body
            ],
        )
        c.setopt(pycurl.WRITEDATA, self.buf)
        c.setopt(pycurl.PROXY, "")  # never an http_proxy from the environment (http.client ignores it)
        c.setopt(pycurl.TCP_NODELAY, 1)
        c.setopt(pycurl.TIMEOUT_MS, int(timeout * 1000))
        c.setopt(pycurl.NOSIGNAL, 1)

    def request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        c, buf = self.curl, self.buf
        buf.seek(0)
        buf.truncate()
        c.setopt(self.pycurl.URL, self.base + path)
        c.setopt(self.pycurl.CUSTOMREQUEST, method)
        c.setopt(self.pycurl.POSTFIELDS, body or b"")
        try:
            c.perform()  # libcurl reuses the connection, and reconnects when the server closed it
        except self.pycurl.error as exc:
            raise ConnectionError(f"libcurl: {exc.args[-1]}") from None
        return c.getinfo(self.pycurl.RESPONSE_CODE), buf.getvalue()

    def close(self) -> None:
        self.curl.close()


class _RequestsConn:
    def __init__(self, base_url: str, token: str, timeout: float) -> None:
        import requests

        self.base = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update(
            {"Authorization": f"Token {token}", "Content-Type": "application/json", "Accept": "application/json"}
        )

    def request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        r = self.session.request(method, self.base + path, data=body, timeout=self.timeout)
        return r.status_code, r.content

    def close(self) -> None:
        self.session.close()


class OursClient:
    """Our REST API: POST .../enqueue, .../dequeue, .../ack."""

    def __init__(self, spec: dict, index: int) -> None:
        import orjson

        self.dumps, self.loads = orjson.dumps, orjson.loads
        cls = {"requests": _RequestsConn, "httpclient": _HttpConn}.get(spec.get("http_client", ""), _CurlConn)
        self.http = cls(spec["base_url"], spec["token"], spec.get("http_timeout", 60.0))
        self.vt = int(spec.get("visibility_timeout", 300))
        self.retries = int(spec.get("retries", 3))
        self.queue = ""

    def set_target(self, target: dict) -> None:
        self.queue = target["queue"]

    def close(self) -> None:
        self.http.close()

    def _post(self, st: PhaseStats, action: str, payload: dict, ok: int) -> dict | None:
        body = self.dumps(payload)
        path = f"/api/v1/queues/{self.queue}/{action}"
        for attempt in range(self.retries + 1):
            st.calls += 1
            try:
                status, data = self.http.request("POST", path, body)
            except Exception as exc:  # connection refused, timeout ...
                st.error(f"{action}: {type(exc).__name__}: {exc}")
                time.sleep(0.05 * (attempt + 1))
                continue
            if status == ok:
                return self.loads(data) if data else {}
            st.error(f"{action}: HTTP {status}: {data[:200]!r}")
            if status < 500 and status not in (408, 409, 423, 429):
                return None  # a 4xx other than "try again" will not get better
            time.sleep(0.05 * (attempt + 1))
        return None

    def enqueue_phase(self, st: PhaseStats, bodies: list[str], batch: int, groups: list[str] | None = None) -> None:
        """`groups` (strict modes): the group of each message, sent as its "group" field."""
        items = (
            [{"body": b} for b in bodies]
            if groups is None
            else [{"body": b, "group": g} for b, g in zip(bodies, groups)]
        )
        if batch <= 1:
            for item in items:
                r = self._post(st, "enqueue", item, 201)
                if r is not None and r.get("id"):
                    st.count += 1
        else:
            for chunk in chunked(items, batch):
                r = self._post(st, "enqueue", {"messages": chunk}, 201)
                if r is not None:
                    st.count += len(r.get("ids") or [])

    def dequeue_once(self, st: PhaseStats, max_n: int) -> list:
        r = self._post(st, "dequeue", {"max": max_n, "visibility_timeout": self.vt, "wait": 0}, 200)
        if not r:
            return []
        return [(m["id"], m["receipt"]) for m in r.get("messages") or []]

    def ack_phase(self, st: PhaseStats, handles: list, batch: int) -> None:
        for chunk in chunked(handles, max(1, batch)):
            r = self._post(st, "ack", {"messages": [{"id": i, "receipt": rc} for i, rc in chunk]}, 200)
            if r is not None:
                st.count += int(r.get("acked", 0))

    def drain_phase(
        self, st: PhaseStats, max_n: int, batch: int, counter, target: int, deadline: float, empty_sleep: float
    ) -> None:
        """Strict modes: dequeue(max_n) then ack what came (`batch` per call), again and again
        until all clients together acked `target` messages. On a strict queue a group's next
        message is only delivered once the previous one is acked, so this is the only way to
        drain it. Each delivery is recorded (group, sequence, id, when received, when its ack
        was sent) for the parent's order / one-at-a-time check."""
        req = {"max": max_n, "visibility_timeout": self.vt, "wait": 0}
        records = st.deliveries
        while counter.value < target:
            if time.monotonic() > deadline:
                st.timed_out = True
                break
            st.dequeues += 1
            r = self._post(st, "dequeue", req, 200)
            t_recv = time.monotonic()
            if r is None:  # failed for good (4xx, or 5xx after the retries)
                st.gave_up = True
                break
            msgs = r.get("messages") or []
            if not msgs:
                st.empty += 1
                time.sleep(empty_sleep)
                continue
            st.received += len(msgs)
            for chunk in chunked(msgs, max(1, batch)):
                t_ack = time.monotonic()
                a = self._post(st, "ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in chunk]}, 200)
                for m in chunk:
                    records.append((m.get("group"), m.get("sequence"), m["id"], t_recv, t_ack))
                if a is None:
                    st.gave_up = True
                    break
                acked = int(a.get("acked", 0))
                st.count += acked
                with counter.get_lock():
                    counter.value += acked
            if st.gave_up:
                break
        if st.gave_up:
            with counter.get_lock():  # let the other clients stop too
                counter.value += DRAIN_ABORT

    @staticmethod
    def handle_id(h) -> str:
        return h[0]


# --------------------------------------------------------------------------------------
# (b) Redis Streams
# --------------------------------------------------------------------------------------


class StreamsClient:
    """XADD (pipelined by `batch`), XREADGROUP COUNT n, XACK with up to `batch` ids."""

    def __init__(self, spec: dict, index: int) -> None:
        import redis

        self.r = redis.Redis.from_url(spec["redis_url"], decode_responses=False)
        self.r.ping()
        self.consumer = f"c{index}-{uuid.uuid4().hex[:6]}"
        self.key = self.group = ""

    def set_target(self, target: dict) -> None:
        self.key, self.group = target["stream"], target["group"]

    def close(self) -> None:
        self.r.close()

    def enqueue_phase(self, st: PhaseStats, bodies: list[str], batch: int) -> None:
        if batch <= 1:
            for b in bodies:
                st.calls += 1
                self.r.xadd(self.key, {b"body": b})
                st.count += 1
        else:
            for chunk in chunked(bodies, batch):
                st.calls += 1
                pipe = self.r.pipeline(transaction=False)
                for b in chunk:
                    pipe.xadd(self.key, {b"body": b})
                st.count += sum(1 for x in pipe.execute() if x)

    def dequeue_once(self, st: PhaseStats, max_n: int) -> list:
        st.calls += 1
        res = self.r.xreadgroup(self.group, self.consumer, {self.key: ">"}, count=max_n)
        if not res:
            return []
        out = []
        for _stream, entries in res:
            out.extend(eid for eid, _fields in entries)
        return out

    def ack_phase(self, st: PhaseStats, handles: list, batch: int) -> None:
        for chunk in chunked(handles, max(1, batch)):
            st.calls += 1
            st.count += int(self.r.xack(self.key, self.group, *chunk))

    @staticmethod
    def handle_id(h) -> str:
        return h.decode() if isinstance(h, bytes) else str(h)


# --------------------------------------------------------------------------------------
# (c) pgqueuer 1.6.0
# --------------------------------------------------------------------------------------


def pgq_settings(schema: str):
    """pgqueuer DBSettings for an installation of its own, in `schema` with its own channel."""
    from pgqueuer.domain.settings import DBSettings

    return DBSettings(db_schema=schema, channel=f"{schema}_ch")


def pgq_queries(driver, schema: str):
    from pgqueuer.adapters.persistence import qb
    from pgqueuer.adapters.persistence.queries import Queries

    s = pgq_settings(schema)
    return Queries(
        driver,
        qbe=qb.QueryBuilderEnvironment(settings=s),
        qbq=qb.QueryQueueBuilder(settings=s),
        qbs=qb.QuerySchedulerBuilder(settings=s),
    )


class PgqClient:
    """pgqueuer's Queries API, the same calls its QueueManager makes.

    enqueue: ``Queries.enqueue(entrypoint, payload)`` (scalar = one INSERT) or with lists
             (batch = one INSERT ... FROM UNNEST of 100 rows).
    dequeue: ``Queries.dequeue(batch_size=1|100, ...)`` = SELECT ... FOR UPDATE SKIP LOCKED and
             UPDATE status='picked' in one statement (QueueManager.fetch_jobs does this).
    ack:     ``Queries.log_jobs([(job, 'successful', None), ...])`` = DELETE from the queue
             table + INSERT into its log table in one statement (QueueManager's
             JobStatusLogBuffer flushes completions through it, max_size = batch_size).
    """

    def __init__(self, spec: dict, index: int) -> None:
        import psycopg
        from pgqueuer.adapters.drivers.psycopg import PsycopgDriver
        from pgqueuer.ports.repository import EntrypointExecutionParameter

        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(psycopg.AsyncConnection.connect(spec["pg_url"], autocommit=True))
        self.q = pgq_queries(PsycopgDriver(self.conn), spec["schema"])
        self.param = EntrypointExecutionParameter(concurrency_limit=0)
        self.qm_id = uuid.uuid4()
        self.hb = timedelta(seconds=int(spec.get("visibility_timeout", 300)))
        self.entrypoint = ""

    def set_target(self, target: dict) -> None:
        self.entrypoint = target["entrypoint"]

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()

    # The phases run as one coroutine each, so the event loop costs nothing per call.
    def enqueue_phase(self, st: PhaseStats, bodies: list[str], batch: int) -> None:
        self.loop.run_until_complete(self._enqueue(st, bodies, batch))

    async def _enqueue(self, st: PhaseStats, bodies: list[str], batch: int) -> None:
        ep = self.entrypoint
        if batch <= 1:
            for b in bodies:
                st.calls += 1
                st.count += len(await self.q.enqueue(ep, b.encode()))
        else:
            for chunk in chunked(bodies, batch):
                st.calls += 1
                ids = await self.q.enqueue([ep] * len(chunk), [b.encode() for b in chunk], [0] * len(chunk))
                st.count += len(ids)

    def dequeue_loop(self, st, max_n, counter, target, deadline, empty_sleep) -> list:
        return self.loop.run_until_complete(self._dequeue_loop(st, max_n, counter, target, deadline, empty_sleep))

    async def _dequeue_loop(self, st, max_n, counter, target, deadline, empty_sleep) -> list:
        received: list = []
        eps = {self.entrypoint: self.param}
        while counter.value < target:
            if time.monotonic() > deadline:
                st.timed_out = True
                break
            st.calls += 1
            jobs = await self.q.dequeue(
                batch_size=max_n,
                entrypoints=eps,
                queue_manager_id=self.qm_id,
                global_concurrency_limit=None,
                heartbeat_timeout=self.hb,
            )
            if jobs:
                received.extend(jobs)
                with counter.get_lock():
                    counter.value += len(jobs)
            else:
                st.empty += 1
                await asyncio.sleep(empty_sleep)
        return received

    def ack_phase(self, st: PhaseStats, handles: list, batch: int) -> None:
        self.loop.run_until_complete(self._ack(st, handles, batch))

    async def _ack(self, st: PhaseStats, handles: list, batch: int) -> None:
        for chunk in chunked(handles, max(1, batch)):
            st.calls += 1
            await self.q.log_jobs([(job, "successful", None) for job in chunk])
            st.count += len(chunk)

    @staticmethod
    def handle_id(h) -> str:
        return str(h.id)


# --------------------------------------------------------------------------------------
# (d) the queue a user writes by hand: a PostgreSQL table and FOR UPDATE SKIP LOCKED
# --------------------------------------------------------------------------------------


def skip_locked_table(schema: str) -> str:
    return f"{schema}.messages"


def skip_locked_ddl(schema: str) -> list[str]:
    """The schema of the hand-written queue (a leftover of an interrupted run is dropped).

    ``visible_at``: when the message may be delivered (again): now() at enqueue, the visibility
    deadline once received. ``receives`` counts deliveries; an ack names it, so an ack that
    comes after the deadline (the message went to someone else) deletes nothing. The index
    serves the dequeue's ``visible_at <= now() ORDER BY visible_at, id``: in-flight messages
    (deadline in the future) are not scanned over."""
    t = skip_locked_table(schema)
    return [
        f"DROP SCHEMA IF EXISTS {schema} CASCADE",
        f"CREATE SCHEMA {schema}",
        (
            f"CREATE TABLE {t} (id bigserial PRIMARY KEY, body text NOT NULL, "
            "visible_at timestamptz NOT NULL DEFAULT now(), receives integer NOT NULL DEFAULT 0)"
        ),
        f"CREATE INDEX ON {t} (visible_at, id)",
    ]


class SkipLockedClient:
    """One psycopg connection (autocommit: every call is one statement, one transaction;
    psycopg prepares a statement from its 5th run on).

    enqueue: ``INSERT ... VALUES (%s)`` or ``INSERT ... SELECT unnest(%s::text[])`` (B rows).
    dequeue: ``UPDATE t SET visible_at = now() + vt, receives = receives + 1 FROM (SELECT id ...
             WHERE visible_at <= now() ORDER BY visible_at, id LIMIT B FOR UPDATE SKIP LOCKED)
             RETURNING id, receives, body``.
    ack:     ``DELETE`` of the (id, receives) pairs: one, or B through unnest.
    """

    def __init__(self, spec: dict, index: int) -> None:
        import psycopg

        self.conn = psycopg.connect(spec["pg_url"], autocommit=True)
        t = spec["table"]
        vt = int(spec.get("visibility_timeout", 300))
        self.insert_one = f"INSERT INTO {t} (body) VALUES (%s)"
        self.insert_many = f"INSERT INTO {t} (body) SELECT unnest(%s::text[])"
        self.dequeue_sql = (
            f"UPDATE {t} AS m SET visible_at = now() + interval '{vt} seconds', receives = m.receives + 1 "
            f"FROM (SELECT id FROM {t} WHERE visible_at <= now() ORDER BY visible_at, id LIMIT %s "
            "FOR UPDATE SKIP LOCKED) AS next WHERE m.id = next.id RETURNING m.id, m.receives, m.body"
        )
        self.delete_one = f"DELETE FROM {t} WHERE id = %s AND receives = %s"
        self.delete_many = (
            f"DELETE FROM {t} AS m USING unnest(%s::bigint[], %s::integer[]) AS a(id, receives) "
            "WHERE m.id = a.id AND m.receives = a.receives"
        )

    def set_target(self, target: dict) -> None:
        pass

    def close(self) -> None:
        self.conn.close()

    def enqueue_phase(self, st: PhaseStats, bodies: list[str], batch: int) -> None:
        cur = self.conn.cursor()
        if batch <= 1:
            for b in bodies:
                st.calls += 1
                cur.execute(self.insert_one, (b,))
                st.count += cur.rowcount
        else:
            for chunk in chunked(bodies, batch):
                st.calls += 1
                cur.execute(self.insert_many, (chunk,))
                st.count += cur.rowcount

    def dequeue_once(self, st: PhaseStats, max_n: int) -> list:
        st.calls += 1
        rows = self.conn.execute(self.dequeue_sql, (max_n,)).fetchall()
        return [(r[0], r[1]) for r in rows]

    def ack_phase(self, st: PhaseStats, handles: list, batch: int) -> None:
        cur = self.conn.cursor()
        if batch <= 1:
            for mid, receives in handles:
                st.calls += 1
                cur.execute(self.delete_one, (mid, receives))
                st.count += cur.rowcount
        else:
            for chunk in chunked(handles, batch):
                st.calls += 1
                cur.execute(self.delete_many, ([h[0] for h in chunk], [h[1] for h in chunk]))
                st.count += cur.rowcount

    @staticmethod
    def handle_id(h) -> str:
        return str(h[0])


CLIENTS = {"ours": OursClient, "streams": StreamsClient, "pgq": PgqClient, "skip": SkipLockedClient}


def generic_dequeue_loop(client, st, max_n, counter, target, deadline, empty_sleep) -> list:
    received: list = []
    while counter.value < target:
        if time.monotonic() > deadline:
            st.timed_out = True
            break
        got = client.dequeue_once(st, max_n)
        if got:
            received.extend(got)
            with counter.get_lock():
                counter.value += len(got)
        else:
            st.empty += 1
            time.sleep(empty_sleep)
    return received


# --------------------------------------------------------------------------------------
# worker process
# --------------------------------------------------------------------------------------


def worker_main(conn, kind: str, spec: dict, index: int, counter, barrier) -> None:
    """Runs in a spawned process: one client, commands from the parent over `conn`."""
    try:
        client = CLIENTS[kind](spec, index)
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        return
    conn.send(("ok", None))
    received: list = []
    while True:
        try:
            cmd, args = conn.recv()
        except EOFError:
            break
        if cmd == "stop":
            break
        try:
            if cmd == "target":
                client.set_target(args)
                received = []
                conn.send(("ok", None))
                continue
            st = PhaseStats()
            # everything that is not the measured work happens before the barrier
            if cmd == "enqueue":
                bodies = [make_body(args["tag"], i) for i in args["indexes"]]
                n_groups = args.get("groups")  # strict modes: group = g<i % groups>
                groups = [f"g{i % n_groups}" for i in args["indexes"]] if n_groups else None
            elif cmd == "ack":
                handles, received = received, []
            elif cmd == "drain" and not hasattr(client, "drain_phase"):
                raise BenchError(f"{kind} has no drain phase (strict modes are for our service only)")
            barrier.wait(timeout=120)
            c0, t0 = time.process_time(), time.monotonic()
            if cmd == "enqueue":
                if groups is None:
                    client.enqueue_phase(st, bodies, args["batch"])
                else:
                    client.enqueue_phase(st, bodies, args["batch"], groups)
            elif cmd == "drain":
                client.drain_phase(
                    st, args["max"], args["batch"], counter, args["target"], t0 + args["timeout"], args["empty_sleep"]
                )
            elif cmd == "dequeue":
                deadline = t0 + args["timeout"]
                loop = getattr(client, "dequeue_loop", None)
                if loop is not None:
                    received = loop(st, args["max"], counter, args["target"], deadline, args["empty_sleep"])
                else:
                    received = generic_dequeue_loop(
                        client, st, args["max"], counter, args["target"], deadline, args["empty_sleep"]
                    )
                st.count = len(received)
            elif cmd == "ack":
                client.ack_phase(st, handles, args["batch"])
            else:
                raise BenchError(f"unknown command {cmd!r}")
            t1, c1 = time.monotonic(), time.process_time()
            if cmd == "dequeue":
                st.ids = [client.handle_id(h) for h in received]  # after the clock stopped
            conn.send(("ok", dict(st.as_dict(), t0=t0, t1=t1, cpu=c1 - c0)))
        except BaseException:
            try:
                barrier.abort()
            except Exception:
                pass
            conn.send(("err", traceback.format_exc()))
    try:
        client.close()
    except Exception:
        pass
