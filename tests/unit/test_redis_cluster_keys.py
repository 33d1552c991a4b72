"""Where a bucket lives on Redis Cluster (``queues.kv.redis_cluster``): every key of a partition
in one hash slot, under the store's prefix, and each Redis key mapped back to its bucket."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from queues.engine import keys
from queues.engine.ids import parse_message_id
from queues.kv.base import KVError, split_key
from queues.kv.redis_cluster import RedisClusterStore, bucket_of, parse_url, partition_of, redis_key, scan_head

BLOCK = "00000001-aaaaaaaaaaaaaaaa"
MID = parse_message_id(f"orders/3/{BLOCK}/17")


def _every_key_of(queue: str, p: int) -> list[str]:
    return [
        keys.message_key(queue, p, BLOCK, 17),
        keys.block_key(queue, p, BLOCK),
        keys.fence_key(queue, p),
        keys.receives_key(queue, p, MID),
        keys.receives_key(queue, p, MID, "sub"),
        keys.ack_key(queue, p, "sub", MID),
        f"{keys.archive_bucket(queue, p)}/e.{BLOCK}.17",
    ]


def test_a_partitions_keys_as_stored_on_a_cluster():
    # given the keys of partition 3 of "orders" under the service's prefix
    buckets = [split_key("mq:" + k)[0] for k in _every_key_of("orders", 3)]
    # then each bucket's hash is tagged with the queue and partition, after the prefix
    assert [redis_key(b) for b in buckets] == [
        f"mq:{{orders/3}}/{BLOCK}",
        "mq:{orders/3}/_blocks",
        "mq:{orders/3}",
        "mq:{orders/3}/_receives",
        "mq:{orders/3}/_receives/sub",
        "mq:{orders/3}/_acks/sub",
        "mq:{orders/3}/_archive",
    ]
    # and a queue's incarnation prefix (``mq:17:``) keeps the same tag, after both prefixes
    assert redis_key("mq:17:orders/3/_blocks") == "mq:17:{orders/3}/_blocks"
    assert redis_key("mq:_mq") == "mq:{_mq}"  # a one-segment bucket (the readiness probe)
    assert redis_key("orders/3") == "{orders/3}"  # no prefix
    assert redis_key("mq.orders/3/x") == "{mq.orders/3}/x"  # a prefix without ':' is inside the tag


@given(
    queue=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True),
    p=st.integers(0, 999),
    prefix=st.sampled_from(["mq:", "mq:17:", "app.mq:", "x"]),
)
def test_every_key_of_a_partition_hashes_to_one_slot(queue, p, prefix):
    buckets = [split_key(prefix + k)[0] for k in _every_key_of(queue, p)]
    rkeys = [redis_key(b) for b in buckets]
    assert len({key_slot(k.encode()) for k in rkeys}) == 1
    assert {partition_of(b) for b in buckets} == {f"{prefix}{queue}/{p}"}
    assert [bucket_of(k) for k in rkeys] == buckets
    if prefix.endswith(":"):
        assert all(k.startswith(prefix) for k in rkeys)


def test_partitions_spread_over_slots():
    slots = {key_slot(redis_key(f"mq:orders/{p}").encode()) for p in range(64)}
    assert len(slots) > 48  # (a tag of the partition number alone would put them all in one)


@pytest.mark.parametrize(
    "prefix,under,beside",
    [
        ("mq:orders", ["mq:orders", "mq:orders/0", "mq:orders/0/b", "mq:orders/12/_acks/s"], ["mq:ordersx/0"]),
        ("mq:orders/0", ["mq:orders/0", "mq:orders/0/b", "mq:orders/0/_acks/s"], ["mq:orders/00/b", "mq:orders"]),
        ("mq:orders/0/_acks/s", ["mq:orders/0/_acks/s", "mq:orders/0/_acks/s/x"], ["mq:orders/0/_acks"]),
    ],
)
def test_a_prefix_scan_matches_every_bucket_under_it(prefix, under, beside):
    head = scan_head(prefix)
    assert all(redis_key(b).startswith(head) for b in under)
    # (what the head matches beyond is told apart by bucket_of, in delete_prefix)
    for b in beside:
        assert not (bucket_of(redis_key(b)) == prefix or bucket_of(redis_key(b)).startswith(prefix + "/"))


def test_seed_nodes_from_the_url():
    kw = parse_url("redis-cluster://127.0.0.1:7000,127.0.0.1:7001, redis-b:7002")
    assert [(n.host, n.port) for n in kw["startup_nodes"]] == [
        ("127.0.0.1", 7000),
        ("127.0.0.1", 7001),
        ("redis-b", 7002),
    ]
    assert kw["ssl"] is False and "password" not in kw
    kw = parse_url("rediss-cluster://app:s%40cret@[::1]:7000/0")
    assert [(n.host, n.port) for n in kw["startup_nodes"]] == [("::1", 7000)]
    assert (kw["ssl"], kw["username"], kw["password"]) == (True, "app", "s@cret")
    for bad in ["redis-cluster://", "redis-cluster://host", "redis-cluster://h:1,h", "redis-cluster://h:1/3"]:
        with pytest.raises(ImproperlyConfigured):
            parse_url(bad)


def test_an_unreachable_cluster_is_a_store_failure_not_a_start_failure():
    # given a store whose seed answers nothing (port 1): made without connecting
    store = RedisClusterStore.from_url("redis-cluster://127.0.0.1:1")
    # then each call fails as the store failing (a 503 to a client), and again on the next
    for call in (lambda: store.get("q/0/k"), lambda: store.put("q/0/k", b"v"), lambda: store.scan("q/0")):
        with pytest.raises(KVError):
            call()
    with pytest.raises(ImproperlyConfigured, match="KV_MIN_REPLICAS"):
        RedisClusterStore.from_url("redis-cluster://127.0.0.1:1", min_replicas=1)
    with pytest.raises(ImproperlyConfigured):
        RedisClusterStore.from_url("redis-cluster://no-port")
