"""The Redis Cluster store's message path: each command on our own connection to the primary
of its slot (``RedisClusterStore._send``), and through the cluster client when the slot map
we read is out of date (a slot moved: MOVED) or a primary's connection fails. Real cluster
(``make test`` starts three primaries on loopback)."""

from __future__ import annotations

import uuid

import pytest

from queues.kv.base import Fence

pytestmark = pytest.mark.usefixtures("redis_cluster_client")


@pytest.fixture
def cluster_store():
    from queues.kv.redis_cluster import RedisClusterStore, cluster_client
    from tests.conftest import REDIS_CLUSTER_URL

    client = cluster_client(REDIS_CLUSTER_URL)  # its own: the tests change its slot map
    yield RedisClusterStore(client)
    client.close()


@pytest.fixture
def client_calls(cluster_store, monkeypatch) -> list[tuple]:
    """The commands that went through the cluster client.

    The scripts are loaded on every primary first: a primary without them (a cluster just
    started, or a test that flushed its scripts) answers NOSCRIPT, and the script is then
    loaded and run through the client, once, which is not what these tests look at."""
    for script in (cluster_store._put, cluster_store._delete, cluster_store._cas):
        cluster_store.client.script_load(script.script)
    calls: list[tuple] = []
    real = cluster_store.client.execute_command

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(cluster_store.client, "execute_command", counting)
    return calls


def _partitions(n: int) -> list[str]:
    q = f"c{uuid.uuid4().hex[:8]}"
    return [f"{q}/{i}" for i in range(n)]


def test_the_message_path_goes_straight_to_the_primaries(cluster_store, client_calls):
    parts = _partitions(6)  # six partitions: their slots lie on more than one primary
    slots = {p: cluster_store.client.keyslot(cluster_store.redis_key(p)) for p in parts}
    primaries = {cluster_store.client.nodes_manager.slots_cache[s][0].name for s in slots.values()}
    assert len(primaries) > 1
    for p in parts:
        fence = Fence(f"{p}/_fence", 1)
        assert cluster_store.compare_and_set(fence.key, None, b"1")
        cluster_store.put_many([(f"{p}/blk/{i}", f"{p}:{i}".encode()) for i in range(3)], fence=fence)
    keys = [f"{p}/blk/{i}" for p in parts for i in range(3)]
    assert cluster_store.get_many(keys) == [
        k.replace("/blk/", ":").encode() for k in keys
    ]  # one read over every primary
    assert sum(cluster_store.delete_many([f"{p}/blk/0"], fence=Fence(f"{p}/_fence", 1)) for p in parts) == 6
    assert cluster_store.get_many([f"{p}/blk/0" for p in parts]) == [None] * 6
    assert client_calls == []  # not one command through the client


def _a_partition_and_its_primary(cluster_store):
    """A new partition with its fence raised: ``(partition, fence, its slot, the primary that
    has it, another primary)``."""
    (p,) = _partitions(1)
    fence = Fence(f"{p}/_fence", 1)
    assert cluster_store.compare_and_set(fence.key, None, b"1")
    slot = cluster_store.client.keyslot(cluster_store.redis_key(p))
    right = cluster_store.client.nodes_manager.slots_cache[slot][0]
    wrong = next(n for n in cluster_store.client.get_primaries() if n.name != right.name)
    return p, fence, slot, right, wrong


def test_a_slot_that_moved_is_followed_through_the_client(cluster_store, client_calls):
    p, fence, slot, right, wrong = _a_partition_and_its_primary(cluster_store)
    cache = cluster_store.client.nodes_manager.slots_cache
    cache[slot] = [wrong]  # our map says another primary: it answers MOVED
    cluster_store.put_many([(f"{p}/blk/0", b"a")], fence=fence)
    assert [c[0] for c in client_calls] == ["EVALSHA"]  # the put went again, through the client
    assert cache[slot][0].name == right.name  # which learnt where the slot is
    client_calls.clear()
    assert cluster_store.get_many([f"{p}/blk/0"]) == [b"a"]
    assert client_calls == []  # and the next calls go straight there again


def test_a_primary_without_the_scripts_gets_them_through_the_client(cluster_store, client_calls):
    (p,) = _partitions(1)
    fence = Fence(f"{p}/_fence", 1)
    assert cluster_store.compare_and_set(fence.key, None, b"1")
    slot = cluster_store.client.keyslot(cluster_store.redis_key(p))
    primary = cluster_store.client.nodes_manager.slots_cache[slot][0]
    cluster_store.client.get_redis_connection(primary).script_flush()  # as a primary restarted empty
    client_calls.clear()
    cluster_store.put_many([(f"{p}/blk/0", b"a")], fence=fence)
    # NOSCRIPT on the direct path: the script is run through the client, which loads it first
    assert [c[0] for c in client_calls] == ["EVALSHA", "SCRIPT LOAD", "EVALSHA"]
    client_calls.clear()
    cluster_store.put_many([(f"{p}/blk/1", b"b")], fence=fence)
    assert cluster_store.get_many([f"{p}/blk/0", f"{p}/blk/1"]) == [b"a", b"b"]
    assert client_calls == []  # loaded again: straight to the primary


def test_a_fence_is_kept_on_the_direct_path(cluster_store):
    from queues.kv.base import Fenced

    (p,) = _partitions(1)
    assert cluster_store.compare_and_set(f"{p}/_fence", None, b"2")
    with pytest.raises(Fenced):
        cluster_store.put_many([(f"{p}/blk/0", b"a")], fence=Fence(f"{p}/_fence", 1))
    assert cluster_store.get_many([f"{p}/blk/0"]) == [None]


def test_a_cut_connection_is_made_again(cluster_store, client_calls):
    from queues.kv.redis import _on_connection

    (p,) = _partitions(1)
    cluster_store.put_many([(f"{p}/blk/0", b"a")])
    slot = cluster_store.client.keyslot(cluster_store.redis_key(p))
    node = cluster_store.client.nodes_manager.slots_cache[slot][0]
    (ours,) = _on_connection(cluster_store._connections(node), [("CLIENT", "ID")])
    node.redis_connection.execute_command("CLIENT", "KILL", "ID", ours)  # as a restart or an idle cut would
    assert cluster_store.get_many([f"{p}/blk/0"]) == [b"a"]  # on a new connection, no error
    (again,) = _on_connection(cluster_store._connections(node), [("CLIENT", "ID")])
    assert again != ours
    assert client_calls == []


def test_a_primary_that_timed_out_is_reached_through_the_client_for_a_while(cluster_store, client_calls, monkeypatch):
    import redis

    from queues.kv import redis_cluster

    (p,) = _partitions(1)
    cluster_store.put_many([(f"{p}/blk/0", b"a")])
    real = redis_cluster._on_connection

    def times_out(conns, commands):
        raise redis.TimeoutError("as a primary whose host is gone")

    monkeypatch.setattr(redis_cluster, "_on_connection", times_out)
    with pytest.raises(redis.TimeoutError):  # (the store's _call holds calls off after it)
        cluster_store._send([("HMGET", cluster_store.redis_key(f"{p}/blk"), "0")])
    monkeypatch.setattr(redis_cluster, "_on_connection", real)
    assert cluster_store.get_many([f"{p}/blk/0"]) == [b"a"]
    assert [c[0] for c in client_calls] == ["HMGET"]  # through the client, which finds the slot map anew
    cluster_store._via_client.clear()  # (its 30 s over)
    client_calls.clear()
    assert cluster_store.get_many([f"{p}/blk/0"]) == [b"a"]
    assert client_calls == []  # and straight to it again once that time is over


def test_connections_to_a_node_no_longer_a_primary_are_let_go_when_the_map_changes(cluster_store, client_calls):
    """A node that lived through failovers must not keep a connection per request thread to
    every primary it ever had: at the next change of the slot map they are dropped, and their
    sockets close."""
    import gc

    from queues.kv.redis import ThreadConnections, _on_connection

    p, fence, slot, right, wrong = _a_partition_and_its_primary(cluster_store)
    # a primary of old, since failed over: a name no slot names now, connected to a real server
    # (so that the test can see its connection close there)
    gone = ThreadConnections(right.redis_connection.connection_pool)
    (gone_id,) = _on_connection(gone, [("CLIENT", "ID")])
    assert gone_id in _client_ids(right)
    cluster_store._nodes["127.0.0.1:1"] = gone
    cluster_store._via_client["127.0.0.1:2"] = 0.0  # a hold-down long over
    del gone
    cluster_store.client.nodes_manager.slots_cache[slot] = [
        wrong
    ]  # a slot moved: MOVED, the client learns the map anew
    cluster_store.put_many([(f"{p}/blk/0", b"a")], fence=fence)
    assert [c[0] for c in client_calls] == ["EVALSHA"]
    assert "127.0.0.1:1" not in cluster_store._nodes and "127.0.0.1:2" not in cluster_store._via_client
    assert wrong.name in cluster_store._nodes, "a node still a primary keeps its connections"
    gc.collect()
    assert gone_id not in _client_ids(right), "its connection was closed"
    client_calls.clear()
    assert cluster_store.get_many([f"{p}/blk/0"]) == [b"a"]
    assert client_calls == []  # and the message path goes straight to the primaries again


def _client_ids(node) -> set[int]:
    return {int(c["id"]) for c in node.redis_connection.client_list()}
