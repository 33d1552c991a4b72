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
def store() -> SQLStore:
    if connection.vendor != "postgresql":
        pytest.skip("the PostgreSQL store")
    return SQLStore()


def test_every_statement_survives_a_connection_the_server_closed(store):
    fence = Fence("q/0/_fence", 1)
    store.compare_and_set(fence.key, None, b"1")
    store.put_many([("q/0/blk/0", b"a")], fence=fence)
    for step in ("put", "read", "delete"):
        pid = connection.connection.info.backend_pid
        _terminate(pid)
        if step == "put":
            store.put_many([("q/0/blk/1", b"b")], fence=fence)
        elif step == "read":
            assert store.get_many(["q/0/blk/0", "q/0/blk/1"]) == [b"a", b"b"]
        else:
            assert store.delete_many(["q/0/blk/0", "q/0/blk/1"], fence=fence) == 2
        assert connection.connection.info.backend_pid != pid  # on a new connection, no error
    assert store.get_many(["q/0/blk/0", "q/0/blk/1"]) == [None, None]


def test_a_statement_is_not_run_again_inside_a_transaction(store):
    from django.db import transaction

    store.put_many([("q/0/blk/0", b"a")])
    with pytest.raises(KVError), transaction.atomic():
        _terminate(connection.connection.info.backend_pid)
        store.get_many(["q/0/blk/0"])  # its transaction is gone with the connection: an error
    connection.close()
    assert store.get_many(["q/0/blk/0"]) == [b"a"]
