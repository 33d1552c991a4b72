"""The private names of dependencies the service relies on (``queues/glue/``,
``config/postgresql/base.py``) still exist with the shape the glue expects.

A dependency may rename a private name in any release; these tests make an upgrade fail here,
in the unit suite, with the name that went missing, rather than in a node at start-up or under
load. Each module's docstring lists what to check.
"""

from __future__ import annotations

import inspect
import socket
import threading

import pytest


def parameter_names(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


# --- redis-py ---------------------------------------------------------------------------------
def test_redis_pools_that_read_with_hiredis_are_recognised():
    import redis
    from redis._parsers import _RESP2Parser

    from queues.glue import redis as glue

    assert glue.reads_with_hiredis(redis.ConnectionPool())  # hiredis is installed: the default
    assert not glue.reads_with_hiredis(redis.ConnectionPool(parser_class=_RESP2Parser))
    assert not glue.reads_with_hiredis(redis.BlockingConnectionPool())


@pytest.fixture
def connection():
    """A redis-py connection with hiredis on one end of a socket pair, and the other end as the
    server (no Redis needed: the test writes its answers)."""
    import redis
    from redis._parsers.hiredis import _HiredisParser

    from queues.glue import redis as glue

    conn = redis.Connection(parser_class=_HiredisParser)
    assert not glue.is_connected(conn)
    ours, server = socket.socketpair()
    server.settimeout(5)
    conn._sock = ours
    conn._parser.on_connect(conn)
    assert glue.is_connected(conn)
    yield conn, server
    conn.disconnect()
    server.close()


def test_redis_round_trip_reads_answers_in_pieces_and_errors_in_place(connection):
    import redis

    from queues.glue import redis as glue

    conn, server = connection

    def serve() -> None:
        got = b""
        while got.count(b"\r\n") < 7:  # *2 $4 PING, *3 $3 GET $1 k ... (the two commands)
            got += server.recv(4096)
        server.sendall(b"+PO")  # a reply cut in two: the reader asks for more
        server.sendall(b"NG\r\n-ERR no such thing\r\n")

    thread = threading.Thread(target=serve)
    thread.start()
    answers = glue.round_trip(conn, [("PING",), ("GET", "k")])
    thread.join()
    assert answers[0] == b"PONG"
    assert isinstance(answers[1], redis.ResponseError)


def test_redis_round_trip_on_a_closed_connection_raises_and_disconnects(connection):
    import redis

    from queues.glue import redis as glue

    conn, server = connection
    server.close()
    with pytest.raises(redis.ConnectionError):
        glue.round_trip(conn, [("PING",)])
    assert not glue.is_connected(conn)


# --- psycopg and Django's PostgreSQL backend --------------------------------------------------
def test_psycopg_wait_and_its_timeout_error_exist():
    import psycopg

    from config.postgresql import base

    assert parameter_names(psycopg.Connection.wait) == ["self", "gen", "interval", "timeout"]
    assert base.WaitTimeout is psycopg.errors._WaitTimeout
    assert issubclass(base.WaitTimeout, psycopg.OperationalError)


def test_django_postgresql_backend_has_the_hooks_overridden():
    from django.db import connection
    from django.db.backends.postgresql.base import DatabaseWrapper

    assert hasattr(DatabaseWrapper, "Database")
    assert parameter_names(DatabaseWrapper.init_connection_state) == ["self"]
    assert parameter_names(DatabaseWrapper.close_if_health_check_failed) == ["self"]
    assert hasattr(connection, "health_check_done")


# --- Django REST framework --------------------------------------------------------------------
def test_drf_request_wraps_the_django_request():
    from django.test import RequestFactory
    from rest_framework.request import Request

    from queues.glue.drf import django_request

    http = RequestFactory().post("/x", data=b"body", content_type="application/octet-stream")
    assert django_request(Request(http)) is http
    assert django_request(Request(http)).body == b"body"
