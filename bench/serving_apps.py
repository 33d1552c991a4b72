"""The tiny applications ``bench/serving.py`` serves with granian, one per serving model.

Each answers any request as a message call would at its simplest: read the body, make one
store round trip (a Redis PING to ``MQ_SERVING_REDIS_URL``; none for the ``nostore`` one),
answer a small JSON body. What they cost the server process is what serving a call costs
before any of the service's own code runs.

The thin queue at the end (``thin_wsgi``, ``thin_rsgi``) is the other kind: a whole message
cycle at its leanest, which ``bench/throughput.py`` measures beside our node.
"""

from __future__ import annotations

import asyncio
import os

BODY = b'{"ids":["0000000000000000-00000001-0000"]}'
HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(BODY)))]
PING = b"*1\r\n$4\r\nPING\r\n"


def _redis_url() -> str:
    return os.environ["MQ_SERVING_REDIS_URL"]


def _read_body(environ) -> None:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        environ["wsgi.input"].read(length)


def wsgi_nostore(environ, start_response):
    """WSGI, no store: the HTTP server's own floor."""
    _read_body(environ)
    start_response("200 OK", HEADERS)
    return [BODY]


_sync_redis = None


def wsgi_ping(environ, start_response):
    """WSGI, one redis-py round trip per call, as the node's store makes it."""
    global _sync_redis
    if _sync_redis is None:
        import redis

        _sync_redis = redis.Redis.from_url(_redis_url())
    _read_body(environ)
    _sync_redis.ping()
    start_response("200 OK", HEADERS)
    return [BODY]


_async_redis = None


async def rsgi_redis_asyncio(scope, protocol):
    """RSGI (one event loop, no request threads), one ``redis.asyncio`` round trip per call."""
    global _async_redis
    if _async_redis is None:
        import redis.asyncio

        _async_redis = redis.asyncio.Redis.from_url(_redis_url())
    await protocol()
    await _async_redis.ping()
    protocol.response_bytes(200, HEADERS, BODY)


class _Pipelined(asyncio.Protocol):
    """One connection to Redis; the calls in flight write their commands on it at once and
    each gets its reply in order (RESP answers in order). Knows only one-line replies (simple
    strings, integers, errors)."""

    def __init__(self) -> None:
        self.waiting: list[asyncio.Future] = []
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\r\n", 1)
            self.waiting.pop(0).set_result(line)

    def connection_lost(self, exc) -> None:
        for future in self.waiting:
            future.set_exception(exc or ConnectionError("redis closed the connection"))

    async def send(self, packed: bytes) -> bytes:
        """Write one packed command; its one-line reply."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        assert self.transport is not None
        self.transport.write(packed)
        return await future

    async def ping(self) -> bytes:
        return await self.send(PING)


_pipelined: _Pipelined | None = None


async def rsgi_protocol(scope, protocol):
    """RSGI, one round trip per call on a pipelined asyncio Protocol: the leanest store client."""
    global _pipelined
    if _pipelined is None:
        from urllib.parse import urlsplit

        url = urlsplit(_redis_url())
        _, _pipelined = await asyncio.get_running_loop().create_connection(
            _Pipelined, url.hostname or "127.0.0.1", url.port or 6379
        )
    await protocol()
    await _pipelined.ping()
    protocol.response_bytes(200, HEADERS, BODY)


async def rsgi_inline(scope, protocol):
    """RSGI, the call's synchronous code run on the event loop's own thread: one redis-py
    round trip per call, blocking the loop for its length (no request threads; what an RSGI
    entrance in front of today's synchronous service would cost)."""
    global _sync_redis
    if _sync_redis is None:
        import redis

        _sync_redis = redis.Redis.from_url(_redis_url())
    await protocol()
    _sync_redis.ping()
    protocol.response_bytes(200, HEADERS, BODY)


# --- the thin queue: the ceiling of a Python HTTP queue service over Redis --------------
#
# ``bench/throughput.py`` runs it beside our node (``thin[wsgi]``, ``thin[rsgi]``): our message
# calls' paths and JSON, the same store round trips as our node's (an enqueue: one write of
# its messages; a dequeue: none, served from memory; an ack: one delete), and nothing else: no
# append tree, lease, fence, validation, grants, metrics, redelivery or persistence of receive
# counts; one process, its queues in memory, IDs from a counter. It is not a queue anyone
# should run (a restart forgets what was in flight); what it costs is about the least a Python
# HTTP service in front of Redis pays per call on this machine, so our node's ratio to it is the
# share of the ceiling we reach, and its ratio to Redis Streams about the best such a service
# could show.


class ThinQueue:
    """In-memory state of the thin queue, shared by the request threads (``thin_wsgi``) or
    used by one event loop (``thin_rsgi``)."""

    def __init__(self) -> None:
        import threading
        from collections import defaultdict, deque

        self.lock = threading.Lock()
        #: deliverable messages by queue (the URL's name: a benchmark round's own queue)
        self.ready: defaultdict[str, deque[tuple[str, str]]] = defaultdict(deque)
        self.out: dict[str, str] = {}  # in flight: id -> receipt
        self.seq = 0
        self.token = os.environ.get("MQ_THIN_TOKEN", "")

    @staticmethod
    def queue(path: str) -> str:
        return path.rsplit("/", 2)[-2]

    def key(self, path: str) -> str:
        return "mq:thin:" + self.queue(path)

    def new_ids(self, n: int) -> list[str]:
        with self.lock:
            first, self.seq = self.seq, self.seq + n
        return [str(first + i) for i in range(n)]

    def enqueue_write(self, path: str, data: dict) -> tuple[list[str], list[str], tuple]:
        """The IDs, bodies and the one store command (HSET of every message) of an enqueue."""
        bodies = [data["body"]] if "body" in data else [m["body"] for m in data["messages"]]
        ids = self.new_ids(len(bodies))
        fields: list[str] = []
        for mid, body in zip(ids, bodies):
            fields += (mid, body)
        return ids, bodies, ("HSET", self.key(path), *fields)

    def enqueued(self, path: str, data: dict, ids: list[str], bodies: list[str]) -> tuple[int, dict]:
        """Deliverable once written; the enqueue's answer."""
        with self.lock:
            self.ready[self.queue(path)].extend(zip(ids, bodies))
        return 201, ({"id": ids[0]} if "body" in data else {"ids": ids})

    def dequeue(self, path: str, data: dict) -> tuple[int, dict]:
        messages = []
        with self.lock:
            ready = self.ready[self.queue(path)]
            for _ in range(min(int(data.get("max", 1)), len(ready))):
                mid, body = ready.popleft()
                self.out[mid] = receipt = "r" + mid
                messages.append({"id": mid, "receipt": receipt, "body": body})
        return 200, {"messages": messages}

    def ack_delete(self, path: str, data: dict) -> tuple[int, tuple | None]:
        """How many of the ack's messages were in flight, and the store command that deletes them."""
        found = []
        with self.lock:
            for item in data["messages"]:
                if self.out.get(item["id"]) == item["receipt"]:
                    del self.out[item["id"]]
                    found.append(item["id"])
        return len(found), (("HDEL", self.key(path), *found) if found else None)

    def acked(self, data: dict, acked: int) -> tuple[int, dict]:
        return 200, {"acked": acked, "not_found": len(data["messages"]) - acked}


_thin = ThinQueue()
_JSON = [("Content-Type", "application/json")]


def _thin_call(path: str, authorization: str | None, raw: bytes):
    """One call of the thin queue, as a generator: it yields the store command the call needs
    (an enqueue's, an ack's; none for a dequeue), which the serving model runs its way, and
    returns ``(status, answer)``."""
    import orjson

    if authorization != f"Token {_thin.token}":
        return 401, {"error": "not_authenticated"}
    if path.endswith("/dequeue"):
        return _thin.dequeue(path, orjson.loads(raw))
    data = orjson.loads(raw)
    if path.endswith("/enqueue"):
        ids, bodies, command = _thin.enqueue_write(path, data)
        yield command
        return _thin.enqueued(path, data, ids, bodies)
    if path.endswith("/ack"):
        acked, delete = _thin.ack_delete(path, data)
        if delete is not None:
            yield delete
        return _thin.acked(data, acked)
    return 404, {"error": "not_found"}


def thin_wsgi(environ, start_response):
    """The thin queue on granian's request threads with redis-py: our node's serving model."""
    global _sync_redis
    import orjson

    if _sync_redis is None:
        import redis

        _sync_redis = redis.Redis.from_url(_redis_url())
    length = int(environ.get("CONTENT_LENGTH") or 0)
    raw = environ["wsgi.input"].read(length) if length else b""
    call = _thin_call(environ["PATH_INFO"], environ.get("HTTP_AUTHORIZATION"), raw)
    try:
        while True:
            _sync_redis.execute_command(*next(call))
    except StopIteration as done:
        status, answer = done.value
    body = orjson.dumps(answer)
    start_response(f"{status} -", [*_JSON, ("Content-Length", str(len(body)))])
    return [body]


async def _thin_store(command: tuple) -> None:
    """One command on the pipelined connection (every reply of ours is one line)."""
    global _pipelined
    from hiredis import pack_command

    if _pipelined is None:
        from urllib.parse import urlsplit

        url = urlsplit(_redis_url())
        _, _pipelined = await asyncio.get_running_loop().create_connection(
            _Pipelined, url.hostname or "127.0.0.1", url.port or 6379
        )
        db = url.path.strip("/")
        if db and db != "0":
            await _pipelined.send(pack_command(("SELECT", db)))
    reply = await _pipelined.send(pack_command(command))
    if reply.startswith(b"-"):
        raise RuntimeError(f"redis: {reply.decode()}")


async def thin_rsgi(scope, protocol):
    """The thin queue on one event loop (RSGI), its store calls awaited on one pipelined
    connection: the leanest serving there is in Python."""
    import orjson

    raw = await protocol()
    call = _thin_call(scope.path, scope.headers.get("authorization"), raw)
    try:
        while True:
            await _thin_store(next(call))
    except StopIteration as done:
        status, answer = done.value
    protocol.response_bytes(status, _JSON, orjson.dumps(answer))
