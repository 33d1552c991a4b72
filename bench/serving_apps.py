"""The tiny applications ``bench/serving.py`` serves with granian, one per serving model.

Each answers any request as a message call would at its simplest: read the body, make one
store round trip (a Redis PING to ``MQ_SERVING_REDIS_URL``; none for the ``nostore`` one),
answer a small JSON body. What they cost the server process is what serving a call costs
before any of the service's own code runs.
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
    each gets its reply in order (RESP answers in order). Knows only simple-string replies."""

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

    async def ping(self) -> bytes:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        assert self.transport is not None
        self.transport.write(PING)
        return await future


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
