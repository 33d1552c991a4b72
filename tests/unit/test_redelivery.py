"""The redelivery index against a plain dict model, with pins (an ack's hold on its entries
while the delete runs): random operation sequences, ``_check()`` after each."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from queues.redelivery import RedeliveryIndex

INF = math.inf
ids = st.sampled_from([f"q/0/b/{i}" for i in range(6)])
times = st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0, INF])
ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), ids, times),
        st.tuples(st.just("remove"), ids),
        st.tuples(st.just("pin"), ids),
        st.tuples(st.just("change"), ids, times),
        st.tuples(st.just("expired"), st.sampled_from([0.0, 1.5, 2.0, 4.0, 10.0]), st.integers(1, 4)),
    ),
    max_size=40,
)


@given(ops)
def test_the_index_behaves_like_its_model(seq):
    index = RedeliveryIndex()
    model: dict[str, list[float]] = {}  # id -> [deadline as read, deadline it sits under]
    for op in seq:
        if op[0] == "add":
            _, mid, d = op
            index.add(mid, d, "r", 1)
            model[mid] = [d, d]
        elif op[0] == "remove":
            _, mid = op
            assert (index.remove(mid) is not None) == (mid in model)
            model.pop(mid, None)
        elif op[0] == "pin":
            _, mid = op
            had = index.pin(mid)
            if mid in model:
                assert had == model[mid][0]
                model[mid][0] = INF
            else:
                assert had is None
        elif op[0] == "change":
            _, mid, d = op
            if mid in model:
                index.change_deadline(mid, d)
                model[mid] = [d, d]
        else:
            _, now, limit = op
            due = sorted((listed, mid) for mid, (read, listed) in model.items() if read == listed and listed <= now)
            assert index.expired(now, limit) == [mid for _, mid in due[:limit]]
        index._check()
        assert len(index) == len(model)
        for mid, (read, _) in model.items():
            entry = index.get(mid)
            assert entry is not None and entry.deadline == read
        unpinned = [listed for read, listed in model.values() if read == listed]
        assert index.next_deadline() == (min(unpinned) if unpinned else None)


def test_a_pinned_entry_is_not_redelivered_and_an_unpin_gives_it_back():
    index = RedeliveryIndex()
    index.add("a", 1.0, "r", 1)
    index.add("b", 2.0, "r", 1)
    had = index.pin("a")
    assert index.expired(5.0, 10) == ["b"]
    assert index.get("a").deadline == INF
    assert index.next_deadline() == 2.0
    index.change_deadline("a", had)  # the delete failed: unpinned where it was
    assert index.expired(5.0, 10) == ["a", "b"]
    index._check()
