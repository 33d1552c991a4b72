"""Fair queues: a plain queue's ungrouped messages with a fairness key take turns, key by key,
so that a key flooding a partition holds the others back by one message a turn, not by its
backlog; without keys the order is the plain FIFO it always was."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from queues.engine import cursor as cursor_mod
from queues.engine.cursor import FairLanes
from queues.engine.ids import StoredMessage, parse_message_id
from queues.kv.memory import MemoryStore
from tests.stand_ins import PartitionRow
from tests.unit.test_groups import Clocks, open_manager


def test_without_keys_the_lanes_are_one_fifo():
    lanes = FairLanes()
    for mid in ("a", "b", "c"):
        lanes.append(mid)
    lanes.appendleft("z")
    assert (len(lanes), lanes[0], list(lanes)) == (4, "z", ["z", "a", "b", "c"])
    assert [lanes.popleft() for _ in range(4)] == ["z", "a", "b", "c"]
    assert not lanes and len(lanes) == 0
    with pytest.raises(IndexError):
        lanes.popleft()
    with pytest.raises(IndexError):
        lanes[0]


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.sampled_from([None, None, "a", "b"])),
            st.tuples(st.just("appendleft"), st.sampled_from([None, "a"])),
            st.tuples(st.just("extend"), st.integers(0, 3)),
            st.tuples(st.just("take"), st.integers(0, 5)),
        ),
        max_size=40,
    )
)
def test_a_run_taken_or_extended_is_as_one_message_at_a_time(ops):
    """take(n) gives what n pops would, extend what appends would, and leaves the same lanes."""
    runs, singles = FairLanes(), FairLanes()
    for step, (op, arg) in enumerate(ops):
        if op == "append":
            runs.append(f"m{step}", arg)
            singles.append(f"m{step}", arg)
        elif op == "appendleft":
            runs.appendleft(f"m{step}", arg)
            singles.appendleft(f"m{step}", arg)
        elif op == "extend":
            mids = [f"m{step}.{k}" for k in range(arg)]
            runs.extend(mids)
            for mid in mids:
                singles.append(mid)
        else:
            want = [singles.popleft() for _ in range(min(arg, len(singles)))]
            assert runs.take(arg) == want
        assert (list(runs), len(runs), bool(runs)) == (list(singles), len(singles), bool(singles))
    assert [runs.popleft() for _ in range(len(runs))] == [singles.popleft() for _ in range(len(singles))]


def test_keys_take_turns_each_oldest_first():
    lanes = FairLanes()
    for i in range(5):
        lanes.append(f"noisy{i}", "noisy")
    lanes.append("a0", "a")
    lanes.append("plain0")
    lanes.append("a1", "a")
    taken = [lanes.popleft() for _ in range(len(lanes))]
    assert taken == ["noisy0", "a0", "plain0", "noisy1", "a1", "noisy2", "noisy3", "noisy4"]


def test_a_message_given_back_goes_first_with_its_key():
    lanes = FairLanes()
    lanes.append("n0", "noisy")
    lanes.append("q0", "quiet")
    lanes.append("n1", "noisy")
    lanes.appendleft("q-back", "quiet")
    # it goes first, then the keys take turns again
    assert [lanes.popleft() for _ in range(4)] == ["q-back", "n0", "q0", "n1"]


def test_a_key_that_had_nothing_waiting_goes_before_the_backlogged_ones():
    lanes = FairLanes()
    for i in range(5):
        lanes.append(f"noisy{i}", "noisy")
    assert lanes.popleft() == "noisy0"  # the noisy lane has had its turn: it is old now
    lanes.append("q0", "quiet")
    assert lanes[0] == "q0"
    assert [lanes.popleft() for _ in range(3)] == ["q0", "noisy1", "noisy2"]
    lanes.append("q1", "quiet")  # quiet had emptied: new again
    assert [lanes.popleft() for _ in range(2)] == ["q1", "noisy3"]


def test_ever_new_keys_leave_the_old_lanes_a_turn_in_every_few(monkeypatch):
    monkeypatch.setattr(cursor_mod, "MAX_NEW_STREAK", 3)
    lanes = FairLanes()
    for i in range(3):
        lanes.append(f"noisy{i}", "noisy")
    assert lanes.popleft() == "noisy0"
    for i in range(7):
        lanes.append(f"k{i}", f"key{i}")
    taken = [lanes.popleft() for _ in range(len(lanes))]
    assert taken == ["k0", "k1", "k2", "noisy1", "k3", "k4", "k5", "noisy2", "k6"]


def test_keys_past_the_bound_share_overflow_lanes(monkeypatch):
    monkeypatch.setattr(cursor_mod, "MAX_FAIR_KEYS", 4)
    lanes = FairLanes()
    for i in range(100):
        lanes.append(f"m{i}", f"k{i}")
    assert len(lanes._lanes) <= 4 + cursor_mod.OVERFLOW_LANES
    assert sorted(lanes.popleft() for _ in range(100)) == sorted(f"m{i}" for i in range(100))


def test_the_fairness_key_is_stored_as_k_and_absent_without_one():
    keyed = StoredMessage("b", 1.0, fairness_key="tenant-a")
    assert orjson.loads(keyed.to_bytes())["k"] == "tenant-a"
    assert StoredMessage.from_bytes(keyed.to_bytes()).fairness_key == "tenant-a"
    assert "k" not in orjson.loads(StoredMessage("b", 1.0).to_bytes())
    assert keyed.stub().fairness_key == "tenant-a"


def _enqueue(m, clocks, *specs):
    """specs: (body, fairness key)."""
    return m.enqueue([StoredMessage(body, clocks.wall, fairness_key=key) for body, key in specs])


def test_a_flooding_key_holds_the_others_back_by_one_message_a_turn():
    clocks = Clocks()
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=64)
    _enqueue(m, clocks, *[(f"noisy{i}", "noisy") for i in range(20)])
    _enqueue(m, clocks, ("quiet-a", "a"), ("quiet-b", "b"), ("plain", None))
    got = m.load_bodies(m.dequeue(4, 5.0))
    assert [d.message.body for d in got] == ["noisy0", "quiet-a", "quiet-b", "plain"]
    assert got[1].message.fairness_key == "a"
    # given back: it goes first again, with its key
    m.give_back(got[1:2])
    again = m.load_bodies(m.dequeue(1, 5.0))
    assert [d.message.body for d in again] == ["quiet-a"]
    m.ack([(parse_message_id(d.id), d.receipt) for d in [got[0], *got[2:], *again]])
    rest = m.load_bodies(m.dequeue(30, 5.0))
    assert [d.message.body for d in rest] == [f"noisy{i}" for i in range(1, 20)]


def test_a_run_that_fails_to_go_out_stays_ready_in_its_order(monkeypatch):
    from queues.engine import delivery

    clocks = Clocks()
    m = open_manager(MemoryStore(), PartitionRow(), clocks, block_size=64)
    _enqueue(m, clocks, ("a0", "a"), ("plain0", None), ("a1", "a"), ("plain1", None))

    def no_receipts(n):
        raise OSError("getrandom failed")

    with monkeypatch.context() as patched:
        patched.setattr(delivery, "new_receipts", no_receipts)
        with pytest.raises(OSError):
            m.dequeue(3, 5.0)
    got = m.load_bodies(m.dequeue(10, 5.0))
    assert [d.message.body for d in got] == ["a0", "plain0", "a1", "plain1"]


def test_after_a_takeover_the_keys_still_take_turns():
    clocks = Clocks()
    store, row = MemoryStore(), PartitionRow()
    first = open_manager(store, row, clocks, block_size=64)
    _enqueue(first, clocks, *[(f"noisy{i}", "noisy") for i in range(10)])
    _enqueue(first, clocks, ("quiet", "q"))
    second = open_manager(store, row, clocks, block_size=64)
    got = second.load_bodies(second.dequeue(2, 5.0))
    assert [d.message.body for d in got] == ["noisy0", "quiet"]
