"""Every key the service writes lies under ``KV_PREFIX``, and nothing it deletes lies outside.

A Redis database is often shared: Celery's broker keeps a list named after each queue
(``celery`` by default) and bindings beside it. A queue of ours named ``celery`` must not touch
them when it is created, purged or deleted: not on one Redis, nor on Redis Cluster, where
the hash tag stands after the prefix (``mq:{celery/0}/...``).
"""

from __future__ import annotations

import os

import pytest
import redis
from django.conf import settings

from queues.kv import KeyValueStore
from queues.kv.memory import MemoryStore

pytestmark = pytest.mark.django_db

API = "/api/v1/queues"


@pytest.fixture(params=["redis", "cluster"])
def kv_redis(request, settings, kv_reset):
    """A client of the Redis database the service's store uses: ``KV_URL``'s, or the test Redis
    Cluster's (then the service's store for the test is the cluster: hash-tagged keys)."""
    if request.param == "cluster":
        from queues.kv.redis_cluster import cluster_client

        request.getfixturevalue("redis_cluster_client")  # skips without a cluster
        settings.KV_URL = os.environ["MQ_TEST_REDIS_CLUSTER_URL"]
        client = cluster_client(settings.KV_URL)
    else:
        if not settings.KV_URL.startswith("redis://"):
            pytest.skip("KV_URL is not Redis (make test sets it)")
        client = redis.Redis.from_url(settings.KV_URL)
    yield client
    client.close()


def test_a_queue_named_like_celerys_broker_list_leaves_the_brokers_keys_alone(
    kv_redis, superuser_api
):  # (the store kv_redis names: set before the runtime opens it)
    # given Celery's broker keys in the same Redis database: its queue list and keys below it
    kv_redis.delete("celery", "celery/x", "celery/0/_blocks")
    kv_redis.rpush("celery", b'{"task": "broker message"}')
    kv_redis.set("celery/x", b"binding")
    kv_redis.hset("celery/0/_blocks", "b", b"not ours")
    before = {k.decode() for k in kv_redis.scan_iter(match="*celery*")}  # (earlier runs' leftovers too)
    try:
        # when a queue named celery is created, used, purged, used again and deleted
        assert superuser_api.post(API, {"name": "celery", "partitions": 2}, format="json").status_code == 201
        r = superuser_api.post(
            f"{API}/celery/enqueue", {"messages": [{"body": f"m{i}"} for i in range(5)]}, format="json"
        )
        assert r.status_code == 201, r.content
        ours = [k.decode() for k in kv_redis.scan_iter(match="*celery*")]
        assert superuser_api.post(f"{API}/celery/purge", {}, format="json").status_code == 200
        assert superuser_api.post(f"{API}/celery/enqueue", {"body": "again"}, format="json").status_code == 201
        assert superuser_api.delete(f"{API}/celery").status_code == 204
        # then the broker's keys are all there, untouched, and every key the queue wrote was
        # under the prefix
        assert kv_redis.lrange("celery", 0, -1) == [b'{"task": "broker message"}']
        assert kv_redis.get("celery/x") == b"binding"
        assert kv_redis.hgetall("celery/0/_blocks") == {b"b": b"not ours"}
        written = [k for k in ours if k not in before]
        assert written, "the queue should have written keys"
        assert all(k.startswith(settings.KV_PREFIX) for k in written), written
    finally:
        kv_redis.delete("celery", "celery/x", "celery/0/_blocks")


def test_a_prefixed_view_reaches_nothing_outside_its_prefix():
    # given a store with keys outside the prefix, and a view under it
    raw = MemoryStore()
    raw.put_many([("celery/x", b"1"), ("celery/0/y", b"2"), ("mq:celery/0/z", b"3"), ("mq:celeryx/0/w", b"4")])
    view: KeyValueStore = raw.within("mq:")
    # when the view deletes the queue's prefix, and writes a fenced key
    view.delete_prefix("celery")
    view.advance_fence("celery/0/_fence", 1)
    # then only the view's keys under that prefix went, and what it wrote is under its prefix
    assert raw.get_many(["celery/x", "celery/0/y", "mq:celery/0/z", "mq:celeryx/0/w"]) == [b"1", b"2", None, b"4"]
    assert raw.get("mq:celery/0/_fence") == b"1"
    assert view.read_fence("celery/0/_fence") == 1
    with pytest.raises(ValueError):
        view.delete_prefix("")
    with pytest.raises(ValueError):
        raw.within("")
    with pytest.raises(ValueError):
        raw.within("mq/")
