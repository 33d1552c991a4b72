"""The Redis store's message path on one connection per thread (``queues.kv.redis``), against
the real Redis: what a pooled client gave for free (a fresh connection after the server closed
one, a connection per process) must hold without the pool."""

from __future__ import annotations

import os
import threading

import pytest

from queues.kv.base import Fence, Fenced, KVError
from queues.kv.redis import RedisStore


@pytest.fixture
def redis_store(redis_client) -> RedisStore:
    s = RedisStore(redis_client)
    assert s._conns is not None  # a plain pool: the message path has its own connections
    return s


def _client_ids(redis_client) -> set[int]:
    return {int(c["id"]) for c in redis_client.client_list()}


def test_a_thread_keeps_one_connection_and_the_client_pool_lends_none(redis_store, redis_client):
    pool = redis_client.connection_pool
    lent = len(pool._in_use_connections) + len(pool._available_connections)
    before = _client_ids(redis_client)
    for i in range(20):
        redis_store.put_many([(f"q/0/blk/1/{i}", b"v")])
        assert redis_store.get_many([f"q/0/blk/1/{i}"]) == [b"v"]
    redis_store.delete_many([f"q/0/blk/1/{i}" for i in range(20)])
    assert len(pool._in_use_connections) + len(pool._available_connections) == lent
    assert _client_ids(redis_client) - before == {_last_id(redis_store)}  # one new connection, this thread's


def test_each_thread_has_its_own_connection(redis_store, redis_client):
    ids: list[int] = []

    def work(t: int) -> None:
        redis_store.put_many([(f"q/{t}/blk/1/0", b"v")])
        ids.append(_last_id(redis_store))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 3
    assert redis_store.get_many([f"q/{t}/blk/1/0" for t in range(3)]) == [b"v"] * 3


def test_a_connection_the_server_closed_is_replaced_without_an_error(redis_store, redis_client):
    redis_store.put_many([("q/0/blk/1/0", b"a")])
    first = _last_id(redis_store)
    redis_client.client_kill_filter(_id=first)  # as a Redis restart or an idle timeout would
    redis_store.put_many([("q/0/blk/1/1", b"b")])  # a script call: sent again on a fresh connection
    second = _last_id(redis_store)
    assert second != first
    redis_client.client_kill_filter(_id=second)
    assert redis_store.get_many(["q/0/blk/1/0", "q/0/blk/1/1"]) == [b"a", b"b"]  # a read: the same
    assert _last_id(redis_store) not in (first, second)


def test_a_store_that_cannot_connect_answers_kv_error(redis_client):
    import redis

    url = redis_client.connection_pool.connection_kwargs
    dead = redis.Redis(host=url["host"], port=1, socket_connect_timeout=1)  # nothing listens on port 1
    with pytest.raises(KVError):
        RedisStore(dead).put_many([("q/0/blk/1/0", b"a")])


def _last_id(redis_store) -> int:
    """The Redis client ID of this thread's connection of the store's message path."""
    conn = redis_store._conns.get()
    conn.send_command("CLIENT", "ID")
    return conn.read_response()


def test_a_fence_refuses_and_the_connection_stays_in_step(redis_store, redis_client):
    redis_store.compare_and_set("q/0/_fence", None, b"3")
    with pytest.raises(Fenced):
        redis_store.put_many([("q/0/blk/1/0", b"x")], fence=Fence("q/0/_fence", 2))
    redis_store.put_many([("q/0/blk/1/0", b"y")], fence=Fence("q/0/_fence", 3))
    assert redis_store.get_many(["q/0/blk/1/0"]) == [b"y"]


def test_an_error_answer_in_a_batch_of_reads_is_a_kv_error_and_the_next_call_reads_right(redis_store, redis_client):
    redis_client.set("q/0/blk/9", "not a hash")
    with pytest.raises(KVError):
        redis_store.get_many(["q/0/blk/1/0", "q/0/blk/9/0", "q/0/blk/2/0"])
    redis_store.put_many([("q/0/blk/1/0", b"z")])
    assert redis_store.get_many(["q/0/blk/1/0", "q/0/blk/2/0"]) == [b"z", None]


def test_a_script_the_server_lost_is_loaded_again(redis_store, redis_client):
    redis_store.put_many([("q/0/blk/1/0", b"a")])
    redis_client.script_flush()
    redis_store.put_many([("q/0/blk/1/1", b"b")])
    assert redis_store.delete_many(["q/0/blk/1/0", "q/0/blk/1/1"]) == 2


def test_a_forked_child_uses_a_connection_of_its_own(redis_store, redis_client):
    redis_store.put_many([("q/0/blk/1/0", b"parent")])
    parent_id = _last_id(redis_store)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its store calls must not share the parent's socket
        try:
            redis_store.put_many([("q/0/blk/1/1", b"child")])
            os.write(write, str(_last_id(redis_store)).encode())
        finally:
            os._exit(0)
    os.close(write)
    child_id = int(os.read(read, 64) or b"0")
    os.waitpid(pid, 0)
    assert child_id and child_id != parent_id
    assert _last_id(redis_store) == parent_id  # the parent's connection is untouched
    assert redis_store.get_many(["q/0/blk/1/0", "q/0/blk/1/1"]) == [b"parent", b"child"]


def test_a_store_that_goes_closes_its_connections(redis_client):
    import gc

    redis_store = RedisStore(redis_client)
    redis_store.put_many([("q/0/blk/1/0", b"a")])
    mine = _last_id(redis_store)
    assert mine in _client_ids(redis_client)
    del redis_store
    gc.collect()
    assert mine not in _client_ids(redis_client)


class _LoadingRedis:
    """A server on loopback that speaks Redis' protocol and answers what a Redis restarting
    answers while it reads its data back: ``-LOADING`` to every command but the handshake.
    (The real restart is ``test_store_outages``; when its timing lands a call in the loading
    window, this is what the call meets. Here it always does.)"""

    def __init__(self) -> None:
        import socket

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.commands: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import hiredis

        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            reader = hiredis.Reader()
            with conn:
                while data := conn.recv(65536):
                    reader.feed(data)
                    while (command := reader.gets()) is not False:
                        name = command[0].upper()
                        self.commands.append(name)
                        if name == b"HELLO":  # the RESP3 handshake: answered with its protocol
                            conn.sendall(b"%1\r\n$5\r\nproto\r\n:3\r\n")
                        elif name in (b"SELECT", b"CLIENT", b"AUTH", b"PING"):
                            conn.sendall(b"+OK\r\n")
                        else:
                            conn.sendall(b"-LOADING Redis is loading the dataset in memory\r\n")

    def close(self) -> None:
        self.listener.close()


def test_a_redis_still_loading_its_data_is_a_kv_error_not_a_success():
    """``LOADING`` is an error answer redis-py's parser makes a ``ConnectionError``
    (``BusyLoadingError``), not a ``ResponseError``: a put that met it stored nothing and must
    not report success (it did once: confirmed messages were lost across a Redis restart)."""
    import redis

    server = _LoadingRedis()
    try:
        redis_store = RedisStore(redis.Redis(host="127.0.0.1", port=server.port, db=1, socket_timeout=5))
        assert redis_store._conns is not None
        with pytest.raises(KVError):
            redis_store.put_many([("q/0/blk/1/0", b"a")])
        with pytest.raises(KVError):
            redis_store.delete_many(["q/0/blk/1/0"])
        with pytest.raises(KVError):
            redis_store.get_many(["q/0/blk/1/0", "q/0/blk/2/0"])
        assert b"EVALSHA" in server.commands and b"HMGET" in server.commands  # the message path was taken
    finally:
        server.close()
