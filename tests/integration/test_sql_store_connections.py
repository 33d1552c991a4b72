"""The PostgreSQL store's statements on a connection the server closed since its last use (a
restart, an idle timeout, an operator's ``pg_terminate_backend``): they are not preceded by a
health check (a ``SELECT 1`` round trip per call), so the statement itself finds the dead
connection and runs once more on a new one (``queues.kv.sql.SQLStore._server_bound``)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from queues.kv.base import Fence, KVError
from queues.kv.sql import SQLStore

pytestmark = pytest.mark.django_db(transaction=True)


def _terminate(pid: int) -> None:
    """End backend ``pid`` from another connection (another thread's), and wait till it is gone."""

    def run() -> None:
        other = connections["default"]
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
            assert cursor.fetchone() == (True,)
        other.close()

    t = threading.Thread(target=run)
    t.start()
    t.join()


@pytest.fixture
def sql_store() -> SQLStore:
    if connection.vendor != "postgresql":
        pytest.skip("the PostgreSQL store")
    return SQLStore()


def test_every_statement_survives_a_connection_the_server_closed(sql_store):
    fence = Fence("q/0/_fence", 1)
    sql_store.compare_and_set(fence.key, None, b"1")
    sql_store.put_many([("q/0/blk/0", b"a")], fence=fence)
    for step in ("put", "read", "delete"):
        pid = connection.connection.info.backend_pid
        _terminate(pid)
        if step == "put":
            sql_store.put_many([("q/0/blk/1", b"b")], fence=fence)
        elif step == "read":
            assert sql_store.get_many(["q/0/blk/0", "q/0/blk/1"]) == [b"a", b"b"]
        else:
            assert sql_store.delete_many(["q/0/blk/0", "q/0/blk/1"], fence=fence) == 2
        assert connection.connection.info.backend_pid != pid  # on a new connection, no error
    assert sql_store.get_many(["q/0/blk/0", "q/0/blk/1"]) == [None, None]


def test_a_statement_is_not_run_again_inside_a_transaction(sql_store):
    from django.db import transaction

    sql_store.put_many([("q/0/blk/0", b"a")])
    with pytest.raises(KVError), transaction.atomic():
        _terminate(connection.connection.info.backend_pid)
        sql_store.get_many(["q/0/blk/0"])  # its transaction is gone with the connection: an error
    connection.close()
    assert sql_store.get_many(["q/0/blk/0"]) == [b"a"]


def _count_checks(monkeypatch) -> list[int]:
    checks: list[int] = []
    wrapper = type(connections["default"])
    real = wrapper.is_usable
    monkeypatch.setattr(wrapper, "is_usable", lambda self: checks.append(1) or real(self))
    return checks


def _query(sql: str = "SELECT 1") -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        cursor.fetchall()


def test_a_connection_that_answered_a_moment_ago_is_not_checked_first(sql_store, monkeypatch):
    from config.postgresql import base

    monkeypatch.setattr(base, "HEALTH_CHECK_IDLE", 60.0)  # "a moment", however slow the machine
    checks = _count_checks(monkeypatch)
    _query()
    connection.close_if_unusable_or_obsolete()  # a request ends: the next first query may check
    _query()
    assert checks == []  # it had answered within HEALTH_CHECK_IDLE: no SELECT 1 before it
    monkeypatch.setattr(base, "HEALTH_CHECK_IDLE", 0.0)
    connection.close_if_unusable_or_obsolete()
    _query()
    assert checks == [1]  # idle past it: checked, as CONN_HEALTH_CHECKS does


def test_a_connection_cut_right_after_it_answered_is_checked_and_replaced(sql_store, monkeypatch):
    # (a database restart: every kept connection is told "terminating connection", then closed)
    from config.postgresql import base

    monkeypatch.setattr(base, "HEALTH_CHECK_IDLE", 60.0)  # "a moment", however slow the machine
    checks = _count_checks(monkeypatch)
    _query()
    pid = connection.connection.info.backend_pid
    _terminate(pid)
    connection.close_if_unusable_or_obsolete()  # a request ends; the next one begins
    _query()  # within HEALTH_CHECK_IDLE, but the server spoke: checked first, no error
    assert checks == [1]
    assert connection.connection.info.backend_pid != pid


def test_a_connection_cut_during_a_request_fails_once_then_is_replaced(sql_store, monkeypatch):
    from django.db import OperationalError

    from config.postgresql import base

    monkeypatch.setattr(base, "HEALTH_CHECK_IDLE", 60.0)  # "a moment", however slow the machine
    checks = _count_checks(monkeypatch)
    _query()
    pid = connection.connection.info.backend_pid
    connection.close_if_unusable_or_obsolete()  # a request ends; the next one begins
    _query()  # its first query: the connection answered a moment ago and said nothing since
    _terminate(pid)
    with pytest.raises(OperationalError):
        _query()  # a later query of the same request finds it cut (503)
    connection.close_if_unusable_or_obsolete()  # the request's end: it had an error, so it is checked
    assert checks == [1]
    _query()
    assert connection.connection.info.backend_pid != pid


def test_a_connection_without_a_socket_to_look_at_is_checked():
    from types import SimpleNamespace

    import psycopg

    from config.postgresql.base import _said_something

    class Lost:
        @property
        def socket(self) -> int:
            raise psycopg.OperationalError("the connection is lost")

    assert _said_something(SimpleNamespace(closed=True))
    assert _said_something(SimpleNamespace(closed=False, pgconn=Lost()))  # not an error: checked


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return sorted(row[0] for row in cursor.fetchall())


def test_the_stores_statements_are_prepared_once_and_djangos_never(sql_store):
    """Planning the store's statements cost PostgreSQL more CPU than running them, so they are
    prepared per connection (``DB_PREPARED_STATEMENTS``); Django's own queries, bound on the
    client, are not (what Django's default protects: a pooler in front of the database)."""
    from queues.models import Queue

    fence = Fence("q/0/_fence", 1)
    sql_store.compare_and_set(fence.key, None, b"1")
    for i in range(3):
        sql_store.put_many([(f"q/0/blk/{i}", b"a")], fence=fence)
        sql_store.delete_many([f"q/0/blk/{i}"], fence=fence)
        sql_store.get_many([f"q/0/blk/{i}"])
        assert Queue.objects.filter(name=f"nothing-{i}").count() == 0  # an ORM query, run again and again
    # Batches after single messages: still the generic plan (PostgreSQL's own choice had kept
    # planning each run once single messages came first).
    for i in range(3, 10):
        keys = [f"q/0/blk/{i}-{k}" for k in range(100)]
        sql_store.put_many([(key, b"b") for key in keys], fence=fence)
        assert sql_store.get_many(keys) == [b"b"] * 100
        assert sql_store.delete_many(keys, fence=fence) == 100
    prepared = _prepared()
    assert len(prepared) == 3  # the put, the delete, the read: once each
    assert all("queues_kv_entry" in statement for statement in prepared)
    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(generic_plans), sum(custom_plans) FROM pg_prepared_statements")
        assert cursor.fetchone() == (30, 0)  # 10 runs of each, never planned again
    # A new connection (the old one cut) prepares them again, and they work there.
    _terminate(connection.connection.info.backend_pid)
    sql_store.put_many([("q/0/blk/9", b"z")], fence=fence)
    assert sql_store.get_many(["q/0/blk/9"]) == [b"z"]
    assert len(_prepared()) == 2
