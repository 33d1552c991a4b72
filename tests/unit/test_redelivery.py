"""The redelivery index against a plain dict model, with pins (an ack's hold on its entries
while the delete runs): random operation sequences, ``_check()`` after each, with the heaps
rebuilt early (``COMPACT_AT`` small) and at their real threshold."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from queues.engine import redelivery
from queues.engine.deadlines import Deadlines
from queues.engine.redelivery import RedeliveryIndex

INF = math.inf
ids = st.sampled_from([f"q/0/b/{i}" for i in range(6)])
times = st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0, INF])
ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), ids, times),
        st.tuples(st.just("add_new"), st.lists(ids, max_size=4), times),
        st.tuples(st.just("remove"), ids),
        st.tuples(st.just("remove_many"), st.lists(ids, max_size=4)),
        st.tuples(st.just("pin"), ids),
        st.tuples(st.just("change"), ids, times),
        st.tuples(st.just("expired"), st.sampled_from([0.0, 1.5, 2.0, 4.0, 10.0]), st.integers(1, 4)),
        st.tuples(st.just("in_flight"), st.sampled_from([0.0, 1.5, 2.0, 4.0, 10.0])),
    ),
    max_size=40,
)


@given(ops, st.sampled_from([0, 1, 3, redelivery.COMPACT_AT]))
def test_the_index_behaves_like_its_model(seq, compact_at):
    real = redelivery.COMPACT_AT
    redelivery.COMPACT_AT = compact_at
    try:
        _run_against_model(seq)
    finally:
        redelivery.COMPACT_AT = real


def _run_against_model(seq):
    index = RedeliveryIndex()
    # id -> [deadline as read, deadline it sits under, when it was listed there]: entries
    # under the same deadline come due in the order they were listed
    model: dict[str, list[float]] = {}
    for step, op in enumerate(seq):
        if op[0] == "add":
            _, mid, d = op
            index.add(mid, d, "r", 1)
            model[mid] = [d, d, step]
        elif op[0] == "add_new":  # one dequeue's first deliveries: IDs not in flight, in order
            _, mids, d = op
            new = list(dict.fromkeys(mid for mid in mids if mid not in model))
            index.add_new(new, d, ["r"] * len(new), [1] * len(new))
            for k, mid in enumerate(new):
                model[mid] = [d, d, step + k / 10]
        elif op[0] == "remove":
            _, mid = op
            assert (index.remove(mid) is not None) == (mid in model)
            model.pop(mid, None)
        elif op[0] == "remove_many":
            _, mids = op
            index.remove_many(mids)
            for mid in mids:
                model.pop(mid, None)
        elif op[0] == "pin":
            _, mid = op
            had = index.pin_many([mid]).get(mid)
            if mid in model and model[mid][0] != INF:
                assert had == model[mid][0]
                model[mid][0] = INF
            else:
                assert had is None  # no entry, or pinned already: a second pin gives nothing back
        elif op[0] == "change":
            _, mid, d = op
            if mid in model:
                index.change_deadline(mid, d)
                model[mid] = [d, d, model[mid][2] if d == model[mid][1] else step]
        elif op[0] == "in_flight":
            _, now = op
            seen = max(now, index.looked)  # a time before the last look counts as that look
            assert index.in_flight_count(now) == sum(1 for _, listed, _ in model.values() if listed > seen)
        else:
            _, now, limit = op
            due = sorted((listed, at, mid) for mid, (read, listed, at) in model.items() if read == listed <= now)
            assert index.expired(now, limit) == [mid for _, _, mid in due[:limit]]
        index._check()
        assert len(index) == len(model)
        for mid, (read, _, _) in model.items():
            entry = index.get(mid)
            assert entry is not None and entry.deadline == read
        unpinned = [listed for read, listed, _ in model.values() if read == listed]
        assert index.next_deadline() == (min(unpinned) if unpinned else None)


def test_pins_of_many_pin_each_once():
    index = RedeliveryIndex()
    index.add_new(["a", "b"], 5.0, ["ra", "rb"], [1, 2])
    assert index.pin_many(["a", "a", "b", "gone"]) == {"a": 5.0, "b": 5.0}
    assert index.pin_many(["a"]) == {}  # pinned already: nothing to give back
    assert (index.get("b").deadline, index.get("b").receipt, index.get("b").receive_count) == (INF, "rb", 2)
    index._check()


def test_a_pinned_entry_is_not_redelivered_and_an_unpin_gives_it_back():
    index = RedeliveryIndex()
    index.add("a", 1.0, "r", 1)
    index.add("b", 2.0, "r", 1)
    had = index.pin_many(["a"]).get("a")
    assert index.expired(5.0, 10) == ["b"]
    assert index.get("a").deadline == INF
    assert index.next_deadline() == 2.0
    index.change_deadline("a", had)  # the delete failed: unpinned where it was
    assert index.expired(5.0, 10) == ["a", "b"]
    index._check()


def test_acknowledged_entries_do_not_pile_up_in_the_heaps():
    index = RedeliveryIndex()
    for i in range(10_000):
        index.add(f"m{i}", 30.0 + i / 1000, "r", 1)
    assert index.in_flight_count(1.0) == 10_000
    for i in range(9_990):
        index.remove(f"m{i}")
    index._check()
    assert len(index.future) <= 2 * len(index) + redelivery.COMPACT_AT
    assert index.in_flight_count(1.0) == 10
    assert index.expired(100.0, 100) == [f"m{i}" for i in range(9_990, 10_000)]
    assert index.in_flight_count(100.0) == 0
    index._check()


def test_readings_change_nothing():
    index = RedeliveryIndex()
    for i in range(50):
        index.add(f"m{i}", float(i), "r", 1)
    index.pin_many(["m0"])
    before = (list(index.future), list(index.due), index.looked)
    assert index.in_flight_count(9.5) == 40
    assert index.next_deadline() == 1.0
    assert (list(index.future), list(index.due), index.looked) == before


def test_a_second_pin_of_the_same_entry_cannot_give_back_infinity():
    index = RedeliveryIndex()
    index.add("a", 5.0, "r", 1)
    first, second = index.pin_many(["a"]).get("a"), index.pin_many(["a"]).get("a")  # two acks of one delivery at once
    assert (first, second) == (5.0, None)
    index.change_deadline("a", first)  # both deletes failed: only the first unpins
    assert index.expired(6.0, 10) == ["a"]


def test_acks_in_delivery_order_leave_no_stale_items_in_front():
    index = RedeliveryIndex()
    for i in range(5_000):
        index.add(f"m{i}", 30.0 + i, "r", 1)
    for i in range(4_990):
        index.remove(f"m{i}")
        assert index.future.first()[2] == f"m{i + 1}"  # the front stays live: next_deadline finds it at once
    assert index.next_deadline() == 30.0 + 4_990
    assert len(index.future) == 10


def test_acks_in_batches_leave_no_stale_items_in_front():
    index = RedeliveryIndex()
    for i in range(5_000):
        index.add(f"m{i}", 30.0 + i // 100, "r", 1)  # a dequeue's batch shares its deadline
    for start in range(0, 4_900, 100):
        index.remove_many([f"m{i}" for i in range(start, start + 100)])
        assert index.future.first()[2] == f"m{start + 100}"
        index._check()
    index.remove_many([f"m{i}" for i in range(4_900, 5_000)] + ["m0", "nothing"])  # gone ones: no error
    assert len(index) == 0 and index.next_deadline() is None
    index._check()


deadlines = st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0])
deadline_ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), deadlines),
        st.tuples(st.just("pop_and_put_back"), st.integers(1, 3)),
        st.tuples(st.just("pop")),
        st.tuples(st.just("keep_even")),
        st.tuples(st.just("until"), deadlines),
        st.tuples(st.just("first_such"), st.integers(0, 1)),
    ),
    max_size=60,
)


@given(deadline_ops)
def test_deadlines_keep_items_in_order_like_a_sorted_list(seq):
    order, model, counter = Deadlines(), [], iter(range(10_000))
    for op in seq:
        if op[0] == "push":
            item = (op[1], next(counter), "m")
            order.push(item)
            model.append(item)
        elif op[0] == "pop":
            if model:
                assert order.pop() == min(model)
                model.remove(min(model))
        elif op[0] == "pop_and_put_back":  # as RedeliveryIndex.expired takes and puts back
            in_heap = len(order.heap)
            taken = [order.pop() for _ in range(min(op[1], len(model)))]
            assert taken == sorted(model)[: len(taken)]
            for item in reversed(taken):
                order.push_front(item)
            assert len(order.heap) <= in_heap  # put back in front of the run, not into the heap
        elif op[0] == "keep_even":
            order = order.kept(lambda it: it[1] % 2 == 0)
            model = [it for it in model if it[1] % 2 == 0]
        elif op[0] == "until":
            assert sorted(order.until(op[1])) == sorted(it for it in model if it[0] <= op[1])
        else:
            parity = op[1]
            accepted = [it for it in model if it[1] % 2 == parity]
            assert order.first_such(lambda it, p=parity: it[1] % 2 == p) == min(accepted, default=None)
        order._check()
        assert len(order) == len(model) and sorted(order) == sorted(model)
        assert order.first() == (min(model) if model else None)


def test_deliveries_in_deadline_order_stay_in_the_run():
    # given deliveries hidden for the same time, then one hidden for less
    index = RedeliveryIndex()
    for i in range(1_000):
        index.add(f"m{i}", 30.0 + i // 100, "r", 1)
    assert len(index.future.heap) == 0  # in order: all in the run, no heap at all
    index.add("quick", 5.0, "r", 1)
    # then the one out of order goes to the heap, and still comes first
    assert len(index.future.heap) == 1 and index.next_deadline() == 5.0
    assert index.expired(30.0, 3) == ["quick", "m0", "m1"]
    index._check()


def test_the_earliest_accepted_item_is_the_earlier_of_the_run_and_the_heap():
    order = Deadlines()
    for item in [(1.0, 0, "a"), (3.0, 1, "b"), (2.0, 2, "c"), (0.5, 3, "d")]:
        order.push(item)
    assert list(order.run) == [(1.0, 0, "a"), (3.0, 1, "b")]  # (c and d came out of order: the heap)
    assert order.first_such(lambda it: it[1] % 2 == 0) == (1.0, 0, "a")  # the run's, before the heap's c
    assert order.first_such(lambda it: it[2] in "bc") == (2.0, 2, "c")  # the heap's, before the run's b
    assert order.first_such(lambda it: it[2] == "b") == (3.0, 1, "b")
    assert order.first_such(lambda it: False) is None
