"""redis-py's private names, used to send a batch of commands and read their answers on a
connection's own socket with its hiredis reader.

``Connection.send_packed_command`` and ``read_response`` check the connection's health, wrap
each chunk and reply, and format errors: on the message path, where each call is one script or
one read, those layers cost a sizeable share of the client's CPU. :func:`round_trip` keeps
redis-py's connection (its socket, its hiredis reader and buffer, its ``connect`` and
``disconnect``) and replaces only those two calls.

On a redis-py upgrade, check (checked against redis==8.1.0 and hiredis==3.5.0, pinned in
requirements.txt):

- ``redis._parsers.hiredis._HiredisParser`` and ``redis._parsers.hiredis.NOT_ENOUGH_DATA``
  (``hiredis.Reader.gets``' answer when a reply is not complete);
- on a connection: ``Connection._sock`` (None while not connected) and ``Connection._parser``;
  on its hiredis parser: ``_reader`` (a ``hiredis.Reader``, None while not connected) and
  ``_buffer`` (the ``bytearray`` the socket is read into).

``tests/unit/test_glue.py`` fails if any of them is gone; ``tests/integration/test_kv_contract.py``
and ``test_redis_connections.py`` run :func:`round_trip` against a real Redis.
"""

from __future__ import annotations

from typing import Any

import redis as redis_lib
from hiredis import pack_command
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _HiredisParser
from redis.connection import DefaultParser


def reads_with_hiredis(pool: redis_lib.ConnectionPool) -> bool:
    """Whether ``pool`` makes plain connections (not Sentinel's, not a blocking pool with its
    own rules) that read with hiredis: the connections :func:`round_trip` can use."""
    return (
        type(pool) is redis_lib.ConnectionPool
        and issubclass(pool.connection_class, redis_lib.Connection)
        and issubclass(pool.connection_kwargs.get("parser_class", DefaultParser), _HiredisParser)
    )


def is_connected(conn: redis_lib.Connection) -> bool:
    """Whether ``conn`` has a socket (it connects on its first use otherwise)."""
    return conn._sock is not None


def round_trip(conn: redis_lib.Connection, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` on ``conn``'s socket and read one answer each, an error answer as an
    exception among them (``ResponseError``, or ``BusyLoadingError``, a ``ConnectionError``:
    the caller raises it); the rest are still read, so the connection stays in step.

    A socket error or a closed connection disconnects ``conn`` and raises ``ConnectionError``;
    a timeout raises ``TimeoutError``, as redis-py does.
    """
    parser = conn._parser
    reader, buffer, sock = parser._reader, parser._buffer, conn._sock
    if reader is None or sock is None:
        raise redis_lib.ConnectionError("redis: connection closed")
    packed = pack_command(commands[0]) if len(commands) == 1 else b"".join(map(pack_command, commands))
    answers: list[Any] = []
    try:
        sock.sendall(packed)
        for _ in commands:
            answer = reader.gets()
            while answer is NOT_ENOUGH_DATA:
                received = sock.recv_into(buffer)
                if not received:
                    raise ConnectionResetError("the server closed the connection")
                reader.feed(buffer, 0, received)
                answer = reader.gets()
            answers.append(answer)
    except TimeoutError as exc:  # socket.timeout
        conn.disconnect()
        raise redis_lib.TimeoutError(f"redis: timeout: {exc}") from exc
    except OSError as exc:
        conn.disconnect()
        raise redis_lib.ConnectionError(f"redis: {exc}") from exc
    except BaseException:
        conn.disconnect()  # out of step with the server (a reply half read): start again
        raise
    return answers
