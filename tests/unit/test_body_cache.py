"""The body cache charges what it holds, so its byte budget bounds the node's memory.

Issue 14: a 1-character body with 16 attributes of 1 KB was charged 97 bytes while the entry
held about 18 KB, so a 64 MiB budget admitted gigabytes.
"""

from __future__ import annotations

import gc
import tracemalloc

from queues.engine.body_cache import BodyCache, held_bytes
from queues.engine.ids import StoredMessage


def hostile(i: int) -> StoredMessage:
    """A 1-character body with 16 attributes of 1 KB (the most the API takes), and a group."""
    attributes = {f"attribute-{k:02d}-{i}": f"{k}{i}".ljust(1024, "x") for k in range(16)}
    return StoredMessage("x", 1000.0 + i, group=f"group-{i}", sequence=i, attributes=attributes)


def mid(i: int) -> str:
    return f"q/0/00000001-{i:016x}/{i % 1000}"


def test_an_entry_is_charged_at_least_what_it_holds():
    # given a message whose attributes are most of it
    message = hostile(1)

    # when it is charged
    cost = held_bytes(mid(1), message)

    # then the charge covers its body, attributes, group and ID (not 1 + 96 bytes)
    assert cost >= 16 * 1024 + 16 * 12 + len("group-1") + len(mid(1))


def _allocated_here() -> int:
    """Bytes traced now that were allocated with this file on the stack: not another thread's
    (the full suite leaves threads of earlier tests running, e.g. a node's housekeeping)."""
    here = tracemalloc.Filter(True, __file__, all_frames=True)
    return sum(trace.size for trace in tracemalloc.take_snapshot().filter_traces([here]).traces)


def test_the_budget_bounds_the_memory_held():
    # given a cache of 1 MiB
    budget = 1 << 20
    cache = BodyCache(budget)
    gc.collect()
    tracemalloc.start(10)  # tracebacks deep enough to reach this test from what its calls allocate
    try:
        before = _allocated_here()

        # when a hostile producer puts 500 messages of ~18 KB each (9 MB) through it
        for i in range(500):
            cache.put(mid(i), hostile(i))
        gc.collect()
        held = _allocated_here() - before
    finally:
        tracemalloc.stop()

    # then the charged bytes stay under the budget and cover what is really held
    assert 0 < cache.used <= budget
    assert held <= budget * 1.1, f"the cache holds {held} bytes against a budget of {budget}"
    assert held >= budget * 0.5, f"only {held} bytes traced: the measure missed what the cache holds"
    assert cache.used >= held * 0.8, f"charged {cache.used} for {held} bytes held"


def test_discard_and_eviction_give_back_exactly_what_was_charged():
    cache = BodyCache(200_000)
    for i in range(50):
        cache.put(mid(i), hostile(i))
    for i in range(50):
        cache.discard(mid(i))
    assert cache.used == 0
    cache.put(mid(1), hostile(1))
    cache.put(mid(1), hostile(1))  # the same ID again: charged once
    assert cache.used == held_bytes(mid(1), hostile(1))


def test_a_batch_is_kept_as_the_same_puts_one_by_one_would_keep_it():
    # given two caches with room for about ten entries, one fed a batch at a time
    budget = 10 * held_bytes(mid(0), hostile(0))
    one_by_one, batched = BodyCache(budget), BodyCache(budget)
    batches = [[(mid(i), hostile(i)) for i in range(start, start + 7)] for start in (0, 7, 14)]

    # when the same messages go in, then a few go
    for batch in batches:
        for msg_id, message in batch:
            one_by_one.put(msg_id, message)
        batched.put_many(batch)
    gone = [mid(i) for i in (15, 18, 99)]
    for msg_id in gone:
        one_by_one.discard(msg_id)
    batched.discard_many(gone)

    # then both hold the same newest entries, charged alike, under the budget
    held = [msg_id for msg_id in (mid(i) for i in range(21)) if batched.get(msg_id) is not None]
    assert held == [msg_id for msg_id in (mid(i) for i in range(21)) if one_by_one.get(msg_id) is not None]
    assert held and held[-1] == mid(20) and mid(0) not in held
    assert batched.used == one_by_one.used <= budget
    batched.discard_many(held)
    assert batched.used == 0


def test_an_ascii_id_and_body_are_charged_as_getsizeof_counts_them():
    # held_bytes sizes ASCII strs by their length: the same bytes as sys.getsizeof
    import sys

    from queues.engine.body_cache import OVERHEAD

    for body in ["", "x", "x" * 100, "é", "€" * 3, "\U0001f600", "x" * 5000 + "é"]:
        for msg_id in [mid(3), "é/0/00000001-0000000000000000/0"]:
            assert held_bytes(msg_id, StoredMessage(body, 1.0)) == OVERHEAD + sys.getsizeof(msg_id) + sys.getsizeof(
                body
            )
