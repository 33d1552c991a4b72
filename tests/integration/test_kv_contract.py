"""One contract for every key-value backend (queues/kv/base.py), run against each of them.

``kv_store`` is parametrized over the memory kv_store (what the unit tests run on), the filesystem
kv_store (in ``tmp_path``), Redis (db 5 of ``MQ_TEST_REDIS_URL``, flushed around each test), Redis
Cluster (the three primaries of ``MQ_TEST_REDIS_CLUSTER_URL``, each test under keys of its own)
and the SQL table in the default database (PostgreSQL in ``make test``). A backend whose
service is not configured is skipped.

One difference is part of the contract: on Redis Cluster a fenced batch holds keys of its
fence's partition (``<queue>/<partition>``) only, and one that does not is refused with
``ValueError`` and changes nothing (:func:`_other_partition` gives those tests partitions
inside the fence's on that backend).
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queues.kv.base import Fence, Fenced, KeyValueStore

BACKENDS = ["memory", "file", "redis", "cluster", "sql"]


@pytest.fixture(params=BACKENDS)
def kv_store(request, tmp_path) -> KeyValueStore:
    kind = request.param
    if kind == "memory":
        from queues.kv.memory import MemoryStore

        s = MemoryStore()
    elif kind == "file":
        from queues.kv.filesystem import FileStore

        s = FileStore(tmp_path / "kv")
    elif kind == "redis":
        from queues.kv.redis import RedisStore

        s = RedisStore(request.getfixturevalue("redis_client"))
    elif kind == "cluster":
        from queues.kv.redis_cluster import RedisClusterStore

        s = RedisClusterStore(request.getfixturevalue("redis_cluster_client"))
    else:
        # ``db`` honours a django_db(transaction=True) mark on the test (then it is transactional).
        request.getfixturevalue("db")
        from queues.kv.sql import SQLStore

        s = SQLStore()
    s.kind = kind
    yield s
    s.close()


def _prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def _other_partition(kv_store, p: str, n: int) -> str:
    """Where a fenced test puts keys "of partition ``n``" beside those of ``{p}/0``, its fence's:
    ``{p}/n``, or on Redis Cluster (one fenced batch, one partition) a bucket inside ``{p}/0``."""
    return f"{p}/0/part{n}" if kv_store.kind == "cluster" else f"{p}/{n}"


# --------------------------------------------------------------------------------- basic I/O


def test_get_put_get_many(kv_store):
    p = _prefix()
    assert kv_store.get(f"{p}/0/a") is None
    assert kv_store.get_many([]) == []
    kv_store.put(f"{p}/0/a", b"A")
    kv_store.put_many([(f"{p}/0/b", b"B"), (f"{p}/1/blk/c", b"C")])
    assert kv_store.get(f"{p}/0/a") == b"A"
    keys = [f"{p}/1/blk/c", f"{p}/0/absent", f"{p}/0/a", f"{p}/nobucket/x", f"{p}/0/b", f"{p}/0/a"]
    assert kv_store.get_many(keys) == [b"C", None, b"A", None, b"B", b"A"]


def test_put_many_overwrites(kv_store):
    p = _prefix()
    kv_store.put_many([(f"{p}/0/a", b"1"), (f"{p}/0/b", b"1"), (f"{p}/1/c", b"1")])
    kv_store.put_many([(f"{p}/0/b", b"2"), (f"{p}/1/c", b"2"), (f"{p}/1/d", b"2")])
    assert kv_store.get_many([f"{p}/0/a", f"{p}/0/b", f"{p}/1/c", f"{p}/1/d"]) == [b"1", b"2", b"2", b"2"]
    kv_store.put(f"{p}/0/a", b"3")
    assert kv_store.get(f"{p}/0/a") == b"3"
    kv_store.put_many([])  # an empty batch is a no-op


def test_put_many_same_key_twice_last_wins(kv_store):
    p = _prefix()
    kv_store.put_many([(f"{p}/0/a", b"first"), (f"{p}/0/b", b"x"), (f"{p}/0/a", b"last")])
    assert kv_store.get_many([f"{p}/0/a", f"{p}/0/b"]) == [b"last", b"x"]


def test_delete_many_counts_only_existing(kv_store):
    p = _prefix()
    kv_store.put_many([(f"{p}/0/a", b"1"), (f"{p}/0/b", b"1"), (f"{p}/1/c", b"1")])
    assert kv_store.delete_many([f"{p}/0/a", f"{p}/0/absent", f"{p}/1/c", f"{p}/9/zz"]) == 2
    assert kv_store.get_many([f"{p}/0/a", f"{p}/0/b", f"{p}/1/c"]) == [None, b"1", None]
    assert kv_store.delete_many([f"{p}/0/a", f"{p}/1/c"]) == 0
    assert kv_store.delete(f"{p}/0/b") == 1
    assert kv_store.delete(f"{p}/0/b") == 0
    assert kv_store.delete_many([]) == 0


def test_compare_and_set(kv_store):
    p = _prefix()
    k = f"{p}/0/k"
    # expected None: only if absent
    assert kv_store.compare_and_set(k, None, b"v1") is True
    assert kv_store.get(k) == b"v1"
    assert kv_store.compare_and_set(k, None, b"v2") is False
    assert kv_store.get(k) == b"v1"
    # expected a value
    assert kv_store.compare_and_set(k, b"wrong", b"v2") is False
    assert kv_store.get(k) == b"v1"
    assert kv_store.compare_and_set(k, b"v1", b"v2") is True
    assert kv_store.get(k) == b"v2"
    assert kv_store.compare_and_set(k, b"v1", b"v3") is False
    assert kv_store.get(k) == b"v2"
    # expecting a value on an absent key does not create it (b"" included)
    assert kv_store.compare_and_set(f"{p}/0/none", b"x", b"y") is False
    assert kv_store.compare_and_set(f"{p}/0/none", b"", b"y") is False
    assert kv_store.get(f"{p}/0/none") is None
    # binary, empty and NUL values compare exactly
    assert kv_store.compare_and_set(f"{p}/0/bin", None, b"\x00") is True
    assert kv_store.compare_and_set(f"{p}/0/bin", b"", b"z") is False
    assert kv_store.compare_and_set(f"{p}/0/bin", b"\x00", b"") is True
    assert kv_store.get(f"{p}/0/bin") == b""
    assert kv_store.compare_and_set(f"{p}/0/bin", None, b"z") is False
    assert kv_store.compare_and_set(f"{p}/0/bin", b"", b"\x00\x01") is True
    assert kv_store.get(f"{p}/0/bin") == b"\x00\x01"


def test_scan_lists_exactly_the_bucket(kv_store):
    p = _prefix()
    kv_store.put_many(
        [
            (f"{p}/0/blk/1", b"x"),
            (f"{p}/0/blk/2", b"x"),
            (f"{p}/0/blk/10", b"x"),
            (f"{p}/0/blk/deeper/3", b"x"),  # a bucket inside the bucket
            (f"{p}/0/blk2/4", b"x"),  # sibling bucket sharing a string prefix
            (f"{p}/0/bl/5", b"x"),  # sibling bucket that is a string prefix
            (f"{p}/0/parent", b"x"),  # a key of the parent bucket
        ]
    )
    assert sorted(kv_store.scan(f"{p}/0/blk")) == ["1", "10", "2"]
    assert kv_store.scan(f"{p}/0/blk/deeper") == ["3"]
    assert kv_store.scan(f"{p}/0/blk2") == ["4"]
    assert kv_store.scan(f"{p}/0/bl") == ["5"]
    assert kv_store.scan(f"{p}/0") == ["parent"]
    assert kv_store.scan(f"{p}/0/nothing") == []
    assert kv_store.scan(f"{p}/9") == []
    assert kv_store.delete_many([f"{p}/0/blk/1", f"{p}/0/blk/2", f"{p}/0/blk/10"]) == 3
    assert kv_store.scan(f"{p}/0/blk") == []
    assert kv_store.scan(f"{p}/0/blk/deeper") == ["3"]
    kv_store.delete(f"{p}/0/blk/deeper/3")
    assert kv_store.scan(f"{p}/0/blk/deeper") == []
    assert kv_store.scan(f"{p}/0/blk") == []


def test_scan_after_fenced_writes_shows_only_keys(kv_store):
    """Whatever a backend keeps beside a fence (a lock file...) is not a key."""
    p = _prefix()
    fk = f"{p}/0/_fence"
    assert kv_store.advance_fence(fk, 1)
    kv_store.put_many([(f"{p}/0/m", b"x"), (f"{p}/0/blk/1", b"x")], fence=Fence(fk, 1))
    assert kv_store.compare_and_set(f"{p}/0/cas", None, b"1")
    assert sorted(kv_store.scan(f"{p}/0")) == ["_fence", "cas", "m"]
    assert kv_store.scan(f"{p}/0/blk") == ["1"]


@pytest.mark.parametrize(
    "name,siblings",
    [
        ("q1", ["q10", "q1x", "q", "xq1"]),
        ("q_1", ["qa1", "q_10", "q__1"]),  # '_' is a LIKE wildcard
        ("my-queue", ["my-queue2", "my", "my-queue_"]),
        ("a.b", ["axb", "a.bc"]),
    ],
)
def test_delete_prefix_removes_the_prefix_at_any_depth_only(kv_store, name, siblings):
    p = _prefix()
    name = f"{p}{name}"
    siblings = [f"{p}{s}" for s in siblings]

    def tree(q: str) -> list[str]:
        return [f"{q}/top", f"{q}/0/_fence", f"{q}/0/blk/1", f"{q}/0/blk/2", f"{q}/0/_blocks/blk", f"{q}/1/a/b/c/deep"]

    doomed = tree(name)
    kept = [k for s in siblings for k in tree(s)]
    kv_store.put_many([(k, k.encode()) for k in doomed + kept])
    kv_store.delete_prefix(name)
    assert kv_store.get_many(doomed) == [None] * len(doomed)
    for bucket in {k.rpartition("/")[0] for k in doomed}:
        assert kv_store.scan(bucket) == []
    assert kv_store.get_many(kept) == [k.encode() for k in kept]
    # the keys can be written again afterwards
    kv_store.put(doomed[2], b"again")
    assert kv_store.get(doomed[2]) == b"again"
    kv_store.delete_prefix(f"{p}never-existed")  # absent prefix: no error


def test_delete_prefix_of_a_deeper_prefix(kv_store):
    p = _prefix()
    keys = {f"{p}/0/blk/1": False, f"{p}/0/x": False, f"{p}/00/blk/1": True, f"{p}/1/blk/1": True, f"{p}/top": True}
    kv_store.put_many([(k, b"v") for k in keys])
    kv_store.delete_prefix(f"{p}/0")
    assert kv_store.get_many(list(keys)) == [b"v" if keep else None for keep in keys.values()]


# --------------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    "value",
    [
        b"\x00",
        b"",
        b"\x00\x00\xff\x00",
        bytes(range(256)),
        "é€😀".encode(),
        b"\r\n\r\n",
        b"FENCED",
        b"\\x00",
    ],
    ids=["nul", "empty", "nuls", "all-bytes", "utf8", "crlf", "fenced-text", "escaped"],
)
def test_binary_values_round_trip(kv_store, value):
    p = _prefix()
    kv_store.put(f"{p}/0/v", value)
    kv_store.put_many([(f"{p}/0/w", value), (f"{p}/1/w", value + b"\x00")])
    assert kv_store.get_many([f"{p}/0/v", f"{p}/0/w", f"{p}/1/w"]) == [value, value, value + b"\x00"]


def test_large_value(kv_store):
    p = _prefix()
    big = os.urandom(1 << 20)
    kv_store.put_many([(f"{p}/0/big", big), (f"{p}/0/small", b"s")])
    assert kv_store.get(f"{p}/0/big") == big
    assert kv_store.compare_and_set(f"{p}/0/big", big, big[::-1]) is True
    assert kv_store.get(f"{p}/0/big") == big[::-1]


def test_many_keys_in_one_batch(kv_store):
    p = _prefix()
    fk = f"{p}/0/_fence"
    assert kv_store.advance_fence(fk, 7)
    # 4,000 in one bucket (more than one Lua unpack group) and 1,000 spread over 10 buckets.
    items = [(f"{p}/0/big/{i}", f"v{i}".encode()) for i in range(4000)]
    items += [(f"{p}/0/b{i % 10}/{i}", f"w{i}".encode()) for i in range(1000)]
    assert len(items) == 5000

    # a stale batch of all of them writes none
    with pytest.raises(Fenced):
        kv_store.put_many(items, fence=Fence(fk, 6))
    assert kv_store.scan(f"{p}/0/big") == []
    assert kv_store.get_many([k for k, _ in items[::97]]) == [None] * len(items[::97])

    kv_store.put_many(items, fence=Fence(fk, 7))
    keys = [k for k, _ in items]
    assert kv_store.get_many(keys) == [v for _, v in items]
    assert len(kv_store.scan(f"{p}/0/big")) == 4000
    assert sorted(kv_store.scan(f"{p}/0/b3")) == sorted(str(i) for i in range(3, 1000, 10))

    with pytest.raises(Fenced):
        kv_store.delete_many(keys, fence=Fence(fk, 8))
    assert len(kv_store.scan(f"{p}/0/big")) == 4000
    assert kv_store.delete_many([*keys, f"{p}/0/big/absent"], fence=Fence(fk, 7)) == 5000
    assert kv_store.scan(f"{p}/0/big") == []
    assert kv_store.get_many(keys[::97]) == [None] * len(keys[::97])


# --------------------------------------------------------------------------------- fencing


def test_fenced_writes_with_the_current_epoch(kv_store):
    p = _prefix()
    fk = f"{p}/0/_fence"
    assert kv_store.advance_fence(fk, 3)
    assert kv_store.read_fence(fk) == 3
    f = Fence(fk, 3)
    p1 = _other_partition(kv_store, p, 1)
    kv_store.put_many([(f"{p}/0/a", b"1"), (f"{p1}/b", b"1")], fence=f)
    kv_store.put(f"{p}/0/c", b"1", fence=f)
    assert kv_store.get_many([f"{p}/0/a", f"{p1}/b", f"{p}/0/c"]) == [b"1"] * 3
    assert kv_store.delete_many([f"{p}/0/a", f"{p1}/b", f"{p}/0/absent"], fence=f) == 2
    assert kv_store.delete(f"{p}/0/c", fence=f) == 1
    assert kv_store.get_many([f"{p}/0/a", f"{p1}/b", f"{p}/0/c"]) == [None] * 3


@pytest.mark.parametrize(
    "stored,epoch",
    [
        (5, 4),  # stale
        (5, 0),
        (5, 6),  # newer than stored: not "the stored epoch" either
        (None, 1),  # no fence at all
        (None, 0),
    ],
    ids=["stale", "zero", "future", "missing", "missing-zero"],
)
def test_fenced_writes_with_a_wrong_epoch_change_nothing(kv_store, stored, epoch):
    p = _prefix()
    fk = f"{p}/0/_fence"
    if stored is not None:
        assert kv_store.advance_fence(fk, stored)
    p1, p2 = _other_partition(kv_store, p, 1), _other_partition(kv_store, p, 2)
    existing = [(f"{p}/0/old", b"old"), (f"{p1}/blk/old", b"old")]
    kv_store.put_many(existing)
    bad = Fence(fk, epoch)
    # a batch that is partly new keys, partly overwrites, over several buckets
    batch = [
        (f"{p}/0/new", b"new"),
        (f"{p}/0/old", b"overwritten"),
        (f"{p1}/blk/new", b"new"),
        (f"{p1}/blk/old", b"overwritten"),
        (f"{p2}/fresh/1", b"new"),
    ]
    with pytest.raises(Fenced):
        kv_store.put_many(batch, fence=bad)
    with pytest.raises(Fenced):
        kv_store.put(f"{p}/0/single", b"x", fence=bad)
    with pytest.raises(Fenced):
        kv_store.delete_many([f"{p}/0/old", f"{p1}/blk/old", f"{p}/0/absent"], fence=bad)
    with pytest.raises(Fenced):
        kv_store.delete(f"{p}/0/old", fence=bad)

    assert kv_store.get_many([k for k, _ in batch] + [f"{p}/0/single"]) == [None, b"old", None, b"old", None, None]
    assert sorted(kv_store.scan(f"{p}/0")) == (["_fence", "old"] if stored is not None else ["old"])
    assert kv_store.scan(f"{p1}/blk") == ["old"]
    assert kv_store.scan(f"{p2}/fresh") == []
    assert kv_store.read_fence(fk) == (stored or 0)
    # unfenced deletes (acks) work whatever the fence
    assert kv_store.delete(f"{p}/0/old") == 1
    assert kv_store.delete_many([f"{p1}/blk/old", f"{p1}/blk/absent"]) == 1
    assert kv_store.get_many([f"{p}/0/old", f"{p1}/blk/old"]) == [None, None]


def test_cluster_refuses_a_fenced_batch_outside_its_fence_partition(redis_cluster_client):
    """(One server makes any fenced batch atomic: only Redis Cluster refuses.)"""
    from queues.kv.redis_cluster import RedisClusterStore

    kv_store = RedisClusterStore(redis_cluster_client)
    p = _prefix()
    fk = f"{p}/0/_fence"
    assert kv_store.advance_fence(fk, 2)
    kv_store.put_many([(f"{p}/1/blk/old", b"old")])
    f = Fence(fk, 2)
    # a batch of the fence's partition and another's, partly overwrites: refused as a whole
    with pytest.raises(ValueError, match="partition"):
        kv_store.put_many([(f"{p}/0/blk/new", b"new"), (f"{p}/1/blk/old", b"overwritten")], fence=f)
    with pytest.raises(ValueError, match="partition"):
        kv_store.delete_many([f"{p}/1/blk/old"], fence=f)
    with pytest.raises(ValueError, match="partition"):  # a partition whose name extends the fence's
        kv_store.put(f"{p}/00/blk/x", b"x", fence=f)
    assert kv_store.get_many([f"{p}/0/blk/new", f"{p}/1/blk/old", f"{p}/00/blk/x"]) == [None, b"old", None]
    # the fence's own partition, at any depth, is one atomic script
    kv_store.put_many([(f"{p}/0/blk/new", b"new"), (f"{p}/0/_acks/s/b.1", b"1"), (f"{p}/0/m", b"m")], fence=f)
    assert kv_store.get_many([f"{p}/0/blk/new", f"{p}/0/_acks/s/b.1", f"{p}/0/m"]) == [b"new", b"1", b"m"]


def test_advance_fence_never_lowers(kv_store):
    p = _prefix()
    fk = f"{p}/0/_fence"
    assert kv_store.read_fence(fk) == 0
    assert kv_store.advance_fence(fk, 3) is True
    assert kv_store.read_fence(fk) == 3
    assert kv_store.advance_fence(fk, 3) is True  # equal: still ours
    assert kv_store.advance_fence(fk, 2) is False  # someone newer owns
    assert kv_store.read_fence(fk) == 3
    assert kv_store.advance_fence(fk, 10) is True
    assert kv_store.advance_fence(fk, 9) is False
    assert kv_store.advance_fence(fk, 0) is False
    assert kv_store.read_fence(fk) == 10
    # the old owner is cut off, the new one writes
    with pytest.raises(Fenced):
        kv_store.put(f"{p}/0/m", b"x", fence=Fence(fk, 3))
    kv_store.put(f"{p}/0/m", b"y", fence=Fence(fk, 10))
    assert kv_store.get(f"{p}/0/m") == b"y"
    # numeric, not lexicographic: 10 -> 9 is refused above, 10 -> 100 accepted
    assert kv_store.advance_fence(fk, 100) is True
    assert kv_store.read_fence(fk) == 100


@pytest.mark.django_db(transaction=True)
def test_concurrent_advance_fence_one_winner_per_epoch(kv_store):
    """Owners racing to raise the same fence: the stored epoch ends at the highest."""
    p = _prefix()
    fk = f"{p}/0/_fence"
    results: dict[int, bool] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def contender(epoch: int) -> None:
        try:
            barrier.wait()
            results[epoch] = kv_store.advance_fence(fk, epoch)
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised by the test thread
            errors.append(exc)
        finally:
            _close_db_connection(kv_store)

    threads = [threading.Thread(target=contender, args=(e,)) for e in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors, errors
    assert kv_store.read_fence(fk) == 6
    assert results[6] is True


def test_raise_fence_says_whether_the_caller_raised_it(kv_store):
    """An owner holds its epoch alone only if it raised the fence to it: found there already,
    it was raised by someone else given the same epoch (a partition row restored from a backup
    hands epochs out again)."""
    p = _prefix()
    fk = f"{p}/0/_fence"
    assert kv_store.raise_fence(fk, 3) == 0  # raised from nothing: ours
    assert kv_store.raise_fence(fk, 3) == 3  # at 3 already: someone else's 3
    assert kv_store.raise_fence(fk, 2) == 3  # ahead: never lowered
    assert kv_store.read_fence(fk) == 3
    assert kv_store.raise_fence(fk, 40) == 3  # past the fence: ours
    assert kv_store.read_fence(fk) == 40
    with pytest.raises(Fenced):
        kv_store.put(f"{p}/0/m", b"x", fence=Fence(fk, 3))


@pytest.mark.django_db(transaction=True)
def test_concurrent_raise_fence_one_raiser_per_epoch(kv_store):
    """Owners given the same epoch race to raise the fence to it: exactly one raised it."""
    p = _prefix()
    fk = f"{p}/0/_fence"
    kv_store.advance_fence(fk, 2)
    answers: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(5)

    def contender() -> None:
        try:
            barrier.wait()
            answers.append(kv_store.raise_fence(fk, 7))
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised by the test thread
            errors.append(exc)
        finally:
            _close_db_connection(kv_store)

    threads = [threading.Thread(target=contender) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors, errors
    assert sorted(answers) == [2, 7, 7, 7, 7]
    assert kv_store.read_fence(fk) == 7


def test_the_head_record_goes_with_the_block_under_the_fence(kv_store):
    """The owner writes a new block and the head record (beside the fence) in one fenced
    write: both or neither."""
    p = _prefix()
    fk, head, block = f"{p}/0/_fence", f"{p}/0/_head", f"{p}/0/_blocks/00000001-ab"
    kv_store.advance_fence(fk, 5)
    with pytest.raises(Fenced):
        kv_store.put_many([(block, b"B"), (head, b'[4,"00000001-ab"]')], fence=Fence(fk, 4))
    assert kv_store.get_many([block, head]) == [None, None]
    kv_store.put_many([(block, b"B"), (head, b'[5,"00000001-ab"]')], fence=Fence(fk, 5))
    assert kv_store.get_many([block, head]) == [b"B", b'[5,"00000001-ab"]']
    assert kv_store.read_fence(fk) == 5


def _close_db_connection(kv_store) -> None:
    if getattr(kv_store, "kind", "") == "sql":
        from django.db import connection

        connection.close()


@pytest.mark.django_db(transaction=True)
def test_no_old_epoch_write_succeeds_after_the_fence_is_raised(kv_store):
    p = _prefix()
    fk = f"{p}/0/_fence"
    assert kv_store.advance_fence(fk, 1)
    old, new = Fence(fk, 1), Fence(fk, 2)
    n_writers = 4

    seq_lock = threading.Lock()
    seq = [0]

    def tick() -> int:
        with seq_lock:
            seq[0] += 1
            return seq[0]

    # (writer, i, start, end, ok) per attempt; keys of attempt (w, i) are unique to it.
    attempts: list[tuple[int, int, int, int, bool]] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    started = threading.Barrier(n_writers + 1)

    def keys_of(w: int, i: int) -> list[str]:
        return [f"{p}/0/w{w}/{i}-a", f"{p}/0/w{w}/{i}-b", f"{p}/0/shared/{w}-{i}"]

    def writer(w: int) -> None:
        try:
            started.wait()
            i = 0
            fenced_in_a_row = 0
            while not stop.is_set() and i < 5000:
                items = [(k, f"{w}-{i}".encode()) for k in keys_of(w, i)]
                start = tick()
                try:
                    kv_store.put_many(items, fence=old)
                    ok = True
                    fenced_in_a_row = 0
                except Fenced:
                    ok = False
                    fenced_in_a_row += 1
                attempts.append((w, i, start, tick(), ok))
                i += 1
                if fenced_in_a_row >= 5:
                    break
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised by the test thread
            errors.append(exc)
        finally:
            _close_db_connection(kv_store)

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(n_writers)]
    for t in threads:
        t.start()
    started.wait()
    # let the old owner get some writes in
    deadline = time.monotonic() + 10
    while sum(1 for a in attempts if a[4]) < 4 * n_writers and not errors:
        assert time.monotonic() < deadline, "the writers made no progress"
        time.sleep(0.002)
    assert kv_store.advance_fence(fk, 2) is True
    advanced = tick()
    # what the store holds at the moment the advance returned
    snapshot = {f"{p}/0/shared/{n}" for n in kv_store.scan(f"{p}/0/shared")}
    for w in range(n_writers):
        snapshot |= {f"{p}/0/w{w}/{n}" for n in kv_store.scan(f"{p}/0/w{w}")}
    for t in threads:
        t.join(20)
    stop.set()
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)

    succeeded = [a for a in attempts if a[4]]
    failed = [a for a in attempts if not a[4]]
    assert succeeded and failed
    # every writer was eventually cut off
    assert {a[0] for a in failed} == set(range(n_writers))
    # no old-epoch write that began after the advance returned succeeded ...
    late = [a for a in succeeded if a[2] > advanced]
    assert not late, f"old-epoch writes succeeded after advance_fence returned: {late[:5]}"
    # ... and every one that succeeded had completed (was stored) when it returned
    for w, i, *_ in succeeded:
        assert set(keys_of(w, i)) <= snapshot, f"write {w}-{i} landed after the advance"
    # once fenced, a writer is never let through again
    for w in range(n_writers):
        mine = sorted((a for a in attempts if a[0] == w), key=lambda a: a[1])
        first_fail = next(k for k, a in enumerate(mine) if not a[4])
        assert all(not a[4] for a in mine[first_fail:])

    # the new owner writes
    kv_store.put_many([(f"{p}/0/shared/new", b"new")], fence=new)

    # every successful write is readable; every refused one left nothing
    ok_keys = [(k, f"{w}-{i}".encode()) for w, i, *_ in succeeded for k in keys_of(w, i)]
    assert kv_store.get_many([k for k, _ in ok_keys]) == [v for _, v in ok_keys]
    bad_keys = [k for w, i, *_ in failed for k in keys_of(w, i)]
    assert kv_store.get_many(bad_keys) == [None] * len(bad_keys)
    assert len(kv_store.scan(f"{p}/0/shared")) == len(succeeded) + 1
    assert kv_store.get(f"{p}/0/shared/new") == b"new"


# --------------------------------------------------------------------------------- model check


_names = st.sampled_from(["a", "b", "c", "10", "x_y"])
_buckets = st.sampled_from(["0/blk", "0/blk2", "1/blk", "0"])
_keys = st.builds(lambda b, n: f"{b}/{n}", _buckets, _names)
_values = st.binary(max_size=12)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.lists(st.tuples(_keys, _values), max_size=5)),
        st.tuples(st.just("delete"), st.lists(_keys, max_size=5)),
        st.tuples(st.just("cas"), _keys, st.one_of(st.none(), _values), _values),
    ),
    max_size=12,
)


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops)
def test_behaves_like_a_dict(kv_store, ops):
    p = _prefix()  # fresh keys per example: the store is shared by the examples
    model: dict[str, bytes] = {}
    for op in ops:
        if op[0] == "put":
            items = [(f"{p}/{k}", v) for k, v in op[1]]
            kv_store.put_many(items)
            model.update(items)
        elif op[0] == "delete":
            keys = [f"{p}/{k}" for k in op[1]]
            expected = len({k for k in keys if k in model})
            assert kv_store.delete_many(keys) == expected
            for k in keys:
                model.pop(k, None)
        else:
            _, k, expected, value = op
            k = f"{p}/{k}"
            should = model.get(k) == expected
            assert kv_store.compare_and_set(k, expected, value) is should
            if should:
                model[k] = value
    all_keys = [f"{p}/{b}/{n}" for b in ["0/blk", "0/blk2", "1/blk", "0"] for n in ["a", "b", "c", "10", "x_y"]]
    assert kv_store.get_many(all_keys) == [model.get(k) for k in all_keys]
    for b in ["0/blk", "0/blk2", "1/blk", "0"]:
        assert sorted(kv_store.scan(f"{p}/{b}")) == sorted(
            k.rpartition("/")[2] for k in model if k.rpartition("/")[0] == f"{p}/{b}"
        )


# --------------------------------------------------------------------------------- file keys


BAD_KEYS = [
    "nokey",
    "a//b",
    "/a/b",
    "a/b/",
    "a/../b",
    "../x",
    "a/..",
    "..",
    "a/.hidden",
    ".a/b",
    "a/./b",
    "a/.",
    "../../etc/passwd",
    "a/b/..",
    "a/b\x00c",
    "a/b c/d",
    "a/b.lock",
]


def _tree(root) -> dict[str, bytes | None]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.join(dirpath, d)] = None
        for f in filenames:
            path = os.path.join(dirpath, f)
            with open(path, "rb") as fh:
                out[path] = fh.read()
    return out


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_file_store_refuses_bad_keys(tmp_path, bad):
    from queues.kv.filesystem import FileStore

    # The root sits two levels down, with neighbours a ".." could reach.
    (tmp_path / "outside").write_bytes(b"keep")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").write_bytes(b"keep")
    (tmp_path / "x").write_bytes(b"keep")
    root = tmp_path / "d1" / "root"
    s = FileStore(root)
    s.put("good/0/k", b"v")
    s.put("good/0/_fence", b"1")
    (tmp_path / "d1" / "x").write_bytes(b"keep")
    (tmp_path / "d1" / "b").write_bytes(b"keep")
    before = _tree(tmp_path)

    calls = [
        lambda: s.get(bad),
        lambda: s.get_many(["good/0/k", bad]),
        lambda: s.put(bad, b"x"),
        lambda: s.put_many([("good/0/new", b"x"), (bad, b"x"), ("good/1/new", b"x")]),
        lambda: s.put_many([("good/0/new", b"x")], fence=Fence(bad, 1)),
        lambda: s.put_many([("good/0/new", b"x"), (bad, b"x")], fence=Fence("good/0/_fence", 1)),
        lambda: s.delete(bad),
        lambda: s.delete_many(["good/0/k", bad]),
        lambda: s.delete_many(["good/0/k"], fence=Fence(bad, 1)),
        lambda: s.compare_and_set(bad, None, b"x"),
        lambda: s.compare_and_set(bad, b"keep", b"x"),
        lambda: s.advance_fence(bad, 5),
    ]
    for call in calls:
        with pytest.raises(ValueError):
            call()
    assert _tree(tmp_path) == before
    assert s.get("good/0/k") == b"v"
    s.close()


@pytest.mark.parametrize(
    "bad", ["..", "../d1", "a/../..", "../../outside", "good/..", ".", "", "/", "good//0", ".hidden"]
)
def test_file_store_scan_and_delete_prefix_stay_inside_the_root(tmp_path, bad):
    from queues.kv.filesystem import FileStore

    (tmp_path / "outside").write_bytes(b"keep")
    root = tmp_path / "d1" / "root"
    s = FileStore(root)
    s.put("good/0/k", b"v")
    (tmp_path / "d1" / "sibling").write_bytes(b"keep")
    before = _tree(tmp_path)
    with pytest.raises(ValueError):
        s.delete_prefix(bad)
    with pytest.raises(ValueError):
        s.scan(bad)
    assert _tree(tmp_path) == before
    s.close()
